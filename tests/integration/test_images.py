# SPDX-License-Identifier: MIT
"""Image pipelines (image_folder, webdataset): decoding against PIL,
transforms against torchvision, random crops by (seed, epoch, index), tar
shards from GNU tar and Python's tarfile, and bad files under both policies.

Every image is generated here, small and few, so that the suite stays fast
under the sanitizers too."""

import io
import os
import tarfile

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
from PIL import Image  # noqa: E402

from imgtest import (MEAN, STD, all_images, folder_samples, image_params, image_spec,  # noqa: E402
                     make_folder, pil_rgb, save_image, smooth_image, tv_reference, wds_members,
                     write_shard_gnutar, write_shard_tarfile)

NORM = {"op": "normalize", "mean": MEAN, "std": STD}
EXACT = {"dct_scaling": False}


def consume_images(ld, spec, n, shape, dtype, *args):
    ld.create(spec)
    res = ld.consume(spec["name"], *args)
    return all_images(res.dump, n, spec.get("batch_size", 32), shape, dtype)


def folder_source(root):
    return {"kind": "image_folder", "path": root}


# ------------------------------------------------------------------ decoding

def decode_cases(root, rng):
    """One class folder per case: (name, file, PIL-compatible expectation)."""
    h, w = 20, 24
    rgb = smooth_image(rng, h, w)
    cases = []

    def add(name, ext, writer):
        d = os.path.join(root, name)
        os.makedirs(d)
        p = os.path.join(d, "x" + ext)
        writer(p)
        cases.append((name, p))

    add("jpeg444", ".jpg", lambda p: save_image(p, rgb, "JPEG", quality=90, subsampling=0))
    add("jpeg420", ".jpg", lambda p: save_image(p, rgb, "JPEG", quality=75, subsampling=2))
    add("jpegprog", ".jpeg", lambda p: save_image(p, rgb, "JPEG", quality=90, progressive=True))
    add("jpeggray", ".JPG", lambda p: save_image(p, Image.fromarray(rgb).convert("L"), "JPEG"))
    add("jpegcmyk", ".jpg", lambda p: save_image(p, Image.fromarray(rgb).convert("CMYK"), "JPEG"))
    add("pngrgb", ".png", lambda p: save_image(p, rgb, "PNG"))
    rgba = np.dstack([rgb, rng.integers(0, 256, (h, w), dtype=np.uint8)])
    add("pngrgba", ".png", lambda p: save_image(p, Image.fromarray(rgba, "RGBA"), "PNG"))
    add("pnggray", ".png", lambda p: save_image(p, Image.fromarray(rgb).convert("L"), "PNG"))
    add("pngla", ".png", lambda p: save_image(p, Image.fromarray(rgba, "RGBA").convert("LA"), "PNG"))
    add("pngbits", ".png", lambda p: save_image(p, Image.fromarray(rgb).convert("1"), "PNG"))
    pal = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    add("pngpal", ".png", lambda p: save_image(p, pal, "PNG"))
    add("pngpaltrns", ".png", lambda p: save_image(p, pal, "PNG", transparency=3))
    add("pnginterlaced", ".png", lambda p: _save_interlaced(p, rgb))
    add("png16", ".png", lambda p: _save_png16(p, rgb, rng))
    return cases


def _save_png16(path, rgb, rng):
    """A 16-bit RGB PNG: PIL reads it as its high bytes."""
    import struct
    import zlib
    h, w, _ = rgb.shape
    px = rgb.astype(">u2") * 256 + rng.integers(0, 256, rgb.shape).astype(">u2")
    raw = b"".join(b"\x00" + px[y].tobytes() for y in range(h))

    def chunk(t, data):
        return struct.pack(">I", len(data)) + t + data + struct.pack(">I", zlib.crc32(t + data))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _save_interlaced(path, rgb):
    """An Adam7-interlaced PNG (PIL cannot write one; built by hand)."""
    import struct
    import zlib
    h, w, _ = rgb.shape
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
              (0, 1, 1, 2)]
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = rgb[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        raw += b"".join(b"\x00" + sub[y].tobytes() for y in range(sub.shape[0]))

    def chunk(t, data):
        return struct.pack(">I", len(data)) + t + data + struct.pack(">I", zlib.crc32(t + data))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1)) +
                chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_decode_matches_pil(ld, workdir):
    root = os.path.join(workdir, "dec")
    cases = decode_cases(root, np.random.default_rng(1))
    samples = folder_samples(root)
    spec = image_spec("dec", folder_source(root), [{"op": "center_crop", "size": [20, 24]}],
                      dtype="uint8", layout="NHWC", decode=EXACT, on_error="fail")
    imgs, labels = consume_images(ld, spec, len(samples), (20, 24, 3), "uint8")
    assert labels.tolist() == [lab for _, lab in samples]
    for i, (path, _) in enumerate(samples):
        want = pil_rgb(path)
        got = imgs[i]
        assert np.array_equal(got, want), (
            f"{path}: differs from PIL in {np.count_nonzero(got != want)} values, "
            f"max {np.abs(got.astype(int) - want).max()}")


