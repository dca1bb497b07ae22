# SPDX-License-Identifier: MIT
"""Prefetch and window left to the daemon (docs/spec.md, "prefetch";
docs/protocol.md, "Batches and order"): a spec without "prefetch" gets 64 MiB
of slots, 8..64 of them, beyond 8 at most a quarter of the free memory; a
client that asks for no window gets 8 MiB of batches, 4..16 requests, beyond
4 at most a quarter of the slots. What a spec or a client names stays exactly
that, and the sizes never change a batch."""

import os

import pytest

from ldrtest import random_tokens, sequential_batches, token_dump, token_spec

KIB, MIB = 1 << 10, 1 << 20


def slot_bytes(seq_len, batch):
    """A token pipeline's slot: input and target, int64, each field on 256
    bytes, the slot on 4 KiB (registry.c)."""
    field = -(-batch * seq_len * 8 // 256) * 256
    return -(-2 * field // 4096) * 4096


def tokens(workdir, name="t.bin", ntokens=2 * 1024 + 1):
    path = os.path.join(workdir, name)
    random_tokens(path, ntokens, "uint16")
    return path


def check_auto(p, slots, sbytes):
    assert (p["slot_bytes"], p["slots_total"], p["prefetch"], p["prefetch_auto"]) == \
        (sbytes, slots, slots, True), p
    assert p["spec"]["prefetch"] == "auto", p["spec"]


@pytest.mark.parametrize("batch,slots", [
    (32, 64),      # 512 KiB slots: 128 by the bytes, the most is 64
    (192, 21),     # 3 MiB: 21
    (256, 16),     # 4 MiB: 16
    (512, 8),      # 8 MiB: 8
    (1024, 8),     # 16 MiB: 4 by the bytes, the least is 8
])
def test_auto_prefetch_by_batch_bytes(ld, workdir, batch, slots):
    tok = tokens(workdir)
    ld.create(token_spec("a", tok, 1024, "uint16", batch_size=batch))
    check_auto(ld.pipeline("a"), slots, slot_bytes(1024, batch))
    assert slot_bytes(1024, batch) == batch * 16 * KIB
    assert f"pipeline.create pipeline=a samples=2 slots={slots} slot_bytes={batch * 16 * KIB} " \
        "prefetch_auto=true " in ld.log()


def test_named_prefetch_is_kept(ld, workdir):
    tok = tokens(workdir)
    # fewer than the auto size would be, and more than its 64 and its quarter rule
    for name, prefetch, batch in (("three", 3, 4), ("many", 100, 32), ("two", 2, 1024)):
        ld.create(token_spec(name, tok, 1024, "uint16", batch_size=batch, prefetch=prefetch))
        p = ld.pipeline(name)
        assert (p["slots_total"], p["prefetch"], p["prefetch_auto"]) == (prefetch, prefetch, False)
        assert p["spec"]["prefetch"] == prefetch
    # "auto" said out loud is the default, and another spec than a named 64
    ld.create(token_spec("said", tok, 1024, "uint16", prefetch="auto"))
    check_auto(ld.pipeline("said"), 64, 512 * KIB)
    ld.create(token_spec("said", tok, 1024, "uint16"), exist_ok=True)
    r = ld.create(token_spec("said", tok, 1024, "uint16", prefetch=64), check=False, exist_ok=True)
    assert r.returncode == 1 and "prefetch" in r.stderr, r.stderr
    # a live set is within the auto-sized slab, as within a named one
    assert ld.ctl("set", "prefetch", "said", "5").stdout == "prefetch of said: 64 -> 5\n"
    p = ld.pipeline("said")
    assert (p["slots_total"], p["prefetch"], p["prefetch_auto"]) == (64, 5, True)
    r = ld.ctl("set", "prefetch", "said", "65", check=False)
    assert r.returncode == 1 and "has a slab of 64 slots" in r.stderr, r.stderr
    # loaderctl pipelines and status: the PREFETCH column, "(auto)" when sized by the daemon
    rows = {ln.split()[0]: ln.split() for ln in ld.ctl("pipelines").stdout.splitlines()[1:]}
    assert rows["said"][2:4] == ["0/64", "5(auto)"] and rows["three"][2:4] == ["0/3", "3"], rows
    lines = [ln.split()[:2] for ln in ld.ctl("status").stdout.splitlines()]
    assert ["said", "5(auto)"] in lines and ["many", "100"] in lines, lines


def test_memory_limit_caps_the_auto_size(daemon, workdir):
    """24 MiB: each auto size beyond 8 slots takes at most a quarter of what
    is free, 8 slots are taken whenever they fit, and a create they do not
    fit fails as one naming 8 would."""
    d = daemon(memory_limit=24 * MIB)
    tok = tokens(workdir)
    sb = 512 * KIB
    want = [("a", 12),     # 24 MiB free: 6 MiB, 12 slots (64 by the bytes)
            ("b", 9),      # 18 MiB free: 4.5 MiB, 9 slots
            ("c", 8),      # 13.5 MiB free: a quarter holds 6, the least is 8
            ("d", 8),      # 9.5 MiB free
            ("e", 8)]      # 5.5 MiB free
    used = 0
    for name, slots in want:
        assert d.status()["memory_used"] == used
        d.create(token_spec(name, tok, 1024, "uint16", batch_size=32, persist=True))
        check_auto(d.pipeline(name), slots, sb)
        used += slots * sb
    assert d.status()["memory_used"] == used == 45 * MIB // 2
    r = d.create(token_spec("f", tok, 1024, "uint16", batch_size=32, persist=True), check=False)
    assert r.returncode == 1
    assert ("memory limit: pipeline 'f' needs 4194304 bytes (8 slots of 524288), 1572864 of "
            "25165824 bytes are free (--memory-limit)") in r.stderr, r.stderr
    # a named prefetch that fits is not the auto rule's business
    d.create(token_spec("g", tok, 1024, "uint16", batch_size=32, prefetch=3))
    assert d.pipeline("g")["slots_total"] == 3


def attachment_of(st, pid):
    for c in st["clients"]:
        if c["pid"] == pid and c["attachments"]:
            return c["attachments"][0]
    return None


@pytest.mark.parametrize("batch,prefetch,inflight,window,auto", [
    (32, None, None, 16, True),      # 512 KiB in 64 slots: 8 MiB is 16 batches
    (1, None, None, 16, True),       # 16 KiB in 64 slots: 256 by the bytes, the most is 16
    (1, 8, None, 4, True),           # 8 slots named: a quarter is 2, the least is 4
    (1, 40, None, 10, True),         # 40 slots: a quarter is 10
    (256, None, None, 4, True),      # 4 MiB in 16 slots: 2 by the bytes, the least is 4
    (64, None, None, 8, True),       # 1 MiB in 64 slots: 8
    (32, None, 7, 7, False),         # asked for: that
    (1024, 8, 64, 64, False),
])
def test_window_by_batch_bytes(ld, workdir, batch, prefetch, inflight, window, auto):
    tok = tokens(workdir, ntokens=1024 * 64 + 1)
    extra = {} if prefetch is None else {"prefetch": prefetch}
    ld.create(token_spec("w", tok, 1024, "uint16", batch_size=batch, epochs=0, **extra))
    args = ("--delay", "50") + (() if inflight is None else ("--inflight", inflight))
    c = ld.popen_consume("w", *args, dump=False)
    try:
        st = ld.wait_for(lambda s: attachment_of(s, c.pid), "the consumer attached", timeout=30)
        a = attachment_of(st, c.pid)
        assert (a["inflight"], a["inflight_auto"]) == (window, auto), a
    finally:
        c.proc.kill()
        c.proc.wait()


def test_auto_sizes_change_no_batch(ld, workdir):
    """The same spec auto-sized (64 slots, a window of 16) and with 2 slots and
    a window of 1: every batch the same, in the same order, as numpy says."""
    L, bs = 16, 8
    path = os.path.join(workdir, "c.bin")
    tok = random_tokens(path, L * 1000 + 1, "uint16", seed=11)
    ld.create(token_spec("auto", path, L, "uint16", batch_size=bs, epochs=3))
    ld.create(token_spec("fixed", path, L, "uint16", batch_size=bs, epochs=3, prefetch=2))
    assert ld.pipeline("auto")["slots_total"] == 64
    a = ld.consume("auto")
    b = ld.consume("fixed", "--inflight", 1)
    assert a.json["batches"] == b.json["batches"] == 3 * 125
    assert a.dump == b.dump == token_dump(tok, L, sequential_batches(1000, bs, epochs=3))
    # shuffled, two partition ranks: each rank's stream the same under both sizes
    for name, extra in (("sa", {}), ("sf", {"prefetch": 2})):
        ld.create(token_spec(name, path, L, "uint16", batch_size=bs, shuffle=True, seed=5,
                             epochs=2, **extra))
    dumps = {}
    for name in ("sa", "sf"):
        for rank in (0, 1):
            res = ld.consume(name, "--mode", "partition", "--rank", rank, "--world-size", 2)
            dumps[name, rank] = res.dump
    assert dumps["sa", 0] == dumps["sf", 0] and dumps["sa", 1] == dumps["sf", 1]
    assert dumps["sa", 0] != dumps["sa", 1] and len(dumps["sa", 0]) > 0
