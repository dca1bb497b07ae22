#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A sweep whose trials must not see the same crops: three trial processes
read ONE broadcast image pipeline, each with its own augment_seed. The daemon
reads and decodes every image once and crops and flips it once per seed
(docs/spec.md, "Augment seeds"); every trial sees the same images in the same
order, each cut its own way. min_clients 3 makes the stream wait until all
three are attached, so all see it from its first batch.

    /usr/bin/python3 examples/augment_sweep.py   # starts a private loaderd
"""

import multiprocessing as mp
import os
import zlib

import _common
import numpy as np

EPOCHS = 2 if _common.QUICK else 4
N = 60 if _common.QUICK else 400


def images(root, n):
    """@n small generated JPEGs in two class folders."""
    from PIL import Image
    rng = np.random.default_rng(0)
    for k in range(n):
        d = os.path.join(root, f"class{k % 2}")
        os.makedirs(d, exist_ok=True)
        px = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        Image.fromarray(px).save(os.path.join(d, f"{k:04d}.jpg"), quality=85)


def trial(sock, spec, seed, q):
    import loaderd
    crops = labels = 0
    with loaderd.DataLoader(spec, socket=sock, mode="broadcast", as_numpy=True,
                            augment_seed=seed) as dl:
        for epoch in range(EPOCHS):
            for b in dl:
                crops = zlib.crc32(b["image"].tobytes(), crops)
                labels = zlib.crc32(b["label"].tobytes(), labels)
    q.put((seed, crops, labels))


def main():
    d = _common.workdir()
    sock = _common.daemon(d)
    root = os.path.join(d, "train")
    images(root, N)
    spec = {"name": "sweep", "source": {"kind": "image_folder", "path": root},
            "transforms": [{"op": "random_resized_crop", "size": 32},
                           {"op": "horizontal_flip", "p": 0.5}],
            "output": {"dtype": "uint8", "layout": "NCHW"}, "batch_size": 16,
            # exact decoding: one decode an image for all seeds (with DCT
            # scaling, the default, seeds whose crops pick different scales
            # each decode at theirs)
            "decode": {"dct_scaling": False},
            "shuffle": True, "seed": 5, "epochs": EPOCHS, "min_clients": 3, "prefetch": 12}
    import loaderd
    # created here, so that this connection holds it until the count below
    # (the trials pass the same spec and find it)
    admin = loaderd.Client(socket=sock)
    admin.create_pipeline(spec, exist_ok=True)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=trial, args=(sock, spec, seed, q)) for seed in (1, 2, 3)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    decoded = admin.pipeline("sweep")["decoded"]
    for seed, crops, labels in results:
        print(f"trial augment_seed={seed}: image crc {crops:08x}, label crc {labels:08x}")
    different = len({c for _, c, _ in results}) == len(results)
    same_order = len({lab for _, _, lab in results}) == 1
    print("the trials saw different crops:", "yes" if different else "NO")
    print("of the same samples in the same order:", "yes" if same_order else "NO")
    print(f"images decoded: {decoded} for the {len(results) * EPOCHS * N} the trials read")
    if not different or not same_order or any(p.exitcode != 0 for p in procs):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
