# SPDX-License-Identifier: MIT
"""Shuffle and determinism: each epoch is a permutation of all samples drawn
from (seed, epoch) only; epochs differ; the same seed reproduces byte for
byte, whatever the number of workers; resume equals the tail of a full run.

The token files hold uint32 tok[k] = k, so each delivered row says which
sample it is (first token / L) and that it is a correct window."""

import os

from ldrtest import (batch_rows, nsamples_tokens, partition_share, position_indices,
                     position_tokens, split_batches, token_spec)

L = 16
BS = 32
N = 1000                     # samples; 31 full batches + one of 8 per epoch
NTOK = N * L + 1


def make_file(workdir, name="pos.bin"):
    path = os.path.join(workdir, name)
    position_tokens(path, NTOK)
    assert nsamples_tokens(NTOK, L) == N
    return path


def epochs_of(res, epochs, n=N, bs=BS):
    """Split a dump of a position file into epochs of sample-index batches."""
    rows = batch_rows(n, bs) * epochs
    batches = position_indices(res.dump, L, rows)
    per = len(batch_rows(n, bs))
    return [batches[e * per:(e + 1) * per] for e in range(epochs)]


def flat(batches):
    return [i for b in batches for i in b]


def test_every_epoch_is_a_fresh_permutation(ld, workdir):
    path = make_file(workdir)
    ld.create(token_spec("shuf", path, L, "uint32", batch_size=BS, shuffle=True, seed=7, epochs=3))
    res = ld.consume("shuf")
    assert res.json["batches"] == 96 and res.json["samples"] == 3 * N and res.json["eof"] is True
    orders = [flat(e) for e in epochs_of(res, 3)]
    for e, order in enumerate(orders):
        assert sorted(order) == list(range(N)), f"epoch {e} is not a permutation of all samples"
        assert order != list(range(N)), f"epoch {e} is not shuffled"
    assert orders[0] != orders[1] and orders[1] != orders[2] and orders[0] != orders[2], \
        "two epochs have the same order"


def test_same_seed_reproduces_byte_for_byte(ld, workdir):
    path = make_file(workdir)
    ld.create(token_spec("a", path, L, "uint32", batch_size=BS, shuffle=True, seed=42, epochs=2))
    ld.create(token_spec("b", path, L, "uint32", batch_size=BS, shuffle=True, seed=42, epochs=2))
    ld.create(token_spec("c", path, L, "uint32", batch_size=BS, shuffle=True, seed=43, epochs=2))
    ra = ld.consume("a")
    rb = ld.consume("b")
    rc = ld.consume("c")
    assert ra.dump == rb.dump, "same spec and seed gave different bytes"
    assert ra.json["checksum"] == rb.json["checksum"]
    assert rc.dump != ra.dump, "another seed gave the same order"
    # the other seed is still a permutation per epoch
    for e in epochs_of(rc, 2):
        assert sorted(flat(e)) == list(range(N))


def test_workers_1_and_2_give_identical_dumps(daemon, workdir):
    path = make_file(workdir)
    spec = token_spec("w", path, L, "uint32", batch_size=BS, shuffle=True, seed=3, epochs=2)
    dumps = []
    for workers in (1, 2):
        d = daemon(workers=workers)
        d.create(spec)
        dumps.append(d.consume("w").dump)
        assert d.status()["workers"] == workers
        d.stop()
    assert len(dumps[0]) == 2 * 2 * N * L * 8
    assert dumps[0] == dumps[1], "--workers 1 and --workers 2 delivered different bytes"


def test_workers_1_and_2_identical_sequential_npy_like(daemon, workdir):
    """Also without shuffle, with a short last batch and drop_last."""
    path = make_file(workdir)
    spec = token_spec("s", path, L, "uint32", batch_size=30, drop_last=True, epochs=2)
    dumps = []
    for workers in (1, 2):
        d = daemon(workers=workers)
        d.create(spec)
        dumps.append(d.consume("s").dump)
        d.stop()
    assert dumps[0] == dumps[1]
    got = position_indices(dumps[0], L, [30] * 66)
    assert got == split_batches(list(range(N)), 30, drop_last=True) * 2


