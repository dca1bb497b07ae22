# SPDX-License-Identifier: MIT
"""Batches behave like torch's: libloader maps the slab copy-on-write, so a
trainer may modify a batch in place (nanoGPT's masking, timm's Mixup and
CutMix, in-place normalisation) and gets exactly what torch gives on a copy;
the daemon, other loaders and the slot's later batches never see it.

Expected contents are computed here from the files (tokens, PNG pixels),
not from other loaders."""

import os

import numpy as np
import pytest

import loaderd
from conftest import run_python
from test_batch import image_folder, image_spec
from test_epochs import epoch_order

torch = pytest.importorskip("torch")

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def small_vocab_tokens(d, ntok=6000, vocab=8, seed=2):
    t = np.random.default_rng(seed).integers(0, vocab, size=ntok).astype(np.uint16)
    p = os.path.join(d, "tok.bin")
    t.tofile(p)
    return t, p


def tok_spec(p, name="tok", L=16, B=8, **kw):
    s = {"name": name, "source": {"kind": "tokens", "path": p, "seq_len": L}, "batch_size": B}
    s.update(kw)
    return s


def expect_tokens(t, ids, L):
    x = np.stack([t[i * L:i * L + L] for i in ids]).astype(np.int64)
    y = np.stack([t[i * L + 1:i * L + L + 1] for i in ids]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def expect_images(samples, ids):
    x = np.stack([samples[i][0].transpose(2, 0, 1) for i in ids]).astype(np.float32) / np.float32(255)
    return torch.from_numpy(x), torch.tensor([samples[i][1] for i in ids], dtype=torch.int64)


def require_cow(*loaders):
    """Fail (not crash: a write into a read-only page is SIGSEGV) when this
    libloader maps the slab read-only."""
    for dl in loaders:
        assert dl.writable, "libloader maps the slab read-only: batches cannot be written"


# timm.data.mixup (Apache-2.0), the in-place parts as timm writes them
def mixup_(x, lam):
    x_flipped = x.flip(0).mul_(1. - lam)
    x.mul_(lam).add_(x_flipped)


def cutmix_(x, yl, yh, xl, xh):
    x[:, :, yl:yh, xl:xh] = x.flip(0)[:, :, yl:yh, xl:xh]


NO_WARNING = r"""
import sys, warnings
warnings.simplefilter("error")   # torch's "non-writable" warning would raise
import numpy as np, torch, loaderd
spec = eval(sys.argv[2])
with loaderd.DataLoader(spec, socket=sys.argv[1]) as dl, \
        loaderd.DataLoader(spec, socket=sys.argv[1], as_numpy=True) as dn:
    assert dl.writable and dn.writable
    x, y = next(iter(dl))
    a, b = next(iter(dn))
    assert a.flags.writeable and a.__array_interface__["data"][1] is False
    a[0] = 7
    x.add_(1)            # no SIGSEGV, no warning
    y[0, 0] = -5
    assert y[0, 0].item() == -5
print("ok")
"""


def test_batches_are_writable_without_a_warning(ld, workdir):
    t, p = small_vocab_tokens(workdir)
    r = run_python(["-c", NO_WARNING, ld.socket, repr(tok_spec(p))])
    assert r.returncode == 0, f"rc {r.returncode}\n{r.stderr}"
    assert r.stdout.strip() == "ok"


def test_nanogpt_masking(ld, workdir):
    """y[y == pad] = -1 (F.cross_entropy(..., ignore_index=-1)) on the
    batch equals the same on a copy; later epochs see the file's tokens."""
    L, B, pad = 16, 8, 3
    t, p = small_vocab_tokens(workdir)
    n = (len(t) - 1) // L
    with loaderd.DataLoader(tok_spec(p, L=L, B=B, shuffle=True, seed=4, prefetch=3),
                            socket=ld.socket) as dl:
        require_cow(dl)
        for epoch in range(3):
            for (x, y), ids in zip(dl, epoch_order(n, B, epoch, seed=4)):
                wx, wy = expect_tokens(t, ids, L)
                assert torch.equal(x, wx) and torch.equal(y, wy)
                ref = y.clone()
                ref[ref == pad] = -1
                y[y == pad] = -1
                assert torch.equal(y, ref) and (y == -1).any()
                x[x == pad] = -1


def test_timm_mixup_cutmix_normalize_in_place(ld, workdir):
    """timm's Mixup (x.mul_(lam).add_(x.flip(0).mul_(1 - lam))), CutMix
    (slice assignment from x.flip(0)) and x.sub_(mean).div_(std) on the
    batch tensor give bit for bit what they give on a clone."""
    root = os.path.join(workdir, "imgs")
    samples = image_folder(root, per_class=8, hw=16)
    n, B = len(samples), 4
    spec = image_spec(root, hw=16, shuffle=True, seed=9, prefetch=3, batch_size=B)
    rng = np.random.default_rng(0)
    with loaderd.DataLoader(spec, socket=ld.socket) as dl:
        require_cow(dl)
        for epoch in range(4):
            for i, ((x, target), ids) in enumerate(zip(dl, epoch_order(n, B, epoch, seed=9))):
                wx, wt = expect_images(samples, ids)
                assert torch.equal(x, wx) and torch.equal(target, wt)
                ref = x.clone()
                which = (epoch + i) % 3
                if which == 0:
                    lam = float(rng.beta(0.8, 0.8))
                    mixup_(x, lam)
                    mixup_(ref, lam)
                elif which == 1:
                    yl, xl = rng.integers(0, 8, 2)
                    cutmix_(x, yl, yl + 8, xl, xl + 8)
                    cutmix_(ref, yl, yl + 8, xl, xl + 8)
                else:
                    x.sub_(MEAN).div_(STD)
                    ref.sub_(MEAN).div_(STD)
                assert torch.equal(x, ref)
                assert not torch.equal(x, wx)


def test_other_broadcast_loader_sees_the_original(ld, workdir):
    """Two broadcast loaders of one pipeline in one process: what one writes
    into its batch, the other never sees (nor the daemon: the next epochs)."""
    L, B = 16, 8
    t, p = small_vocab_tokens(workdir)
    n = (len(t) - 1) // L
    spec = tok_spec(p, name="bc", L=L, B=B, min_clients=2, prefetch=4)
    a = loaderd.DataLoader(spec, socket=ld.socket, mode="broadcast", timeout=20)
    b = loaderd.DataLoader(spec, socket=ld.socket, mode="broadcast", timeout=20)
    require_cow(a, b)
    for epoch in range(2):
        for (xa, ya), (xb, yb), ids in zip(a, b, epoch_order(n, B, epoch, shuffle=False)):
            wx, wy = expect_tokens(t, ids, L)
            assert torch.equal(xa, wx)
            xa.fill_(-9)
            ya.mul_(1000)
            assert (xa == -9).all()
            assert torch.equal(xb, wx) and torch.equal(yb, wy)
            xb.add_(100)
            assert (xa == -9).all()  # nor does b's write reach a
    a.close()
    b.close()


def test_written_batches_come_back_clean(ld, workdir):
    """Scribble over every batch, drop it, and its slot's later batches are
    the file's data again: 2 slots reused for 5 epochs of a shuffled stream,
    every batch compared, numpy and torch."""
    L, B = 16, 8
    t, p = small_vocab_tokens(workdir)
    n = (len(t) - 1) // L
    for as_numpy in (False, True):
        spec = tok_spec(p, name=f"reuse{int(as_numpy)}", L=L, B=B, shuffle=True, seed=1,
                        prefetch=2)
        with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=as_numpy) as dl:
            require_cow(dl)
            count = 0
            for epoch in range(5):
                for (x, y), ids in zip(dl, epoch_order(n, B, epoch, seed=1)):
                    wx, wy = expect_tokens(t, ids, L)
                    np.testing.assert_array_equal(np.asarray(x), wx.numpy())
                    np.testing.assert_array_equal(np.asarray(y), wy.numpy())
                    if as_numpy:
                        x[:] = -1
                        y[::2] = 12345
                    else:
                        x.fill_(-1)
                        y[::2] = 12345
                    count += 1
                # a loop broken off mid-epoch: written batches dropped at re-attach
                for i, (x, y) in enumerate(dl):
                    x[:] = -2  # numpy and torch alike
                    if i == 1:
                        break
                x = y = None
                dl.set_epoch(epoch + 1)
            assert count == 5 * len(dl)
