# SPDX-License-Identifier: MIT
"""`loaderctl top` in a real terminal, and the same figures in `status`.

top runs in a tmux pane (a real pty and a terminal emulator that renders
the escapes; capture-pane gives the screen as a person sees it), against a
real daemon with one worker and two real consumers (loaderctl consume):

- a slow trainer: a cheap token pipeline, each batch held 100 ms (--delay);
  the pipeline keeps well ahead of it, so it waits for data almost never and
  its pipeline is limited by its consumers;
- a data-starved trainer: an image pipeline whose samples are costly JPEG
  decodes and resizes for the one worker; the trainer takes each batch at
  once and waits for the next almost always, and its pipeline is limited by
  the workers.

The test asserts orderings (who waits more, what limits which pipeline,
the row order under each sort key), never durations. With
LOADERD_TOP_SCREENSHOT=FILE it writes the screen it checked there (the
README's screenshot is one).
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ldrtest import LOADERCTL, python_client_env, random_tokens, token_spec
from loaderd_harness import child_env

TMUX = shutil.which("tmux")
needs_tmux = pytest.mark.skipif(TMUX is None,
                                reason="tmux is not installed (scripts/bootstrap installs it)")
COLS, ROWS = 150, 40

PIPE_HEAD = ["PIPELINE", "STATE", "MODE", "CLIENTS", "SAMPLES/S", "MB/S", "BUSY%", "JOBS",
             "SLOTS R/L/F", "ERR/SKIP", "LIMITED BY"]
CLIENT_HEAD = ["ID", "PID", "NAME", "PIPELINE", "MODE", "BATCH/S", "SAMPLES/S", "WAIT%", "P50",
               "P99", "LAG", "LEASES", "DELIVERED", "STARVING"]


class Tmux:
    """A private tmux server with one COLS x ROWS window running /bin/sh."""

    def __init__(self, workdir):
        self.sock = os.path.join(workdir, "tmux.sock")
        env = child_env()
        env.pop("TMUX", None)
        env["ENV"] = ""  # no rc file for the interactive sh
        self.env = env
        self.run("new-session", "-d", "-s", "t", "-x", str(COLS), "-y", str(ROWS),
                 "env PS1='$ ' /bin/sh -i")

    def run(self, *args):
        return subprocess.run([TMUX, "-S", self.sock, "-f", "/dev/null", *args], env=self.env,
                              capture_output=True, text=True, timeout=30, check=True).stdout

    def prompt(self):
        return self.wait_screen(lambda s: s.rstrip().endswith("$"), "the shell's prompt")

    def type(self, text):
        self.run("send-keys", "-t", "t", "-l", text)

    def key(self, name):
        self.run("send-keys", "-t", "t", name)

    def screen(self):
        return self.run("capture-pane", "-p", "-t", "t")

    def wait_screen(self, predicate, what, timeout=30):
        deadline = time.monotonic() + timeout
        s = None
        while time.monotonic() < deadline:
            s = self.screen()
            if predicate(s):
                return s
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; the screen:\n{s}")

    def kill(self):
        subprocess.run([TMUX, "-S", self.sock, "kill-server"], env=self.env,
                       capture_output=True, timeout=30)


def table(lines, head):
    """The rows under the header line @head (fields split on 2+ blanks in the
    header, on blanks in the rows) until the first blank line."""
    for i, line in enumerate(lines):
        if re.split(r"\s{2,}", line.strip()) == head:
            rows = []
            for row in lines[i + 1:]:
                if not row.strip():
                    break
                rows.append(row.split())
            return rows
    raise AssertionError(f"no table with the header {head} in:\n" + "\n".join(lines))


def pipeline_rows(lines):
    return {r[0]: r for r in table(lines, PIPE_HEAD) if len(r) == len(PIPE_HEAD)}


def client_rows(lines):
    """The clients table's rows, in screen order, as dicts."""
    rows = table(lines, CLIENT_HEAD)
    for r in rows:
        assert len(r) == len(CLIENT_HEAD), f"client row {r} does not have {len(CLIENT_HEAD)} cells"
    return [dict(zip(CLIENT_HEAD, r)) for r in rows]


def noise_jpegs(root, n=8, h=600, w=800):
    """JPEGs of noise: as costly to decode as JPEGs of that size get."""
    from PIL import Image
    rng = np.random.default_rng(3)
    os.makedirs(os.path.join(root, "a"))
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
            os.path.join(root, "a", f"{i}.jpg"), quality=90)


