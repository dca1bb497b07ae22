#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Train a small MLP on a generated .npy dataset twice: fed by loaderd, then
by torch.utils.data.DataLoader over the same files. Same model, seed,
batch size, epochs; the orders differ (loaderd's permutation vs torch's
RandomSampler), so the loss curves differ, the final accuracy should not.

    /usr/bin/python3 examples/train_npy.py        # starts a private loaderd
"""

import time

import _common  # noqa: F401  (sys.path, LOADERD_LIBRARY)
import numpy as np
import torch
import torch.nn as nn

import loaderd

EPOCHS = 2 if _common.QUICK else 5
N = 8000 if _common.QUICK else 20000
BATCH = 64
torch.set_num_threads(1)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def train(batches_of_epoch, xv, yv):
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        for x, y in batches_of_epoch(epoch):
            opt.zero_grad()
            loss = lossf(net(x), y)
            loss.backward()
            opt.step()
    with torch.no_grad():
        return (net(xv).argmax(1) == yv).float().mean().item()


class NpyDataset(torch.utils.data.Dataset):
    def __init__(self, xp, lp):
        self.x = np.load(xp, mmap_mode="r")
        self.y = np.load(lp, mmap_mode="r")

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(np.array(self.x[i])), int(self.y[i])


def main():
    d = _common.workdir()
    sock = _common.daemon(d)
    xp, lp = _common.classification_npy(d, n=N)
    x_all, y_all = torch.from_numpy(np.load(xp)), torch.from_numpy(np.load(lp))
    ntrain = N * 4 // 5
    # train on the first 80 %: a second pair of files, as a user would have them
    np.save(d + "/xt.npy", np.load(xp)[:ntrain])
    np.save(d + "/lt.npy", np.load(lp)[:ntrain])
    xv, yv = x_all[ntrain:], y_all[ntrain:]

    spec = {"name": "train-npy", "source": {"kind": "npy", "paths": [d + "/xt.npy", d + "/lt.npy"]},
            "batch_size": BATCH, "shuffle": True, "seed": 1, "epochs": EPOCHS}
    t0 = time.monotonic()
    with loaderd.DataLoader(spec, socket=sock) as dl:
        def ldr_epoch(e):
            return dl  # as torch's: each `for` over it is the next epoch, (x, y) batches
        acc_ldr = train(ldr_epoch, xv, yv)
    t_ldr = time.monotonic() - t0

    t0 = time.monotonic()
    tdl = torch.utils.data.DataLoader(NpyDataset(d + "/xt.npy", d + "/lt.npy"), batch_size=BATCH,
                                      shuffle=True, num_workers=2,
                                      generator=torch.Generator().manual_seed(1))

    def torch_epoch(e):
        return iter(tdl)
    acc_torch = train(torch_epoch, xv, yv)
    t_torch = time.monotonic() - t0
    print(f"loaderd accuracy {acc_ldr:.4f} ({t_ldr:.1f} s)")
    print(f"torch   accuracy {acc_torch:.4f} ({t_torch:.1f} s)")
    print(f"difference {abs(acc_ldr - acc_torch):.4f}")


if __name__ == "__main__":
    main()
