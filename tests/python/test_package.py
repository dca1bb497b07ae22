# SPDX-License-Identifier: MIT
"""The loaderd Python package against a private daemon: contents, zero-copy,
lifetimes, resume, dtypes, errors, fork/spawn, torch arguments."""

import gc
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import loaderd
from conftest import run_python

try:
    import torch
except Exception:  # pragma: no cover
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="python3-torch is not installed")


# ----------------------------------------------------------------- helpers

def npy_dataset(d, n=100, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3, 4)).astype(np.float32)
    y = np.arange(n, dtype=np.int64)
    xp, yp = os.path.join(d, "x.npy"), os.path.join(d, "y.npy")
    np.save(xp, x)
    np.save(yp, y)
    return x, y, [xp, yp]


def npy_spec(paths, name="arr", **kw):
    spec = {"name": name, "source": {"kind": "npy", "paths": paths}, "batch_size": 16}
    spec.update(kw)
    return spec


def tokens(d, ntok=20000, dtype="uint16", seed=1):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 50000, size=ntok).astype(dtype)
    p = os.path.join(d, "tok.bin")
    t.tofile(p)
    return t, p


def in_slab(loader, ptr):
    base, size = loader.slab
    return base <= ptr < base + size


def collect(loader, key):
    return np.concatenate([np.array(b[key]) for b in loader])


# ---------------------------------------------------------------- contents

def test_npy_contents_numpy(ld, workdir):
    x, y, paths = npy_dataset(workdir)
    with loaderd.DataLoader(npy_spec(paths), socket=ld.socket, as_numpy=True) as dl:
        assert len(dl) == math.ceil(100 / 16) == 7
        assert dl.batch_size == 16 and dl.samples_per_epoch == 100
        got = list(dl)
        assert [b.index for b in got] == list(range(7))
        assert all(b.epoch == 0 for b in got)
        assert [b.rows for b in got] == [16] * 6 + [4]
        for b in got:
            assert list(b.keys()) == ["x", "y"]  # the order of the spec's paths
            assert isinstance(b["x"], np.ndarray) and b["x"].dtype == np.float32
            assert b["x"].shape == (b.rows, 3, 4) and b["y"].shape == (b.rows,)
        np.testing.assert_array_equal(np.concatenate([b["x"] for b in got]), x)
        np.testing.assert_array_equal(np.concatenate([b["y"] for b in got]), y)


@needs_torch
def test_tokens_contents_torch(ld, workdir):
    t, p = tokens(workdir)
    L = 64
    spec = {"name": "tok", "source": {"kind": "tokens", "path": p, "dtype": "uint16", "seq_len": L},
            "batch_size": 8}
    n = (len(t) - 1) // L
    with loaderd.DataLoader(spec, socket=ld.socket) as dl:
        assert len(dl) == math.ceil(n / 8)
        rows = 0
        for b in dl:
            assert isinstance(b["input"], torch.Tensor)
            assert b["input"].dtype == torch.int64 and b["target"].dtype == torch.int64
            assert tuple(b["input"].shape) == (b.rows, L)
            for r in range(b.rows):
                i = b.index * 8 + r
                np.testing.assert_array_equal(b["input"][r].numpy(), t[i * L:i * L + L])
                np.testing.assert_array_equal(b["target"][r].numpy(), t[i * L + 1:i * L + L + 1])
            rows += b.rows
        assert rows == n


