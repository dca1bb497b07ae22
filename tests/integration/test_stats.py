# SPDX-License-Identifier: MIT
"""Stall accounting (docs/operations.md): libloader times each next() and the
trainer's compute between calls and reports both with the lease returns; the
daemon's status shows per client how long it waited (wait fraction,
percentiles, histogram), its rates and lag, and per pipeline the workers'
time by stage and what limits it.

Real trainers: Python clients of the loaderd package that sleep between
batches (a slow trainer) and one fed by an image pipeline with a single
worker (a data-starved one). Their figures are compared with each other, not
with clock times: only sleeps give lower bounds."""

import os
import signal
import subprocess
import textwrap

from ldrtest import (RawReq, REP_HELLO, pb_field, pb_read_varint, pb_top_field, pb_varint, python_client_env,
                     random_tokens, token_spec)

SEQ = 16
BATCH = 8
BUCKETS = 23


def trainer(d, pipeline, batches, sleep, hold=True, mode=None):
    """A Python trainer: reads @batches batches sleeping @sleep s after each,
    prints "done", then (hold) stays attached until its stdin closes."""
    code = textwrap.dedent(f"""
        import sys, time, loaderd
        loader = loaderd.DataLoader({pipeline!r}, socket={d.socket!r}, name="trainer", mode={mode!r})
        n = 0
        while n < {batches}:
            for b in loader:
                time.sleep({sleep})
                del b
                n += 1
                if n == {batches}:
                    break
        print("done", flush=True)
        if {hold}:
            sys.stdin.read()
    """)
    return subprocess.Popen(["/usr/bin/python3", "-c", code],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=python_client_env())


def att_of(st, pid):
    for c in st["clients"]:
        if c["pid"] == pid and c["attachments"]:
            return c["attachments"][0]
    return None


def pipeline_of(st, name):
    return next(p for p in st["pipelines"] if p["name"] == name)


def finish(p):
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return out


def test_a_trainers_waits_and_compute_are_counted(ld, workdir):
    """20 batches, 30 ms of "compute" after each: 20 calls in the histogram,
    at least 19 x 30 ms of compute, totals that agree with the batches."""
    tok = os.path.join(workdir, "tok.bin")
    random_tokens(tok, 400 * SEQ + 1)
    ld.create(token_spec("tok", tok, SEQ, "uint16", batch_size=BATCH, epochs=0))
    p = trainer(ld, "tok", 20, 0.03)
    try:
        assert p.stdout.readline().strip() == "done"
        st = ld.wait_for(lambda s: (att_of(s, p.pid) or {}).get("stats", {})
                         .get("next_calls_total") == 20, "the 20th call reported", timeout=20)
        s = att_of(st, p.pid)["stats"]
        h = s["wait_histogram"]
        assert len(h["le"]) == BUCKETS - 1 and len(h["counts"]) == BUCKETS
        assert h["le"][:3] == [1e-06, 2e-06, 5e-06] and h["le"][-1] == 10.0
        assert h["le"] == sorted(h["le"])
        assert sum(h["counts"]) == h["count"] == 20
        assert h["sum_s"] == s["wait_seconds_total"] > 0
        assert s["compute_seconds_total"] >= 19 * 0.03
        a = att_of(st, p.pid)
        assert s["batches_total"] == a["delivered"] >= 20
        assert s["samples_total"] == s["batches_total"] * BATCH
        # tokens: input and target, SEQ int64 each (docs/spec.md)
        assert s["bytes_total"] == s["samples_total"] * 2 * SEQ * 8
        assert s["bad_reports"] == 0
        pl = pipeline_of(st, "tok")["stats"]
        assert pl["samples_total"] == pl["batches_total"] * BATCH >= s["samples_total"]
        assert pl["errors_total"] == 0 and pl["skipped_total"] == 0
        # token windows are copied, nothing else: all of the time is read time
        assert pl["stage_seconds_total"]["read"] == pl["worker_seconds_total"] > 0
        assert pl["stage_seconds_total"]["decode"] == 0
        assert (pl["slots_ready"] + pl["slots_leased"] + pl["slots_free"] + pl["jobs"]
                == pipeline_of(st, "tok")["slots_total"])
    finally:
        finish(p)


