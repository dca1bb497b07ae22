# SPDX-License-Identifier: MIT
"""The decoded-image cache ("cache": {"decoded": true, ...}, docs/spec.md):
batches with the cache equal those of an exact (full-scale) decode without
it, byte for byte, over shuffled epochs; max_side reductions are
deterministic and are what PIL computes; bad images are never cached; a
full cache changes no byte; status counts hits, misses and bytes exactly;
the memory limit bounds it; spec errors name the key."""

import os
import tarfile

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
from PIL import Image  # noqa: E402

from imgtest import (MEAN, STD, all_images, folder_samples, image_params, image_spec,  # noqa: E402
                     make_folder, save_image, smooth_image, wds_members, write_shard_tarfile)

NORM = {"op": "normalize", "mean": MEAN, "std": STD}
EXACT = {"dct_scaling": False}
RRC = [{"op": "random_resized_crop", "size": 32}, {"op": "horizontal_flip", "p": 0.5}, NORM]
RESIZE = [{"op": "resize", "size": 40}, {"op": "center_crop", "size": 32},
          {"op": "horizontal_flip", "p": 0.5}, NORM]
# the header of an entry and its alignment (daemon/sources/images/imagecache.c)
ENTRY_HEADER, ENTRY_ALIGN = 24, 64


def entry_bytes(w, h):
    n = ENTRY_HEADER + w * h * 3
    return (n + ENTRY_ALIGN - 1) // ENTRY_ALIGN * ENTRY_ALIGN


def folder_source(root):
    return {"kind": "image_folder", "path": root}


def mixed_folder(root):
    """JPEGs (4:2:0, 4:4:4, progressive, gray) and PNGs of several sizes,
    all larger than the crops so that reductions are real."""
    rng = np.random.default_rng(21)
    kinds = [("a", ".jpg", dict(quality=85, subsampling=2), "RGB", (90, 120)),
             ("b", ".jpg", dict(quality=90, subsampling=0), "RGB", (131, 77)),
             ("c", ".jpg", dict(quality=90, progressive=True), "RGB", (64, 64)),
             ("d", ".jpg", dict(quality=90), "L", (100, 70)),
             ("e", ".png", {}, "RGB", (75, 110)),
             ("f", ".png", {}, "RGB", (48, 50))]
    paths = []
    for k in range(12):
        cls, ext, kw, mode, (h, w) = kinds[k % len(kinds)]
        d = os.path.join(root, cls)
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, f"i{k:02d}{ext}")
        img = Image.fromarray(smooth_image(rng, h, w)).convert(mode)
        save_image(p, img, "JPEG" if ext == ".jpg" else "PNG", **kw)
        paths.append(p)
    return sorted(paths)


def sizes_of(paths):
    out = []
    for p in paths:
        with Image.open(p) as im:
            out.append(im.size)
    return out


def cache_spec(name, root, ops, cache=None, **kw):
    spec = image_spec(name, folder_source(root), ops, shuffle=True, seed=99, epochs=3,
                      batch_size=5, persist=True, **kw)
    if cache is not None:
        spec["cache"] = cache
    return spec


def run(ld, spec):
    ld.create(spec)
    return ld.consume(spec["name"]).dump


