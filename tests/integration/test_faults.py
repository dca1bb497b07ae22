# SPDX-License-Identifier: MIT
"""Faults: consumers killed with SIGKILL mid-stream, a dataset file truncated
under a running pipeline, malformed / oversized / truncated messages on the
daemon's sockets. The daemon must keep serving and account for everything."""

import os
import re
import select
import signal
import socket
import struct
import subprocess
import time

import numpy as np
import pytest

from ldrtest import (LOADERD, REP_ERROR, REP_HELLO, RawReq, npy_dump, npy_spec, pb_field,
                     pb_top_field, random_tokens, sequential_batches, token_dump, token_spec,
                     wait_log, write_npy)

L = 16


def client_of(status, pid):
    for c in status["clients"]:
        if c["pid"] == pid:
            return c
    return None


def attached(status, pid, pipeline):
    c = client_of(status, pid)
    return c is not None and c.get("pipeline") == pipeline


def pipe_of(status, name):
    return [p for p in status["pipelines"] if p["name"] == name][0]


def first_batch_line(consumer, what, timeout=20):
    """Wait for the first `--verbose` line of a consumer: it has a batch.
    (With --json, loaderctl prints the per-batch lines on stderr.)"""
    r, _, _ = select.select([consumer.proc.stderr], [], [], timeout)
    assert r, f"{what}: no batch within {timeout} s"
    line = consumer.proc.stderr.readline()
    assert "batch" in line, f"{what}: unexpected first line {line!r}"
    return line


def stopped_survivor(ld, name):
    """A consumer of broadcast pipeline @name, reading from its first batch,
    SIGSTOPped once it streams. A brake (a consumer that holds its first
    batch for an hour) attaches first, so that the survivor cannot run ahead
    of it by more than the pipeline's slots before the SIGSTOP: alone, it
    reads a 20 000-batch pipeline in about 0.2 s, which a loaded machine can
    take between a status poll and the signal. The brake is then killed and
    gone from status."""
    brake = ld.popen_consume(name, "--delay", 3600000, dump=False)
    ld.wait_for(lambda s: (client_of(s, brake.pid) or {}).get("delivered", 0) >= 1,
                "the brake holds its first batch")
    survivor = ld.popen_consume(name, "--timeout", 120000)
    ld.wait_for(lambda s: (client_of(s, survivor.pid) or {}).get("delivered", 0) >= 1,
                "survivor streaming")
    survivor.signal(signal.SIGSTOP)
    brake.signal(signal.SIGKILL)
    brake.proc.wait(timeout=10)
    ld.wait_for(lambda s: client_of(s, brake.pid) is None, "the brake gone from status")
    return survivor


def test_sigkill_consumers_20_times(ld, workdir):
    """20 broadcast consumers, one after the other, killed with SIGKILL while
    streaming, while a survivor of the same pipeline goes on. The survivor's
    stream is complete and exact; each dead client vanishes from status with
    its leases; in the end no client and no slot in use remain.

    So that the survivor does not finish before the 20 rounds are done, it is
    stopped (SIGSTOP) except from a victim's attach to its first batch; each
    victim prints one line per batch (--verbose) and is killed on the first."""
    n, bs = 80000, 4                                  # 20000 batches of 512 bytes
    path = os.path.join(workdir, "k.bin")
    tok = random_tokens(path, n * L + 1, "uint16", seed=20)
    ld.create(token_spec("k", path, L, "uint16", batch_size=bs, prefetch=4))

    survivor = stopped_survivor(ld, "k")

    dead = set()
    for i in range(20):
        v = ld.popen_consume("k", "--verbose", dump=False)
        ld.wait_for(lambda s: attached(s, v.pid, "k"), f"victim {i} attached", timeout=20)
        survivor.signal(signal.SIGCONT)
        first_batch_line(v, f"victim {i}")
        v.signal(signal.SIGKILL)
        survivor.signal(signal.SIGSTOP)
        v.proc.wait(timeout=10)
        assert v.proc.returncode == -signal.SIGKILL, f"victim {i} ended before it was killed"
        dead.add(v.pid)
        st = ld.wait_for(lambda s: client_of(s, v.pid) is None,
                         f"killed victim {i} (pid {v.pid}) gone from status", timeout=10)
        live = {c["pid"] for c in st["clients"]}
        assert not (live & dead), f"dead clients still listed: {live & dead}"
        p = pipe_of(st, "k")
        assert p["clients"] == 1, f"round {i}: pipeline counts {p['clients']} clients, 1 is alive"
        me = client_of(st, survivor.pid)
        assert me is not None and me["pipeline"] == "k"
        assert 0 <= p["slots_in_use"] <= p["slots_total"]
        assert survivor.proc.poll() is None, (
            f"survivor ended (exit {survivor.proc.returncode}) before round {i}: pipeline too small")

    survivor.signal(signal.SIGCONT)
    res = survivor.wait(timeout=240, check=True)
    expected = token_dump(tok, L, sequential_batches(n, bs))
    assert res.json["batches"] == 20000 and res.json["eof"] is True
    assert res.dump == expected, "the survivor's stream is not the exact pipeline stream"

    st = ld.wait_for(lambda s: s["clients"] == [] and pipe_of(s, "k")["slots_in_use"] == 0,
                     "no client and no slot in use after everybody left")
    p = pipe_of(st, "k")
    assert p["state"] == "done" and p["error"] is None
    assert p["clients"] == 0
    # the daemon still serves a new pipeline correctly
    ld.create(token_spec("after", path, L, "uint16", batch_size=bs))
    assert ld.consume("after", "--batches", 50).dump == expected[:50 * 2 * bs * L * 8]


