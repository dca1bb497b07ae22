# SPDX-License-Identifier: MIT
"""Helpers of the image tests: generated datasets, tar shards, references.

Images are generated at test time (small, few) with numpy and PIL. The
references are what torchvision's ImageFolder pipeline computes on PIL images
(docs/spec.md, "Image pipelines"): decode with PIL and .convert("RGB"), crop
and resize with PIL's bilinear filter, ToTensor (x / 255), Normalize.
"""

import io
import os
import subprocess
import tarfile

import numpy as np

from ldrtest import BUILD_DIR

IMAGE_PARAMS = os.path.join(BUILD_DIR, "tests", "unit", "sources", "image-params")

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def smooth_image(rng, h, w):
    """A photo-like RGB uint8 image: smooth gradients plus some noise and edges."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.empty((h, w, 3))
    for c in range(3):
        fx, fy, ph = rng.uniform(0.01, 0.08, 2).tolist() + [rng.uniform(0, 6.28)]
        img[..., c] = 127 + 90 * np.sin(x * fx + ph) * np.cos(y * fy)
    # a few rectangles: sharp edges exercise the filters
    for _ in range(3):
        y0, x0 = rng.integers(0, h), rng.integers(0, w)
        img[y0:y0 + h // 4, x0:x0 + w // 4] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def save_image(path, arr, fmt=None, **kw):
    from PIL import Image
    img = Image.fromarray(arr) if isinstance(arr, np.ndarray) else arr
    img.save(path, format=fmt, **kw)
    return path


def make_folder(root, classes, per_class, sizes, seed=0, fmt="JPEG", ext=".jpg", quality=90):
    """An ImageFolder tree; returns the sorted list of (path, label) as
    torchvision's ImageFolder orders it."""
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    out = []
    k = 0
    for ci, cls in enumerate(classes):
        d = os.path.join(root, cls)
        os.makedirs(d, exist_ok=True)
        for i in range(per_class):
            h, w = sizes[k % len(sizes)]
            k += 1
            p = os.path.join(d, f"img{i:03d}{ext}")
            kw = {"quality": quality} if fmt == "JPEG" else {}
            save_image(p, smooth_image(rng, h, w), fmt, **kw)
    return folder_samples(root)


def folder_samples(root):
    """(path, label) in torchvision ImageFolder's order."""
    from torchvision.datasets import ImageFolder
    ds = ImageFolder(root)
    return list(ds.samples)


def pil_rgb(path):
    from PIL import Image
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def write_shard_tarfile(path, members, fmt):
    """A tar with Python's tarfile; members: [(name, bytes)]."""
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mtime = 1700000000
            tf.addfile(ti, io.BytesIO(data))
    return path


def write_shard_gnutar(path, members, workdir, fmt="gnu"):
    """A tar made by GNU tar from files written under @workdir."""
    src = os.path.join(workdir, "gnutar-src-" + os.path.basename(path))
    names = []
    for name, data in members:
        p = os.path.join(src, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        names.append(name)
    subprocess.run(["tar", "--format=" + fmt, "-cf", path, "-C", src, "--no-recursion"] + names,
                   check=True)
    return path


def wds_members(samples, key_prefix="", long_dirs=False):
    """WebDataset members (key.ext image, key.cls label) for (path, label)s."""
    out = []
    for i, (path, label) in enumerate(samples):
        ext = os.path.splitext(path)[1].lower()
        key = f"{key_prefix}s{i:05d}"
        if long_dirs:
            key = "d" * 60 + "/" + "e" * 60 + "/" + key + "_" + "x" * 40
        with open(path, "rb") as f:
            out.append((key + ext, f.read()))
        out.append((key + ".cls", str(label).encode()))
    return out


def image_spec(name, source, transforms, dtype="float32", layout="NCHW", **kw):
    spec = {"name": name, "source": source, "transforms": transforms,
            "output": {"dtype": dtype, "layout": layout}}
    spec.update(kw)
    return spec


def parse_image_dump(dump, rows_per_batch, shape, dtype):
    """[(images [rows, *shape], labels [rows])] of an image pipeline's dump."""
    dt = np.dtype(dtype)
    per = int(np.prod(shape)) * dt.itemsize
    out = []
    pos = 0
    for rows in rows_per_batch:
        imgs = np.frombuffer(dump, dtype=dt, count=rows * int(np.prod(shape)), offset=pos)
        pos += rows * per
        labels = np.frombuffer(dump, dtype=np.int64, count=rows, offset=pos)
        pos += rows * 8
        out.append((imgs.reshape((rows,) + tuple(shape)), labels))
    assert pos == len(dump), f"dump has {len(dump) - pos} bytes after the expected batches"
    return out


def all_images(dump, nsamples, batch_size, shape, dtype):
    rows = [batch_size] * (nsamples // batch_size)
    if nsamples % batch_size:
        rows.append(nsamples % batch_size)
    parts = parse_image_dump(dump, rows, shape, dtype)
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def tv_pipeline(ops):
    """The torchvision transform of a spec's transforms list (PIL input), up
    to ToTensor/Normalize; returns (transform, normalize or None)."""
    import torchvision.transforms as T
    tl = []
    norm = None
    for op in ops:
        kind = op["op"]
        if kind == "resize":
            tl.append(T.Resize(op["size"], interpolation=T.InterpolationMode.BILINEAR))
        elif kind == "center_crop":
            tl.append(T.CenterCrop(op["size"]))
        elif kind == "normalize":
            norm = T.Normalize(op["mean"], op["std"])
        else:
            raise ValueError(kind)
    return T.Compose(tl), norm


def tv_reference(path, ops, dtype="float32"):
    """torchvision's output for a file, as numpy CHW (float32) or HWC uint8."""
    import torch
    import torchvision.transforms.functional as F
    from PIL import Image
    tf, norm = tv_pipeline(ops)
    with Image.open(path) as im:
        out = tf(im.convert("RGB"))
    if dtype == "uint8":
        return np.asarray(out)
    t = F.to_tensor(out)
    if norm is not None:
        t = norm(t)
    return t.numpy().astype(np.float32)


def image_params(h, w, size, scale, ratio, seed, epoch, first, count, flip_p=None):
    """Our random_resized_crop (and flip) draws, from build/tests/unit/sources/image-params:
    rows of [index, top, left, height, width(, flip)]."""
    cmd = [IMAGE_PARAMS, str(h), str(w), str(size), str(scale[0]), str(scale[1]),
           str(ratio[0]), str(ratio[1]), str(seed), str(epoch), str(first), str(count)]
    if flip_p is not None:
        cmd.append(str(flip_p))
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return np.loadtxt(io.StringIO(r.stdout), dtype=np.int64, ndmin=2)
