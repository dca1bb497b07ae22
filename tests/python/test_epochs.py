# SPDX-License-Identifier: MIT
"""Epochs as torch's DataLoader gives them (docs/python.md, "Epochs and
iteration"): each `for` is one whole epoch from its first batch, a `break`
abandons the rest of it, set_epoch() picks the epoch of the next `for`,
len() is an epoch's length, a script run twice reads the same stream, and
torchrun's ranks get DistributedSampler's shares.

The expected orders are computed here, independently of the daemon, from
docs/spec.md ("Order and determinism", "The permutation")."""

import math
import os
import zlib

import numpy as np
import pytest

import loaderd
from conftest import run_python

try:
    import torch
except Exception:  # pragma: no cover
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="python3-torch is not installed")

M64 = (1 << 64) - 1


# ------------------------------------------------- the order, independently

def mix64(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def splitmix64(x):
    return mix64((x + 0x9e3779b97f4a7c15) & M64)


def permute(seed, epoch, n, pos):
    """docs/spec.md, "The permutation"."""
    if n == 1:
        return 0
    bits = max(2, (n - 1).bit_length())
    bits += bits & 1
    h = bits // 2
    mask = (1 << h) - 1
    base = splitmix64(splitmix64(seed) ^ epoch)
    keys = [splitmix64((base + k) & M64) for k in range(8)]
    x = pos % n
    while True:
        lo, hi = x >> h, x & mask
        for k in range(8):
            lo, hi = hi, lo ^ (mix64(hi ^ keys[k]) & mask)
        x = (lo << h) | hi
        if x < n:
            return x


def epoch_order(n, batch, epoch, shuffle=True, seed=0, rank=0, world=1, drop_last=False):
    """The sample ids of each batch of @epoch for @rank of @world."""
    share = n // world if drop_last else -(-n // world)
    nb = share // batch if drop_last else -(-share // batch)
    out = []
    for b in range(nb):
        rows = min(batch, share - b * batch)
        ids = []
        for r in range(rows):
            p = (rank + world * (b * batch + r)) % n
            ids.append(permute(seed, epoch, n, p) if shuffle else p)
        out.append(ids)
    return out


def npy_ids(d, n, name="id"):
    """A one-field dataset whose field is the sample id (plus a second
    field, x = id * 3 as float32, so that batches have two fields)."""
    ip, xp = os.path.join(d, name + ".npy"), os.path.join(d, "x3.npy")
    np.save(ip, np.arange(n, dtype=np.int64))
    np.save(xp, (np.arange(n, dtype=np.float32) * 3).reshape(n, 1))
    return [ip, xp]


def ids_spec(paths, name="ep", batch=8, **kw):
    s = {"name": name, "source": {"kind": "npy", "paths": paths}, "batch_size": batch,
         "shuffle": True, "seed": 7}
    s.update(kw)
    return s


def ids_of(b):
    ids = np.asarray(b["id"]).tolist()
    np.testing.assert_array_equal(np.asarray(b["x3"])[:, 0], np.asarray(ids, np.float32) * 3)
    return ids


# --------------------------------------------------------------- tests

def test_permutation_here_matches_the_daemon(ld, workdir):
    """The independent order above is the daemon's, for a few sizes."""
    for n in (1, 2, 3, 45, 64, 100):
        d = os.path.join(workdir, f"n{n}")
        os.makedirs(d)
        with loaderd.DataLoader(ids_spec(npy_ids(d, n), name=f"p{n}", batch=4), socket=ld.socket,
                                as_numpy=True) as dl:
            for e in range(2):
                assert [ids_of(b) for b in dl] == epoch_order(n, 4, e, seed=7)


def test_break_starts_the_next_epoch_at_batch_0(ld, workdir):
    """torch: every `for` is a fresh pass from its first batch; a `break`
    abandons the rest. Epoch k here is the daemon's permutation of (seed, k)."""
    n, B = 100, 8
    paths = npy_ids(workdir, n)
    with loaderd.DataLoader(ids_spec(paths), socket=ld.socket, as_numpy=True) as dl:
        assert dl.mode == "partition" and (dl.rank, dl.world_size) == (0, 1)
        got = []
        for b in dl:  # epoch 0: three batches, then break
            got.append((b.epoch, b.index, ids_of(b)))
            if b.index == 2:
                break
        # state_dict(): the rest of the broken loop (torchdata's); the next
        # `for` is still a fresh pass of the next epoch
        assert dl.state_dict()["epoch"] == 0 and dl.state_dict()["batch"] == 3
        assert dl.epoch == 1
        for b in dl:  # epoch 1, whole
            got.append((b.epoch, b.index, ids_of(b)))
        for i, b in enumerate(dl):  # epoch 2, broken off after 5
            got.append((b.epoch, b.index, ids_of(b)))
            if i == 4:
                break
        it = iter(dl)  # a loop abandoned before its first batch uses no epoch
        del it
        for b in dl:  # epoch 3
            got.append((b.epoch, b.index, ids_of(b)))
    want = []
    for e, count in ((0, 3), (1, None), (2, 5), (3, None)):
        order = epoch_order(n, B, e, seed=7)
        want += [(e, i, ids) for i, ids in enumerate(order[:count])]
    assert got == want


def test_break_equals_a_fresh_stream_at_that_epoch(ld, workdir):
    """After a break, the next `for` gives exactly what a fresh loader
    resumed at (epoch, 0) gives."""
    paths = npy_ids(workdir, 60)
    spec = ids_spec(paths, batch=7)
    with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True) as dl:
        for b in dl:
            break
        after = [ids_of(b) for b in dl]
    with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True) as fresh:
        fresh.load_state_dict({"pipeline": "ep", "epoch": 1, "batch": 0, "rank": 0,
                               "world_size": 1})
        assert [ids_of(b) for b in fresh] == after


