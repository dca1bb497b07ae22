# SPDX-License-Identifier: MIT
"""Slots shared fairly between the streams and attachments of one pipeline
(docs/protocol.md, "Sharing slots"): data-parallel ranks in lockstep, every
mix of modes, idle clients, two loaders of one spec in one process.

Every loader here has a timeout, so a stall fails the test with loaderd's
"DataLoader timed out" error instead of hanging it. The pipelines have 8
slots, named in their spec, unless a test says otherwise."""

import itertools
import os
import sys
import textwrap
import time

import numpy as np
import pytest

import loaderd
from conftest import run_python

try:
    import torch
    import torch.distributed  # noqa: F401
except Exception:  # pragma: no cover
    torch = None

N = 256          # samples; y[i] == i
BATCH = 4
TIMEOUT = 20     # seconds a loader waits for one batch before it raises


def dataset(d):
    x = (np.arange(N * 6, dtype=np.float32).reshape(N, 6) % 251)
    y = np.arange(N, dtype=np.int64)
    xp, yp = os.path.join(d, "x.npy"), os.path.join(d, "y.npy")
    np.save(xp, x)
    np.save(yp, y)
    return x, y, [xp, yp]


def spec(paths, name="share", **kw):
    s = {"name": name, "source": {"kind": "npy", "paths": paths}, "batch_size": BATCH,
         "shuffle": False, "epochs": 0, "prefetch": 8}
    s.update(kw)
    return s