def slow_and_starved(daemon, workdir):
    """The daemon (one worker), the slow consumer, the starved one, and a
    status in which both have reported their waits."""
    d = daemon(workers=1)
    tok = os.path.join(workdir, "tok.bin")
    random_tokens(tok, 64 * 4096 + 1)
    d.create(token_spec("tokens", tok, 64, "uint16", batch_size=32, epochs=0))
    img = os.path.join(workdir, "img")
    noise_jpegs(img)
    # prefetch 2: at most two decodes queued ahead of a token batch
    d.create({"name": "images", "source": {"kind": "image_folder", "path": img},
              "transforms": [{"op": "resize", "size": [512, 512]}],
              "batch_size": 1, "prefetch": 2, "epochs": 0})
    slow = d.popen_consume("tokens", "--delay", 100, dump=False)
    # attached first: the lower client id
    d.wait_for(lambda st: any(c["pid"] == slow.pid and c["attachments"] for c in st["clients"]),
               "the slow consumer attached")
    starved = d.popen_consume("images", dump=False)

    def settled(st):
        # both reported a few times, and the start-up waits (the first token
        # batches queue behind image jobs on the one worker) left the window
        atts = {c["pid"]: c["attachments"] for c in st["clients"]}
        pipes = {p["name"]: p.get("stats") or {} for p in st["pipelines"]}
        return (all(len(atts.get(c.pid, [])) == 1 and
                    (atts[c.pid][0].get("stats") or {}).get("next_calls_total", 0) >= 12
                    for c in (slow, starved)) and
                pipes["tokens"].get("limited_by") == "consumers" and
                pipes["images"].get("limited_by") == "workers")

    st = d.wait_for(settled, "both consumers reporting, their pipelines told apart", timeout=60)
    return d, slow, starved, st


@needs_tmux
def test_top_tells_a_slow_trainer_from_a_starved_one(daemon, workdir):
    d, slow, starved, st = slow_and_starved(daemon, workdir)
    ids = {c["pid"]: c["id"] for c in st["clients"]}
    assert ids[slow.pid] < ids[starved.pid]
    term = Tmux(workdir)
    try:
        before, after = os.path.join(workdir, "stty.before"), os.path.join(workdir, "stty.after")
        term.prompt()
        term.type(f"stty -g > {before}; {LOADERCTL} --socket {d.socket} top -d 0.5; "
                  f"echo EXIT=$?; stty -g > {after}")
        term.key("Enter")

        # several refreshes: the slow trainer's DELIVERED grows from frame to frame
        seen = []

        def refreshed(s):
            rows = [r for r in client_rows(s.splitlines()) if r["PID"] == str(slow.pid)]
            if rows and (not seen or int(rows[0]["DELIVERED"]) > seen[-1]):
                seen.append(int(rows[0]["DELIVERED"]))
            return len(seen) >= 4

        term.wait_screen(lambda s: CLIENT_HEAD[0] in s and refreshed(s), "four refreshes")
        screen = term.screen()
        lines = screen.splitlines()
        assert len(lines) <= ROWS and all(len(x) <= COLS for x in lines), screen
        assert re.match(rf"loaderd {re.escape(st['version'])}  pid {d.pid}  up \S+  workers 1  "
                        r"memory \S+ \S+ / \S+ \S+  \d\d:\d\d:\d\d$", lines[0]), screen
        assert lines[1].startswith("sort: wait  (keys: w wait, r rate, n name, i id, s next; "
                                   "q quit)  every 0.5s"), screen

        pipes = pipeline_rows(lines)
        assert set(pipes) == {"tokens", "images"}, screen
        for name in pipes:
            assert pipes[name][1:4] == ["running", "broadcast", "1"], screen
        assert pipes["images"][-1] == "workers", screen
        assert pipes["tokens"][-1] == "consumers", screen
        # the pipelines' why, one line each under the table
        assert any(x.startswith("images: ") for x in lines), screen
        assert any(x.startswith("tokens: ") for x in lines), screen

        rows = client_rows(lines)
        assert [r["PID"] for r in rows] == [str(starved.pid), str(slow.pid)], screen
        by_pid = {r["PID"]: r for r in rows}
        s_row, f_row = by_pid[str(starved.pid)], by_pid[str(slow.pid)]
        assert (s_row["PIPELINE"], f_row["PIPELINE"]) == ("images", "tokens"), screen
        assert int(s_row["WAIT%"]) > int(f_row["WAIT%"]), screen
        for r in rows:
            assert r["NAME"] == "loaderctl" and r["MODE"] == "broadcast", screen
            for col in ("BATCH/S", "SAMPLES/S", "P50", "P99", "LAG"):
                assert r[col] != "-", f"{col} of pid {r['PID']} is not shown:\n{screen}"
        if os.environ.get("LOADERD_TOP_SCREENSHOT"):
            with open(os.environ["LOADERD_TOP_SCREENSHOT"], "w") as f:
                f.write(screen.rstrip() + "\n")

        # i: the daemon's order (ids): the slow trainer, that attached first, on top
        term.key("i")
        s = term.wait_screen(lambda s: s.splitlines()[1].startswith("sort: id "), "sort: id")
        assert [r["PID"] for r in client_rows(s.splitlines())] == [str(slow.pid),
                                                                   str(starved.pid)], s
        # s cycles on: from id back to wait, the starved trainer on top again
        term.key("s")
        s = term.wait_screen(lambda s: s.splitlines()[1].startswith("sort: wait "), "sort: wait")
        assert [r["PID"] for r in client_rows(s.splitlines())] == [str(starved.pid),
                                                                   str(slow.pid)], s

        # a narrower window: the next frame is cut to its width
        term.run("resize-window", "-t", "t", "-x", "60", "-y", str(ROWS))
        s = term.wait_screen(lambda s: "PIPELINE  STATE" in s and
                             max(len(x) for x in s.splitlines()) == 60, "a 60-column frame")
        assert all(len(x) <= 60 for x in s.splitlines()), s
        assert s.splitlines()[0].startswith(f"loaderd {st['version']}  pid {d.pid}  up "), s

        # q: top exits 0, the shell's screen is back, the terminal's modes too
        term.key("q")
        s = term.wait_screen(lambda s: "EXIT=" in s and s.rstrip().endswith("$"), "top's exit")
        assert "EXIT=0" in s.split(), s
        assert "PIPELINE" not in s and "sort:" not in s, f"top's screen is still shown:\n{s}"
        term.wait_screen(lambda s: os.path.exists(after) and os.path.getsize(after) > 0,
                         "stty -g after top")
        with open(before) as b, open(after) as a:
            assert b.read() == a.read(), "top left the terminal's modes changed"
    finally:
        term.kill()
    assert slow.proc.poll() is None and starved.proc.poll() is None

    # status: the same columns once, with the same verdicts
    text = d.ctl("status").stdout.splitlines()
    pipes = pipeline_rows(text)
    assert (pipes["images"][-1], pipes["tokens"][-1]) == ("workers", "consumers"), text
    rows = {r["PID"]: r for r in client_rows(text)}
    assert int(rows[str(starved.pid)]["WAIT%"]) > int(rows[str(slow.pid)]["WAIT%"]), text