def test_sigkill_stopped_consumers_holding_leases(ld, workdir):
    """Consumers stopped while attached and holding leases, so that the
    broadcast pipeline stalls waiting for them, then killed: 20 rounds. Each
    victim holds every slot, so the next round can only deliver anything if
    the dead one's leases were released; the survivor ends exact."""
    n, bs = 80000, 4                                  # 20000 batches
    path = os.path.join(workdir, "h.bin")
    tok = random_tokens(path, n * L + 1, "uint16", seed=22)
    ld.create(token_spec("h", path, L, "uint16", batch_size=bs, prefetch=4))
    survivor = stopped_survivor(ld, "h")

    for i in range(20):
        v = ld.popen_consume("h", "--verbose", dump=False)
        ld.wait_for(lambda s: attached(s, v.pid, "h"), f"victim {i} attached", timeout=20)
        survivor.signal(signal.SIGCONT)
        first_batch_line(v, f"victim {i}")
        v.signal(signal.SIGSTOP)
        # the survivor catches up with the stopped victim, then the pipeline
        # stalls: status names the victim as what holds it back (slow.c)
        st = ld.wait_for(lambda s: (pipe_of(s, "h")["held_back_by"] or {}).get("pid") == v.pid,
                         f"round {i}: the stopped victim holding the pipeline back", timeout=20)
        held = client_of(st, v.pid)["leases"]
        assert held >= 1, f"round {i}: the stopped victim holds no lease"
        assert pipe_of(st, "h")["slots_in_use"] >= held
        assert survivor.proc.poll() is None, f"survivor ended early in round {i}"
        survivor.signal(signal.SIGSTOP)
        v.signal(signal.SIGKILL)
        v.proc.wait(timeout=10)
        st = ld.wait_for(lambda s: client_of(s, v.pid) is None,
                         f"killed victim {i} gone from status", timeout=10)
        p = pipe_of(st, "h")
        assert p["clients"] == 1 and p["slots_in_use"] <= p["slots_total"]
    survivor.signal(signal.SIGCONT)
    res = survivor.wait(timeout=240, check=True)
    assert res.json["batches"] == 20000 and res.json["eof"] is True
    assert res.dump == token_dump(tok, L, sequential_batches(n, bs))
    ld.wait_for(lambda s: s["clients"] == [] and pipe_of(s, "h")["slots_in_use"] == 0,
                "no client and no slot in use after everybody left")


