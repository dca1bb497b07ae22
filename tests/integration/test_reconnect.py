# SPDX-License-Identifier: MIT
"""Restart without killing training (docs/reliability.md): the daemon is
SIGKILLed under streaming Python trainers and a new one starts on the same
socket; libloader reconnects, creates the trainers' own pipelines again,
re-attaches each attachment at the next batch its trainer has not taken, and
the trainers finish their epochs with exactly the batches they would have had.
Also: the reconnect time running out, reconnecting disabled, and a batch held
across the restart."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from ldrtest import (nsamples_tokens, partition_share, position_tokens, python_client_env,
                     sanitizer_report, split_batches, token_dump, token_spec)

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "reconnect_trainer.py")
L = 16


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def stderr_of(p):
    with open(p.err_path, errors="replace") as f:
        return f.read()


def wait_until(ready, procs, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not ready():
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: a trainer exited {p.returncode} first:\n"
                                     f"{stderr_of(p)}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def main_thread_sleeps(pid):
    """Is process @pid's main thread asleep (blocked in a call)? /proc's
    state, the third field of its stat."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def wait_file(path, procs, what):
    wait_until(lambda: os.path.exists(path), procs, what)


def let_go(out, p, clients=1):
    """Let the paused trainer @p go on once each of its @clients clients (one
    per loader) saw the daemon go (their lines on stderr): from then on it
    takes nothing more of the old daemon's (else a client that has not seen
    it yet may still take a batch that had arrived, and re-attach after it)."""
    wait_until(lambda: stderr_of(p).count("went away") >= clients, [p],
               f"the trainer's {clients} client(s) seeing the daemon go")
    open(os.path.join(out, "go"), "w").close()


def trainer(sock, out, pause_at, *loaders, env=None):
    os.makedirs(out, exist_ok=True)
    err_path = os.path.join(out, "stderr.log")
    with open(err_path, "wb") as err:
        p = subprocess.Popen([sys.executable, TRAINER, sock, out, str(pause_at), *loaders],
                             stdout=subprocess.DEVNULL, stderr=err, env=env or python_client_env())
    p.err_path = err_path
    return p


def finish(p, what):
    p.wait(timeout=120)
    err = stderr_of(p)
    assert p.returncode == 0, f"{what} exited {p.returncode}:\n{err}"
    marker = sanitizer_report(err)
    assert marker is None, f"{what} printed a {marker} report:\n{err}"
    return err


def read(path):
    with open(path, "rb") as f:
        return f.read()


def tokens_config(workdir, name, n, **kw):
    """A position_tokens() file of @n samples and a daemon config with one
    pipeline @name of it (sequential): (config path, token path, tokens,
    samples)."""
    tok_path = os.path.join(workdir, "pos.bin")
    tok = position_tokens(tok_path, n * L + 1)
    cfg = os.path.join(workdir, "loaderd.json")
    write_json(cfg, {"pipelines": [token_spec(name, tok_path, L, "uint32", shuffle=False,
                                              epochs=1, output_dtype="int64", **kw)]})
    return cfg, tok_path, tok, nsamples_tokens(n * L + 1, L)


