# SPDX-License-Identifier: MIT
"""A Batch unpacks as torch's (input, target) batches do: iterating it gives
the fields' values in the source's field order (tokens: input, target; npy:
the order of paths; images: image, label), and it stays a dict of name ->
tensor. progress=True with tqdm present and absent."""

import os
import pickle

import numpy as np
import pytest

import loaderd
from conftest import run_python

try:
    import torch
except Exception:  # pragma: no cover
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="python3-torch is not installed")


def tokens(d, ntok=5000, seed=1):
    t = np.random.default_rng(seed).integers(0, 50000, size=ntok).astype(np.uint16)
    p = os.path.join(d, "tok.bin")
    t.tofile(p)
    return t, p


def image_folder(root, classes=("cat", "dog"), per_class=5, hw=12, seed=0):
    """PNG images of exactly hw x hw (a center_crop of that size keeps every
    pixel): samples in torchvision ImageFolder's order, with their pixels."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    out = []
    for ci, c in enumerate(classes):
        os.makedirs(os.path.join(root, c))
        for i in range(per_class):
            px = rng.integers(0, 256, size=(hw, hw, 3), dtype=np.uint8)
            Image.fromarray(px).save(os.path.join(root, c, f"{i:03d}.png"))
            out.append((px, ci))
    return out


def image_spec(root, name="img", hw=12, **kw):
    s = {"name": name, "source": {"kind": "image_folder", "path": root},
         "transforms": [{"op": "center_crop", "size": hw}],
         "output": {"dtype": "float32", "layout": "NCHW"}, "batch_size": 4}
    s.update(kw)
    return s


@needs_torch
def test_for_x_y_in_loader_tokens(ld, workdir):
    t, p = tokens(workdir)
    L, B = 32, 8
    spec = {"name": "tok", "source": {"kind": "tokens", "path": p, "seq_len": L},
            "batch_size": B}
    with loaderd.DataLoader(spec, socket=ld.socket) as dl:
        n = 0
        for x, y in dl:
            assert isinstance(x, torch.Tensor) and x.dtype == torch.int64
            for r in range(x.shape[0]):
                i = n + r
                np.testing.assert_array_equal(x[r].numpy(), t[i * L:i * L + L])
                np.testing.assert_array_equal(y[r].numpy(), t[i * L + 1:i * L + L + 1])
            n += x.shape[0]
        assert n == (len(t) - 1) // L
        batch = next(iter(dl))
        x, y = batch
        assert x is batch["input"] and y is batch["target"]
        assert list(batch.keys()) == ["input", "target"]
        assert [k for k, _ in batch.items()] == ["input", "target"]
        assert list(batch) == [x, y] and len(batch) == 2
        assert "input" in batch and "image" not in batch
        d = dict(batch)
        assert type(d) is dict and list(d) == ["input", "target"] and d["input"] is x
        assert {**batch}.keys() == d.keys()
        plain = pickle.loads(pickle.dumps(batch))
        assert type(plain) is dict and list(plain) == ["input", "target"]
        assert torch.equal(plain["target"], y)


def test_for_x_y_in_loader_npy_follows_paths(ld, workdir):
    n = 40
    a = np.arange(n, dtype=np.int64) * 10
    b = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    pa, pb = os.path.join(workdir, "zeta.npy"), os.path.join(workdir, "alpha.npy")
    np.save(pa, a)
    np.save(pb, b)
    # the order of paths, not of names: zeta before alpha
    spec = {"name": "npy", "source": {"kind": "npy", "paths": [pa, pb]}, "batch_size": 16}
    with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True) as dl:
        got_a, got_b = [], []
        for first, second in dl:
            got_a.append(np.array(first))
            got_b.append(np.array(second))
        np.testing.assert_array_equal(np.concatenate(got_a), a)
        np.testing.assert_array_equal(np.concatenate(got_b), b)
        batch = next(iter(dl))
        assert list(batch.keys()) == ["zeta", "alpha"]
    three = os.path.join(workdir, "w.npy")
    np.save(three, np.ones(n, np.int8))
    spec = {"name": "npy3", "source": {"kind": "npy", "paths": [pb, three, pa]}, "batch_size": 16}
    with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True) as dl:
        for i, (x, w, z) in enumerate(dl):
            np.testing.assert_array_equal(z, a[16 * i:16 * i + 16])
            assert w.dtype == np.int8 and x.shape[1:] == (2,)


@needs_torch
def test_for_images_labels_in_loader(ld, workdir):
    root = os.path.join(workdir, "imgs")
    samples = image_folder(root)
    with loaderd.DataLoader(image_spec(root), socket=ld.socket) as dl:
        k = 0
        for images, labels in dl:
            assert images.dtype == torch.float32 and tuple(images.shape[1:]) == (3, 12, 12)
            assert labels.dtype == torch.int64
            for r in range(images.shape[0]):
                px, label = samples[k]
                want = px.transpose(2, 0, 1).astype(np.float32) / np.float32(255)
                np.testing.assert_array_equal(images[r].numpy(), want)
                assert labels[r].item() == label
                k += 1
        assert k == len(samples)
        assert list(next(iter(dl)).keys()) == ["image", "label"]


PROGRESS = r"""
import sys
if sys.argv[3] == "absent":
    sys.modules["tqdm"] = None   # import tqdm fails: the plain bar
else:
    import tqdm                  # must be installed for this case
import loaderd
spec = eval(sys.argv[2])
with loaderd.DataLoader(spec, socket=sys.argv[1], progress=True, as_numpy=True) as dl:
    rows = sum(b.rows for b in dl)          # epoch 0, whole
    for i, (x, y) in enumerate(dl):          # epoch 1, broken off
        if i == 2:
            break
    n = len([b for b in dl])                 # epoch 2, whole
print(rows, n)
"""


@pytest.mark.parametrize("tqdm", ["present", "absent"])
def test_progress(ld, workdir, tqdm):
    if tqdm == "present":
        pytest.importorskip("tqdm")
    n = 100
    xp, yp = os.path.join(workdir, "x.npy"), os.path.join(workdir, "y.npy")
    np.save(xp, np.zeros((n, 2), np.float32))
    np.save(yp, np.arange(n))
    spec = {"name": "arr", "source": {"kind": "npy", "paths": [xp, yp]}, "batch_size": 16}
    r = run_python(["-c", PROGRESS, ld.socket, repr(spec), tqdm])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["100", "7"]
    assert "TypeError" not in r.stderr
    for e in (0, 1, 2):
        assert f"arr epoch {e}" in r.stderr, r.stderr
    assert "7/7" in r.stderr
    if tqdm == "present":
        assert "batch/s" in r.stderr or "it/s" in r.stderr or "s/batch" in r.stderr
        assert "arr epoch 0: 100%" in r.stderr, r.stderr  # tqdm's own format
    else:
        assert "arr epoch 0 [####" in r.stderr