# ---------------------------------------------------------------- transforms

TRANSFORM_CASES = {
    "resize-center": [{"op": "resize", "size": 20}, {"op": "center_crop", "size": 16}],
    "resize-hw": [{"op": "resize", "size": [13, 29]}],
    "upscale": [{"op": "resize", "size": 90}, {"op": "center_crop", "size": [80, 70]}],
    "pad": [{"op": "center_crop", "size": [70, 45]}],
    "crop-resize": [{"op": "center_crop", "size": 30}, {"op": "resize", "size": 11}],
    "two-resizes": [{"op": "resize", "size": [33, 41]}, {"op": "resize", "size": 17},
                    {"op": "center_crop", "size": 15}],
}


@pytest.mark.parametrize("case", sorted(TRANSFORM_CASES))
@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_transforms_match_torchvision(ld, workdir, case, dtype):
    root = os.path.join(workdir, "tf")
    samples = make_folder(root, ["a", "b"], 2, [(40, 50), (37, 61), (64, 31), (55, 55)], seed=2)
    ops = list(TRANSFORM_CASES[case])
    if dtype != "uint8":
        ops.append(NORM)
    first = tv_reference(samples[0][0], ops, dtype)
    layout = "NHWC" if dtype == "uint8" else "NCHW"
    spec = image_spec("tf", folder_source(root), ops, dtype=dtype, layout=layout, decode=EXACT)
    imgs, labels = consume_images(ld, spec, len(samples), first.shape, dtype)
    assert labels.tolist() == [lab for _, lab in samples]
    for i, (path, _) in enumerate(samples):
        want = tv_reference(path, ops, dtype).astype(np.float64)
        got = imgs[i].astype(np.float64)
        if dtype == "uint8":
            diff = np.abs(got - want) / 255.0
        else:
            # back to the 0..1 scale of the pixels: undo std
            diff = np.abs(got - want) * np.asarray(STD)[:, None, None]
        assert diff.mean() <= 1.5 / 255, f"{path}: mean abs diff {diff.mean() * 255:.3f}/255"
        assert diff.max() <= 2.0 / 255 + 1e-6, f"{path}: max abs diff {diff.max() * 255:.3f}/255"


def test_dtypes_and_layouts(ld, workdir):
    root = os.path.join(workdir, "dt")
    samples = make_folder(root, ["a"], 3, [(30, 40)], seed=3)
    ops = [{"op": "resize", "size": 18}, {"op": "center_crop", "size": [16, 12]}, NORM]
    n = len(samples)
    out = {}
    for dtype, layout in [("float32", "NCHW"), ("float32", "NHWC"), ("float16", "NCHW"),
                          ("bfloat16", "NHWC")]:
        shape = (3, 16, 12) if layout == "NCHW" else (16, 12, 3)
        spec = image_spec(f"{dtype}-{layout}", folder_source(root), ops, dtype=dtype,
                          layout=layout, decode=EXACT)
        np_dtype = "uint16" if dtype == "bfloat16" else dtype
        imgs, _ = consume_images(ld, spec, n, shape, np_dtype)
        out[(dtype, layout)] = imgs
    f32 = out[("float32", "NCHW")]
    assert np.array_equal(out[("float32", "NHWC")], f32.transpose(0, 2, 3, 1))
    assert np.array_equal(out[("float16", "NCHW")], f32.astype(np.float16))
    bf = torch.from_numpy(f32.transpose(0, 2, 3, 1).copy()).to(torch.bfloat16)
    assert np.array_equal(out[("bfloat16", "NHWC")], bf.view(torch.int16).numpy().view(np.uint16))


# --------------------------------------------------------- random crops