@pytest.mark.parametrize("ops", [RRC, RESIZE], ids=["rrc", "resize"])
def test_cache_equals_exact_decode(daemon, workdir, ops):
    """Three shuffled epochs with the cache (epochs 2 and 3 cut from cached
    pixels) are the bytes of the same spec without it, with 3 workers; status
    counts every image once in entries and bytes_used (full size), and every
    sample as a hit or a miss (an image of epoch 1 that another worker is
    still decoding for epoch 0 is a miss too: the bytes are the same)."""
    ld = daemon(workers=3)
    root = os.path.join(workdir, "imgs")
    paths = mixed_folder(root)
    n = len(paths)
    want = run(ld, cache_spec("plain", root, ops, decode=EXACT))
    got = run(ld, cache_spec("cached", root, ops, decode=EXACT,
                             cache={"decoded": True, "bytes": "64M"}))
    assert len(got) == len(want) and got == want
    c = ld.pipeline("cached")["cache"]
    used = sum(entry_bytes(w, h) for w, h in sizes_of(paths))
    hits = c.pop("hits")
    assert c == {"misses": 3 * n - hits, "entries": n, "bytes_used": used,
                 "bytes": 64 << 20, "refused": 0, "max_side": 0}, c
    assert hits <= 2 * n    # each image's first read decodes it
    assert ld.pipeline("plain")["cache"] is None
    assert ld.pipeline("cached")["spec"]["cache"] == {"decoded": True, "bytes": 64 << 20}


def test_cache_with_dct_scaling_is_the_full_decode(ld, workdir):
    """Under the default dct_scaling, a cached pipeline gives what
    dct_scaling off gives (the full-scale decode), every epoch; without the
    cache dct_scaling on gives other bytes (so the comparison means
    something)."""
    root = os.path.join(workdir, "imgs")
    mixed_folder(root)
    ops = [{"op": "random_resized_crop", "size": 16}, {"op": "horizontal_flip", "p": 0.5}]
    exact = run(ld, cache_spec("exact", root, ops, dtype="uint8", layout="NHWC", decode=EXACT))
    scaled = run(ld, cache_spec("scaled", root, ops, dtype="uint8", layout="NHWC"))
    cached = run(ld, cache_spec("cached", root, ops, dtype="uint8", layout="NHWC",
                                cache={"decoded": True, "bytes": 1 << 26}))
    assert scaled != exact
    assert cached == exact


def test_webdataset_cache(ld, workdir):
    """A webdataset's samples (labels from their .cls members) come from the
    cache as an image folder's do: the bytes of the uncached exact decode,
    labels included, and one entry per sample."""
    root = os.path.join(workdir, "imgs")
    mixed_folder(root)
    samples = folder_samples(root)
    tar = write_shard_tarfile(os.path.join(workdir, "s.tar"), wds_members(samples),
                              tarfile.PAX_FORMAT)
    want = run(ld, cache_spec("folder", root, RRC, decode=EXACT))
    spec = cache_spec("wds", root, RRC, cache={"decoded": True, "bytes": "16M"})
    spec["source"] = {"kind": "webdataset", "urls": tar}
    assert run(ld, spec) == want
    assert ld.pipeline("wds")["cache"]["entries"] == len(samples)


def test_full_cache_changes_no_byte(daemon, workdir):
    """A cache with room for a few images: the others are decoded every
    epoch, refused once each, and the batches are still the bytes of an
    unbounded cache, for 1 and 3 workers."""
    root = os.path.join(workdir, "imgs")
    paths = mixed_folder(root)
    n = len(paths)
    sizes = sizes_of(paths)
    room = sum(sorted(entry_bytes(w, h) for w, h in sizes)[:4])
    dumps = []
    for workers in (1, 3):
        ld = daemon(workers=workers)
        big = run(ld, cache_spec("big", root, RRC, cache={"decoded": True, "bytes": "64M"}))
        small = run(ld, cache_spec("small", root, RRC, cache={"decoded": True, "bytes": room}))
        assert small == big
        c = ld.pipeline("small")["cache"]
        assert c["entries"] + c["refused"] == n and 1 <= c["entries"] <= 4, c
        assert c["bytes_used"] <= room and c["bytes"] == room, c
        assert c["hits"] + c["misses"] == 3 * n and c["hits"] <= 2 * c["entries"], c
        if workers == 1:    # one sample at a time: an image cached is a hit after
            assert c["hits"] == 2 * c["entries"], c
        dumps.append(small)
        ld.stop()
    assert dumps[0] == dumps[1]