def test_sigkill_running_consumer_frees_leases(ld, workdir):
    """A consumer killed while streaming at full speed (not stopped) on an
    endless pipeline: its client entry and leases disappear, and a second
    consumer that was held back by it goes on to its last batch."""
    n, bs = 400, 8
    path = os.path.join(workdir, "e.bin")
    tok = random_tokens(path, n * L + 1, "uint16", seed=21)
    ld.create(token_spec("e", path, L, "uint16", batch_size=bs, epochs=0, prefetch=3, min_clients=2))
    for round_ in range(3):
        victim = ld.popen_consume("e", dump=False)
        other = ld.popen_consume("e", "--batches", 300, "--timeout", 60000)
        ld.wait_for(lambda s: (client_of(s, victim.pid) or {}).get("delivered", 0) >= 5,
                    "victim streaming", timeout=20)
        victim.signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        res = other.wait(timeout=120, check=True)
        assert res.json["batches"] == 300
        # a later broadcast consumer joins at the oldest batch still held, so
        # its stream is a contiguous run of the sequential stream
        per_epoch = sequential_batches(n, bs)
        one_epoch = token_dump(tok, L, per_epoch)
        batch_bytes = 2 * bs * L * 8
        first = res.json["first_batch"]
        stream = (one_epoch * 8)[first * batch_bytes:]
        assert res.dump == stream[:300 * batch_bytes], f"round {round_}: not a contiguous stream"
        # no client left: the slots in use are only the batches the endless
        # pipeline prefetched (at most `prefetch` = 3), none held by the dead
        st = ld.wait_for(lambda s: s["clients"] == [] and pipe_of(s, "e")["clients"] == 0,
                         f"round {round_}: all clients gone")
        assert pipe_of(st, "e")["slots_in_use"] <= 3