def ks_2samp(a, b):
    """Two-sample Kolmogorov-Smirnov statistic."""
    a = np.sort(np.asarray(a, dtype=np.float64))
    b = np.sort(np.asarray(b, dtype=np.float64))
    grid = np.concatenate([a, b])
    ca = np.searchsorted(a, grid, side="right") / len(a)
    cb = np.searchsorted(b, grid, side="right") / len(b)
    return np.max(np.abs(ca - cb))


@pytest.mark.parametrize("hw,scale,ratio", [
    ((256, 256), (0.08, 1.0), (3 / 4, 4 / 3)),
    ((200, 300), (0.08, 1.0), (3 / 4, 4 / 3)),
    ((64, 48), (0.5, 1.0), (0.5, 2.0)),       # the fallback is frequent here
])
def test_random_resized_crop_distribution(hw, scale, ratio):
    import torchvision.transforms as T
    h, w = hw
    n = 4000
    ours = image_params(h, w, 32, scale, ratio, seed=11, epoch=0, first=0, count=n)
    torch.manual_seed(5)
    img = torch.zeros(1, h, w)
    ref = np.array([T.RandomResizedCrop.get_params(img, list(scale), list(ratio)) for _ in range(n)])
    # columns: top, left, height, width
    ot, ol, oh, ow = ours[:, 1], ours[:, 2], ours[:, 3], ours[:, 4]
    rt, rl, rh, rw = ref[:, 0], ref[:, 1], ref[:, 2], ref[:, 3]
    assert (ot >= 0).all() and (ot + oh <= h).all() and (ol >= 0).all() and (ol + ow <= w).all()
    crit = 1.95 * np.sqrt(2.0 / n)             # alpha = 0.001
    for name, a, b in [
        ("area", oh * ow, rh * rw),
        ("aspect", ow / oh, rw / rh),
        ("height", oh, rh),
        ("top", (ot + 0.5) / (h - oh + 1), (rt + 0.5) / (h - rh + 1)),
        ("left", (ol + 0.5) / (w - ow + 1), (rl + 0.5) / (w - rw + 1)),
    ]:
        d = ks_2samp(a, b)
        assert d < crit, f"{name}: KS statistic {d:.4f} >= {crit:.4f} vs torchvision"


def test_random_crops_match_torchvision_and_reproduce(daemon, workdir):
    """The daemon's crops are those that image-params prints for (seed,
    epoch, index); given those parameters torchvision computes the same
    pixels; and the worker count changes nothing."""
    import torchvision.transforms.functional as F
    root = os.path.join(workdir, "rrc")
    samples = make_folder(root, ["a", "b", "c"], 3, [(48, 64), (70, 52), (40, 40)], seed=4)
    n = len(samples)
    ops = [{"op": "random_resized_crop", "size": 24}, {"op": "horizontal_flip", "p": 0.5}, NORM]
    spec = image_spec("rrc", folder_source(root), ops, decode=EXACT, seed=1234, epochs=2,
                      batch_size=4)
    dumps = []
    for workers in (1, 3):
        ld = daemon(workers=workers)
        ld.create(spec)
        dumps.append(ld.consume("rrc").dump)
        ld.stop()
    assert dumps[0] == dumps[1], "the worker count changed the batches"
    per_epoch = len(dumps[0]) // 2
    flips = 0
    for epoch in (0, 1):
        imgs, labels = all_images(dumps[0][epoch * per_epoch:(epoch + 1) * per_epoch], n, 4,
                                  (3, 24, 24), "float32")
        for i, (path, lab) in enumerate(samples):
            with Image.open(path) as im:
                pil = im.convert("RGB")
            p = image_params(pil.height, pil.width, 24, (0.08, 1.0), (3 / 4, 4 / 3), 1234, epoch,
                             i, 1, flip_p=0.5)[0]
            _, top, left, ch, cw, flip = p.tolist()
            out = F.resized_crop(pil, top, left, ch, cw, [24, 24])
            if flip:
                out = F.hflip(out)
                flips += 1
            want = F.normalize(F.to_tensor(out), MEAN, STD).numpy()
            diff = np.abs(imgs[i] - want) * np.asarray(STD)[:, None, None]
            assert diff.mean() <= 1.5 / 255, f"epoch {epoch} sample {i}: {diff.mean() * 255:.3f}/255"
            assert labels[i] == lab
    assert 0 < flips < 2 * n
    # epoch 1 crops differ from epoch 0's
    e0 = np.frombuffer(dumps[0][:per_epoch], dtype=np.uint8)
    e1 = np.frombuffer(dumps[0][per_epoch:], dtype=np.uint8)
    assert not np.array_equal(e0, e1)


