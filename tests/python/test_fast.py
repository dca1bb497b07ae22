# SPDX-License-Identifier: MIT
"""loaderd._fast (client/python/pyfast.c): the DataLoader's per-batch path in C.

The build under test has it (meson builds it where Python's headers are, and
scripts/bootstrap installs them), so the rest of this suite runs on it from
each attachment's second batch on. Here: the batches it builds equal the
pure Python path's ($LOADERD_PYFAST=0, in another process) value for value,
dtype for dtype, shape for shape, zero-copy, for numpy arrays and torch
tensors of every dtype; what holds a batch (a view of one field, a tensor)
holds its lease, and the last reference gives it back; in-place writes stay
the process's own."""

import gc
import json
import os

import numpy as np
import pytest

import loaderd
from loaderd import _lib
from conftest import run_python

try:
    import torch
except Exception:  # pragma: no cover
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="python3-torch is not installed")

N = 40
ARRS = {
    "b": np.arange(N) % 3 == 0, "i1": (np.arange(N) % 100 - 50).astype(np.int8),
    "u1": np.arange(N, dtype=np.uint8), "i2": np.arange(N * 2, dtype=np.int16).reshape(N, 2),
    "i4": np.arange(N, dtype=np.int32) * -7, "i8": np.arange(N * 6, dtype=np.int64).reshape(N, 2, 3),
    "f2": np.linspace(0, 1, N).astype(np.float16), "f4": np.linspace(-1, 1, N).astype(np.float32),
    "f8": np.linspace(0, 3, N), "u2": np.arange(N, dtype=np.uint16) + 60000,
    "u4": np.arange(N, dtype=np.uint32) + 4000000000,
    "u8": np.arange(N, dtype=np.uint64) + (1 << 63) + 5,
}

# Every batch of pipeline argv[2] as JSON: per batch, per field the dtype,
# the shape, the values, the lease's type, and whether it lies in the slab.
DUMP = r"""
import json, sys
import numpy as np
import loaderd
sock, name, as_numpy = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
out = []
with loaderd.DataLoader(name, socket=sock, as_numpy=as_numpy, mode="partition") as dl:
    base, size = dl.slab
    while True:
        b = dl.next_batch()
        if b is None:
            break
        row = {"_lease": type(b._lease).__module__ + "." + type(b._lease).__name__,
               "_epoch": b.epoch, "_index": b.index, "_rows": b.rows}
        for k, v in b.items():
            a = v if as_numpy else v.numpy()
            ptr = a.__array_interface__["data"][0]
            row[k] = [str(v.dtype), list(v.shape), a.tolist(), base <= ptr < base + size]
        out.append(row)
        del v, a
print(json.dumps(out))
"""


def dtypes_pipeline(ld, workdir, name="dt"):
    paths = []
    for k, a in ARRS.items():
        p = os.path.join(workdir, k + ".npy")
        np.save(p, a)
        paths.append(p)
    ld.create({"name": name, "source": {"kind": "npy", "paths": paths}, "batch_size": 6,
               "shuffle": True, "seed": 3, "epochs": 2})
    return name


def dump(ld, name, as_numpy, pyfast):
    r = run_python(["-c", DUMP, ld.socket, name, "1" if as_numpy else "0"],
                   env={"LOADERD_PYFAST": pyfast})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_build_under_test_has_it():
    assert _lib.fast() is not None, _lib.fast_error


@pytest.mark.parametrize("as_numpy", [True, pytest.param(False, marks=needs_torch)],
                         ids=["numpy", "torch"])
