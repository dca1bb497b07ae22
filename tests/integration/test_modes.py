# SPDX-License-Identifier: MIT
"""Sharing modes: broadcast consumers receive identical streams; partition
ranks follow DistributedSampler (disjoint, covering, same batch count);
dynamic consumers together receive every batch exactly once."""

import collections
import os
import re
import signal

import numpy as np

from ldrtest import (batch_rows, crc, position_indices, position_tokens, random_tokens,
                     sequential_batches, split_batches, partition_share, token_dump, token_spec)

L = 16


def pos_file(workdir, nsamples, name="pos.bin"):
    path = os.path.join(workdir, name)
    position_tokens(path, nsamples * L + 1)
    return path


def test_two_broadcast_consumers_identical(ld, workdir):
    n, bs = 1000, 32
    path = pos_file(workdir, n)
    ld.create(token_spec("bc", path, L, "uint32", batch_size=bs, shuffle=True, seed=1,
                         epochs=3, prefetch=4, min_clients=2))
    a = ld.popen_consume("bc")
    b = ld.popen_consume("bc")
    ra, rb = a.wait(check=True), b.wait(check=True)
    assert ra.json["batches"] == rb.json["batches"] == 96
    assert ra.json["checksum"] == rb.json["checksum"]
    assert ra.dump == rb.dump, "two broadcast consumers got different streams"
    assert ra.json["mode"] == "broadcast"
    # and it is the whole stream: three permutations
    batches = position_indices(ra.dump, L, batch_rows(n, bs) * 3)
    per = len(batch_rows(n, bs))
    for e in range(3):
        order = [i for bt in batches[e * per:(e + 1) * per] for i in bt]
        assert sorted(order) == list(range(n))


def test_broadcast_min_clients_gates_delivery(ld, workdir):
    """With min_clients 2 a lone consumer waits; the second one releases both."""
    n, bs = 300, 10
    path = os.path.join(workdir, "t.bin")
    tok = random_tokens(path, n * L + 1, "uint16")
    ld.create(token_spec("gate", path, L, "uint16", batch_size=bs, min_clients=2, prefetch=2))
    a = ld.popen_consume("gate")
    st = ld.wait_for(lambda s: any(c["pid"] == a.pid and c["pipeline"] == "gate" for c in s["clients"]),
                     "first consumer attached")
    p = [x for x in st["pipelines"] if x["name"] == "gate"][0]
    assert p["clients"] == 1
    me = [c for c in st["clients"] if c["pid"] == a.pid][0]
    assert me["delivered"] == 0, "a broadcast pipeline delivered before min_clients attached"
    assert a.proc.poll() is None
    b = ld.popen_consume("gate")
    ra, rb = a.wait(check=True), b.wait(check=True)
    expected = token_dump(tok, L, sequential_batches(n, bs))
    assert ra.dump == expected and rb.dump == expected


def test_partition_ranks_disjoint_and_cover(ld, workdir):
    """n divisible by W: the ranks' samples of an epoch are disjoint and cover
    it, and each rank's share is exactly DistributedSampler's for the epoch
    order a broadcast consumer of the same seed sees."""
    n, bs, W = 1200, 32, 4
    path = pos_file(workdir, n)
    common = dict(batch_size=bs, shuffle=True, seed=21, epochs=2)
    ld.create(token_spec("part", path, L, "uint32", **common))
    ld.create(token_spec("ref", path, L, "uint32", **common))
    ref = ld.consume("ref")
    ref_batches = position_indices(ref.dump, L, batch_rows(n, bs) * 2)
    per = len(batch_rows(n, bs))
    orders = [[i for bt in ref_batches[e * per:(e + 1) * per] for i in bt] for e in range(2)]

    cons = [ld.popen_consume("part", "--mode", "partition", "--rank", r, "--world-size", W)
            for r in range(W)]
    results = [c.wait(check=True) for c in cons]
    share = n // W                                  # 300 = 9 full batches + one of 12
    rows = batch_rows(share, bs)
    counts = {r.json["batches"] for r in results}
    assert counts == {2 * len(rows)}, f"ranks got different batch counts: {counts}"
    for e in range(2):
        seen = []
        for r, res in enumerate(results):
            assert res.json["mode"] == "partition"
            batches = position_indices(res.dump, L, rows * 2)
            mine = [i for bt in batches[e * len(rows):(e + 1) * len(rows)] for i in bt]
            assert mine == partition_share(orders[e], r, W), \
                f"epoch {e} rank {r} is not DistributedSampler's share of the epoch order"
            seen += mine
        assert sorted(seen) == list(range(n)), f"epoch {e}: ranks overlap or miss samples"


