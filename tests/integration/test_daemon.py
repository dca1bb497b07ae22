# SPDX-License-Identifier: MIT
"""The daemon process: its sockets, signals, a second start, stale sockets,
status, the client list, --help/--version, socket path resolution."""

import json
import os
import signal
import socket
import stat
import subprocess
import time

from ldrtest import LOADERCTL, LOADERD, random_tokens, sequential_batches, token_dump, token_spec

L = 16


def small_pipeline(d, workdir, name="s", n=200, bs=8, **kw):
    path = os.path.join(workdir, f"{name}.bin")
    tok = random_tokens(path, n * L + 1, "uint16", seed=len(name))
    d.create(token_spec(name, path, L, "uint16", batch_size=bs, **kw))
    return token_dump(tok, L, sequential_batches(n, bs))


def test_socket_mode_and_fd_channel(ld):
    st = os.stat(ld.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660, f"socket mode {oct(stat.S_IMODE(st.st_mode))}, expected 0o660"
    fst = os.stat(ld.fds_socket)
    assert stat.S_ISSOCK(fst.st_mode), "no fd channel socket at PATH.fds"


def test_sigterm_exits_0_and_removes_sockets(daemon, workdir):
    d = daemon()
    expected = small_pipeline(d, workdir)
    assert d.consume("s").dump == expected
    d.stop(signal.SIGTERM)
    assert not os.path.exists(d.socket)
    assert not os.path.exists(d.fds_socket), "the fd channel socket was left behind"


def test_sigint_exits_0(daemon):
    d = daemon()
    d.stop(signal.SIGINT)
    assert not os.path.exists(d.fds_socket)


def test_restart_on_same_socket(daemon, workdir):
    d1 = daemon()
    d1.stop()
    d2 = daemon(socket=d1.socket)
    expected = small_pipeline(d2, workdir)
    assert d2.consume("s").dump == expected


def test_sigterm_with_consumers_attached(daemon, workdir, monkeypatch):
    """Shutdown does not wait for clients: a running consumer of an endless
    pipeline and a stopped one are both told, the daemon exits 0 at once,
    and the consumers end (non-zero: their stream did not end) instead of
    hanging. (Not reconnecting, LOADERD_RECONNECT_TIMEOUT=0: reconnecting
    consumers wait for the next daemon, test_reconnect.py.)"""
    monkeypatch.setenv("LOADERD_RECONNECT_TIMEOUT", "0")
    d = daemon()
    small_pipeline(d, workdir, epochs=0, prefetch=2)
    running = d.popen_consume("s", dump=False)
    stopped = d.popen_consume("s", dump=False)
    d.wait_for(lambda s: sum(1 for c in s["clients"] if c["pid"] in (running.pid, stopped.pid)
                             and c["delivered"] > 0) == 2, "both consumers streaming")
    stopped.signal(signal.SIGSTOP)
    d.stop(signal.SIGTERM, reap_first=False)
    stopped.signal(signal.SIGCONT)
    for what, c in (("running", running), ("stopped", stopped)):
        try:
            rc = c.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the {what} consumer (pid {c.pid}) still runs 15 s after the daemon "
                                 f"exited; daemon log:\n{d.log()}")
        err = c.proc.stderr.read()
        assert rc != 0, f"a consumer whose daemon went away mid-stream exited 0 (stderr: {err})"
        assert err.strip(), "a consumer whose daemon went away printed no error"