def test_default_prefetch_and_window_are_the_daemons(ld, workdir):
    """Without "prefetch" and inflight the daemon sizes both from the batch
    bytes (docs/spec.md "prefetch", docs/python.md): 4 KiB slots get 64
    slots and a window of 16; inflight=3 is 3; the batches are the same."""
    t, p = tokens(workdir)
    L = 64
    spec = {"name": "tok", "source": {"kind": "tokens", "path": p, "dtype": "uint16", "seq_len": L},
            "batch_size": 8}
    got = {}
    for inflight, window, auto in ((None, 16, True), (3, 3, False)):
        with loaderd.DataLoader(spec, socket=ld.socket, inflight=inflight, as_numpy=True) as dl:
            it = iter(dl)
            first = next(it)
            st = ld.status()
            [att] = [a for c in st["clients"] if c["pid"] == os.getpid() for a in c["attachments"]]
            assert (att["inflight"], att["inflight_auto"]) == (window, auto), att
            pl = ld.pipeline("tok")
            assert (pl["slots_total"], pl["prefetch_auto"]) == (64, True), pl
            got[inflight] = [np.array(first["input"])] + [np.array(b["input"]) for b in it]
    assert len(got[None]) == len(got[3]) == math.ceil((len(t) - 1) // L / 8)
    for a, b in zip(got[None], got[3]):
        np.testing.assert_array_equal(a, b)


def test_holding_every_slot_keeps_instead_of_hanging(ld, workdir):
    """Holding every slot no longer stops the stream: the oldest batches are
    kept (copied out of their slots) and stay exact (tests/python/test_keep.py)."""
    x, y, paths = npy_dataset(workdir)
    with loaderd.DataLoader(npy_spec(paths, prefetch=4, epochs=0), socket=ld.socket,
                            as_numpy=True, timeout=20) as dl:
        it = iter(dl)
        with pytest.warns(RuntimeWarning, match="out of shared memory"):
            held = [next(it) for _ in range(7)]
            del it
        assert [b.index for b in held] == list(range(7))
        assert held[0].kept
        for b in held:
            np.testing.assert_array_equal(b["y"], y[16 * b.index:16 * b.index + b.rows])
        del held
        b = next(iter(dl))  # the next `for`: epoch 1 from its first batch
        assert (b.epoch, b.index) == (1, 0)


def test_partition_ranks_cover(ld, workdir):
    x, y, paths = npy_dataset(workdir, n=50)
    spec = npy_spec(paths, batch_size=4)
    seen = []
    for rank in range(2):
        with loaderd.DataLoader(spec, socket=ld.socket, mode="partition", rank=rank,
                                world_size=2, as_numpy=True) as dl:
            assert len(dl) == math.ceil(25 / 4)
            got = collect(dl, "y")
            np.testing.assert_array_equal(got, np.arange(rank, 50, 2))
            seen.append(got)
    assert sorted(np.concatenate(seen).tolist()) == list(range(50))


def test_torchrun_env_selects_partition(ld, workdir, monkeypatch):
    x, y, paths = npy_dataset(workdir, n=20)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with loaderd.DataLoader(npy_spec(paths, batch_size=5), socket=ld.socket, as_numpy=True) as dl:
        assert (dl.mode, dl.rank, dl.world_size) == ("partition", 1, 2)
        assert len(dl) == 2
        np.testing.assert_array_equal(collect(dl, "y"), np.arange(1, 20, 2))


def test_epochs_len_set_epoch_shuffle(ld, workdir):
    x, y, paths = npy_dataset(workdir, n=40)
    spec = npy_spec(paths, batch_size=8)
    with loaderd.DataLoader(spec, shuffle=True, seed=3, epochs=3, socket=ld.socket,
                            mode="partition", as_numpy=True) as dl:
        assert len(dl) == 5 and dl.epochs == 3
        orders = []
        for e in range(3):
            dl.set_epoch(e)
            got = [(b.epoch, b["y"].copy()) for b in dl]  # copies: batches hold slots
            assert len(got) == 5 and {ep for ep, _ in got} == {e}
            order = np.concatenate([y for _, y in got])
            assert sorted(order.tolist()) == list(range(40))  # a permutation
            orders.append(order.tolist())
        assert orders[0] != orders[1] != orders[2]
        assert list(dl) == [] and dl.exhausted  # the pipeline ends after 3 epochs
        # set_epoch in partition mode re-attaches: epoch 1 again, same order
        dl.set_epoch(1)
        assert np.concatenate([b["y"] for b in dl]).tolist() == orders[1]


def test_broadcast_loop_per_epoch(ld, workdir):
    """Broadcast: each `for` is one epoch of the shared stream."""
    x, y, paths = npy_dataset(workdir, n=30)
    with loaderd.DataLoader(npy_spec(paths, batch_size=10, name="bc"), epochs=2,
                            socket=ld.socket, as_numpy=True, mode="broadcast") as dl:
        assert dl.mode == "broadcast"
        e0 = list(dl)
        e1 = list(dl)
        assert [(b.epoch, b.index) for b in e0] == [(0, 0), (0, 1), (0, 2)]
        assert [(b.epoch, b.index) for b in e1] == [(1, 0), (1, 1), (1, 2)]
        assert list(dl) == []


# ---------------------------------------------------------------- zero copy

def test_zero_copy_numpy_copy_on_write(ld, workdir):
    """numpy arrays are views of the slab, writable: the slab is mapped
    copy-on-write, so a write changes this process's page only
    (tests/python/test_inplace.py checks what other loaders and later
    batches see)."""
    x, y, paths = npy_dataset(workdir)
    with loaderd.DataLoader(npy_spec(paths), socket=ld.socket, as_numpy=True) as dl:
        base, size = dl.slab
        assert base and size > 0
        assert dl.writable
        for b in dl:
            for k, a in b.items():
                ptr = a.__array_interface__["data"][0]
                assert in_slab(dl, ptr) and in_slab(dl, ptr + a.nbytes - 1), k
                assert a.__array_interface__["data"][1] is False  # not read-only
                assert a.flags.writeable and not a.flags.owndata
                a[0] = 0
                assert not a[0].any()
                v = a[1:]  # views are writable too
                assert v.flags.writeable
            np.testing.assert_array_equal(b["x"][1:], x[1:16])
            break


@needs_torch
def test_zero_copy_torch_no_warning(ld, workdir):
    x, y, paths = npy_dataset(workdir)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "non-writable" warning may leak out
        with loaderd.DataLoader(npy_spec(paths), socket=ld.socket) as dl:
            n = 0
            for b in dl:
                for k, t in b.items():
                    assert isinstance(t, torch.Tensor)
                    assert in_slab(dl, t.data_ptr()), k
                    assert in_slab(dl, t.data_ptr() + t.numel() * t.element_size() - 1)
                n += 1
            assert n == 7


# ----------------------------------------------------------------- lifetime

def my_leases(st):
    return sum(c["leases"] for c in st["clients"])


# The waits below for a lease to come back (or a client to go) after a drop,
# release() or close() use wait_for's default deadline, not a short one: what
# they check is that it happens with nothing more from the trainer (no next(),
# no further call), which nothing else would do in any time; a short deadline
# only measured the machine (one `loaderctl status` under ASan on a loaded
# machine can take a second, and wait_for gives up after its first sample).


def test_batch_outlives_loop_and_loader(ld, workdir):
    """A batch kept after the loop ends stays valid and equal and holds its
    lease; dropping it returns the lease. After close() a kept batch stays
    mapped (readable, no crash) though its slot is no longer reserved."""
    x, y, paths = npy_dataset(workdir)
    dl = loaderd.DataLoader(npy_spec(paths, epochs=1), socket=ld.socket, as_numpy=True, inflight=1)
    kept = None
    for b in dl:
        if b.index == 2:
            kept = b["x"]  # only one array of the batch
    del b
    gc.collect()
    ld.wait_for(lambda s: my_leases(s) == 1, "only the kept batch leased")
    assert ld.pipeline("arr")["slots_leased"] == 1
    np.testing.assert_array_equal(kept, x[32:48])
    del kept
    ld.wait_for(lambda s: my_leases(s) == 0, "the lease of the dropped batch")
    assert ld.pipeline("arr")["slots_leased"] == 0
    kept = None
    for b in dl:  # the finished pipeline: nothing more
        kept = b
    assert kept is None and dl.exhausted
    dl.close()
    dl2 = loaderd.DataLoader(npy_spec(paths, epochs=1, name="arr2"), socket=ld.socket,
                             as_numpy=True)
    keep2 = [b["y"] for b in dl2][3]
    dl2.close()
    del dl2
    ld.wait_for(lambda s: not s["clients"], "close() to detach at once")
    np.testing.assert_array_equal(keep2, y[48:64])
    del keep2


def test_batches_alive_at_close_stay_valid(ld, workdir):
    """close() detaches at once, but batches still alive keep their contents
    (libloader keeps them: private copies at the same addresses) while the
    daemon reuses the slots."""
    x, y, paths = npy_dataset(workdir)
    spec = npy_spec(paths, epochs=0, prefetch=2)  # 2 slots
    dl = loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True)
    it = iter(dl)
    kept = [next(it)["x"], next(it)["x"]]  # both slots
    del it
    base, size = dl.slab
    dl.close()
    assert not dl.__dict__.get("_att")
    with loaderd.DataLoader("arr", socket=ld.socket, as_numpy=True) as other:
        for e in range(3):  # the 2 slots are reused many times over
            for b in other:
                pass
    for i, a in enumerate(kept):
        np.testing.assert_array_equal(a, x[16 * i:16 * i + 16])
        assert base <= a.__array_interface__["data"][0] < base + size
        a[0] = -1  # a private copy (kept at detach), still writable
        np.testing.assert_array_equal(a[1:], x[16 * i + 1:16 * i + 16])