def expect_rank(rank, world, batches):
    """The y values partition rank @rank of @world receives in its first
    @batches batches of unshuffled epochs (DistributedSampler's rule:
    samples rank, rank + world, ...)."""
    total = -(-N // world) * world        # padded with the first samples again
    share = (np.arange(total) % N)[rank::world]
    per = -(-len(share) // BATCH)
    out = []
    for b in range(batches):
        e, i = divmod(b, per)
        out.append(share[i * BATCH:(i + 1) * BATCH])
    return out


def check_x(b, x):
    np.testing.assert_array_equal(np.asarray(b["x"]), x[np.asarray(b["y"])])


# ------------------------------------------------ data-parallel ranks (DDP)

DDP_RANK = textwrap.dedent(r"""
    import json, os, sys, time
    import numpy as np
    import torch, torch.distributed as dist
    import loaderd

    rank, world, sock, initf, out, late = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                           sys.argv[4], sys.argv[5], float(sys.argv[6]))
    spec = json.loads(sys.argv[7])
    dist.init_process_group("gloo", init_method="file://" + initf, rank=rank, world_size=world)
    # the last rank attaches first, rank 0 `late` seconds after it, as when
    # one rank's setup (a checkpoint load, a compile) takes longer
    time.sleep(late if rank == 0 else 0.1 * (world - 1 - rank))
    loader = loaderd.DataLoader(spec, socket=sock, mode="partition", rank=rank, world_size=world,
                                timeout=%(timeout)d, as_numpy=True)
    model = torch.nn.Linear(6, 1)
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        for step, b in enumerate(loader):
            x = torch.from_numpy(np.array(b["x"]))
            y = torch.from_numpy(np.array(b["y"])).float()
            loss = ((model(x).squeeze(1) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()          # the all-reduce: every rank in lockstep
            opt.step()
            seen.append(np.asarray(b["y"]).tolist())
    with open(out, "w") as f:
        json.dump(seen, f)
    loader.close()
    # every rank done before any tears gloo down: torch 2.x's gloo aborts a
    # rank ("terminate called without an active exception") whose peer left first
    dist.barrier()
    dist.destroy_process_group()
""") % {"timeout": TIMEOUT}


@pytest.mark.skipif(torch is None, reason="python3-torch is not installed")
@pytest.mark.parametrize("world", [2, 8])
def test_ddp_ranks_in_lockstep(ld, workdir, world):
    """torch DDP (gloo) ranks as separate processes, one partition loader
    each, the last rank attaching first and rank 0 half a second late: every
    rank gets exactly its share for two epochs (it deadlocked at step 0)."""
    import json
    import subprocess
    x, y, paths = dataset(workdir)
    sp = json.dumps(spec(paths))
    script = os.path.join(workdir, "rank.py")
    with open(script, "w") as f:
        f.write(DDP_RANK)
    initf = os.path.join(workdir, "dist-init")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs, outs = [], []
    for rank in reversed(range(world)):
        out = os.path.join(workdir, f"seen-{rank}.json")
        outs.append((rank, out))
        procs.append(subprocess.Popen([sys.executable, script, str(rank), str(world), ld.socket,
                                       initf, out, "0.5", sp], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=240)[0] for p in procs]
    failed = [f"rank {r}:\n{log}" for (r, _), p, log in zip(outs, procs, logs) if p.returncode]
    assert not failed, "\n".join(failed)
    per = -(-(N // world) // BATCH)
    for rank, out in outs:
        with open(out) as f:
            seen = json.load(f)
        assert len(seen) == 2 * per
        want = expect_rank(rank, world, 2 * per)
        assert [list(map(int, w)) for w in want] == seen, f"rank {rank}"


def test_eight_ranks_in_lockstep_in_one_process(ld, workdir):
    """Eight partition loaders in one process stepped together, each holding
    its current batch while the others fetch theirs (one slot each)."""
    x, y, paths = dataset(workdir)
    sp = spec(paths)
    loaders = [loaderd.DataLoader(sp, socket=ld.socket, mode="partition", rank=r, world_size=8,
                                  timeout=TIMEOUT, as_numpy=True) for r in reversed(range(8))]
    loaders.reverse()
    per = len(loaders[0])
    its = [l.next_batch for l in loaders]
    held = [None] * 8
    got = [[] for _ in range(8)]
    for step in range(2 * per):
        for r in range(8):
            held[r] = its[r]()          # the previous batch is still held here
            check_x(held[r], x)
            got[r].append(np.asarray(held[r]["y"]).tolist())
    for r in range(8):
        assert got[r] == [w.tolist() for w in expect_rank(r, 8, 2 * per)], f"rank {r}"
    held = None
    for l in loaders:
        l.close()


# ------------------------------------------------------------ mode mixes

MODES = ("broadcast", "partition", "dynamic")


def mix_loaders(ld, sp, modes):
    nparts = sum(m == "partition" for m in modes)
    loaders, rank = [], 0
    for m in modes:
        kw = {}
        if m == "partition":
            kw = dict(rank=rank, world_size=nparts)
            rank += 1
        loaders.append((m, kw, loaderd.DataLoader(sp, socket=ld.socket, mode=m, timeout=TIMEOUT,
                                                  as_numpy=True, **kw)))
    return loaders


@pytest.mark.parametrize("modes", list(itertools.product(MODES, repeat=2)) +
                         list(itertools.product(MODES, repeat=3)), ids="-".join)
def test_every_mix_of_modes(ld, workdir, modes):
    """Loaders of every pair and triple of modes attach in turn to one
    8-slot pipeline (the first may have filled every slot before the next
    came), then read in turn: each gets what its mode promises."""
    x, y, paths = dataset(workdir)
    sp = spec(paths)
    loaders = mix_loaders(ld, sp, modes)
    steps = 24
    got = {i: [] for i in range(len(loaders))}
    dyn = []
    for step in range(steps):
        for i, (m, kw, l) in enumerate(loaders):
            b = l.next_batch()
            check_x(b, x)
            got[i].append(np.asarray(b["y"]).tolist())
            if m == "dynamic":
                dyn.append((b.epoch, b.index))
            b = None
    for i, (m, kw, l) in enumerate(loaders):
        if m == "partition":
            want = expect_rank(kw["rank"], kw["world_size"], steps)
            assert got[i] == [w.tolist() for w in want], f"{m} {kw}"
        elif m == "broadcast":
            # one shared stream: consecutive batches from where it stood
            flat = [v for bt in got[i] for v in bt]
            start = flat[0]
            assert start % BATCH == 0
            assert flat == [(start + k) % N for k in range(len(flat))]
        else:
            for bt in got[i]:     # whole batches of the unshuffled stream
                assert bt == list(range(bt[0], bt[0] + len(bt)))
    # dynamic: each batch of the stream to exactly one client
    assert len(dyn) == len(set(dyn)), "a dynamic batch went to two clients"
    for _, _, l in loaders:
        l.close()


def test_idle_dynamic_client_stalls_nobody(ld, workdir):
    """A dynamic client that attaches and never asks (its libloader window
    still asks for batches) takes no slot from a partition and a broadcast
    client reading 60 batches each."""
    x, y, paths = dataset(workdir)
    sp = spec(paths)
    idle = loaderd.DataLoader(sp, socket=ld.socket, mode="dynamic", timeout=TIMEOUT, as_numpy=True)
    part = loaderd.DataLoader(sp, socket=ld.socket, mode="partition", rank=0, world_size=1,
                              timeout=TIMEOUT, as_numpy=True)
    bc = loaderd.DataLoader(sp, socket=ld.socket, mode="broadcast", timeout=TIMEOUT, as_numpy=True)
    want = expect_rank(0, 1, 60)
    for k in range(60):
        b = part.next_batch()
        assert np.asarray(b["y"]).tolist() == want[k].tolist()
        c = bc.next_batch()
        check_x(c, x)
    st = ld.status()
    [pl] = [p for p in st["pipelines"] if p["name"] == "share"]
    assert pl["slots_total"] == 8
    for l in (idle, part, bc):
        l.close()


def test_two_loaders_of_one_spec_in_one_process(ld, workdir):
    """nanoGPT's shape: a train loop and an estimate_loss loop over loaders
    of the same spec in one process; the eval loader reads 3 batches every
    5 steps and otherwise sits idle. Both progress for 50 steps."""
    x, y, paths = dataset(workdir)
    sp = spec(paths)
    train = loaderd.DataLoader(sp, socket=ld.socket, timeout=TIMEOUT, as_numpy=True)
    evl = loaderd.DataLoader(sp, socket=ld.socket, timeout=TIMEOUT, as_numpy=True)
    it = None
    n = 0
    for step in range(50):
        if it is None:
            it = iter(train)
        try:
            b = next(it)
        except StopIteration:
            it = None
            continue
        check_x(b, x)
        n += 1
        if step % 5 == 0:
            for k, e in enumerate(evl):
                check_x(e, x)
                if k == 2:
                    break
    assert n >= 45
    train.close()
    evl.close()


# ------------------------------------------- a trainer that stops reading

EVAL_RANK = textwrap.dedent(r"""
    import json, sys
    import loaderd

    sock, name = sys.argv[1], sys.argv[2]
    dl = loaderd.DataLoader(name, socket=sock, mode="partition", rank=0, world_size=2,
                            inflight=8, timeout=%(timeout)d, as_numpy=True)
    it = iter(dl)
    held = next(it)                  # the step's batch, held through the eval
    seen = [held["y"].tolist()]
    print("ready", flush=True)
    sys.stdin.readline()             # a long eval: no next() meanwhile
    del held
    seen += [b["y"].tolist() for b in it]
    print(json.dumps(seen), flush=True)
    dl.close()
""") % {"timeout": TIMEOUT}


def test_stopped_trainer_gives_back_its_share(ld, workdir):
    """Rank 0 of 2, in a process of its own, attaches alone: the 4 slots
    (prefetch 4) hold its whole epoch and its window (8) its End too, while
    its trainer holds the batch it took and stopped (a long eval). Rank 1 of
    another process attaches: the quotas are 2, so rank 0 must hand back its
    2 newest batches (those below its End) with no call of its trainer. Rank
    1 reads its whole epoch meanwhile; rank 0 then gets the batches it gave
    back again, and its End: each exactly its DistributedSampler share."""
    import json
    import subprocess
    n = 32
    y = np.arange(n, dtype=np.int64)
    xp, yp = os.path.join(workdir, "x.npy"), os.path.join(workdir, "y.npy")
    np.save(xp, y.astype(np.float32).reshape(n, 1))
    np.save(yp, y)
    with loaderd.Client(ld.socket) as c:
        c.create_pipeline(spec([xp, yp], name="eval", epochs=1, prefetch=4))
    script = os.path.join(workdir, "eval.py")
    with open(script, "w") as f:
        f.write(EVAL_RANK)
    p = subprocess.Popen([sys.executable, script, ld.socket, "eval"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        deadline = time.monotonic() + TIMEOUT
        while True:  # its whole epoch delivered, and its End after it
            st = ld.status()
            atts = [a for cl in st["clients"] for a in cl["attachments"]]
            if [(a["position"], a["leases"], a["delivered"]) for a in atts] == \
                    [({"epoch": 1, "batch": 0}, 4, 4)]:
                break
            assert time.monotonic() < deadline, atts
            time.sleep(0.01)
        with loaderd.DataLoader("eval", socket=ld.socket, mode="partition", rank=1, world_size=2,
                                timeout=TIMEOUT, as_numpy=True) as dl:
            assert [b["y"].tolist() for b in dl] == [list(range(8 * i + 1, 8 * i + 8, 2))
                                                     for i in range(4)]
        st = ld.status()
        [a] = [a for cl in st["clients"] for a in cl["attachments"]]
        assert (a["rank"], a["revokes"], a["returned"]) == (0, 1, 2)
        out, _ = p.communicate("go\n", timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, out
    assert json.loads(out) == [list(range(8 * i, 8 * i + 8, 2)) for i in range(4)]
