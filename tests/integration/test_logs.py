# SPDX-License-Identifier: MIT
"""The daemon's log (docs/operations.md, "Logs"): one line per event, the
event's name and key=value fields (logfmt: values with spaces quoted), and a
client's own events rate-limited, so that one that attaches in a loop cannot
flood the journal: LOG_RATE_EVENTS (20) lines a window, then a count."""

import os
import re
import subprocess
import textwrap

from ldrtest import (REP_HELLO, RawReq, pb_field, pb_top_field, python_client_env,
                     random_tokens, token_spec)

ATTACHES = 70


def test_events_are_key_value_lines(ld, workdir):
    tok = os.path.join(workdir, "tok.bin")
    random_tokens(tok, 64 * 8 + 1)
    ld.create(token_spec("tok", tok, 8, "uint16", batch_size=4, epochs=1))
    res = ld.popen_consume("tok", "--mode", "partition", "--rank", "0", "--world-size", "1")
    res = res.wait(timeout=60, check=True)
    log = ld.log()
    m = re.search(r"^loaderd: info: client\.attach client=(\d+) pid=(\d+) uid=%d pipeline=tok "
                  r"attachment=\d+ mode=partition rank=0 world_size=1 device=cpu$" % os.getuid(),
                  log, re.M)
    assert m, log
    cid, pid = m.group(1), m.group(2)
    # the consumer has exited, but the daemon logs its disconnect when it
    # handles the closed connection, which may be a moment later
    ld.wait_for(lambda s: re.search(r"client\.disconnect client=%s " % cid, ld.log()),
                "the consumer's disconnect line", timeout=20)
    log = ld.log()
    assert re.search(r"^loaderd: info: client\.disconnect client=%s pid=%s uid=%d name=loaderctl "
                     r"leases_released=\d+ connected_s=\d+$" % (cid, pid, os.getuid()), log, re.M), log
    assert re.search(r"^loaderd: info: pipeline\.create pipeline=tok samples=64 slots=64 "
                     r"slot_bytes=4096 prefetch_auto=true owner=%d by=client$" % os.getuid(),
                     log, re.M), log
    # every event line: a dotted name, then only key=value fields
    field = r'[a-z_]+=(?:"(?:[^"\\]|\\.)*"|[^\s"=]+)'
    for line in log.splitlines():
        body = line.split(": ", 2)[-1]
        if re.match(r"[a-z]+\.[a-z_]+ ", body):
            assert re.fullmatch(r"[a-z]+\.[a-z_]+(?: %s)+" % field, body), line


def test_a_client_that_attaches_in_a_loop_is_rate_limited(ld, workdir):
    """70 attaches and detaches on one connection: 20 attach lines, and the
    other 50 counted in one client.quiet line when the client goes. Its name,
    with a space and a quote, comes quoted."""
    tok = os.path.join(workdir, "tok.bin")
    random_tokens(tok, 64 * 8 + 1)
    ld.create(token_spec("tok", tok, 8, "uint16", batch_size=4, epochs=0))
    code = textwrap.dedent(f"""
        from loaderd import loader as L
        c = L._Client({ld.socket!r}, 'flood "x" client')
        for _ in range({ATTACHES}):
            a = L._Attachment(c, "tok", "broadcast", 0, 1, None, 4)
            a.detach()
        c.close()
    """)
    r = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                       env=python_client_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    gone = re.compile(r'client\.disconnect client=(\d+) pid=\d+ uid=\d+ name="flood \\"x\\" client"')
    ld.wait_for(lambda s: gone.search(ld.log()), "the client's disconnect", timeout=20)
    log = ld.log()
    m = gone.search(log)
    cid = m.group(1)
    attaches = re.findall(r"client\.attach client=%s " % cid, log)
    quiet = [int(n) for n in re.findall(r"client\.quiet client=%s pid=\d+ events=(\d+) " % cid, log)]
    # every attach written or counted, 20 lines a 10 s window at most: on a
    # loaded machine the 70 may span more than one window
    assert len(attaches) + sum(quiet) == ATTACHES, log[-3000:]
    assert 20 <= len(attaches) <= 20 * (1 + len(quiet)) and quiet, log[-3000:]


def test_a_client_name_that_is_not_printable_utf8_is_cleaned(ld):
    """A Hello name with an invalid byte and a C1 CSI (U+009B, which a
    terminal obeys) is stored cleaned: status still lists the client (an
    invalid byte made jansson drop it, hiding its leases from admins), and
    the log and status show '?' in their place; valid UTF-8 stays."""
    from ldrtest import REQ_HELLO
    raw = RawReq(ld.socket)
    try:
        name = "caf\u00e9 ".encode() + b"bad\xff\xc2\x9b[31mname"
        num, _, _ = pb_top_field(raw.call(pb_field(REQ_HELLO, b"\x08\x02" + pb_field(2, name))))
        assert num == REP_HELLO
        names = [c["name"] for c in ld.status()["clients"]]
        assert "caf\u00e9 bad??[31mname" in names, names
    finally:
        raw.close()
    gone = re.compile(r'client\.disconnect client=\d+ pid=\d+ uid=\d+ name="caf\u00e9 bad\?\?\[31mname"')
    ld.wait_for(lambda s: gone.search(ld.log()), "the client's disconnect", timeout=20)