def test_dct_scaling(ld, workdir):
    """Large images reduced a lot: DCT scaling stays close to the full decode."""
    root = os.path.join(workdir, "big")
    samples = make_folder(root, ["a"], 2, [(400, 520), (480, 360)], seed=5)
    ops = [{"op": "resize", "size": 48}, {"op": "center_crop", "size": 48}]
    res = {}
    for dct in (False, True):
        spec = image_spec(f"dct{int(dct)}", folder_source(root), ops, dtype="uint8",
                          layout="NHWC", decode={"dct_scaling": dct})
        res[dct], _ = consume_images(ld, spec, 2, (48, 48, 3), "uint8")
    for i, (path, _) in enumerate(samples):
        want = tv_reference(path, ops, "uint8").astype(np.float64)
        assert np.array_equal(res[False][i], want.astype(np.uint8))
        diff = np.abs(res[True][i] - want)
        assert diff.mean() <= 4.0, f"DCT-scaled decode too far: mean {diff.mean():.2f}/255"


def _region_folder(root, rng):
    """JPEGs of every layout region decoding handles, large enough that a
    random crop skips rows and columns (sorted as ImageFolder sorts them)."""
    d = os.path.join(root, "k")
    os.makedirs(d)
    kinds = [
        ("a444", dict(quality=90, subsampling=0), "RGB"),
        ("b420", dict(quality=85, subsampling=2), "RGB"),
        ("c422", dict(quality=90, subsampling=1), "RGB"),
        ("dprog", dict(quality=90, progressive=True), "RGB"),
        ("egray", dict(quality=90), "L"),
        ("fcmyk", dict(quality=90), "CMYK"),
    ]
    paths = []
    for k, (name, kw, mode) in enumerate(kinds):
        h, w = [(203, 317), (260, 190), (240, 240)][k % 3]
        p = os.path.join(d, name + ".jpg")
        save_image(p, Image.fromarray(smooth_image(rng, h, w)).convert(mode), "JPEG", **kw)
        paths.append(p)
    return paths


@pytest.mark.parametrize("size", [40, 224])
def test_region_decode_crops_exact(ld, workdir, size):
    """Only the crop window is decoded: with dct_scaling off the result
    still equals torchvision's crop of the whole image exactly (uint8),
    across many random crops of 4:4:4, 4:2:0, 4:2:2, progressive, gray and
    CMYK files; with dct_scaling on it stays within test_dct_scaling's
    tolerance."""
    import torchvision.transforms.functional as F
    root = os.path.join(workdir, "region")
    paths = _region_folder(root, np.random.default_rng(11))
    n, epochs = len(paths), 6
    ops = [{"op": "random_resized_crop", "size": size}, {"op": "horizontal_flip", "p": 0.5}]
    res = {}
    for dct in (False, True):
        spec = image_spec(f"region{int(dct)}", folder_source(root), ops, dtype="uint8",
                          layout="NHWC", decode={"dct_scaling": dct}, seed=77, epochs=epochs,
                          batch_size=n)
        res[dct], _ = consume_images(ld, spec, n * epochs, (size, size, 3), "uint8")
    diffs = []
    for epoch in range(epochs):
        for i, path in enumerate(paths):
            with Image.open(path) as im:
                pil = im.convert("RGB")
            p = image_params(pil.height, pil.width, size, (0.08, 1.0), (3 / 4, 4 / 3), 77, epoch,
                             i, 1, flip_p=0.5)[0]
            _, top, left, ch, cw, flip = p.tolist()
            out = F.resized_crop(pil, top, left, ch, cw, [size, size])
            if flip:
                out = F.hflip(out)
            want = np.asarray(out)
            got = res[False][epoch * n + i]
            assert np.array_equal(got, want), \
                f"{os.path.basename(path)} epoch {epoch}: crop {top},{left} {ch}x{cw} differs"
            diff = np.abs(res[True][epoch * n + i].astype(np.float64) - want)
            diffs.append(diff.mean())
            # small noisy crops decoded at 1/2..1/8 (the region decode itself is
            # bit-equal to a whole decode at that scale:
            # tests/unit/sources/test-image.c)
            assert diff.mean() <= 8.0, f"{path}: DCT-scaled region too far: {diff.mean():.2f}/255"
    assert np.mean(diffs) <= 4.0, f"DCT-scaled regions too far: mean {np.mean(diffs):.2f}/255"