def expected_dump(tok, nsamples, bs, rank=None, world=None):
    order = list(range(nsamples))
    if rank is not None:
        order = partition_share(order, rank, world)
    return token_dump(tok, L, split_batches(order, bs))


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_restart_under_two_trainers(daemon, workdir, how):
    """Two trainers: ranks 0 and 1 of a config pipeline (partition), and the
    second also reads a pipeline it created itself (broadcast). The daemon is
    SIGKILLed (a crash) or SIGTERMed (systemctl restart: it answers ESHUTDOWN
    first) while both are mid-epoch, and a new one started on the same socket
    a second later: both finish with exact contents, say so on stderr, and
    the batch held across the restart still reads its bytes."""
    cfg, tok_path, tok, ns = tokens_config(workdir, "cfg", 4000, batch_size=8, prefetch=8)
    own = os.path.join(workdir, "own.json")
    write_json(own, token_spec("own", tok_path, L, "uint32", batch_size=16, shuffle=False,
                               prefetch=8, epochs=1, output_dtype="int64"))
    d1 = daemon("--config", cfg)
    sock = d1.socket
    ta = trainer(sock, os.path.join(workdir, "a"), 40, "r0:cfg:partition:0:2")
    tb = trainer(sock, os.path.join(workdir, "b"), 30, "r1:cfg:partition:1:2", f"own:@{own}:broadcast")
    for t, who in ((ta, "a"), (tb, "b")):
        wait_file(os.path.join(workdir, who, "paused"), [ta, tb], f"trainer {who} mid-epoch")
    if how == "SIGKILL":
        d1.kill9()
    else:
        d1.stop(signal.SIGTERM, reap_first=False)
    for who, t, clients in (("a", ta, 1), ("b", tb, 2)):
        let_go(os.path.join(workdir, who), t, clients)
    # the trainers went on and wait in next() (nothing but next() sleeps
    # after "resumed") while no daemon answers
    for who, t in (("a", ta), ("b", tb)):
        wait_until(lambda: os.path.exists(os.path.join(workdir, who, "resumed")) and
                   main_thread_sleeps(t.pid), [ta, tb], f"trainer {who} waiting in next()")
    daemon("--config", cfg, socket=sock)
    ea, eb = finish(ta, "trainer a"), finish(tb, "trainer b")

    assert read(os.path.join(workdir, "a", "r0.dump")) == expected_dump(tok, ns, 8, 0, 2)
    assert read(os.path.join(workdir, "b", "r1.dump")) == expected_dump(tok, ns, 8, 1, 2)
    assert read(os.path.join(workdir, "b", "own.dump")) == expected_dump(tok, ns, 16)
    for who, err in (("a", ea), ("b", eb)):
        held = read(os.path.join(workdir, who, "held.dump"))
        assert held == read(os.path.join(workdir, who, "held.expected")) and len(held) > 0
        assert read(os.path.join(workdir, who, "reconnects")) == b"1"
        # each loader's first batch since it went on came after the reconnection
        across = json.loads(read(os.path.join(workdir, who, "across")))
        names = ["r0"] if who == "a" else ["r1", "own"]
        assert across == {"before": dict.fromkeys(names, 0), "after": dict.fromkeys(names, 1)}, across
        # re-attached through the new daemon's batch ring, as at the first attach
        rings = json.loads(read(os.path.join(workdir, who, "rings")))
        assert rings == [True] * (1 if who == "a" else 2), rings
        assert f"loaderd: the daemon at {sock} went away; reconnecting for up to 60 s" in err, err
        assert f"loaderd: reconnected to the daemon at {sock} after" in err, err
    assert "(pipeline 'cfg') re-attached at epoch 0 batch 40" in ea, ea
    assert "(pipeline 'cfg') re-attached at epoch 0 batch 30" in eb, eb
    # b paused after its 30th batch of r1, before its 30th of own
    assert "(pipeline 'own') re-attached at epoch 0 batch 29" in eb, eb


def daemon_with_p(daemon, workdir):
    """A daemon with pipeline 'p' (2000 samples of position tokens, batches of 8)."""
    tok_path = os.path.join(workdir, "pos.bin")
    position_tokens(tok_path, 2000 * L + 1)
    d = daemon()
    d.create(token_spec("p", tok_path, L, "uint32", batch_size=8, epochs=1))
    return d


def client_took_one(sock, loader_args, rest):
    """A Python client that takes one batch of 'p' (DataLoader(..., @loader_args)),
    says 'took' and, once given a line on stdin, runs @rest (the iterator is
    `it`, the loader `ld`)."""
    code = (
        "import loaderd, sys\n"
        f"ld = loaderd.DataLoader('p', socket={sock!r}, as_numpy=True, {loader_args})\n"
        "it = iter(ld); next(it)\n"
        "print('took', flush=True); sys.stdin.readline()\n" + rest)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=python_client_env())
    assert p.stdout.readline() == b"took\n"
    return p


def test_reconnect_timeout_expires(daemon, workdir):
    """No daemon comes back: after the reconnect time next() fails with
    LDR_EDISCONNECTED naming the time and the socket."""
    d1 = daemon_with_p(daemon, workdir)
    rest = ("try:\n"
            "    for b in it: pass\n"
            "except loaderd.Error as e:\n"
            "    print('ERR', e.code, e.message, flush=True)\n")
    procs = {setting: client_took_one(d1.socket, f"reconnect_timeout={setting}", rest)
             for setting in ("1.5", "0")}
    d1.kill9()
    results = {}
    for setting, p in procs.items():
        out, err = p.communicate(b"\n", timeout=60)
        results[setting] = (out.decode(), err.decode())
    out, err = results["1.5"]
    assert out.startswith("ERR -4093 disconnected from the daemon at "
                          f"{d1.socket}: it went away and libloader could not reconnect within "
                          "1.5 s (reconnect timeout, LOADERD_RECONNECT_TIMEOUT)"), out + err
    assert f"loaderd: the daemon at {d1.socket} went away; reconnecting for up to 1.5 s" in err
    out, err = results["0"]
    assert out == f"ERR -4093 disconnected from the daemon at {d1.socket}\n", out + err
    assert "reconnecting" not in err, err


