# SPDX-License-Identifier: MIT
"""Keeping batches is unlimited (docs/python.md, "Keeping batches"): when the
batches a trainer holds reach its share of the pipeline's slots, the oldest
are kept (copied to private memory at the same addresses, only the fields
still alive) and their slots go back, with one warning per loader. So
`list(loader)` and an eval loop's `targets.append(y)` work, every kept batch
exact, and a kept label tensor does not copy its batch's images."""

import gc
import os
import re
import warnings

import numpy as np
import pytest

import loaderd
from test_epochs import epoch_order

try:
    import torch
except Exception:  # pragma: no cover
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="python3-torch is not installed")


def dataset(d, n, shape=(3, 8, 8)):
    x = (np.arange(n * int(np.prod(shape)), dtype=np.float32).reshape((n,) + shape) % 1009)
    y = np.arange(n, dtype=np.int64) * 7
    xp, yp = os.path.join(d, "x.npy"), os.path.join(d, "y.npy")
    np.save(xp, x)
    np.save(yp, y)
    return x, y, [xp, yp]


def spec(paths, name="keep", **kw):
    s = {"name": name, "source": {"kind": "npy", "paths": paths}, "batch_size": 16,
         "shuffle": True, "seed": 5}
    s.update(kw)
    return s


def check(b, x, y, ids):
    np.testing.assert_array_equal(np.asarray(b["x"]), x[ids])
    np.testing.assert_array_equal(np.asarray(b["y"]), y[ids])


def kept_warnings(w):
    return [str(m.message) for m in w if "out of shared memory so that" in str(m.message)]


def my_leases(ld):
    return sum(c["leases"] for c in ld.status()["clients"] if c["pid"] == os.getpid())


def test_list_of_a_100_batch_epoch_with_8_slots(ld, workdir):
    n = 1600
    x, y, paths = dataset(workdir, n)
    with loaderd.DataLoader(spec(paths, prefetch=8), socket=ld.socket, as_numpy=True,
                            timeout=20) as dl:
        assert len(dl) == 100
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            batches = list(dl)
            assert my_leases(ld) <= 8  # the kept ones gave their slots back
            again = list(dl)  # epoch 1: no second warning
        msgs = kept_warnings(w)
        assert len(msgs) == 1, msgs
        m = re.search(r"share of the slots \((\d+)\): it copied (\d+) batches \(", msgs[0])
        assert m and int(m.group(1)) == 8 and 80 <= int(m.group(2)) <= 100, msgs[0]
        assert "prefetch" in msgs[0] and "clone()" in msgs[0]
        for e, got in ((0, batches), (1, again)):
            order = epoch_order(n, 16, e, seed=5)
            assert [b.index for b in got] == list(range(100))
            for b, ids in zip(got, order):
                check(b, x, y, ids)
        assert sum(b.kept for b in batches) >= 80
        del batches, again, b, got
        gc.collect()
        ld.wait_for(lambda s: sum(c["leases"] for c in s["clients"]) <= 8, "leases back")


def test_the_warning_names_the_trainers_line(ld, workdir):
    """The one warning points at the trainer's own code (its file and line),
    whether it hoards through next_batch() or a `for` loop."""
    x, y, paths = dataset(workdir, 640)
    for how in ("next_batch", "for"):
        with loaderd.DataLoader(spec(paths, name="kw" + how, prefetch=4), socket=ld.socket,
                                as_numpy=True, timeout=20) as dl:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                if how == "next_batch":
                    held = [dl.next_batch() for _ in range(12)]
                else:
                    held = [b for b in dl]
            [m] = [m for m in w if "out of shared memory so that" in str(m.message)]
            assert m.filename == __file__, (how, m.filename, m.lineno)
            assert len(held) == (12 if how == "next_batch" else 40)
            del held