@pytest.mark.parametrize("cut", [2, 300])
def test_truncated_jpeg_fails_whatever_the_crop(ld, workdir, cut):
    """A JPEG cut short is a bad image even when the crop lies before the
    cut (decoding stops after the window's last row, but the file is still
    checked for its end marker): the policy does not depend on the draw."""
    rng = np.random.default_rng(12)
    root = os.path.join(workdir, "trunc")
    d = os.path.join(root, "k")
    os.makedirs(d)
    with io.BytesIO() as b:
        Image.fromarray(smooth_image(rng, 256, 256)).save(b, "JPEG", quality=90)
        jpg = b.getvalue()
    with open(os.path.join(d, "a.jpg"), "wb") as f:
        f.write(jpg[:-cut])
    with open(os.path.join(d, "b.jpg"), "wb") as f:
        f.write(jpg)
    # small crops (1-2 % of the area): most lie well before the cut
    spec = image_spec("trunc", folder_source(root), [{"op": "random_resized_crop", "size": 16,
                                                      "scale": [0.01, 0.02]}],
                      on_error="fail", batch_size=1, epochs=3)
    ld.create(spec)
    res = ld.consume("trunc", "--timeout", 20000, check=False, timeout=60)
    assert res.rc != 0, res.describe()
    assert "a.jpg" in res.stderr and "Premature end of JPEG file" in res.stderr, res.describe()


# -------------------------------------------------------------- webdataset

def test_webdataset_equals_image_folder(ld, workdir):
    root = os.path.join(workdir, "wf")
    samples = make_folder(root, ["cat", "dog", "eel"], 4, [(30, 40), (44, 33)], seed=6)
    n = len(samples)
    ops = [{"op": "random_resized_crop", "size": 20}, {"op": "horizontal_flip"}, NORM]
    base = image_spec("folder", folder_source(root), ops, seed=9, batch_size=5, shuffle=True)
    ld.create(base)
    want = ld.consume("folder").dump
    members = wds_members(samples)
    # three shards of 4 samples, made four different ways
    shards = os.path.join(workdir, "shards")
    os.makedirs(shards)
    chunks = [members[0:8], members[8:16], members[16:24]]
    makers = [
        lambda p, m: write_shard_tarfile(p, m, tarfile.USTAR_FORMAT),
        lambda p, m: write_shard_tarfile(p, m, tarfile.GNU_FORMAT),
        lambda p, m: write_shard_tarfile(p, m, tarfile.PAX_FORMAT),
        lambda p, m: write_shard_gnutar(p, m, workdir, "gnu"),
        lambda p, m: write_shard_gnutar(p, m, workdir, "posix"),
    ]
    for k, make in enumerate(makers):
        d = os.path.join(shards, f"v{k}")
        os.makedirs(d)
        for s, chunk in enumerate(chunks):
            make(os.path.join(d, f"train-{s:03d}.tar"), chunk)
        spec = dict(base, name=f"wds{k}",
                    source={"kind": "webdataset", "urls": [os.path.join(d, "train-{000..002}.tar")]})
        ld.create(spec)
        got = ld.consume(f"wds{k}").dump
        assert got == want, f"webdataset made by maker {k} differs from the image folder"
    # long member names: GNU 'L' records, pax 'path' records, ustar prefixes
    long_members = wds_members(samples, long_dirs=True)
    for k, fmt in enumerate([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]):
        p = write_shard_tarfile(os.path.join(shards, f"long{k}.tar"), long_members, fmt)
        spec = dict(base, name=f"long{k}", source={"kind": "webdataset", "urls": p})
        ld.create(spec)
        assert ld.consume(f"long{k}").dump == want
    p = write_shard_gnutar(os.path.join(shards, "longgnu.tar"), long_members, workdir, "gnu")
    ld.create(dict(base, name="longgnu", source={"kind": "webdataset", "urls": [p]}))
    assert ld.consume("longgnu").dump == want
    assert n == 12


# ------------------------------------------------------------------ bad files