def test_partition_padding_by_wraparound(ld, workdir):
    """n not divisible by W: every rank gets ceil(n/W) samples, the extra ones
    wrap around to the start of the epoch order (shuffle false: identity)."""
    n, bs, W = 103, 8, 4
    path = pos_file(workdir, n)
    ld.create(token_spec("pad", path, L, "uint32", batch_size=bs))
    cons = [ld.popen_consume("pad", "--mode", "partition", "--rank", r, "--world-size", W)
            for r in range(W)]
    results = [c.wait(check=True) for c in cons]
    share = 26                                     # ceil(103 / 4)
    rows = batch_rows(share, bs)                  # 8, 8, 8, 2
    allseen = []
    for r, res in enumerate(results):
        assert res.json["batches"] == len(rows) == 4
        assert res.json["samples"] == share
        got = position_indices(res.dump, L, rows)
        expected = split_batches(partition_share(list(range(n)), r, W), bs)
        assert got == expected, f"rank {r}"
        allseen += [i for b in got for i in b]
    assert set(allseen) == set(range(n))
    assert len(allseen) == 104 and collections.Counter(allseen)[0] == 2


def test_partition_drop_last_floor(ld, workdir):
    """drop_last: floor(n/W) samples per rank (103 / 4 -> 25 = 5 batches of 5)."""
    n, bs, W = 103, 5, 4
    path = pos_file(workdir, n)
    ld.create(token_spec("pdl", path, L, "uint32", batch_size=bs, drop_last=True, shuffle=True, seed=2))
    ld.create(token_spec("pref", path, L, "uint32", batch_size=bs, shuffle=True, seed=2))
    ref = ld.consume("pref", "--mode", "partition", "--rank", 0, "--world-size", 1)
    order = [i for b in position_indices(ref.dump, L, batch_rows(n, bs)) for i in b]
    seen = []
    for r in range(W):
        res = ld.consume("pdl", "--mode", "partition", "--rank", r, "--world-size", W)
        got = position_indices(res.dump, L, [bs] * 5)
        mine = [i for b in got for i in b]
        assert mine == partition_share(order, r, W, drop_last=True), f"rank {r}"
        seen += mine
    assert len(set(seen)) == len(seen) == 100


def test_dynamic_every_batch_exactly_once(ld, workdir):
    """Two dynamic consumers of one job on a shuffled, multi-epoch pipeline:
    together they receive every batch of the stream exactly once."""
    n, bs, epochs = 512, 4, 4                     # 128 full batches per epoch, 512 in all
    path = pos_file(workdir, n)
    common = dict(batch_size=bs, shuffle=True, seed=13, epochs=epochs, prefetch=4)
    ld.create(token_spec("dyn", path, L, "uint32", **common))
    ld.create(token_spec("dref", path, L, "uint32", **common))
    ref = ld.consume("dref")
    ref_batches = position_indices(ref.dump, L, [bs] * (128 * epochs))
    # within one epoch batches are disjoint; across epochs a batch is told
    # apart by its epoch, so key every batch by (sample tuple)
    expected = collections.Counter(tuple(b) for b in ref_batches)
    assert sum(expected.values()) == 512

    # one job: were they two (two processes are, docs/spec.md "Jobs"), a
    # consumer that reads the whole stream before the other attaches would
    # leave it ended, and the other would start a new stream from batch 0
    a = ld.popen_consume("dyn", "--mode", "dynamic", "--job", "dyn-pair")
    b = ld.popen_consume("dyn", "--mode", "dynamic", "--job", "dyn-pair")
    ra, rb = a.wait(check=True), b.wait(check=True)
    assert ra.json["mode"] == "dynamic"
    got = collections.Counter()
    for res in (ra, rb):
        nb = res.json["batches"]
        assert res.json["samples"] == nb * bs
        got.update(tuple(x) for x in position_indices(res.dump, L, [bs] * nb))
    assert ra.json["batches"] + rb.json["batches"] == 512, \
        f"dynamic consumers got {ra.json['batches']} + {rb.json['batches']} batches, not 512"
    assert got == expected, "dynamic consumers did not get every batch exactly once"


def test_dynamic_verbose_positions(ld, workdir):
    """--verbose names each batch's (epoch, index); over two consumers every
    (epoch, batch) pair appears exactly once."""
    n, bs, epochs = 200, 10, 3
    path = pos_file(workdir, n)
    ld.create(token_spec("dv", path, L, "uint32", batch_size=bs, epochs=epochs, prefetch=3))
    # one job: if a reads to the end before b attaches, b gets the end, not
    # a stream of its own (docs/spec.md, "Jobs")
    a = ld.popen_consume("dv", "--mode", "dynamic", "--verbose", "--job", "dv", dump=False)
    b = ld.popen_consume("dv", "--mode", "dynamic", "--verbose", "--job", "dv", dump=False)
    ra, rb = a.wait(check=True), b.wait(check=True)
    pairs = []
    for res in (ra, rb):
        found = re.findall(r"epoch (\d+) batch (\d+)", res.stdout + res.stderr)
        assert len(found) == res.json["batches"], \
            f"--verbose printed {len(found)} 'epoch E batch B' lines for {res.json['batches']} batches"
        pairs += [(int(e), int(x)) for e, x in found]
    assert sorted(pairs) == [(e, x) for e in range(epochs) for x in range(20)]