@needs_tmux
def test_top_shows_the_daemon_away_and_back(daemon, workdir):
    """A daemon that does not answer (stopped), that goes away, that comes
    back: top says which, its keys work meanwhile, and it quits even while
    a request hangs."""
    d = daemon()
    term = Tmux(workdir)
    try:
        term.prompt()
        # -n: that many frames, then the shell's screen again
        term.type(f"{LOADERCTL} --socket {d.socket} top -n 3 -d 0.2; echo EXIT1=$?")
        term.key("Enter")
        s = term.wait_screen(lambda s: "EXIT1=" in s and s.rstrip().endswith("$"), "top -n 3")
        assert "EXIT1=0" in s.split() and "sort:" not in s, s

        term.type(f"{LOADERCTL} --socket {d.socket} top -d 0.2; echo EXIT=$?")
        term.key("Enter")
        term.wait_screen(lambda s: f"  pid {d.pid}  up " in s, "top's first frame")

        os.kill(d.pid, signal.SIGSTOP)
        try:
            s = term.wait_screen(lambda s: "no answer from loaderd for " in s, "no answer")
            assert re.search(r"^no answer from loaderd for \d+s; the figures below are from "
                             r"before$", s, re.M) and "no pipelines" in s, s
            term.key("i")
            term.wait_screen(lambda s: s.splitlines()[1].startswith("sort: id "),
                             "sort: id while the request hangs")
        finally:
            os.kill(d.pid, signal.SIGCONT)
        s = term.wait_screen(lambda s: "no answer" not in s, "the answer")
        assert s.splitlines()[1].startswith("sort: id "), s

        d.stop()
        # the frame after the connection broke: "status: disconnected ...";
        # each one after: the redial's error
        s = term.wait_screen(lambda s: "cannot connect to loaderd at" in s, "the daemon away")
        lines = s.splitlines()
        assert lines[0].startswith("loaderd -  ") and lines[1].startswith("sort: id "), s
        assert lines[2].startswith(f"cannot connect to loaderd at {d.socket}: ") and \
            lines[2].endswith("; retrying every 0.2s"), s
        assert "no pipelines" not in s, f"figures shown without a daemon:\n{s}"
        # a new daemon on the socket: the next frame is its
        d2 = daemon(socket=d.socket)
        s = term.wait_screen(lambda s: f"  pid {d2.pid}  up " in s, "the new daemon's frame")
        assert "retrying" not in s and "no pipelines" in s, s

        # Ctrl-C while a request hangs: top leaves it and exits 0 at once
        os.kill(d2.pid, signal.SIGSTOP)
        try:
            term.wait_screen(lambda s: "no answer from loaderd for " in s, "no answer")
            term.key("C-c")
            s = term.wait_screen(lambda s: "EXIT=" in s and s.rstrip().endswith("$"),
                                 "top's exit", timeout=10)
            assert "EXIT=0" in s.split(), s
        finally:
            os.kill(d2.pid, signal.SIGCONT)
    finally:
        term.kill()