def bad_folder(root, rng):
    """Good and bad files in sorted order; returns (samples, bad indices)."""
    d = os.path.join(root, "k")
    os.makedirs(d)
    good = smooth_image(rng, 30, 30)
    with io.BytesIO() as b:
        Image.fromarray(good).save(b, "JPEG", quality=90)
        jpg = b.getvalue()
    with io.BytesIO() as b:
        Image.fromarray(good).save(b, "PNG")
        png = b.getvalue()
    files = [
        ("a0.jpg", jpg),
        ("a1.jpg", jpg[:len(jpg) // 2]),           # truncated JPEG
        ("a2.jpg", b""),                           # zero bytes
        ("a3.png", jpg),                           # a JPEG named .png: fine
        ("a4.jpg", b"this is not an image\n"),     # not an image
        ("a5.png", png[:len(png) - 40]),           # truncated PNG
        ("a6.jpg", jpg[:200] + bytes(rng.integers(0, 256, len(jpg) - 200, dtype=np.uint8))),
        ("a7.png", png),
    ]
    for name, data in files:
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return [os.path.join(d, name) for name, _ in files], [1, 2, 4, 5, 6]


def test_bad_files_skip(ld, workdir):
    root = os.path.join(workdir, "bad")
    paths, bad = bad_folder(root, np.random.default_rng(7))
    ops = [{"op": "center_crop", "size": 24}]
    spec = image_spec("skip", folder_source(root), ops, dtype="uint8", layout="NHWC", epochs=2,
                      batch_size=4)
    imgs, labels = consume_images(ld, spec, 2 * len(paths), (24, 24, 3), "uint8")
    n = len(paths)
    for epoch in (0, 1):
        for i in range(n):
            j = i
            while j in bad:                     # the next good sample, in dataset order
                j = (j + 1) % n
            want = np.asarray(Image.open(paths[j]).convert("RGB"))[3:27, 3:27]
            assert np.array_equal(imgs[epoch * n + i], want), f"sample {i} (epoch {epoch})"
    assert ld.alive()
    p = ld.pipeline("skip")
    # the bad samples, each read once: not once for every sample whose
    # replacement search runs over it (that was 18 here)
    assert p["skipped"] == len(bad)


@pytest.mark.parametrize("which,reason", [
    (1, "JPEG"), (2, "empty file"), (4, "not a JPEG or PNG image"), (5, "PNG"),
])
def test_bad_files_fail(ld, workdir, which, reason):
    root = os.path.join(workdir, "bad")
    paths, _ = bad_folder(root, np.random.default_rng(8))
    # only the one bad file under test, and a good one
    for k, p in enumerate(paths):
        if k not in (0, which):
            os.unlink(p)
    spec = image_spec("fail", folder_source(root), [{"op": "center_crop", "size": 24}],
                      on_error="fail", batch_size=1)
    ld.create(spec)
    res = ld.consume("fail", "--timeout", 20000, check=False, timeout=60)
    assert res.rc != 0, res.describe()
    name = os.path.basename(paths[which])
    assert name in res.stderr and reason in res.stderr, res.describe()
    p = ld.pipeline("fail")
    assert p["state"] == "failed" and name in p["error"] and reason in p["error"], p
    assert ld.alive()


def test_webdataset_bounds(ld, workdir):
    """A create whose index would be too large fails at once with the
    number (issue 13: a million names took a minute and 2.9 GB); a missing
    shard fails the create there; status shows what an index takes."""
    ops = [{"op": "center_crop", "size": 16}]
    spec = image_spec("wbig", {"kind": "webdataset",
                               "urls": os.path.join(workdir, "shard-{000000..999999}.tar")}, ops)
    r = ld.create(spec, check=False)
    assert r.returncode != 0, r.stderr
    assert "spec: source.urls: 1000000 shards named, the most is 65536" in r.stderr, r.stderr
    rng = np.random.default_rng(9)
    with io.BytesIO() as b:
        Image.fromarray(smooth_image(rng, 20, 20)).save(b, "JPEG")
        jpg = b.getvalue()
    p = write_shard_tarfile(os.path.join(workdir, "ok.tar"), [("s0.jpg", jpg), ("s0.cls", b"3")],
                            tarfile.PAX_FORMAT)
    missing = os.path.join(workdir, "m-{00000..59999}.tar")
    r = ld.create(dict(spec, name="wmiss", source={"kind": "webdataset", "urls": [p, missing]}),
                  check=False)
    assert r.returncode != 0, r.stderr
    assert os.path.join(workdir, "m-00000.tar") + ": No such file or directory" in r.stderr, r.stderr
    ld.create(dict(spec, name="wok", source={"kind": "webdataset", "urls": p}))
    got = ld.pipeline("wok")["index_bytes"]
    assert 1024 <= got <= 1 << 20, got        # one sample: a first block of entries and names
    assert ld.alive()


def test_webdataset_bad_members(ld, workdir):
    rng = np.random.default_rng(9)
    with io.BytesIO() as b:
        Image.fromarray(smooth_image(rng, 20, 20)).save(b, "JPEG")
        jpg = b.getvalue()
    members = [("s0.jpg", jpg), ("s0.cls", b"3\n"),
               ("s1.jpg", jpg), ("s1.cls", b"three"),              # bad label
               ("s2.jpg", jpg),                                     # no label
               ("s3.txt", b"caption only"),                         # not a sample
               ("s4.jpg", b"garbage"), ("s4.cls", b"1"),            # bad image
               ("s5.png", jpg), ("s5.cls", b" 7 ")]
    p = write_shard_tarfile(os.path.join(workdir, "bad.tar"), members, tarfile.PAX_FORMAT)
    ops = [{"op": "center_crop", "size": 16}]
    spec = image_spec("wbad", {"kind": "webdataset", "urls": p}, ops, dtype="uint8")
    ld.create(spec)
    res = ld.consume("wbad")
    _, labels = all_images(res.dump, 5, 32, (3, 16, 16), "uint8")
    assert labels.tolist() == [3, 7, 7, 7, 7]
    # on_error fail: the batches before the first bad one come, then its
    # error, whichever worker failed first (s1, s2 and s4 are all bad)
    for k in range(4):
        ld.create(dict(spec, name=f"wfail{k}", on_error="fail", batch_size=1))
        res = ld.consume(f"wfail{k}", "--timeout", 20000, check=False, timeout=60)
        assert res.rc != 0 and "bad.tar: s1" in res.stderr and ".cls" in res.stderr, res.describe()
        assert len(res.dump) == 3 * 16 * 16 + 8, res.describe()    # exactly batch 0 (s0)
        _, labels = all_images(res.dump, 1, 1, (3, 16, 16), "uint8")
        assert labels.tolist() == [3]


# ------------------------------------------------------------------- specs

@pytest.mark.parametrize("edit,want", [
    (lambda s: s.update(transforms=[{"op": "resize", "size": 32}]), "transforms: the output image size"),
    (lambda s: s.update(transforms=[{"op": "flip"}]), "transforms[0].op"),
    (lambda s: s["transforms"][0].update(size=[0, 3]), "transforms[0].size"),
    (lambda s: s["transforms"][0].update(bogus=1), 'unknown key "transforms[0].bogus"'),
    (lambda s: s.update(output={"dtype": "uint8"}), "normalize needs output.dtype"),
    (lambda s: s.update(output={"layout": "HWC"}), "output.layout"),
    (lambda s: s.update(on_error="retry"), "on_error"),
    (lambda s: s.update(decode={"dct_scaling": "no"}), "decode.dct_scaling"),
    (lambda s: s.update(decode={"max_pixels": 0}), "decode.max_pixels: must be an integer in 1..134217728"),
    (lambda s: s["source"].update(bogus=1), 'unknown key "source.bogus"'),
])
def test_spec_errors(ld, workdir, edit, want):
    spec = image_spec("bad", folder_source(workdir),
                      [{"op": "random_resized_crop", "size": 8}, NORM])
    edit(spec)
    r = ld.create(spec, check=False)
    assert r.returncode != 0 and want in r.stderr, r.stderr


def test_open_errors(ld, workdir):
    spec = image_spec("nofolder", folder_source(os.path.join(workdir, "nope")),
                      [{"op": "center_crop", "size": 8}])
    r = ld.create(spec, check=False)
    assert r.returncode != 0 and "nope" in r.stderr, r.stderr
    with open(os.path.join(workdir, "x.tar"), "wb") as f:
        f.write(b"not a tar file" * 100)
    spec = image_spec("notar", {"kind": "webdataset", "urls": [os.path.join(workdir, "x.tar")]},
                      [{"op": "center_crop", "size": 8}])
    r = ld.create(spec, check=False)
    assert r.returncode != 0 and "x.tar" in r.stderr and "checksum" in r.stderr, r.stderr
    assert ld.alive()