def test_reconnect_timeout_setting_is_checked(ld):
    env = python_client_env()
    env["LOADERD_RECONNECT_TIMEOUT"] = "soon"
    r = subprocess.run([sys.executable, "-c", f"import loaderd; loaderd.Client({ld.socket!r})"],
                       capture_output=True, text=True, env=env)
    assert r.returncode != 0
    assert ("LOADERD_RECONNECT_TIMEOUT='soon' is not a number of seconds from 0 (never reconnect) "
            "to 2073600") in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", "import loaderd\n"
                        f"loaderd.DataLoader('x', socket={ld.socket!r}, reconnect_timeout=-1)"],
                       capture_output=True, text=True, env=python_client_env())
    assert "reconnect_timeout must be a number of seconds from 0 (never reconnect) to 2073600, " \
           "not -1" in r.stderr, r.stderr


def killed_under_one_trainer(daemon, workdir, cfg, pause_at, loader):
    """A daemon of @cfg, one trainer of @loader that takes @pause_at batches,
    the daemon SIGKILLed, the trainer let go on (it waits for a daemon):
    (the dead daemon, the trainer, its output folder)."""
    d1 = daemon("--config", cfg)
    out = os.path.join(workdir, "t")
    t = trainer(d1.socket, out, pause_at, loader)
    wait_file(os.path.join(out, "paused"), [t], "the trainer mid-epoch")
    d1.kill9()
    let_go(out, t)
    return d1, t, out


def test_dynamic_starts_again_with_the_new_daemon(daemon, workdir):
    """Dynamic mode is not exact across a restart (docs/reliability.md): the
    new daemon's dynamic stream starts again at its first batch. With one
    client that is exactly the batches it took, then the whole epoch."""
    cfg, _, tok, ns = tokens_config(workdir, "dyn", 800, batch_size=8)
    d1, t, out = killed_under_one_trainer(daemon, workdir, cfg, 7, "d:dyn:dynamic")
    daemon("--config", cfg, socket=d1.socket)
    err = finish(t, "the trainer")
    batches = split_batches(list(range(ns)), 8)
    assert read(os.path.join(out, "d.dump")) == token_dump(tok, L, batches[:7] + batches)
    assert "(pipeline 'dyn') re-attached at the dynamic stream's next batch" in err, err


def test_close_while_reconnecting(daemon, workdir):
    """A loader closed while its client reconnects (for up to 10 minutes
    here) closes at once: the reconnection gives up."""
    d1 = daemon_with_p(daemon, workdir)
    p = client_took_one(d1.socket, "timeout=1, reconnect_timeout=600",
                        "try:\n"
                        "    for b in it: pass\n"
                        "except loaderd.Timeout as e:\n"
                        "    print('TIMEOUT', e.message, flush=True)\n"
                        "ld.close()\n"
                        "print('closed', ld.reconnects, flush=True)\n")
    d1.kill9()
    out, err = p.communicate(b"\n", timeout=60)
    assert p.returncode == 0, err.decode()
    assert out.decode() == ("TIMEOUT DataLoader timed out after 1 seconds: no batch from "
                            "pipeline 'p'\nclosed 0\n"), out.decode() + err.decode()


@pytest.mark.parametrize("change", ["layout", "spec"])
def test_changed_pipeline_is_not_followed(daemon, workdir, change):
    """The new daemon's pipeline of that name has other batches (its config
    changed): the attachment does not go on with another stream, it fails
    saying what changed: the layout (a batch size), or, with the same layout
    and length, the spec (it now shuffles), which the fingerprint of the
    spec in the attach reply shows."""
    cfg, tok_path, _, _ = tokens_config(workdir, "cfg", 2000, batch_size=8)
    d1, t, out = killed_under_one_trainer(daemon, workdir, cfg, 3, "r0:cfg:partition:0:1")
    kw = {"batch_size": 16} if change == "layout" else {"batch_size": 8, "shuffle": True, "seed": 5}
    write_json(cfg, {"pipelines": [token_spec("cfg", tok_path, L, "uint32", epochs=1,
                                              output_dtype="int64", **dict({"shuffle": False}, **kw))]})
    daemon("--config", cfg, socket=d1.socket)
    t.wait(timeout=120)
    err = stderr_of(t)
    assert t.returncode == 1, err
    why = ("the pipeline's layout or length changed (250 batches of 8 per epoch, 1 epochs, 2 "
           "fields; now 125 of 16, 1, 2)" if change == "layout" else
           "pipeline 'cfg' now has another spec than at the attach (fingerprint ")
    assert (f"next: the daemon at {d1.socket} restarted, and pipeline 'cfg' could not be attached "
            f"again at epoch 0 batch 3: {why}") in err, err