def test_resume_partition_equals_tail_of_full_run(ld, workdir):
    """A partition attachment started at (epoch, batch) gets exactly what an
    uninterrupted run of that rank gets from that batch on."""
    path = make_file(workdir)
    W, rank = 2, 1
    common = dict(batch_size=BS, shuffle=True, seed=11, epochs=2)
    ld.create(token_spec("full", path, L, "uint32", **common))
    ld.create(token_spec("again", path, L, "uint32", **common))
    full = ld.consume("full", "--mode", "partition", "--rank", rank, "--world-size", W)
    per_rank = N // W                                   # 500 samples: 15 full + one of 20
    rows = batch_rows(per_rank, BS)
    assert full.json["batches"] == 2 * len(rows)
    full_batches = position_indices(full.dump, L, rows * 2)

    start_epoch, start_batch = 1, 5
    res = ld.consume("again", "--mode", "partition", "--rank", rank, "--world-size", W,
                     "--start-epoch", start_epoch, "--start-batch", start_batch)
    tail_from = start_epoch * len(rows) + start_batch
    assert res.json["batches"] == len(full_batches) - tail_from
    assert (res.json["first_epoch"], res.json["first_batch"]) == (start_epoch, start_batch)
    assert res.json["eof"] is True
    # byte equality with the tail of the uninterrupted dump
    tail_bytes = sum(2 * r * L * 8 for r in (rows * 2)[:tail_from])
    assert res.dump == full.dump[tail_bytes:], "resumed stream differs from the tail of a full run"


def test_resume_same_pipeline_after_partial_run(ld, workdir):
    """A trainer that stopped after some batches resumes on the same pipeline."""
    path = make_file(workdir)
    ld.create(token_spec("rs", path, L, "uint32", batch_size=BS, shuffle=True, seed=5, epochs=2))
    ld.create(token_spec("ref", path, L, "uint32", batch_size=BS, shuffle=True, seed=5, epochs=2))
    ref = ld.consume("ref", "--mode", "partition", "--rank", 0, "--world-size", 1)
    first = ld.consume("rs", "--mode", "partition", "--rank", 0, "--world-size", 1, "--batches", 40)
    assert first.json["batches"] == 40
    rest = ld.consume("rs", "--mode", "partition", "--rank", 0, "--world-size", 1,
                      "--start-epoch", 1, "--start-batch", 8)    # 32 batches per epoch
    assert first.dump + rest.dump == ref.dump


def test_partition_w1_equals_broadcast_order(ld, workdir):
    """One rank of one is the whole epoch order, the same one broadcast gets."""
    path = make_file(workdir)
    ld.create(token_spec("p", path, L, "uint32", batch_size=BS, shuffle=True, seed=9))
    ld.create(token_spec("q", path, L, "uint32", batch_size=BS, shuffle=True, seed=9))
    part = ld.consume("p", "--mode", "partition", "--rank", 0, "--world-size", 1)
    bc = ld.consume("q")
    assert part.dump == bc.dump
    order = flat(epochs_of(bc, 1)[0])
    assert partition_share(order, 0, 1) == order


def test_elastic_tail_with_loaderctl(ld, workdir):
    """`consume --start-position`: 8 ranks read 2 batches each in lockstep
    (positions [0, 512) of the epoch's permutation), then 6 ranks take the
    tail from 512 (docs/spec.md, "Order and determinism"): rank r reads
    positions 512 + r + 6j, 82 each (488 left, padded to 492 by wrapping to
    the epoch's positions 0..3), as the last 3 of the 6 batches of its epoch."""
    path = make_file(workdir)
    common = dict(batch_size=BS, shuffle=True, seed=3, epochs=1)
    ld.create(token_spec("ref", path, L, "uint32", **common))
    ld.create(token_spec("el", path, L, "uint32", **common))
    perm = flat(epochs_of(ld.consume("ref"), 1)[0])
    count = [0] * N
    for r in range(8):
        res = ld.consume("el", "--mode", "partition", "--rank", r, "--world-size", 8,
                         "--batches", 2)
        got = flat(position_indices(res.dump, L, [BS, BS]))
        assert got == [perm[r + 8 * j] for j in range(2 * BS)]
        for i in got:
            count[i] += 1
    for r in range(6):
        res = ld.consume("el", "--mode", "partition", "--rank", r, "--world-size", 6,
                         "--start-epoch", 0, "--start-position", 512)
        assert (res.json["first_epoch"], res.json["first_batch"]) == (0, 3)
        assert res.json["batches"] == 3 and res.json["eof"] is True
        got = flat(position_indices(res.dump, L, batch_rows(82, BS)))
        assert got == [perm[(512 + r + 6 * j) % N] for j in range(82)]
        for i in got:
            count[i] += 1
    assert [count[perm[p]] for p in range(N)] == [2] * 4 + [1] * (N - 4)