def test_loop_to_the_end_goes_on_without_reattaching(ld, workdir):
    """A loop that ran to the end leaves the stream at the next epoch's
    first batch: the next `for` (and set_epoch to that epoch) re-attach
    nothing; set_epoch to another epoch and a break do."""
    paths = npy_ids(workdir, 40)
    with loaderd.DataLoader(ids_spec(paths), socket=ld.socket, as_numpy=True) as dl:
        att = dl._att
        for e in range(3):
            dl.set_epoch(e)  # DistributedSampler's idiom: costs nothing here
            assert len([b for b in dl]) == len(dl) == 5
            assert dl._att is att
        for b in dl:  # epoch 3, broken off
            break
        b = None
        for b in dl:  # epoch 4: a new stream at (4, 0)
            assert (b.epoch, b.index) == (4, 0)
            break
        assert dl._att is not att
        att = dl._att
        dl.set_epoch(9)
        assert dl._att is att  # lazily: at the next `for`
        assert [b.epoch for b in dl] == [9] * 5
        assert dl._att is not att


def test_set_epoch(ld, workdir):
    """set_epoch(e): the next `for` is epoch e from batch 0, whatever came
    before; the same epoch twice is the same order (DistributedSampler)."""
    n, B = 50, 6
    paths = npy_ids(workdir, n)
    with loaderd.DataLoader(ids_spec(paths, batch=B), socket=ld.socket, as_numpy=True) as dl:
        dl.set_epoch(5)
        assert dl.epoch == 5 and dl.state_dict()["epoch"] == 5
        e5 = [ids_of(b) for b in dl]
        assert e5 == epoch_order(n, B, 5, seed=7)
        assert [ids_of(b) for b in dl] == epoch_order(n, B, 6, seed=7)  # then 6
        dl.set_epoch(5)
        assert [ids_of(b) for b in dl] == e5
        for i, b in enumerate(dl):  # 6, broken off
            if i == 3:
                break
        dl.set_epoch(2)
        assert [ids_of(b) for b in dl] == epoch_order(n, B, 2, seed=7)
        with pytest.raises(ValueError):
            dl.set_epoch(-1)


