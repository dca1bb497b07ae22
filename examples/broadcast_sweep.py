#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A two-trial hyper-parameter sweep: two trainer processes (different
learning rates) share ONE broadcast pipeline, so every batch is read and
collated once and delivered to both. min_clients 2 makes the stream wait
until both trainers are attached, so both see the whole stream.

    /usr/bin/python3 examples/broadcast_sweep.py   # starts a private loaderd
"""

import multiprocessing as mp
import zlib

import _common
import numpy as np

EPOCHS = 2 if _common.QUICK else 4
N = 8000 if _common.QUICK else 20000


def trial(sock, spec, lr, xv_path, yv_path, q):
    import torch
    import torch.nn as nn
    import loaderd
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    crc, batches = 0, 0
    # both trials pass the same spec: the first creates the pipeline, the
    # second finds it (exist_ok); mode="broadcast" shares one stream between
    # them (the default would give each trial a private stream of its own)
    with loaderd.DataLoader(spec, socket=sock, mode="broadcast") as dl:
        for epoch in range(EPOCHS):
            for x, y in dl:  # fields in the order of the spec's paths: x, label
                crc = zlib.crc32(y.numpy().tobytes(), crc)
                batches += 1
                opt.zero_grad()
                lossf(net(x), y).backward()
                opt.step()
    xv, yv = torch.from_numpy(np.load(xv_path)), torch.from_numpy(np.load(yv_path))
    with torch.no_grad():
        acc = (net(xv).argmax(1) == yv).float().mean().item()
    q.put((lr, acc, batches, crc))


def main():
    d = _common.workdir()
    sock = _common.daemon(d)
    xp, lp = _common.classification_npy(d, n=N)
    xv = d + "/xv.npy"
    yv = d + "/yv.npy"
    np.save(xv, np.load(xp)[-2000:])
    np.save(yv, np.load(lp)[-2000:])
    spec = {"name": "sweep", "source": {"kind": "npy", "paths": [xp, lp]}, "batch_size": 64,
            "shuffle": True, "seed": 5, "epochs": EPOCHS, "min_clients": 2}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=trial, args=(sock, spec, lr, xv, yv, q)) for lr in (0.01, 0.1)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    for lr, acc, batches, crc in results:
        print(f"trial lr={lr}: accuracy {acc:.4f}, {batches} batches, label crc {crc:08x}")
    same = len({(b, c) for _, _, b, c in results}) == 1
    print("both trials received the same stream:", "yes" if same else "NO")
    if not same or any(p.exitcode != 0 for p in procs):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
