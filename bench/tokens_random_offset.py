#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""nanoGPT's get_batch against a loaderd pipeline of random offsets (issue 27).

    /usr/bin/python3 bench/tokens_random_offset.py [--build build] [--seconds 6]
        [--tokens 200000000] [--shards 64] [--seq-len 1024] [--batch 12] [--json FILE]
    /usr/bin/python3 bench/tokens_random_offset.py --quick     # a smoke: tiny, 1 s each

One generated uint16 corpus, written twice: as one train.bin (nanoGPT's
layout) and as --shards shard files. Three trainers, one after the other,
each taking batches in a loop for --seconds after a warm-up and touching
every batch (x[:, 0].sum()):

  nanogpt          karpathy/nanoGPT train.py's get_batch, as written there:
                   np.memmap of train.bin each call, torch.randint offsets,
                   torch.stack of the int64 slices (device 'cpu')
  loaderd-file     a tokens pipeline, sampling random_offset, over train.bin
  loaderd-shards   the same over the shards (paths: a glob, boundaries file)

  batches/s        batches taken inside the window / seconds
  trainer ms/b     the trainer's CPU (utime+stime) per batch
  daemon ms/b      loaderd's CPU per batch (0 for nanogpt)

The daemon gets --workers = the number of CPUs. Figures go to
docs/benchmarks.md; this script asserts nothing about speed.
"""

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from torch_compare import Daemon, proc_cpu  # noqa: E402


def make_corpus(d, ntokens, nshards):
    import numpy as np
    rng = np.random.default_rng(0)
    per = ntokens // nshards
    with open(os.path.join(d, "train.bin"), "wb") as cat:
        for s in range(nshards):
            t = rng.integers(0, 50257, size=per, dtype=np.uint16)
            t.tofile(os.path.join(d, f"shard-{s:04d}.bin"))
            t.tofile(cat)


def measure(next_batch, seconds, daemon_pid=None):
    import torch
    acc = 0
    for _ in range(5):                      # warm-up
        x, y = next_batch()
    n = 0
    c0, d0 = time.process_time(), proc_cpu(daemon_pid) if daemon_pid else 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        x, y = next_batch()
        acc += int(x[:, 0].sum()) + int(y[:, -1].sum())
        n += 1
    wall = time.monotonic() - t0
    cpu = time.process_time() - c0
    dcpu = (proc_cpu(daemon_pid) - d0) if daemon_pid else 0.0
    assert isinstance(x, torch.Tensor) and x.dtype == torch.int64
    return {"batches_per_s": n / wall, "trainer_ms_per_batch": 1000 * cpu / n,
            "daemon_ms_per_batch": 1000 * dcpu / n, "batches": n}


def nanogpt(d, block_size, batch_size, seconds):
    import numpy as np
    import torch
    data_dir = d

    def get_batch(split):               # karpathy/nanoGPT train.py
        data = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64))
                         for i in ix])
        return x, y

    return measure(lambda: get_batch('train'), seconds)


def with_loaderd(daemon, src, block_size, batch_size, seconds):
    import loaderd
    spec = {"name": "bench", "source": dict({"kind": "tokens", "seq_len": block_size,
                                             "sampling": "random_offset",
                                             "samples_per_epoch": 1 << 30}, **src),
            "batch_size": batch_size, "seed": 1337, "epochs": 0}
    with loaderd.DataLoader(spec, socket=daemon.socket, timeout=60) as dl:
        it = iter(dl)

        def next_batch():
            b = next(it)
            x, y = b
            return x, y

        r = measure(next_batch, seconds, daemon.proc.pid)
    with loaderd.Client(daemon.socket) as c:
        c.drop_pipeline("bench")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--tokens", type=int, default=200_000_000)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny corpus, 1 s each")
    a = ap.parse_args()
    if a.quick:
        a.tokens, a.shards, a.seconds, a.seq_len, a.batch = 2_000_000, 8, 1.0, 256, 8
    os.environ.setdefault("LOADERD_LIBRARY", os.path.join(a.build, "client", "libloader.so"))
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    import torch
    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory(prefix="ldr-tokbench-") as d:
        make_corpus(d, a.tokens, a.shards)
        results["nanogpt"] = nanogpt(d, a.seq_len, a.batch, a.seconds)
        daemon = Daemon(a.build, d, os.cpu_count())
        try:
            results["loaderd-file"] = with_loaderd(daemon, {"path": os.path.join(d, "train.bin")},
                                                   a.seq_len, a.batch, a.seconds)
            results["loaderd-shards"] = with_loaderd(
                daemon, {"paths": [os.path.join(d, "shard-*.bin")]}, a.seq_len, a.batch,
                a.seconds)
        finally:
            daemon.stop()
    print(f"{a.tokens} tokens, {a.shards} shards, seq_len {a.seq_len}, batch {a.batch}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'':16} {'batches/s':>10} {'trainer ms/b':>13} {'daemon ms/b':>12}")
    for k, r in results.items():
        print(f"{k:16} {r['batches_per_s']:10.1f} {r['trainer_ms_per_batch']:13.3f} "
              f"{r['daemon_ms_per_batch']:12.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