def test_len_is_the_epoch_length(ld, workdir):
    paths = npy_ids(workdir, 45)
    cases = [({}, {}, math.ceil(45 / 8)), ({"drop_last": True}, {}, 45 // 8),
             ({}, {"mode": "partition", "rank": 1, "world_size": 4}, math.ceil(math.ceil(45 / 4) / 8))]
    for i, (skw, lkw, want) in enumerate(cases):
        with loaderd.DataLoader(ids_spec(paths, name=f"len{i}", **skw), socket=ld.socket,
                                as_numpy=True, **lkw) as dl:
            assert len(dl) == want
            for b in dl:
                break
            assert len(dl) == want  # after a break too
            assert sum(1 for _ in dl) == want
            assert len(dl.dataset) == 45  # the whole source, as torch's len(loader.dataset)


def test_finite_pipeline_and_state(ld, workdir):
    """epochs=2: two loops, then nothing (exhausted); set_epoch goes back.
    state_dict() is where the next batch comes from: inside a loop its
    rest, after a loop broken off its rest too (torchdata's
    StatefulDataLoader), after a loop that ended the next loop's start."""
    n, B = 30, 8
    paths = npy_ids(workdir, n)
    with loaderd.DataLoader(ids_spec(paths, epochs=2), socket=ld.socket, as_numpy=True) as dl:
        it = iter(dl)
        next(it)
        next(it)
        assert dl.state_dict()["epoch"] == 0 and dl.state_dict()["batch"] == 2
        del it
        assert (dl.state_dict()["epoch"], dl.state_dict()["batch"]) == (0, 2)
        assert [ids_of(b) for b in dl] == epoch_order(n, B, 1, seed=7)
        assert list(dl) == [] and dl.exhausted
        assert (dl.state_dict()["epoch"], dl.state_dict()["batch"]) == (2, 0)
        dl.set_epoch(0)
        assert not dl.exhausted
        assert [ids_of(b) for b in dl] == epoch_order(n, B, 0, seed=7)


def test_resume_after_break_from_state(ld, workdir):
    """A checkpoint taken after a broken-off loop (a job at its time limit)
    resumes with the rest of that loop's epoch, as torchdata's
    StatefulDataLoader does; the loader that broke off starts the next epoch
    at its next `for`, as torch's does."""
    n, B = 40, 8
    paths = npy_ids(workdir, n)
    spec = ids_spec(paths)
    with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True) as dl:
        for b in dl:
            break
        state = dl.state_dict()
        assert [ids_of(b) for b in dl] == epoch_order(n, B, 1, seed=7)
    with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True) as dl:
        dl.load_state_dict(state)
        assert [ids_of(b) for b in dl] == epoch_order(n, B, 0, seed=7)[1:]


RERUN = r"""
import sys, zlib, json
import numpy as np
import loaderd
spec = json.loads(sys.argv[2])
out = []
with loaderd.DataLoader(spec, socket=sys.argv[1], as_numpy=True) as dl:
    for epoch in range(3):
        for i, b in enumerate(dl):
            out.append((b.epoch, b.index, np.asarray(b["id"]).tolist()))
            if epoch == 0 and i == 1:
                break   # a first epoch cut short, as a dry run does
print(json.dumps(out))
"""


def test_same_script_twice_reads_the_same_stream(ld, workdir):
    """Two runs of one script (one after the other, same spec dict): the
    same stream from epoch 0 batch 0, which is the expected one."""
    import json
    n, B = 64, 8
    paths = npy_ids(workdir, n)
    spec = json.dumps(ids_spec(paths, name="rerun"))
    runs = []
    for _ in range(2):
        r = run_python(["-c", RERUN, ld.socket, spec])
        assert r.returncode == 0, r.stderr
        runs.append([tuple(x) for x in json.loads(r.stdout)])
    assert runs[0] == runs[1]
    want = [(0, i, ids) for i, ids in enumerate(epoch_order(n, B, 0, seed=7)[:2])]
    for e in (1, 2):
        want += [(e, i, ids) for i, ids in enumerate(epoch_order(n, B, e, seed=7))]
    assert runs[0] == want