def test_same_batches_as_the_python_path(ld, workdir, as_numpy):
    name = dtypes_pipeline(ld, workdir)
    fast, slow = dump(ld, name, as_numpy, "1"), dump(ld, name, as_numpy, "0")
    assert len(fast) == len(slow) == 2 * 7  # 40 rows, batch 6, 2 epochs
    # the first batch of an attachment comes through Python (it learns the
    # fields), every later one through C; with LOADERD_PYFAST=0 none does
    assert [b["_lease"] for b in fast] == ["loaderd.loader._Lease"] + ["loaderd._fast.Lease"] * 13
    assert {b["_lease"] for b in slow} == {"loaderd.loader._Lease"}
    strip = lambda bs: [{k: v for k, v in b.items() if k != "_lease"} for b in bs]  # noqa: E731
    assert strip(fast) == strip(slow)
    # zero-copy where the dtype has no widening (torch < 2.3 has no
    # uint16/32/64; torch >= 2.3 has all three)
    widened = set() if as_numpy or hasattr(torch, "uint16") else {"u2", "u4", "u8"}
    for b in fast:
        for k in ARRS:
            assert b[k][3] == (k not in widened), (k, b["_index"])
    # and the values are the files' rows, in the shuffled order of each epoch
    for e in range(2):
        rows = [b for b in fast if b["_epoch"] == e]
        got = np.concatenate([np.array(b["i4"][2]) for b in rows])
        assert sorted(got.tolist()) == sorted(ARRS["i4"].tolist())


def held(dl):
    return dl._att.held()


@pytest.mark.parametrize("as_numpy", [True, pytest.param(False, marks=needs_torch)],
                         ids=["numpy", "torch"])
def test_a_view_holds_the_lease_and_the_last_reference_gives_it_back(ld, workdir, as_numpy):
    name = dtypes_pipeline(ld, workdir)
    with loaderd.DataLoader(name, socket=ld.socket, as_numpy=as_numpy) as dl:
        first = dl.next_batch()
        del first
        gc.collect()
        b = dl.next_batch()
        assert type(b._lease).__module__ == "loaderd._fast"
        assert held(dl) == 1
        view = b["i8"][1:, 0]          # a view of one field outlives the batch
        want = ARRS["i8"].reshape(N, 2, 3)
        rows = [r.tolist() for r in (view if as_numpy else view.numpy())]
        del b
        gc.collect()
        assert held(dl) == 1, "a view holds its batch"
        assert all(r in want[:, 0].tolist() for r in rows)
        del view
        assert held(dl) == 0, "the last reference gave the lease back"
        # an explicit release, and a batch kept by the daemon's share rule,
        # go through the same lease
        c = dl.next_batch()
        c.release()
        assert c.released and held(dl) == 0
        del c


@needs_torch
def test_in_place_writes_stay_private(ld, workdir):
    """A trainer's in-place op on a tensor of the C path changes its copy
    only: the next epoch's batches read the daemon's bytes again."""
    name = dtypes_pipeline(ld, workdir)
    seen = {}
    with loaderd.DataLoader(name, socket=ld.socket) as dl:
        for e in range(2):
            for b in dl:
                x = b["f4"]
                if b.index > 0:
                    assert type(b._lease).__module__ == "loaderd._fast"
                vals = x.numpy().tolist()
                for v in vals:
                    assert v in ARRS["f4"].tolist(), (e, b.index, v)
                seen.setdefault(e, []).extend(vals)
                x.mul_(-1000.0)           # in place, on the slot's pages
                assert x.numpy().tolist() == (np.array(vals, np.float32) * np.float32(-1000)).tolist()
                del b, x
    assert sorted(seen[0]) == sorted(seen[1]) == sorted(ARRS["f4"].tolist())


def test_the_loop_keeps_no_reference_to_the_batch(ld, workdir):
    """As with torch's DataLoader, `for b in loader` holds nothing of its own
    while the body runs: `del b` gives the slot back there and then, in a
    private and in a shared stream."""
    name = dtypes_pipeline(ld, workdir)
    for mode in ("partition", "broadcast"):
        with loaderd.DataLoader(name, socket=ld.socket, as_numpy=True, mode=mode) as dl:
            n = 0
            for b in dl:
                assert held(dl) == 1
                del b
                assert held(dl) == 0, (mode, n)
                n += 1
            assert n == 7