def test_second_daemon_on_live_socket_refused(daemon, workdir):
    d1 = daemon()
    expected = small_pipeline(d1, workdir)
    r = subprocess.run([LOADERD, "--socket", d1.socket, "--workers", "1"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode != 0, "a second loaderd on a live socket exited 0"
    assert "already" in (r.stderr + r.stdout), f"message does not say 'already': {r.stderr!r}"
    # the first daemon is untouched and its sockets still work
    assert os.path.exists(d1.socket) and os.path.exists(d1.fds_socket)
    assert d1.status()["pid"] == d1.pid
    assert d1.consume("s").dump == expected


def test_stale_plain_socket_file_is_replaced(daemon, workdir):
    path = os.path.join(workdir, "stale.sock")
    for p in (path, path + ".fds"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(p)
        s.close()                      # the file stays, nobody listens
        assert os.path.exists(p)
    d = daemon(socket=path)
    expected = small_pipeline(d, workdir)
    assert d.consume("s").dump == expected
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660


def test_stale_socket_of_killed_daemon_is_replaced(daemon, workdir):
    d1 = daemon()
    small_pipeline(d1, workdir, name="old")
    d1.kill9()
    assert os.path.exists(d1.socket), "socket vanished after SIGKILL (test assumption)"
    r = subprocess.run([LOADERCTL, "--socket", d1.socket, "status"], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode != 0, "loaderctl status succeeded against a dead daemon"
    assert r.stderr.strip(), "loaderctl printed no error for a dead daemon"
    d2 = daemon(socket=d1.socket)
    assert d2.status()["pipelines"] == []
    expected = small_pipeline(d2, workdir, name="new")
    assert d2.consume("new").dump == expected


def test_status_json(daemon, workdir):
    d = daemon(workers=2, memory_limit=64 << 20)
    st = d.status()
    assert st["pid"] == d.pid
    assert st["workers"] == 2
    assert st["memory_limit"] == 64 << 20
    assert st["memory_used"] == 0
    assert st["pipelines"] == []
    assert [c for c in st["clients"] if c["pipeline"] is not None] == []
    assert isinstance(st["version"], str) and st["version"]
    small_pipeline(d, workdir, n=200, bs=8, prefetch=4)
    st = d.status()
    p = st["pipelines"][0]
    for key in ("name", "state", "error", "slots_total", "slots_in_use", "slot_bytes", "samples",
                "batch_size", "batches_per_epoch", "epochs", "clients", "batches_produced", "spec"):
        assert key in p, f"pipeline status lacks {key!r}"
    assert p["name"] == "s" and p["samples"] == 200 and p["batch_size"] == 8
    assert p["batches_per_epoch"] == 25 and p["epochs"] == 1 and p["clients"] == 0
    assert p["slots_total"] >= 2
    assert 0 <= p["slots_in_use"] <= p["slots_total"]
    assert p["slot_bytes"] >= 2 * 8 * L * 8, "a slot cannot hold one batch"
    assert 0 < st["memory_used"] <= st["memory_limit"]
    assert st["memory_used"] >= p["slots_total"] * p["slot_bytes"], "memory_used does not count the slots"
    assert p["spec"]["name"] == "s" and p["spec"]["prefetch"] == 4
    d.consume("s")
    st = d.wait_for(lambda s: s["pipelines"][0]["state"] == "done" and s["pipelines"][0]["clients"] == 0,
                    "pipeline done after its only consumer read it to the end")
    p = st["pipelines"][0]
    assert p["batches_produced"] == 25
    assert p["slots_in_use"] == 0


def test_clients_in_status(ld, workdir):
    small_pipeline(ld, workdir, name="cl", n=400, bs=4, prefetch=2, epochs=0)
    c = ld.popen_consume("cl", "--mode", "partition", "--rank", 1, "--world-size", 2, dump=False)
    st = ld.wait_for(lambda s: any(x["pid"] == c.pid and x["delivered"] > 0 for x in s["clients"]),
                     "partition consumer streaming")
    c.signal(signal.SIGSTOP)
    st = ld.status()
    me = [x for x in st["clients"] if x["pid"] == c.pid]
    assert len(me) == 1
    me = me[0]
    for key in ("id", "pid", "uid", "name", "pipeline", "mode", "leases", "delivered", "attachments"):
        assert key in me, f"client status lacks {key!r}"
    assert me["uid"] == os.getuid()
    assert me["pipeline"] == "cl" and me["mode"] == "partition"
    assert isinstance(me["leases"], int) and me["leases"] >= 0
    assert isinstance(me["attachments"], list) and len(me["attachments"]) == 1
    p = [x for x in st["pipelines"] if x["name"] == "cl"][0]
    assert p["clients"] == 1
    assert p["slots_in_use"] <= p["slots_total"]
    r = ld.ctl("clients")
    assert str(c.pid) in r.stdout, f"`loaderctl clients` does not show pid {c.pid}:\n{r.stdout}"
    c.signal(signal.SIGKILL)
    c.proc.wait(timeout=10)
    ld.wait_for(lambda s: s["clients"] == [] and s["pipelines"][0]["slots_in_use"] == 0,
                "killed client gone and its slots free")


def test_help_and_version(ld):
    r = subprocess.run([LOADERD, "--help"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0
    out = r.stdout + r.stderr
    for opt in ("--socket", "--workers", "--memory-limit", "--help", "--version"):
        assert opt in out, f"loaderd --help does not mention {opt}"
    r = subprocess.run([LOADERCTL, "--help"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0
    out = r.stdout + r.stderr
    for word in ("--socket", "--json", "status", "pipelines", "clients", "create", "drop", "consume",
                 "--mode", "--rank", "--world-size", "--start-epoch", "--start-batch", "--start-position",
                 "--batches",
                 "--epochs", "--dump", "--exist-ok", "--force", "top", "--interval", "--iterations",
                 "--sort"):
        assert word in out, f"loaderctl --help does not mention {word}"
    version = ld.status()["version"]
    for prog in (LOADERD, LOADERCTL):
        r = subprocess.run([prog, "--version"], capture_output=True, text=True, timeout=20)
        assert r.returncode == 0
        out = r.stdout + r.stderr
        assert version in out, f"{prog} --version does not print {version}"
        # loaderctl links nng and protobuf-c (through libloader), not libuv
        libs = ("libuv", "nng", "protobuf-c") if prog == LOADERD else ("nng", "protobuf-c")
        for lib in libs:
            assert lib in out, f"{prog} --version does not name {lib}: {out!r}"


def test_loaderctl_without_daemon(workdir):
    r = subprocess.run([LOADERCTL, "--socket", os.path.join(workdir, "none.sock"), "status"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert r.stderr.strip()


def test_loaderctl_usage_errors(ld):
    for args in (["bogus-command"], ["consume"], ["create"], ["consume", "x", "--mode", "sideways"],
                 ["consume", "x", "--batches", "-3"]):
        r = ld.ctl(*args, check=False)
        assert r.returncode != 0, f"loaderctl {' '.join(args)} exited 0"
        assert r.stderr.strip(), f"loaderctl {' '.join(args)} printed no error"


def test_consume_unknown_pipeline(ld):
    r = ld.consume("no-such-pipeline", check=False, dump=False)
    assert r.rc != 0
    assert "no-such-pipeline" in r.stderr, r.describe()


def test_loaderd_bad_options(workdir):
    for args in (["--workers", "0"], ["--workers", "many"], ["--no-such-option"],
                 ["--memory-limit", "lots"]):
        cmd = [LOADERD, "--socket", os.path.join(workdir, "bad.sock")] + args
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        assert r.returncode != 0, f"{' '.join(cmd)} exited 0"
        assert r.stderr.strip(), f"{' '.join(cmd)} printed no error"
        assert not os.path.exists(os.path.join(workdir, "bad.sock"))


def test_socket_from_environment(daemon, workdir):
    """LOADERD_SOCKET is used by loaderctl when --socket is absent."""
    d = daemon()
    env = dict(os.environ, LOADERD_SOCKET=d.socket)
    r = subprocess.run([LOADERCTL, "--json", "status"], capture_output=True, text=True, env=env,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pid"] == d.pid


def test_daemon_socket_from_environment(workdir):
    """loaderd without --socket listens on $LOADERD_SOCKET."""
    path = os.path.join(workdir, "env.sock")
    env = dict(os.environ, LOADERD_SOCKET=path)
    env.pop("RUNTIME_DIRECTORY", None)
    log = open(os.path.join(workdir, "env.log"), "w")
    p = subprocess.Popen([LOADERD, "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not os.path.exists(path):
            assert p.poll() is None, open(os.path.join(workdir, "env.log")).read()
            time.sleep(0.05)
        ok = False
        while time.monotonic() < deadline:
            r = subprocess.run([LOADERCTL, "status"], capture_output=True, text=True, env=env, timeout=30)
            if r.returncode == 0:
                ok = True
                break
            time.sleep(0.05)
        assert ok, "loaderd did not listen on $LOADERD_SOCKET"
    finally:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=10)
        log.close()
    assert rc == 0
    assert not os.path.exists(path)