def image_folder(root, n=48, size=(480, 640)):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(3)
    for c in range(2):
        os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
        for i in range(n // 2):
            px = rng.integers(0, 255, (*size, 3), dtype=np.uint8)
            Image.fromarray(px).save(os.path.join(root, f"c{c}", f"{i}.jpg"), quality=90)


def test_a_slow_trainer_and_a_starved_one_are_told_apart(daemon, workdir):
    """One worker: the trainer of an image pipeline waits for every batch
    (limited by workers, decode time counted); a trainer that sleeps 200 ms a
    batch on a token pipeline has its batches ready (limited by consumers)."""
    d = daemon(workers=1)
    tok = os.path.join(workdir, "tok.bin")
    random_tokens(tok, 400 * SEQ + 1)
    d.create(token_spec("fast", tok, SEQ, "uint16", batch_size=BATCH, epochs=0))
    root = os.path.join(workdir, "img")
    image_folder(root)
    d.create({"name": "heavy", "source": {"kind": "image_folder", "path": root},
              "transforms": [{"op": "random_resized_crop", "size": 224},
                             {"op": "horizontal_flip", "p": 0.5},
                             {"op": "normalize", "mean": [0.485, 0.456, 0.406],
                              "std": [0.229, 0.224, 0.225]}],
              "batch_size": 16, "epochs": 0})
    slow = trainer(d, "fast", 10**6, 0.2)
    starved = trainer(d, "heavy", 10**6, 0.0)

    def told_apart(s):
        # start-up waits (the first token batches queue behind image jobs on
        # the one worker, 0.4-0.9 s on a loaded machine) leave the window
        # after a few seconds: until then the slow trainer waits too
        a, b = att_of(s, slow.pid), att_of(s, starved.pid)
        fast = pipeline_of(s, "fast")["stats"]
        return (a and b and a["stats"]["next_calls_total"] >= 12
                and b["stats"]["next_calls_total"] >= 12
                and fast["limited_by"] == "consumers"
                and "the data is ready before they ask" in fast["limited_why"]
                and pipeline_of(s, "heavy")["stats"]["limited_by"] == "workers")
    try:
        st = d.wait_for(told_apart, "both trainers reported, their pipelines told apart",
                        timeout=60)
        a, b = att_of(st, slow.pid)["stats"], att_of(st, starved.pid)["stats"]
        assert a["wait_fraction"] < b["wait_fraction"], (a, b)
        assert a["wait_p50_s"] < b["wait_p50_s"], (a, b)
        assert b["starving"] or b["lag_batches"] == 0
        heavy, fast = pipeline_of(st, "heavy")["stats"], pipeline_of(st, "fast")["stats"]
        assert "workers are" in heavy["limited_why"] and "% busy" in heavy["limited_why"]
        assert "the data is ready before they ask" in fast["limited_why"]
        assert heavy["workers"] == 1 and heavy["workers_busy"] > fast["workers_busy"]
        for stage in ("read", "decode", "transform"):
            assert heavy["stage_seconds_total"][stage] > 0, heavy
        assert heavy["sample_seconds"]["decode"] > heavy["sample_seconds"]["read"], heavy
        assert heavy["stage_seconds_total"]["collate"] == 0
    finally:
        for p in (slow, starved):
            p.kill()
            p.communicate(timeout=30)


def trainer_stats(wait_ns, compute_ns, calls, buckets):
    body = (b"\x08" + pb_varint(wait_ns) + b"\x10" + pb_varint(compute_ns)
            + b"\x18" + pb_varint(calls))
    return body + pb_field(4, b"".join(pb_varint(n) for n in buckets))


def release_with(raw, att_id, stats):
    """Release{attach_id, stats}: answered Ok (field 4)."""
    num, _, _ = pb_top_field(raw.call(pb_field(7, b"\x08" + pb_varint(att_id) + pb_field(3, stats))))
    return num


def test_reports_that_do_not_add_up_are_ignored_and_counted(ld, workdir):
    """A client's report replaces its figures only when it is whole and
    grows; others are counted in bad_reports, and the daemon serves on."""
    tok = os.path.join(workdir, "tok.bin")
    random_tokens(tok, 400 * SEQ + 1)
    ld.create(token_spec("tok", tok, SEQ, "uint16", batch_size=BATCH, epochs=0))
    raw = RawReq(ld.socket)
    try:
        assert raw.hello() == REP_HELLO
        num, _, reply = pb_top_field(raw.call(pb_field(5, pb_field(1, b"tok"))))
        assert num == 6, "attach answered with field %d" % num
        assert reply[0] == 0x08                      # AttachReply.attach_id
        att_id, _ = pb_read_varint(reply, 1)

        def stats():
            return [a for c in ld.status()["clients"] for a in c["attachments"]
                    if a["id"] == att_id][0]["stats"]

        good = [0] * BUCKETS
        good[3], good[10] = 4, 1
        assert release_with(raw, att_id, trainer_stats(3_000_000, 7_000_000, 5, good)) == 4
        s = stats()
        assert (s["wait_seconds_total"], s["compute_seconds_total"], s["next_calls_total"]) \
            == (0.003, 0.007, 5)
        assert s["wait_histogram"]["counts"] == good and s["bad_reports"] == 0
        bad = [
            trainer_stats(4_000_000, 8_000_000, 6, good),            # buckets sum to 5, not 6
            trainer_stats(1_000_000, 8_000_000, 5, good),            # wait went backwards
            trainer_stats(4_000_000, 8_000_000, 5, good[:-1]),       # 22 buckets
            # buckets that add up to 10 only by wrapping around 2**64
            trainer_stats(4_000_000, 8_000_000, 10, [2**64 - 1, 6] + good[2:]),
            # more waiting than the time since the attach (seconds)
            trainer_stats(20_003_000_000, 7_000_000, 6, good[:22] + [1]),
            # whole and growing, but a count JSON and Prometheus cannot show
            trainer_stats(4_000_000, 8_000_000, 2**63 + 5, [2**63] + good[1:]),
        ]
        for i, b in enumerate(bad, 1):
            assert release_with(raw, att_id, b) == 4
            s = stats()
            assert s["bad_reports"] == i and s["next_calls_total"] == 5, s
        # whole, growing, plausible: counted
        more = list(good)
        more[12] = 1
        assert release_with(raw, att_id, trainer_stats(11_000_000, 7_000_000, 6, more)) == 4
        s = stats()
        assert s["next_calls_total"] == 6 and s["wait_seconds_total"] == 0.011
        assert s["wait_histogram"]["counts"][12] == 1 and s["bad_reports"] == len(bad)
    finally:
        raw.close()


def test_a_wait_that_lasts_is_reported_while_it_lasts(ld, workdir):
    """A trainer whose next() waits for seconds (a broadcast stream that
    waits for a second client) shows its wait as it grows, with no wait
    ended yet: the Python package's polls that time out and the C library's
    untimed wait alike. Before, a starved trainer showed no figure at all."""
    tok = os.path.join(workdir, "tok.bin")
    random_tokens(tok, 400 * SEQ + 1)
    ld.create(token_spec("two", tok, SEQ, "uint16", batch_size=BATCH, epochs=0, min_clients=3))
    py = trainer(ld, "two", 1, 0.0, mode="broadcast")
    c = ld.popen_consume("two", "--mode", "broadcast", dump=False)

    def waited(s):
        got = [att_of(s, p.pid) for p in (py, c)]
        return all(a and a["stats"]["wait_seconds_total"] >= 1.5 for a in got)
    try:
        st = ld.wait_for(waited, "both waits reported while they last", timeout=30)
        for p in (py, c):
            s = att_of(st, p.pid)["stats"]
            assert s["next_calls_total"] == 0 and s["batches_total"] == 0, s
            assert s["wait_fraction"] is not None and s["wait_fraction"] > 0.9, s
            assert s["starving"] is True and s["bad_reports"] == 0, s
    finally:
        py.kill()
        py.communicate(timeout=30)
        c.signal(signal.SIGKILL)
        c.wait(timeout=30)


# A ringed trainer (docs/protocol.md, "The batch ring"): takes 3 batches, then
# scribbles on the figures in its own ring's header as the command on stdin
# says, and answers "ok" when done. "next": one more batch, the library's own.
RINGED = r"""
import mmap, os, struct, sys
import loaderd
dl = loaderd.DataLoader(sys.argv[2], socket=sys.argv[1], timeout=20, as_numpy=True)
it = iter(dl)
for _ in range(3):
    next(it).release()
fd = [int(f) for f in os.listdir("/proc/self/fd")
      if os.path.exists("/proc/self/fd/" + f)
      and os.readlink("/proc/self/fd/" + f).startswith("/memfd:loaderd-ring")][0]
m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
FLAGS, SEQ, CALLS, BUCKETS = 24, 576, 600, 608
print(struct.unpack_from("<I", m, FLAGS)[0], struct.unpack_from("<Q", m, SEQ)[0] % 2,
      struct.unpack_from("<Q", m, CALLS)[0], flush=True)
for line in sys.stdin:
    cmd = line.split()
    seq = struct.unpack_from("<Q", m, SEQ)[0]
    if cmd[0] == "garbage":      # whole, but 1000 calls in buckets that hold 3
        struct.pack_into("<Q", m, SEQ, seq + 1)
        struct.pack_into("<Q", m, CALLS, 1000)
        struct.pack_into("<Q", m, SEQ, seq + 2)
    elif cmd[0] == "odd":        # a write that never ends
        struct.pack_into("<Q", m, SEQ, seq + 1)
        struct.pack_into("<QQQ", m, SEQ + 8, 1, 1, 1)
    elif cmd[0] == "next":
        next(it).release()
    print("ok", flush=True)
"""


def test_a_ringed_trainer_reports_in_its_ring(ld, workdir):
    """A trainer delivered through its batch ring sends no report: its figures
    are in the ring, and status shows them exact at once, with no flush to
    wait for. What the client writes there is checked as a socket report is:
    garbage is counted in bad_reports and changes nothing, a write left half
    done (an odd count) is not read, and the library's next write counts
    again; the stream goes on meanwhile."""
    tok = os.path.join(workdir, "tok.bin")
    random_tokens(tok, 400 * SEQ + 1)
    ld.create(token_spec("tok", tok, SEQ, "uint16", batch_size=BATCH, epochs=0))
    p = subprocess.Popen(["/usr/bin/python3", "-c", RINGED, ld.socket, "tok"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=python_client_env())

    def say(cmd):
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "ok", p.stderr.read()

    def figures():
        a = att_of(ld.status(), p.pid)
        assert a["ring"] is True, a
        return a["stats"]

    try:
        # the daemon reads the figures: the ring says so, the library wrote
        # a whole report of the 3 calls
        assert p.stdout.readline().split() == ["1", "0", "3"], p.stderr.read()
        s = figures()
        assert (s["next_calls_total"], sum(s["wait_histogram"]["counts"]), s["bad_reports"]) == (3, 3, 0)
        assert s["batches_total"] >= 3
        say("garbage")
        s = figures()
        assert (s["next_calls_total"], s["bad_reports"]) == (3, 1), s
        say("odd")
        s = figures()
        assert (s["next_calls_total"], s["bad_reports"]) == (3, 1), s
        say("next")
        s = figures()
        assert (s["next_calls_total"], sum(s["wait_histogram"]["counts"]), s["bad_reports"]) == (4, 4, 1), s
        assert s["batches_total"] >= 4 and ld.alive()
    finally:
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
