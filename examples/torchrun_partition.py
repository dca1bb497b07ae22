#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""torchrun-style data parallelism: WORLD_SIZE ranks, each receiving its
disjoint share of every epoch (as DistributedSampler gives it). loaderd reads
RANK and WORLD_SIZE from the environment, like torchrun sets them, and then
attaches in partition mode.

    /usr/bin/python3 examples/torchrun_partition.py        # launches 2 ranks itself
    torchrun --nproc-per-node 2 examples/torchrun_partition.py   # (with LOADERD_SOCKET set)
"""

import os
import subprocess
import sys

import _common
import numpy as np

EPOCHS = 2


def rank_main(spec):
    import loaderd
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    seen = []
    with loaderd.DataLoader(spec, as_numpy=True) as dl:  # socket: $LOADERD_SOCKET
        assert dl.mode == "partition" and (dl.rank, dl.world_size) == (rank, world)
        for epoch in range(EPOCHS):
            dl.set_epoch(epoch)
            # np.array copies: a batch kept beyond its step holds its slot
            ids = np.concatenate([np.array(b["id"]) for b in dl])
            seen.append(ids)
            print(f"rank {rank}/{world} epoch {epoch}: {len(ids)} samples, "
                  f"first ids {ids[:4].tolist()}", flush=True)
    np.save(os.environ["RANK_OUT"] + f".{rank}.npy", np.stack(seen))


def main():
    n = 1000
    if "RANK" in os.environ:  # started by torchrun or by us below
        d = os.environ["EXAMPLE_DIR"]
        rank_main(spec_for(d))
        return
    d = _common.workdir()
    _common.daemon(d)
    np.save(d + "/id.npy", np.arange(n, dtype=np.int64))
    np.save(d + "/feat.npy", np.random.default_rng(0).standard_normal((n, 8)).astype(np.float32))
    world = 2
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   EXAMPLE_DIR=d, RANK_OUT=d + "/out")
        procs.append(subprocess.Popen([sys.executable, __file__], env=env))
    rcs = [p.wait(120) for p in procs]
    if any(rcs):
        raise SystemExit(f"a rank failed: {rcs}")
    got = [np.load(d + f"/out.{r}.npy") for r in range(world)]
    for e in range(EPOCHS):
        union = np.concatenate([g[e] for g in got])
        disjoint = len(set(got[0][e].tolist()) & set(got[1][e].tolist())) == 0
        print(f"epoch {e}: ranks disjoint: {'yes' if disjoint else 'NO'}, "
              f"cover all {n}: {'yes' if sorted(union.tolist()) == list(range(n)) else 'NO'}")


def spec_for(d):
    return {"name": "ddp", "source": {"kind": "npy", "paths": [d + "/id.npy", d + "/feat.npy"]},
            "batch_size": 50, "shuffle": True, "seed": 9}


if __name__ == "__main__":
    main()