def test_token_file_truncated_while_running(ld, workdir):
    path = os.path.join(workdir, "shrinking.bin")
    Lt, bs = 64, 8
    ntok = 4 * 1024 * 1024                            # 8 MiB of uint16, 8191 batches
    tok = random_tokens(path, ntok, "uint16", seed=30)
    # A stopped "brake" consumer holds the broadcast pipeline (min_clients 2)
    # near its start while the file is truncated; then it is killed and the
    # consumer runs on into the missing part.
    ld.create(token_spec("shrink", path, Lt, "uint16", batch_size=bs, prefetch=2, min_clients=2))
    brake = ld.popen_consume("shrink", dump=False)
    ld.wait_for(lambda s: attached(s, brake.pid, "shrink"), "brake attached")
    brake.signal(signal.SIGSTOP)
    c = ld.popen_consume("shrink", "--timeout", 60000)
    ld.wait_for(lambda s: (client_of(s, c.pid) or {}).get("delivered", 0) >= 1,
                "consumer partway", timeout=20)
    os.truncate(path, 1024 * 1024)                    # keep the first 1 MiB: ~1000 batches
    brake.signal(signal.SIGKILL)
    res = c.wait(timeout=120)
    assert res.rc != 0, "consumer of a truncated file exited 0:\n" + res.describe()
    assert "truncated" in res.stderr, "consumer's error does not say 'truncated':\n" + res.describe()
    assert "shrinking.bin" in res.stderr, "consumer's error does not name the file:\n" + res.describe()

    st = ld.wait_for(lambda s: pipe_of(s, "shrink")["state"] == "failed", "pipeline failed")
    p = pipe_of(st, "shrink")
    assert p["error"] and "truncated" in p["error"] and "shrinking.bin" in p["error"], p["error"]

    # whatever it delivered before the error is the exact start of the stream
    if res.dump:
        full_batch = 2 * bs * Lt * 8
        k = len(res.dump) // full_batch
        assert k * full_batch == len(res.dump)
        assert k < 1030, f"delivered {k} batches, past the truncation point"
        assert res.dump == token_dump(tok, Lt, sequential_batches(ntok // Lt, bs)[:k])

    # a new consumer of the failed pipeline gets the error too, not a hang
    again = ld.consume("shrink", "--timeout", 20000, check=False, timeout=60)
    assert again.rc != 0 and "truncated" in again.stderr, again.describe()

    # and the daemon still serves other pipelines
    x = write_npy(os.path.join(workdir, "x.npy"), np.arange(600, dtype=np.int32).reshape(200, 3))
    ld.create(npy_spec("ok", [os.path.join(workdir, "x.npy")], batch_size=64))
    good = ld.consume("ok")
    assert good.dump == npy_dump([x], sequential_batches(200, 64))
    assert ld.status()["pid"] == ld.pid


# --------------------------------------------------------- the wire itself

def serving(ld):
    st = ld.status()
    assert st["pid"] == ld.pid
    return st


def expect_error_or_close(raw, what):
    """The daemon answered with an Error reply or closed the pipe."""
    try:
        body = raw.recv_reply()
    except (ConnectionError, OSError, AssertionError):
        return "closed"
    num, _, _ = pb_top_field(body)
    assert num == REP_ERROR, f"{what}: reply is field {num}, expected an Error (1) or a closed pipe"
    return "error"


def test_raw_protocol_sanity(ld):
    """The hand-written nng REQ peer used below works: hello then status."""
    raw = RawReq(ld.socket)
    try:
        assert raw.peer_proto == 0x31, "the daemon's socket is not an nng REP socket"
        assert raw.hello() == REP_HELLO
        assert raw.status()["pid"] == ld.pid
    finally:
        raw.close()


def test_wrong_protocol_version_is_refused(ld):
    raw = RawReq(ld.socket)
    try:
        body = raw.call(pb_field(1, b"\x08\xe7\x07"))          # Hello{protocol: 999}
        num, _, payload = pb_top_field(body)
        assert num == REP_ERROR, f"hello with protocol 999 answered with field {num}"
    except ConnectionError:
        pass
    finally:
        raw.close()
    serving(ld)


@pytest.mark.parametrize("body", [
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",           # invalid varint tag
    b"\x0a\x7f\x08\x01",                                   # length runs past the end
    b"\x4a\x05\x0a\x03abc\x0a\xff\xff\xff\xff\x0f",      # nested garbage
    b"\x07",                                               # wire type 7
    b"",                                                   # empty request
    pb_field(6, b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"),  # Next for an unknown attachment
    pb_field(5, pb_field(1, b"nope") + b"\x10\x07"),       # Attach, unknown pipeline, bad mode
], ids=["badtag", "overrun", "nested", "wiretype7", "empty", "next-unknown", "attach-bad"])
def test_malformed_protobuf(ld, body):
    raw = RawReq(ld.socket)
    try:
        assert raw.hello() == REP_HELLO
        raw.send_request(body)
        outcome = expect_error_or_close(raw, repr(body))
        if outcome == "error":
            # the connection still works after an error reply
            assert raw.status()["pid"] == ld.pid
    finally:
        raw.close()
    serving(ld)


def test_malformed_requests_are_rate_limited(ld):
    """A client that sends malformed requests at will gets its first 5
    logged one by one, then counts: one summary line an interval and one
    when it goes (log.h LOG_LIMIT_*), not a line per request (issue 13:
    83 000 lines for 100 000 messages)."""
    sent = 300
    raw = RawReq(ld.socket)
    try:
        assert raw.hello() == REP_HELLO
        for _ in range(sent):
            raw.send_request(b"\xff" * 10)                  # invalid varint tag
            num, _, _ = pb_top_field(raw.recv_reply())
            assert num == REP_ERROR
        pid = os.getpid()
    finally:
        raw.close()
    summary = re.compile(r"client \d+ \(pid %d\): (\d+) more malformed requests in " % pid)
    log = wait_log(ld, re.compile(r"client\.disconnect client=\d+ pid=%d " % pid),
                   "the malformed client's disconnect")
    one_by_one = re.findall(r"client \d+ \(pid %d\): malformed request\b(?! *s)" % pid, log)
    counted = [int(n) for n in summary.findall(log)]
    assert len(one_by_one) == 5, log[-3000:]
    assert sum(counted) == sent - 5, log[-3000:]
    assert 1 <= len(counted) <= 2, log[-3000:]   # at most one an interval, and one at the end
    serving(ld)


def test_malformed_before_hello(ld):
    raw = RawReq(ld.socket)
    try:
        raw.send_request(b"\x4a\x00")                      # Status before Hello
        try:
            body = raw.recv_reply()
            num, _, _ = pb_top_field(body)
            assert num in (REP_ERROR, 5), f"field {num}"
        except (ConnectionError, OSError):
            pass
    finally:
        raw.close()
    serving(ld)


def test_oversized_message(ld):
    raw = RawReq(ld.socket)
    try:
        assert raw.hello() == REP_HELLO
        big = struct.pack(">I", 0x80000077) + pb_field(2, pb_field(1, b"x" * (8 << 20)))
        try:
            raw.send_frame(big)
        except (BrokenPipeError, ConnectionResetError):
            pass
        expect_error_or_close(raw, "8 MiB request")
    finally:
        raw.close()
    raw = RawReq(ld.socket)
    try:
        # a header announcing 2^40 bytes, then a little data
        try:
            raw.send_frame(b"\x80\x00\x00\x01" + b"\0" * 4096, declared_len=1 << 40)
        except (BrokenPipeError, ConnectionResetError):
            pass
        expect_error_or_close(raw, "2^40-byte header")
    finally:
        raw.close()
    serving(ld)


def test_truncated_frame_then_close(ld):
    """Peers that said Hello, then hang up in the middle of a frame: the
    daemon ends each one's session (its client.disconnect line) and
    serves on."""
    for _ in range(5):
        raw = RawReq(ld.socket)
        assert raw.hello() == REP_HELLO
        raw.send_frame(b"\x80\x00\x00\x09\x4a", declared_len=1000)   # 5 of 1000 bytes
        raw.close()
    wait_log(ld, re.compile(r"client\.disconnect client=\d+ pid=%d uid=\d+ name=rawtest " % os.getpid()),
             "the 5 cut sessions ended", count=5)
    st = serving(ld)
    assert [c for c in st["clients"] if c.get("name") == "rawtest"] == []


def nng_wedges_on_a_cut_handshake():
    """nng before 1.6 (issue #1518) stops accepting on an ipc listener after
    a peer hangs up in the middle of the SP handshake; the daemon's watchdog
    replaces that listener (daemon/server/nngfix.c). The nng the daemon runs on
    is in its --version."""
    out = subprocess.run([LOADERD, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"^nng (\d+)\.(\d+)", out, re.M)
    assert m, f"loaderd --version names no nng: {out!r}"
    return (int(m[1]), int(m[2])) < (1, 6)


def test_connection_closed_mid_handshake(ld):
    """Peers that send half of the SP header and hang up. Where nng wedges
    on them, the watchdog replaces the listener and says so: peers come, 3
    at a time, until it does (one may not wedge it). The daemon then serves,
    a new connection included."""
    healed = (f"listener on {ld.socket} stopped accepting (a peer hung up during the handshake); "
              "replaced it")
    wedges = nng_wedges_on_a_cut_handshake()
    deadline = time.monotonic() + 60
    while True:
        for _ in range(3):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(ld.socket)
            s.sendall(b"\x00SP")
            s.close()
        if not wedges:
            break
        try:
            wait_log(ld, healed, "the watchdog replacing the wedged listener", timeout=5)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
    serving(ld)
    raw = RawReq(ld.socket)
    try:
        assert raw.hello() == REP_HELLO
    finally:
        raw.close()


def test_garbage_instead_of_handshake(ld):
    """A peer that speaks something else entirely (HTTP): the daemon's side
    of the handshake (its SP header) comes, then the daemon closes the
    connection; it serves on."""
    for _ in range(3):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(ld.socket)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        got, closed = b"", False
        while not closed:
            try:
                chunk = s.recv(100)
            except ConnectionResetError:
                chunk = b""
            got += chunk
            closed = not chunk
        s.close()
        assert got == b"\x00SP\x00\x00\x31\x00\x00", f"the daemon sent {got!r}, then closed"
    serving(ld)


def test_idle_connection_does_not_block_others(ld):
    """A peer that connects and says nothing, kept open: others are served."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(ld.socket)
    try:
        serving(ld)
        raw = RawReq(ld.socket)
        assert raw.hello() == REP_HELLO
        raw.close()
    finally:
        s.close()


def test_fd_channel_garbage(ld, workdir):
    assert os.path.exists(ld.fds_socket)
    for payload in (b"", b"\0" * 16, os.urandom(64), b"x" * 70000):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(ld.fds_socket)
        try:
            if payload:
                s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            data, anc, flags, _ = s.recvmsg(4096, socket.CMSG_SPACE(64 * 4))
            assert not anc, f"the fd channel sent fds for a bogus token {payload[:16]!r}"
        except (ConnectionError, socket.timeout, OSError) as e:
            if isinstance(e, socket.timeout):
                raise AssertionError("fd channel neither answered nor closed a bogus request in 10 s")
        finally:
            s.close()
    # the real thing still works
    path = os.path.join(workdir, "f.bin")
    tok = random_tokens(path, 40 * L + 1, "uint16")
    ld.create(token_spec("f", path, L, "uint16", batch_size=8))
    assert ld.consume("f").dump == token_dump(tok, L, sequential_batches(40, 8))