@needs_torch
def test_eval_loop_keeps_only_the_labels(ld, workdir):
    """pytorch/examples' validate(): outputs and targets appended over an
    epoch. Only the label fields are copied, never the images."""
    n = 480
    x, y, paths = dataset(workdir, n, shape=(3, 32, 32))  # 192 KiB of x per batch
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 4))
    with loaderd.DataLoader(spec(paths, name="eval", prefetch=4, shuffle=False),
                            socket=ld.socket, timeout=20) as dl:
        targets, outputs = [], []
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with torch.no_grad():
                for images, target in dl:
                    outputs.append(model(images))
                    targets.append(target)
        [msg] = kept_warnings(w)
        nkept, nbytes = dl._att.kept()
        assert nkept >= len(dl) - 4
        # a label field is 128 bytes (a page or two copied); an image field 192 KiB
        assert nbytes <= nkept * 2 * 4096, (nkept, nbytes)
        assert f"copied {nkept} batches" in msg
        assert torch.equal(torch.cat(targets), torch.from_numpy(y))
        # the model on the same batches (torch >= 2's CPU matmul rounds
        # differently for 480 rows than for 16 at a time)
        ref = torch.cat([model(torch.from_numpy(x[i:i + 16]).clone()) for i in range(0, n, 16)])
        assert torch.equal(torch.cat(outputs), ref)


@needs_torch
def test_one_kept_label_does_not_pin_its_batch(ld, workdir):
    """A label tensor kept from each batch: the images' slots are reused
    (the loop never stalls with 3 slots for 30 batches), labels exact."""
    n = 480
    x, y, paths = dataset(workdir, n, shape=(3, 16, 16))
    with loaderd.DataLoader(spec(paths, name="lab", prefetch=3), socket=ld.socket,
                            timeout=20) as dl:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            labels = [yb for _, yb in dl]
        order = epoch_order(n, 16, 0, seed=5)
        for lab, ids in zip(labels, order):
            np.testing.assert_array_equal(lab.numpy(), y[ids])
        assert my_leases(ld) <= 3


@needs_torch
def test_a_kept_batch_keeps_what_was_written(ld, workdir):
    n = 160
    x, y, paths = dataset(workdir, n)
    with loaderd.DataLoader(spec(paths, name="wr", prefetch=2, shuffle=False),
                            socket=ld.socket, timeout=20) as dl:
        assert dl.writable
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            held = []
            for b in dl:
                b["x"].mul_(-1)
                b["y"][0] = -1
                held.append(b)
        assert held[0].kept and len(held) == 10
        for i, b in enumerate(held):
            want_y = y[16 * i:16 * i + 16].copy()
            want_y[0] = -1
            np.testing.assert_array_equal(b["x"].numpy(), -x[16 * i:16 * i + 16])
            np.testing.assert_array_equal(b["y"].numpy(), want_y)
        del held, b
        # what the trainer wrote is gone once released: the next epoch is clean
        for i, (xb, yb) in enumerate(dl):
            np.testing.assert_array_equal(xb.numpy(), x[16 * i:16 * i + 16])
            np.testing.assert_array_equal(yb.numpy(), y[16 * i:16 * i + 16])


def test_batches_kept_across_break_reattach_and_close(ld, workdir):
    """Batches held when a loop is broken off (the next `for` re-attaches)
    and when the loader closes stay exact while the slots are reused."""
    n = 320
    x, y, paths = dataset(workdir, n)
    dl = loaderd.DataLoader(spec(paths, name="ra", prefetch=4), socket=ld.socket,
                            as_numpy=True, timeout=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = []
        for b in dl:
            first.append(b)
            if len(first) == 6:
                break
        second = list(dl)  # a new stream at (1, 0): the first's batches kept at detach
    dl.close()
    with loaderd.DataLoader("ra", socket=ld.socket, as_numpy=True) as other:
        for e in range(3):  # the 4 slots are refilled many times
            for b in other:
                pass
    for e, got in ((0, first), (1, second)):
        for b, ids in zip(got, epoch_order(n, 16, e, seed=5)):
            check(b, x, y, ids)
    assert len(second) == 20


def test_no_copy_when_nothing_is_hoarded(ld, workdir):
    """A plain training loop (the previous batch alive while the next is
    asked for) copies nothing and says nothing."""
    n = 320
    x, y, paths = dataset(workdir, n)
    with loaderd.DataLoader(spec(paths, name="plain", prefetch=4), socket=ld.socket,
                            as_numpy=True, timeout=20) as dl:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for e in range(3):
                prev = None
                for b, ids in zip(dl, epoch_order(n, 16, e, seed=5)):
                    check(b, x, y, ids)
                    prev = b  # noqa: F841  (nanoGPT holds X, Y while fetching the next)
        assert dl._att.kept() == (0, 0)