def test_top_without_a_terminal_and_status(ld, workdir):
    tok = os.path.join(workdir, "tok.bin")
    random_tokens(tok, 64 * 512 + 1)
    ld.create(token_spec("t", tok, 64, "uint16", batch_size=8, epochs=0))
    c = ld.popen_consume("t", "--delay", 20, dump=False)
    # a client whose name holds escape sequences: a C0 ESC (the daemon makes
    # it '?') and a C1 CSI, U+009B, that loaderctl must not pass on either
    name = "evil\x1b[2J\u009b2Jname"
    evil = subprocess.Popen([sys.executable, "-c",
                             "import sys, loaderd; c = loaderd.Client(sys.argv[1], sys.argv[2]);"
                             " print('up', flush=True); sys.stdin.readline()", ld.socket, name],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=python_client_env())
    try:
        assert evil.stdout.readline() == "up\n"
        ld.wait_for(lambda s: any(x["pid"] == c.pid and x["delivered"] > 0 for x in s["clients"])
                    and any(x["pid"] == evil.pid for x in s["clients"]), "both clients")

        # no terminal: -n frames one after the other, then exit 0
        r = ld.ctl("top", "-n", "2", "-d", "0.2")
        frames = re.split(r"\n\n(?=loaderd )", r.stdout)
        assert len(frames) == 2, r.stdout
        for f in frames:
            lines = f.splitlines()
            assert lines[0].startswith(f"loaderd {ld.status()['version']}  pid {ld.pid}  up "), f
            assert lines[1].startswith("sort: wait  "), f
            assert list(pipeline_rows(lines)) == ["t"], f
            rows = client_rows(lines)
            assert sorted(r["PID"] for r in rows) == sorted([str(c.pid), str(evil.pid)]), f
        for out in (r.stdout, ld.ctl("status").stdout, ld.ctl("clients").stdout):
            assert "\x1b" not in out and "\u009b" not in out, repr(out)
            assert "evil?[2J?2Jname" in out, out

        # status: the daemon, the figures, the lifetimes, the clients
        text = ld.ctl("status").stdout.splitlines()
        assert text[0].startswith(f"loaderd {ld.status()['version']}  pid {ld.pid}  up "), text
        assert text[0].endswith(f"  socket {ld.socket}"), text
        assert pipeline_rows(text)["t"][:4] == ["t", "running", "broadcast", "1"], text
        life = table(text, ["PIPELINE", "PREFETCH", "PRODUCED", "OWNER", "BY", "AGE", "IDLE",
                            "EXPIRES"])
        assert [row[0] for row in life] == ["t"] and life[0][-1] == "never", text
        rows = {r["PID"]: r for r in client_rows(text)}
        assert rows[str(c.pid)]["PIPELINE"] == "t" and rows[str(evil.pid)]["PIPELINE"] == "-"
        assert rows[str(c.pid)]["LEASES"] != "-" and rows[str(evil.pid)]["WAIT%"] == "-"
    finally:
        evil.stdin.close()
        evil.wait(timeout=30)

    # usage errors name what was wrong
    for args, msg in ((["-d", "0"], "invalid interval -- '0' (seconds, 0.1 to 3600)"),
                      (["-d", "1x"], "invalid interval -- '1x' (seconds, 0.1 to 3600)"),
                      (["-n", "0"], "invalid iteration count -- '0'"),
                      (["--sort", "fast"], "invalid sort key -- 'fast' (wait, rate, name or id)"),
                      (["extra"], "top: unexpected argument -- 'extra'")):
        r = ld.ctl("top", *args, check=False)
        assert r.returncode == 2 and r.stderr.startswith(f"loaderctl: {msg}\n"), (args, r.stderr)
    r = ld.ctl("top", check=False, json_out=True)
    assert r.returncode == 2 and "top: --json does not apply" in r.stderr, r.stderr
    # no daemon there: an error before any screen
    r = subprocess.run([LOADERCTL, "--socket", os.path.join(workdir, "none.sock"), "top"],
                       capture_output=True, text=True, timeout=30, env=child_env())
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr.startswith("loaderctl: top: cannot connect to loaderd at "), r.stderr