def test_max_side_reduction(daemon, workdir):
    """max_side 40: images with a longer side above 40 are kept reduced (the
    longer side 40, the shorter rounded), the crop drawn on the file's size
    is mapped onto them; batches are the same bytes for any worker count,
    and for PNGs close to PIL's bilinear reduction then a resize of the
    mapped box (PIL lets the filter reach past the box; the window cut from
    the reduced pixels ends at the box's pixels, as for a DCT-scaled decode)."""
    root = os.path.join(workdir, "imgs")
    paths = mixed_folder(root)
    n = len(paths)
    size, seed, epochs = 24, 5, 2
    ops = [{"op": "random_resized_crop", "size": size}, {"op": "horizontal_flip", "p": 0.5}]
    cache = {"decoded": True, "max_side": 40, "bytes": "16M"}
    dumps = []
    for workers in (1, 3):
        ld = daemon(workers=workers)
        spec = image_spec("side", folder_source(root), ops, dtype="uint8", layout="NHWC",
                          seed=seed, epochs=epochs, batch_size=n, persist=True, cache=cache)
        dumps.append(run(ld, spec))
        c = ld.pipeline("side")["cache"]
        kept = []
        for w, h in sizes_of(paths):
            lng, sht = max(w, h), min(w, h)
            s = (sht * 40 + lng // 2) // lng if lng > 40 else sht
            kept.append((40, s) if w >= h and lng > 40 else (s, 40) if lng > 40 else (w, h))
        assert c["entries"] == n and c["bytes_used"] == sum(entry_bytes(w, h) for w, h in kept), c
        assert c["max_side"] == 40
        ld.stop()
    assert dumps[0] == dumps[1], "the worker count changed the batches"
    imgs, _ = all_images(dumps[0], n * epochs, n, (size, size, 3), "uint8")
    checked = 0
    for epoch in range(epochs):
        for i, p in enumerate(paths):
            if not p.endswith(".png"):
                continue
            with Image.open(p) as im:
                pil = im.convert("RGB")
            W, H = pil.size
            cw, ch = kept[i]
            red = pil.resize((cw, ch), Image.BILINEAR) if (cw, ch) != (W, H) else pil
            _, top, left, hh, ww, flip = image_params(H, W, size, (0.08, 1.0), (3 / 4, 4 / 3),
                                                      seed, epoch, i, 1, flip_p=0.5)[0].tolist()
            fx, fy = cw / W, ch / H
            box = (left * fx, top * fy, (left + ww) * fx, (top + hh) * fy)
            out = red.resize((size, size), Image.BILINEAR, box=box)
            if flip:
                out = out.transpose(Image.FLIP_LEFT_RIGHT)
            want = np.asarray(out).astype(np.int16)
            diff = np.abs(imgs[epoch * n + i].astype(np.int16) - want)
            assert diff.mean() <= 1.5, f"{p} epoch {epoch}: mean diff {diff.mean():.2f}/255"
            checked += 1
    assert checked == 2 * epochs * 2


@pytest.mark.parametrize("max_side, kept, drafted", [(48, (48, 36), (50, 38)),
                                                    (70, (70, 53), (100, 75))])
def test_max_side_pixels_are_pil_draft_and_resize(ld, workdir, max_side, kept, drafted):
    """What is kept of an image above max_side is PIL's reduction exactly: a
    JPEG decoded at the DCT scale Image.draft() picks (the smallest of 1/8,
    1/4, 1/2 that keeps max_side's pixels: 1/4 for 48, and 1/2 for 70 where
    libjpeg-turbo's 3/8 would keep them too) then resized bilinear
    (antialiased) to the kept size; a PNG resized from full scale. A resize
    to exactly the kept size shows the kept pixels as they are."""
    root = os.path.join(workdir, "red")
    rng = np.random.default_rng(8)
    d = os.path.join(root, "k")
    os.makedirs(d)
    paths = []
    for k, (ext, kw) in enumerate([(".jpg", dict(quality=90, subsampling=2)),
                                    (".jpg", dict(quality=90, subsampling=0)),
                                    (".png", {})]):
        p = os.path.join(d, f"x{k}{ext}")
        save_image(p, smooth_image(rng, 150, 200), "JPEG" if ext == ".jpg" else "PNG", **kw)
        paths.append(p)
    paths.sort()
    # 200x150 with max_side M: M x round(150 * M / 200), 48x36 or 70x53
    kw, kh = kept
    spec = image_spec("red", folder_source(root), [{"op": "resize", "size": [kh, kw]}],
                      dtype="uint8", layout="NHWC", batch_size=3, persist=True,
                      cache={"decoded": True, "max_side": max_side, "bytes": "1M"})
    imgs, _ = all_images(run(ld, spec), 3, 3, (kh, kw, 3), "uint8")
    for i, p in enumerate(paths):
        with Image.open(p) as im:
            if p.endswith(".jpg"):
                im.draft("RGB", kept)
                assert im.size == drafted    # 1/4 or 1/2 of 200x150, rounded up
            want = np.asarray(im.convert("RGB").resize(kept, Image.BILINEAR))
        assert np.array_equal(imgs[i], want), f"{p}: max diff {np.abs(imgs[i] - want).max()}"
    assert ld.pipeline("red")["cache"]["bytes_used"] == 3 * entry_bytes(kw, kh)


def bad_folder(root):
    rng = np.random.default_rng(3)
    d = os.path.join(root, "k")
    os.makedirs(d)
    good = []
    for i in range(6):
        p = os.path.join(d, f"g{i}.jpg")
        save_image(p, smooth_image(rng, 50, 60), "JPEG", quality=90)
        good.append(p)
    with open(os.path.join(d, "g1b.jpg"), "wb") as f:
        f.write(b"not an image")
    with open(good[2], "rb") as f:
        data = f.read()
    with open(os.path.join(d, "g3b.jpg"), "wb") as f:
        f.write(data[:len(data) // 2])
    return good


def test_bad_images_are_never_cached(daemon, workdir):
    ld = daemon(workers=1)
    root = os.path.join(workdir, "bad")
    good = bad_folder(root)
    ops = [{"op": "random_resized_crop", "size": 16}, NORM]
    want = run(ld, cache_spec("plain", root, ops, decode=EXACT))
    got = run(ld, cache_spec("cached", root, ops, cache={"decoded": True, "bytes": "8M"}))
    assert got == want
    p = ld.pipeline("cached")
    assert p["skipped"] == 2
    c = p["cache"]
    assert c["entries"] == len(good) and c["refused"] == 0, c
    assert c["bytes_used"] == len(good) * entry_bytes(60, 50), c
    # one worker: each good image decoded once, each bad one tried once and
    # then remembered as bad; 3 epochs of 8 samples, and the 2 bad ones'
    # replacements read besides in the first
    assert c["misses"] == len(good) + 2 and c["hits"] == 3 * 8 + 2 - c["misses"], c


def test_memory_limit(daemon, workdir):
    """cache.bytes counts against the memory limit: above it is an error at
    create; the arena (capped by what the images can take) is part of
    memory_used while the pipeline lives, and given back when it goes."""
    root = os.path.join(workdir, "imgs")
    make_folder(root, ["a"], 4, [(30, 40)], seed=2)
    ld = daemon(memory_limit="64M")
    spec = cache_spec("c", root, RRC, cache={"decoded": True, "bytes": "1G"})
    r = ld.create(spec, check=False)
    assert r.returncode != 0
    assert ("spec: cache.bytes: 1073741824 bytes is more than the memory limit, 67108864 bytes"
            in r.stderr), r.stderr
    base = ld.status()["memory_used"]
    # max_side 40: at most 4 entries of 40x40
    spec = cache_spec("c", root, RRC, cache={"decoded": True, "max_side": 40, "bytes": "32M"})
    ld.create(spec)
    p = ld.pipeline("c")
    cap = 4 * entry_bytes(40, 40)
    assert p["cache"]["bytes"] == cap
    assert ld.status()["memory_used"] == base + p["slots_total"] * p["slot_bytes"] + cap
    ld.ctl("drop", "c")
    ld.wait_for(lambda st: st["memory_used"] == base, "the cache's bytes given back")
    # the slab and the cache together must fit
    spec = cache_spec("d", root, RRC, cache={"decoded": True, "bytes": "64M"})
    r = ld.create(spec, check=False)
    assert r.returncode != 0 and "memory limit: pipeline 'd' needs" in r.stderr, r.stderr
    assert "and 67108864 of cache.bytes" in r.stderr, r.stderr
    # a cache that leaves little: the default prefetch is sized from what
    # it leaves free (64 slots of this spec would not fit beside it)
    spec = cache_spec("e", root, RRC, cache={"decoded": True, "bytes": "62M"})
    ld.create(spec)
    p = ld.pipeline("e")
    assert 2 <= p["slots_total"] < 64, p["slots_total"]
    assert p["slots_total"] * p["slot_bytes"] + (62 << 20) <= 64 << 20
    assert ld.alive()


@pytest.mark.parametrize("cache,want", [
    ([], "cache: must be an object"),
    ({"bytes": "1G"}, "cache.decoded: is required"),
    ({"decoded": "yes", "bytes": "1G"}, "cache.decoded: must be true or false"),
    ({"decoded": True}, "cache.bytes: is required"),
    ({"decoded": True, "bytes": "lots"}, 'cache.bytes: must be bytes (an integer above 0) or a size like "8G"'),
    ({"decoded": True, "bytes": 0}, "cache.bytes: must be bytes"),
    ({"decoded": True, "bytes": "9e30"}, 'cache.bytes: "9e30" is above the largest size'),
    ({"decoded": True, "bytes": "1G", "max_side": 0}, "cache.max_side: must be an integer in 1..16384"),
    ({"decoded": True, "bytes": "1G", "max_side": 16385}, "cache.max_side: must be an integer in 1..16384"),
    ({"decoded": True, "bytes": "1G", "evict": "lru"}, 'unknown key "cache.evict"'),
])
def test_spec_errors(ld, workdir, cache, want):
    spec = image_spec("bad", folder_source(workdir), RRC, cache=cache)
    r = ld.create(spec, check=False)
    assert r.returncode != 0 and want in r.stderr, r.stderr


def test_decoded_false_is_no_cache(ld, workdir):
    # false: as without the key, bytes not needed; what is given is still checked
    root = os.path.join(workdir, "imgs")
    mixed_folder(root)
    ld.create(cache_spec("off", root, RRC, cache={"decoded": False}))
    assert ld.pipeline("off")["cache"] is None
    ld.create(cache_spec("off2", root, RRC, cache={"decoded": False, "bytes": "1G"}))
    assert ld.pipeline("off2")["cache"] is None
    r = ld.create(cache_spec("off3", root, RRC, cache={"decoded": False, "bytes": "lots"}),
                  check=False)
    assert r.returncode != 0 and "cache.bytes: must be bytes" in r.stderr, r.stderr


def test_cache_only_for_images(ld, workdir):
    from ldrtest import token_spec, write_tokens
    path = os.path.join(workdir, "t.bin")
    write_tokens(path, list(range(100)))
    spec = token_spec("tok", path, 8, "uint16")
    spec["cache"] = {"decoded": True, "bytes": "1G"}
    r = ld.create(spec, check=False)
    assert r.returncode != 0 and "cache: only for image sources" in r.stderr, r.stderr


def test_status_text_and_metrics(daemon, workdir):
    """One worker, 12 images, 3 epochs: 12 misses then 24 hits, in
    `loaderctl status`'s line under the table and in /metrics."""
    from test_metrics import get_unix, parse, value, write_config
    root = os.path.join(workdir, "imgs")
    paths = mixed_folder(root)
    n = len(paths)
    sock = os.path.join(workdir, "metrics.sock")
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"metrics_address": sock})
    ld = daemon("--config", cfg, workers=1)
    code, _, text = get_unix(sock)
    assert code == 200 and "loaderd_pipeline_image_cache_hits" in parse(text)    # no sample yet
    run(ld, cache_spec("c", root, RRC, cache={"decoded": True, "bytes": "4M"}))
    used = sum(entry_bytes(w, h) for w, h in sizes_of(paths))
    fams = parse(get_unix(sock)[2])
    got = {}
    for k in ("hits_total", "misses_total", "entries", "used_bytes", "bytes", "refused_total"):
        name = "loaderd_pipeline_image_cache_" + k
        got[k] = value(fams, name.removesuffix("_total"), name, pipeline="c")
    assert got == {"hits_total": 2 * n, "misses_total": n, "entries": n, "used_bytes": used,
                   "bytes": 4 << 20, "refused_total": 0}, got
    out = ld.ctl("status").stdout
    want = f"c: image cache: 67% hits, {n} images, {used / 1024:.1f} KiB of 4.0 MiB"
    assert want in out.splitlines(), out


def test_check_config_knows_the_limit(workdir):
    """loaderd --check-config refuses a config pipeline whose cache.bytes is
    above the memory limit the daemon would run with: the config's, or
    --memory-limit's (which wins)."""
    import json
    import subprocess
    from ldrtest import LOADERD
    spec = image_spec("c", folder_source("/nonexistent"), RRC,
                      cache={"decoded": True, "bytes": "2G"})
    cfg = os.path.join(workdir, "c.json")
    with open(cfg, "w") as f:
        json.dump({"memory_limit": "1G", "pipelines": [spec]}, f)
    env = {k: v for k, v in os.environ.items() if k != "LOADERD_CONFIG"}

    def check(*args):
        return subprocess.run([LOADERD, *args, f"--check-config={cfg}"], capture_output=True,
                              text=True, timeout=30, env=env)
    r = check()
    assert (r.returncode, r.stdout) == (1, ""), r
    assert r.stderr == (f"loaderd: {cfg}: pipelines[0]: spec: cache.bytes: 2147483648 bytes is "
                        "more than the memory limit, 1073741824 bytes (--memory-limit, or "
                        "memory_limit in the config)\n"), r.stderr
    r = check("--memory-limit", "3G")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{cfg}: ok: 1 pipeline\n", ""), r


def test_augment_seeds_with_a_full_cache(daemon, workdir):
    """Three augment seeds over a cache with room for two images: each
    sample read decodes its file once for all seeds, kept or not (one
    worker: the first epoch decodes N, the second the N - 2 refused), and
    every seed's stream is its solo run's."""
    from test_augment import EPOCHS, N, images, solo, spec
    ld = daemon(workers=1)
    root = images(workdir)
    truth = {s: solo(ld, root, s) for s in (7, 11, 12)}
    s = spec("full", root, 7, min_clients=3)
    # the images are 52x40, 36x48 and 44x44: entries of 6272, 5248 and 5888 bytes
    s["cache"] = {"decoded": True, "bytes": 6272 + 5888 + 100}
    ld.create(s)
    cons = [ld.popen_consume("full", *([] if s == 7 else ["--augment-seed", s]))
            for s in (7, 11, 12)]
    for seed, c in zip((7, 11, 12), cons):
        assert c.wait(check=True).dump == truth[seed], f"augment seed {seed}"
    p = ld.pipeline("full")
    assert p["cache"]["entries"] == 2 and p["cache"]["refused"] == N - 2, p["cache"]
    assert p["decoded"] == N * EPOCHS - 2
    assert p["cache"]["hits"] == 2 and p["cache"]["misses"] == N * EPOCHS - 2, p["cache"]