def test_64_broadcast_consumers(ld, workdir):
    n, bs = 200, 16
    path = os.path.join(workdir, "small.bin")
    tok = random_tokens(path, n * L + 1, "uint16", seed=64)
    ld.create(token_spec("many", path, L, "uint16", batch_size=bs, min_clients=64, prefetch=4,
                         shuffle=True, seed=64))
    cons = [ld.popen_consume("many", dump=False) for _ in range(64)]
    results = [c.wait(timeout=180) for c in cons]
    bad = [r.describe() for r in results if r.rc != 0]
    assert not bad, f"{len(bad)} of 64 consumers failed; first:\n{bad[0]}"
    sums = collections.Counter(r.json["checksum"] for r in results)
    assert len(sums) == 1, f"64 consumers got different streams: {sums}"
    assert {r.json["batches"] for r in results} == {13}
    # the stream is a permutation of the samples: compare with a fresh consumer's dump
    ld.create(token_spec("one", path, L, "uint16", batch_size=bs, shuffle=True, seed=64))
    one = ld.consume("one")
    assert int(results[0].json["checksum"], 16) == crc(one.dump)
    windows = sorted(tuple(tok[i * L:i * L + L].tolist()) for i in range(n))
    got = []
    pos = 0
    for r in [bs] * 12 + [8]:
        got += [tuple(x) for x in
                np.frombuffer(one.dump, dtype=np.int64, count=r * L, offset=pos).reshape(r, L).tolist()]
        pos += 2 * r * L * 8
    assert sorted(got) == windows, "the broadcast stream is not a permutation of the samples"
    ld.wait_for(lambda s: s["clients"] == [], "all 64 consumers detached")


def test_broadcast_late_joiner_starts_at_oldest_held_batch(ld, workdir):
    """"A later one joins at the oldest batch the pipeline still holds": while
    consumer A is stopped holding leases on its batches, consumer B attaches
    and starts at or before the oldest of them, not after A's position; B's
    stream is then the contiguous continuation of the pipeline."""
    n, bs = 400, 4                                    # 100 batches per epoch, endless
    path = os.path.join(workdir, "late.bin")
    tok = random_tokens(path, n * L + 1, "uint16", seed=7)
    ld.create(token_spec("late", path, L, "uint16", batch_size=bs, prefetch=4, epochs=0))
    bpe = 100
    # --delay: A holds each batch 2 ms, so it holds leases whenever status looks
    # (without it A could read its 1000 tiny batches between two looks)
    a = ld.popen_consume("late", "--batches", 1000, "--timeout", 60000, "--delay", 2)
    ld.wait_for(lambda s: any(c["pid"] == a.pid and c["leases"] >= 1 for c in s["clients"]),
                "A holds a lease")
    a.signal(signal.SIGSTOP)
    # The oldest batch A holds: the next it would receive less its leases (it
    # releases in order). The daemon filling A's window moves both alike;
    # only A's releases move it, and A, stopped, makes none: what it wrote
    # to its ring before the stop is announced on the ring's eventfd, which
    # the daemon's loop has taken by the time it answers a later request. So
    # two looks, one after the other, agree; the first may not.
    def a_oldest():
        me = [c for c in ld.status()["clients"] if c["pid"] == a.pid][0]
        att = me["attachments"][0]
        assert att["ring"] is True, "A reads through its batch ring: its releases come that way"
        pos = att["position"]
        return me["leases"], pos["epoch"] * bpe + pos["batch"] - me["leases"]
    looks = [a_oldest()]
    while True:
        looks.append(a_oldest())
        if looks[-1][1] == looks[-2][1]:
            break
        assert len(looks) < 50, f"A's oldest held batch moves while A is stopped: {looks}"
    held, oldest = looks[-1]
    assert held >= 1
    b = ld.popen_consume("late", "--batches", 100, "--timeout", 60000)
    # where B starts is set as it attaches (attach.c, group_start())
    ld.wait_for(lambda s: any(c["pid"] == b.pid and c["pipeline"] == "late" for c in s["clients"]),
                "B attached")
    assert a_oldest()[1] == oldest, "A's oldest held batch moved while A was stopped"
    a.signal(signal.SIGCONT)
    ra, rb = a.wait(check=True), b.wait(check=True)
    one = token_dump(tok, L, sequential_batches(n, bs))
    batch_bytes = 2 * bs * L * 8
    stream = one * 22
    assert ra.dump == stream[:1000 * batch_bytes]
    first = rb.json["first_epoch"] * bpe + rb.json["first_batch"]
    assert rb.dump == stream[first * batch_bytes:(first + 100) * batch_bytes], \
        "B's stream is not a contiguous run of the pipeline"
    assert first <= oldest, (
        f"B started at batch {first}, but A still held leases on batches "
        f"{oldest}..{oldest + held - 1} when B attached (B joined at the head, "
        f"not at the oldest batch the pipeline still holds)")