def test_lease_returns_when_dropped_and_on_release(ld, workdir):
    x, y, paths = npy_dataset(workdir)
    with loaderd.DataLoader(npy_spec(paths, epochs=1), socket=ld.socket, as_numpy=True,
                            inflight=1) as dl:
        it = iter(dl)
        held = [next(it) for _ in range(3)]
        arrays = [b["y"] for b in held]
        del held
        # three held plus the one that arrived for the request in flight
        ld.wait_for(lambda s: my_leases(s) == 4, "4 leases")
        del arrays[0]
        ld.wait_for(lambda s: my_leases(s) == 3, "3 leases")
        b = next(it)
        ld.wait_for(lambda s: my_leases(s) == 4, "4 leases")
        b.release()
        assert b.released
        b.release()  # twice is fine
        ld.wait_for(lambda s: my_leases(s) == 3, "3 leases")
        arrays.clear()
        ld.wait_for(lambda s: my_leases(s) == 1, "1 lease")
        del b, it
    ld.wait_for(lambda s: not s["clients"], "no client")
    assert ld.pipeline("arr")["slots_leased"] == 0


@needs_torch
def test_torch_tensor_keeps_batch(ld, workdir):
    x, y, paths = npy_dataset(workdir)
    with loaderd.DataLoader(npy_spec(paths, epochs=1), socket=ld.socket, inflight=1) as dl:
        t = next(iter(dl))["x"]
        gc.collect()
        ld.wait_for(lambda s: my_leases(s) == 2, "2 leases (1 kept, 1 arrived)")
        np.testing.assert_array_equal(t.numpy(), x[:16])
        t2 = t[3:5] * 2  # ops make new tensors
        v = t[3:5]        # views keep the batch
        del t
        gc.collect()
        # still held: libloader counts a release as it is made, before the
        # daemon hears of it (a sleep here could end before the daemon did)
        assert dl._att.held() == 1
        assert my_leases(ld.status()) == 2
        np.testing.assert_array_equal(v.numpy(), x[3:5])
        del v
        gc.collect()
        assert dl._att.held() == 0
        ld.wait_for(lambda s: my_leases(s) == 1, "1 lease")
        np.testing.assert_array_equal(t2.numpy(), x[3:5] * 2)