DDP = r"""
import json, os, sys
import numpy as np
import loaderd
spec = json.loads(sys.argv[2])
out = []
with loaderd.DataLoader(spec, socket=sys.argv[1], as_numpy=True) as dl:
    assert (dl.mode, dl.rank, dl.world_size) == ("partition", int(os.environ["RANK"]), 3)
    for epoch in range(2):
        dl.set_epoch(epoch)
        out.append([v for b in dl for v in np.asarray(b["id"]).tolist()])
    for b in dl:   # epoch 2, broken off: the next loop is epoch 3
        break
    out.append([v for b in dl for v in np.asarray(b["id"]).tolist()])
print(json.dumps(out))
"""


@needs_torch
def test_torchrun_ranks_get_distributed_sampler_shares(ld, workdir):
    """RANK/WORLD_SIZE (torchrun) select partition: each rank gets exactly
    the indices torch's DistributedSampler(shuffle=False) gives it,
    padding included; break and set_epoch per rank as for one trainer."""
    import json
    from torch.utils.data.distributed import DistributedSampler
    n = 50
    paths = npy_ids(workdir, n)
    spec = ids_spec(paths, name="ddp", batch=4, shuffle=False)
    procs = []
    for rank in range(3):
        procs.append(run_python(["-c", DDP, ld.socket, json.dumps(spec)],
                                env={"RANK": str(rank), "WORLD_SIZE": "3",
                                     "LOCAL_RANK": str(rank)}))
    for rank, r in enumerate(procs):
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        ds = DistributedSampler(list(range(n)), num_replicas=3, rank=rank, shuffle=False)
        assert got == [list(ds)] * 3
    # shuffled: the daemon's permutation per epoch, DistributedSampler's rule
    spec = ids_spec(paths, name="ddp2", batch=4, seed=3)
    for rank in range(3):
        r = run_python(["-c", DDP, ld.socket, json.dumps(spec)],
                       env={"RANK": str(rank), "WORLD_SIZE": "3"})
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        for e, ids in zip((0, 1, 3), got):
            want = [v for bt in epoch_order(n, 4, e, seed=3, rank=rank, world=3) for v in bt]
            assert ids == want


def test_broadcast_mode_keeps_the_shared_stream(ld, workdir):
    """mode="broadcast" (sweeps): one stream shared by every broadcast
    loader; a loop goes from the stream's next batch to the end of its
    epoch, a break resumes mid-epoch, set_epoch only warns."""
    n, B = 40, 8
    paths = npy_ids(workdir, n)
    spec = ids_spec(paths, name="bc", min_clients=2)
    a = loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True, mode="broadcast", timeout=20)
    b = loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True, mode="broadcast", timeout=20)
    e0 = epoch_order(n, B, 0, seed=7)
    got_a = []
    for x in a:
        got_a.append((x.epoch, x.index, ids_of(x)))
        if x.index == 1:
            break
    got_a += [(x.epoch, x.index, ids_of(x)) for x in a]  # the rest of epoch 0
    assert got_a == [(0, i, ids) for i, ids in enumerate(e0)]
    assert [ids_of(x) for x in b] == e0  # the same stream
    with pytest.warns(UserWarning, match="no effect in broadcast"):
        a.set_epoch(5)
    assert [x.epoch for x in a] == [1] * 5
    a.close()
    b.close()


def test_next_batch_reads_on_across_epochs(ld, workdir):
    """next_batch(): the stream regardless of epoch boundaries (nanoGPT's
    get_batch); a `for` after it goes on to the end of that epoch."""
    n, B = 24, 8
    paths = npy_ids(workdir, n)
    with loaderd.DataLoader(ids_spec(paths), socket=ld.socket, as_numpy=True) as dl:
        got = [(b.epoch, b.index) for b in (dl.next_batch() for _ in range(4))]
        assert got == [(0, 0), (0, 1), (0, 2), (1, 0)]
        assert [(b.epoch, b.index) for b in dl] == [(1, 1), (1, 2)]
        assert [(b.epoch, b.index) for b in dl] == [(2, 0), (2, 1), (2, 2)]
