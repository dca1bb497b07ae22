# SPDX-License-Identifier: MIT
"""Shuffle windows (docs/spec.md, "Shuffle windows"): the order a webdataset
with "shuffle_window" delivers, against a reference written here from the
docs' definition, with partition over 3 ranks and two epochs; the spec's
errors. (The streamed case, each shard fetched once an epoch, is in
test_objects.py beside the other streams.)

Each sample's label is its dataset index, so a batch's labels say which
samples it holds."""

import ast
import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np

from imgtest import parse_image_dump, save_image, smooth_image
from ldrtest import partition_share, python_client_env

SIZES = [5, 3, 0, 8, 1, 6, 4, 7]    # samples per shard; one has none (a .txt only)
N = sum(SIZES)
OPS = [{"op": "random_resized_crop", "size": 8}, {"op": "horizontal_flip"}]


def _reference_permutation():
    """permute/splitmix64 of tests/python/test_epochs.py (the suite's port of
    docs/spec.md, "The permutation"), taken from its source: importing it
    would import that directory's conftest."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "python", "test_epochs.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    keep = [n for n in tree.body
            if (isinstance(n, ast.FunctionDef) and n.name in ("mix64", "splitmix64", "permute"))
            or (isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "M64" for t in n.targets))]
    ns = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), ns)
    return ns


REF = _reference_permutation()
M64 = REF["M64"]


def window_order(seed, epoch, sizes, window):
    """docs/spec.md, "Shuffle windows": window_permute(seed, epoch, p) for
    every position p."""
    permute, splitmix64 = REF["permute"], REF["splitmix64"]
    k = len(sizes)
    first = [sum(sizes[:i]) for i in range(k)]
    t = splitmix64(seed ^ 0x77696e646f777321)
    slots = [permute(t, epoch, k, i) for i in range(k)]
    out = []
    for j in range(-(-k // window)):
        ws = slots[j * window:(j + 1) * window]
        samples = [first[s] + c for s in ws for c in range(sizes[s])]
        m = len(samples)
        out += [samples[permute((t + 1 + j) & M64, epoch, m, q)] for q in range(m)]
    return out


def write_shards(workdir, sizes=SIZES):
    """Shards of tiny JPEGs whose cls is the sample's dataset index; the
    brace pattern naming them."""
    d = os.path.join(workdir, "wshards")
    os.makedirs(d, exist_ok=True)
    jpg = os.path.join(d, "img.jpg")
    save_image(jpg, smooth_image(np.random.default_rng(3), 12, 10), "JPEG", quality=90)
    with open(jpg, "rb") as f:
        img = f.read()
    idx = 0
    for s, size in enumerate(sizes):
        with tarfile.open(os.path.join(d, f"w-{s:02d}.tar"), "w", format=tarfile.USTAR_FORMAT) as tf:
            members = [(f"k{idx + i:04d}.jpg", img) for i in range(size)]
            members = [m for i in range(size) for m in (members[i], (f"k{idx + i:04d}.cls",
                                                                     str(idx + i).encode()))]
            if not size:
                members = [("only.txt", b"no image")]
            for name, data in members:
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                ti.mtime = 1700000000
                tf.addfile(ti, io.BytesIO(data))
        idx += size
    return os.path.join(d, "w-{00.." + f"{len(sizes) - 1:02d}" + "}.tar")


def spec(name, urls, **kw):
    s = {"name": name, "source": {"kind": "webdataset", "urls": [urls]}, "transforms": OPS,
         "output": {"dtype": "uint8", "layout": "NCHW"}, "batch_size": 4, "shuffle": True,
         "seed": 11, "shuffle_window": 3, "epochs": 2}
    s.update(kw)
    return s


def labels(dump, rows):
    return [int(x) for _, lab in parse_image_dump(dump, rows, (3, 8, 8), "uint8") for x in lab]


def batch_rows(share, bs, epochs):
    return ([bs] * (share // bs) + ([share % bs] if share % bs else [])) * epochs


def test_window_order_partition_two_epochs(ld, workdir):
    urls = write_shards(workdir)
    ld.create(spec("win", urls))
    canon = ld.pipeline("win")["spec"]
    assert canon["shuffle_window"] == 3 and canon["shuffle"] is True
    world, share = 3, -(-N // 3)
    orders = [window_order(11, e, SIZES, 3) for e in range(2)]
    for e in range(2):
        assert sorted(orders[e]) == list(range(N))
    assert orders[0] != orders[1]
    for rank in range(world):
        res = ld.consume("win", "--mode", "partition", "--rank", rank, "--world-size", world)
        want = [i for e in range(2) for i in partition_share(orders[e], rank, world)]
        assert labels(res.dump, batch_rows(share, 4, 2)) == want, f"rank {rank}"
    # a window of 1: each shard's samples in one run; windows past the
    # shard count mix all (another order than the plain shuffle's)
    for w in (1, 8, 100):
        ld.create(spec(f"win{w}", urls, shuffle_window=w, epochs=1))
        got = labels(ld.consume(f"win{w}").dump, batch_rows(N, 4, 1))
        assert got == window_order(11, 0, SIZES, w), w
    runs = [s for s, g in enumerate(SIZES) for _ in range(g)]
    got1 = [runs[i] for i in window_order(11, 0, SIZES, 1)]
    assert len([i for i in range(len(got1)) if i == 0 or got1[i] != got1[i - 1]]) == 7


def test_python_dataloader_passes_the_key(ld, workdir):
    """loaderd.DataLoader with a spec dict: shuffle_window goes to the
    daemon as it is (docs/python.md); its labels are the windowed order."""
    urls = write_shards(workdir)
    code = ("import json, sys, loaderd\n"
            "dl = loaderd.DataLoader(json.loads(sys.argv[2]), socket=sys.argv[1], as_numpy=True,"
            " epochs=1)\n"
            "with dl:\n"
            "    print(json.dumps([int(x) for b in dl for x in b['label']]))\n")
    r = subprocess.run([sys.executable, "-c", code, ld.socket, json.dumps(spec("py", urls, persist=True))],
                       env=python_client_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == window_order(11, 0, SIZES, 3)
    assert ld.pipeline("py")["spec"]["shuffle_window"] == 3


def test_window_spec_errors(ld, workdir):
    urls = write_shards(workdir, [2, 2])

    def err(s):
        r = ld.create(s, check=False)
        assert r.returncode != 0
        return r.stderr.strip()

    assert "spec: shuffle_window: needs \"shuffle\": true" in err(spec("e1", urls, shuffle=False))
    assert "spec: shuffle_window: must be an integer in 0..65536" in err(spec("e2", urls, shuffle_window=-1))
    assert "spec: shuffle_window: must be an integer in 0..65536" in err(spec("e3", urls, shuffle_window="4"))
    assert "spec: shuffle_window: must be an integer in 0..65536" in err(spec("e4", urls, shuffle_window=65537))
    npy = {"name": "e5", "source": {"kind": "npy", "paths": [urls]}, "shuffle": True, "shuffle_window": 2}
    assert "spec: shuffle_window: only for a source of shards (webdataset), not npy" in err(npy)
    # 0 is the plain shuffle, and the canonical form leaves it out
    ld.create(spec("plain", urls, shuffle_window=0))
    assert "shuffle_window" not in ld.pipeline("plain")["spec"]