# ------------------------------------------------------------------- resume

@pytest.mark.parametrize("mode", ["partition", "broadcast"])
def test_state_dict_resume_equals_stream(ld, workdir, mode):
    """Interrupt at several points, resume in a new loader from state_dict()
    taken inside the loop: the batches are exactly those of the uninterrupted
    stream (test_epochs.py: a state taken after a loop was broken off)."""
    x, y, paths = npy_dataset(workdir, n=45)
    spec = npy_spec(paths, name="rs", batch_size=4, shuffle=True, seed=11, epochs=2)
    with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True, mode=mode) as full:
        ref = [(b.epoch, b.index, b["y"].copy()) for e in range(2) for b in full]
    assert len(ref) == 2 * 12
    for cut in (0, 5, 11, 12, 17):
        # a finished broadcast stream stays finished: a fresh pipeline per cut
        name = "rs" if mode == "partition" else f"rs{cut}"
        spec["name"] = name
        with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True, mode=mode) as a:
            it = iter(a)
            got = []
            for _ in range(cut):
                if len(got) == 12:
                    it = iter(a)  # the next epoch
                b = next(it)
                got.append((b.epoch, b.index, b["y"].copy()))
            state = a.state_dict()  # a checkpoint inside the loop: its iterator alive
            b = it = None
        # torchdata's shape: the batches of the epoch yielded (a private
        # stream: all 12 of it with its last batch in hand), loaderd's keys
        epoch, batch = (cut // 12 - 1, 12) if cut and cut % 12 == 0 and mode == "partition" \
            else (cut // 12, cut % 12)
        assert {k: state[k] for k in ("pipeline", "epoch", "batch", "rank", "world_size")} == \
            {"pipeline": name, "epoch": epoch, "batch": batch, "rank": 0, "world_size": 1}
        assert state["_num_yielded"] == batch and state["_iterator_finished"] is False
        with loaderd.DataLoader(name, socket=ld.socket, as_numpy=True, mode=mode) as b2:
            b2.load_state_dict(state)
            while len(got) < len(ref):
                n = len(got)
                got += [(b.epoch, b.index, b["y"].copy()) for b in b2]
                assert len(got) > n
        assert [(e, i) for e, i, _ in got] == [(e, i) for e, i, _ in ref]
        for (_, _, u), (_, _, v) in zip(got, ref):
            np.testing.assert_array_equal(u, v)


def test_state_dict_partition_rank(ld, workdir):
    x, y, paths = npy_dataset(workdir, n=60)
    spec = npy_spec(paths, name="pr", batch_size=5, shuffle=True, seed=2)
    kw = dict(socket=ld.socket, as_numpy=True, mode="partition", rank=1, world_size=3)
    with loaderd.DataLoader(spec, **kw) as dl:
        ref = collect(dl, "y")
    with loaderd.DataLoader(spec, **kw) as dl:
        it = iter(dl)
        first = [next(it)["y"].copy() for _ in range(2)]
        st = dl.state_dict()
    assert st["batch"] == 2 and st["rank"] == 1 and st["world_size"] == 3
    with loaderd.DataLoader(spec, **kw) as dl:
        dl.load_state_dict(st)
        rest = collect(dl, "y")
    np.testing.assert_array_equal(np.concatenate(first + [rest]), ref)
    # another rank of the same world: ranks in lockstep stand at one global
    # position, so rank 0 goes on from batch 2 of its own share
    kw0 = dict(kw, rank=0)
    with loaderd.DataLoader(spec, **kw0) as dl:
        ref0 = collect(dl, "y")
    with loaderd.DataLoader(spec, **kw0) as dl:
        dl.load_state_dict(st)
        assert len(dl) == 4
        np.testing.assert_array_equal(collect(dl, "y"), ref0[10:])


# ------------------------------------------------------------------- dtypes

@needs_torch
def test_torch_dtypes_and_shapes(ld, workdir):
    n = 10
    arrs = {
        "b": np.arange(n) % 3 == 0, "i1": np.arange(n, dtype=np.int8) - 5,
        "u1": np.arange(n, dtype=np.uint8), "i2": np.arange(n * 2, dtype=np.int16).reshape(n, 2),
        "i4": np.arange(n, dtype=np.int32), "i8": np.arange(n * 6, dtype=np.int64).reshape(n, 2, 3),
        "f2": np.linspace(0, 1, n).astype(np.float16), "f4": np.linspace(0, 1, n).astype(np.float32),
        "f8": np.linspace(0, 1, n), "u2": np.arange(n, dtype=np.uint16) + 60000,
        "u4": np.arange(n, dtype=np.uint32) + 4000000000,
    }
    paths = []
    for k, a in arrs.items():
        p = os.path.join(workdir, k + ".npy")
        np.save(p, a)
        paths.append(p)
    want = {"b": torch.bool, "i1": torch.int8, "u1": torch.uint8, "i2": torch.int16,
            "i4": torch.int32, "i8": torch.int64, "f2": torch.float16, "f4": torch.float32,
            "f8": torch.float64}
    spec = {"name": "dt", "source": {"kind": "npy", "paths": paths}, "batch_size": 4}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with loaderd.DataLoader(spec, socket=ld.socket) as dl:
            got = list(dl)
            for k in want:  # zero-copy for every dtype torch has
                assert in_slab(dl, got[0][k].data_ptr()), k
    for k, dt in want.items():
        assert got[0][k].dtype == dt, k
        assert tuple(got[0][k].shape) == (4,) + arrs[k].shape[1:]
        np.testing.assert_array_equal(torch.cat([b[k] for b in got]).numpy(), arrs[k])
    # unsigned 16/32-bit: no such torch dtype before torch 2.3: widened, by value
    for k in ("u2", "u4"):
        np.testing.assert_array_equal(torch.cat([b[k] for b in got]).numpy(), arrs[k])
    if not hasattr(torch, "uint16"):
        assert got[0]["u2"].dtype == torch.int32 and got[0]["u4"].dtype == torch.int64
    # numpy mode: every dtype as is, zero-copy
    with loaderd.DataLoader("dt", socket=ld.socket, as_numpy=True, mode="partition") as dl:
        got = list(dl)
    for k, a in arrs.items():
        assert got[0][k].dtype == a.dtype, k
        np.testing.assert_array_equal(np.concatenate([b[k] for b in got]), a)


# ------------------------------------------------------------------- errors

def test_error_not_found(ld):
    with pytest.raises(loaderd.NotFound) as ei:
        loaderd.DataLoader("nosuch", socket=ld.socket)
    assert ei.value.code == -2
    assert "nosuch" in str(ei.value)
    assert isinstance(ei.value, loaderd.Error) and isinstance(ei.value, LookupError)


def test_error_invalid_spec_has_daemon_message(ld, workdir):
    x, y, paths = npy_dataset(workdir)
    spec = npy_spec(paths)
    spec["shufle"] = True
    with pytest.raises(loaderd.InvalidSpec) as ei:
        loaderd.DataLoader(spec, socket=ld.socket)
    assert ei.value.code == -22
    assert 'spec: unknown key "shufle"' in str(ei.value)
    with pytest.raises(loaderd.Error, match="No such file"):
        loaderd.DataLoader(npy_spec([os.path.join(workdir, "missing.npy")]), socket=ld.socket)
    # attaching by name with settings that differ from the pipeline's
    with loaderd.DataLoader(npy_spec(paths), socket=ld.socket):
        with pytest.raises(loaderd.InvalidSpec, match="batch_size=8"):
            loaderd.DataLoader("arr", batch_size=8, socket=ld.socket)


def test_error_no_daemon(workdir):
    with pytest.raises(loaderd.Disconnected) as ei:
        loaderd.DataLoader("x", socket=os.path.join(workdir, "none.sock"))
    assert "none.sock" in str(ei.value)


def test_error_timeout(ld, workdir):
    x, y, paths = npy_dataset(workdir)
    with loaderd.DataLoader(npy_spec(paths, min_clients=2), socket=ld.socket, timeout=0.3,
                            mode="broadcast") as dl:
        t0 = time.monotonic()
        with pytest.raises(loaderd.Timeout) as ei:
            next(iter(dl))
        # not before the timeout; the upper bound only catches a wait that
        # never ends (generous: a loaded machine must not trip it)
        assert 0.25 < time.monotonic() - t0 < 30
        assert isinstance(ei.value, TimeoutError) and ei.value.code == -110


def test_daemon_dies_mid_epoch_raises_disconnected(workdir):
    from conftest import Daemon
    d = Daemon(workdir)
    x, y, paths = npy_dataset(workdir)
    # reconnect_timeout=0: no reconnecting (tests/integration/test_reconnect.py)
    dl = loaderd.DataLoader(npy_spec(paths, epochs=0), socket=d.socket, as_numpy=True,
                            reconnect_timeout=0)
    it = iter(dl)
    next(it)
    d.kill9()
    t0 = time.monotonic()
    with pytest.raises(loaderd.Disconnected):
        for _ in range(1000):
            b = next(dl.__iter__())  # batches already in flight may still come
    # at once, not after a reconnect time (60 s by default): generous, so
    # that a loaded machine does not trip it
    assert time.monotonic() - t0 < 30
    dl.close()


def test_torch_compat_arguments(ld, workdir):
    x, y, paths = npy_dataset(workdir)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = loaderd.DataLoader(npy_spec(paths), socket=ld.socket, num_workers=4, pin_memory=False,
                               persistent_workers=True, prefetch_factor=2)
        b = loaderd.DataLoader(npy_spec(paths), socket=ld.socket, num_workers=4)
    msgs = [str(x.message) for x in w]
    assert sum("num_workers" in m for m in msgs) <= 1  # once per process
    for m in ("pin_memory", "persistent_workers", "prefetch_factor"):
        assert sum(m in s for s in msgs) <= 1
    a.close()
    b.close()
    for bad in ("collate_fn", "worker_init_fn"):
        with pytest.raises(TypeError, match=bad):
            loaderd.DataLoader(npy_spec(paths), socket=ld.socket, **{bad: object()})
    # a sampler gives a spec's loader its order too (the daemon reads what it says)
    rev = list(range(99, -1, -7))
    with loaderd.DataLoader(npy_spec(paths), socket=ld.socket, as_numpy=True, batch_size=16,
                            sampler=rev) as dl:
        got = [int(v) for b in dl for v in b["y"]]
    assert got == rev
    with pytest.raises(TypeError, match="bogus"):
        loaderd.DataLoader(npy_spec(paths), socket=ld.socket, bogus=1)
    with pytest.raises(ValueError, match="cuda"):
        loaderd.DataLoader(npy_spec(paths), socket=ld.socket, device="cuda:0")


def test_progress_plain_and_pickle(ld, workdir):
    x, y, paths = npy_dataset(workdir)
    code = ("import loaderd, sys\n"
            "sys.modules['tqdm'] = None\n"  # no tqdm: the plain bar
            f"dl = loaderd.DataLoader({npy_spec(paths)!r}, socket={ld.socket!r}, progress=True, as_numpy=True)\n"
            "print(sum(b.rows for b in dl))\n")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "100"
    assert "7/7" in r.stderr and "arr epoch 0 [####" in r.stderr
    import pickle
    with loaderd.DataLoader("arr", socket=ld.socket) as dl:
        with pytest.raises(TypeError, match="create it in the process"):
            pickle.dumps(dl)


# ------------------------------------------------------------- fork, spawn

def test_forked_child_gets_forked_error(ld, workdir):
    x, y, paths = npy_dataset(workdir)
    dl = loaderd.DataLoader(npy_spec(paths, epochs=0), socket=ld.socket, as_numpy=True)
    kept = next(iter(dl))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 1
        try:
            try:
                next(iter(dl))
                msg = b"no error"
            except loaderd.ForkedError as e:
                msg = b"ForkedError:" + str(e).encode()
                code = 0
            except BaseException as e:
                msg = repr(e).encode()
            # the inherited batch is still readable; dropping it and the loader
            # must not touch the parent's connection
            np.testing.assert_array_equal(kept["y"], y[:16])
            del kept
            dl.close()
            gc.collect()
            os.write(w, msg)
        finally:
            os._exit(code)
    os.close(w)
    msg = os.read(r, 4096).decode()
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, msg
    assert "ForkedError" in msg and "fork" in msg
    # the parent's loader still works: the next `for` is the next epoch
    b = next(iter(dl))
    assert (b.epoch, b.index) == (1, 0)
    del kept, b
    dl.close()


def _spawn_worker(sock, spec, q):
    try:
        import loaderd as ldd
        with ldd.DataLoader(spec, socket=sock, as_numpy=True) as dl:
            q.put(sum(int(b["y"].sum()) for b in dl))
    except BaseException as e:
        q.put(repr(e))


def test_loader_created_in_spawned_child(ld, workdir):
    x, y, paths = npy_dataset(workdir)
    with loaderd.DataLoader(npy_spec(paths, epochs=0), socket=ld.socket) as dl:
        next(iter(dl))  # the parent uses its own loader too
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=_spawn_worker,
                        args=(ld.socket, npy_spec(paths, name="child", epochs=1), q))
        p.start()
        got = q.get(timeout=60)
        p.join(30)
        assert p.exitcode == 0
        assert got == int(y.sum())


FORK_SCRIPT = """
import multiprocessing as mp, sys
import loaderd
sock, spec = sys.argv[1], eval(sys.argv[2])

def work(q, i):
    spec["name"] = f"child{i}"
    with loaderd.DataLoader(spec, socket=sock, as_numpy=True) as dl:
        q.put(sum(int(b["y"].sum()) for b in dl))

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=work, args=(q, i)) for i in range(2)]
    for p in ps:
        p.start()
    # the parent connects after forking: fine
    with loaderd.DataLoader(spec, socket=sock, as_numpy=True) as dl:
        mine = sum(int(b["y"].sum()) for b in dl)
    got = sorted([q.get(timeout=60), q.get(timeout=60)])
    for p in ps:
        p.join(30)
    print(mine, got, [p.exitcode for p in ps])
    # a child forked now, after the parent used libloader, gets ForkedError
    def late(q):
        try:
            loaderd.DataLoader(spec, socket=sock)
            q.put("no error")
        except loaderd.ForkedError as e:
            q.put("ForkedError " + str(e))
    p = ctx.Process(target=late, args=(q,))
    p.start()
    print(q.get(timeout=60))
    p.join(30)
"""


def test_loaders_created_in_forked_children(ld, workdir):
    x, y, paths = npy_dataset(workdir)
    r = run_python(["-c", FORK_SCRIPT, ld.socket, repr(npy_spec(paths, epochs=1))], timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    s = int(y.sum())
    assert lines[0] == f"{s} [{s}, {s}] [0, 0]", r.stdout
    assert lines[1].startswith("ForkedError") and "spawn" in lines[1], r.stdout
