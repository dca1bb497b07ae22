# SPDX-License-Identifier: MIT
"""A real 8-rank lockstep run on gloo (issue 27): 8 processes, each a
partition rank of one pipeline, joined by torch.distributed (gloo, a
file:// rendezvous). Per step every rank all_gathers (batch index, sample
ids): the same batch index on every rank (lockstep) and no sample on two
ranks. After 3 steps rank 0's state_dict() is saved, the job ends, and 4
processes resume it (a new world size, every rank loading rank 0's state)
to the end of the epoch: every sample of the epoch read exactly once."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed without gloo", allow_module_level=True)

import loaderd  # noqa: E402

N, BS = 96, 2

RANK_SCRIPT = r"""
import json, sys
import torch, torch.distributed as dist
import loaderd

rank, world, init, sock, name, steps, state_in, out = sys.argv[1:9]
rank, world, steps = int(rank), int(world), int(steps)
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
dl = loaderd.DataLoader(name, socket=sock, as_numpy=True, mode="partition", rank=rank,
                        world_size=world, inflight=2)
if state_in != "-":
    with open(state_in) as f:
        dl.load_state_dict(json.load(f))
mine, step, it, n0 = [], 0, iter(dl), len(dl)
while True:
    b = next(it, None)
    t = torch.full((2 + %(bs)d,), -1, dtype=torch.int64)
    if b is not None:
        t[0], t[1] = b.index, b.rows
        t[2:2 + b.rows] = torch.as_tensor(b["y"])
    got = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(got, t)
    assert len({int(g[0]) for g in got}) == 1, f"step {step}: not in lockstep: {got}"
    if b is None:
        break
    ids = [int(i) for g in got for i in g[2:2 + int(g[1])]]
    assert len(ids) == len(set(ids)), f"step {step}: a sample on two ranks: {got}"
    mine += [int(i) for i in b["y"]]
    step += 1
    if step == steps:
        if rank == 0:
            with open(out + ".state", "w") as f:
                json.dump(dl.state_dict(), f)
        break
dist.barrier()
with open(out, "w") as f:
    json.dump({"ids": mine, "steps": step, "len": n0}, f)
dl.close()
dist.destroy_process_group()
""" % {"bs": BS}


def run_job(ld, workdir, tag, world, steps, state):
    script = os.path.join(workdir, "rank.py")
    with open(script, "w") as f:
        f.write(RANK_SCRIPT)
    init = "file://" + os.path.join(workdir, f"rdzv-{tag}")
    outs = [os.path.join(workdir, f"{tag}-{r}.json") for r in range(world)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    procs = [subprocess.Popen([sys.executable, script, str(r), str(world), init, ld.socket, "g",
                               str(steps), state or "-", outs[r]], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(world)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} of {world}: exit {p.returncode}\n{logs[r]}"
    res = []
    for o in outs:
        with open(o) as f:
            res.append(json.load(f))
    return res, outs[0] + ".state"


def test_gloo_8_ranks_then_4(ld, workdir):
    import numpy as np
    yp = os.path.join(workdir, "y.npy")
    np.save(yp, np.arange(N, dtype=np.int64))
    with loaderd.Client(ld.socket) as c:  # the pipeline lives while its creator is connected
        c.create_pipeline({"name": "g", "source": {"kind": "npy", "paths": [yp]},
                           "batch_size": BS, "shuffle": True, "seed": 3, "epochs": 1})
        first, state_path = run_job(ld, workdir, "w8", 8, 3, None)
        assert [r["steps"] for r in first] == [3] * 8 and {r["len"] for r in first} == {6}
        with open(state_path) as f:
            state = json.load(f)
        assert (state["position"], state["world_size"], state["_num_yielded"]) == (48, 8, 3)
        rest, _ = run_job(ld, workdir, "w4", 4, 0, state_path)
    # 48 left over 4 ranks: 12 each, 6 batches in lockstep
    assert [r["steps"] for r in rest] == [6] * 4 and {r["len"] for r in rest} == {6}
    ids = [i for r in first + rest for i in r["ids"]]
    assert sorted(ids) == list(range(N)), "the epoch is not every sample exactly once"
