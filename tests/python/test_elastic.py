# SPDX-License-Identifier: MIT
"""Elastic resume (issue 27): a state_dict() saved at world size W resumes
at W' != W with nothing repeated and nothing skipped in the rest of that
epoch (docs/python.md, "Exact resume"; docs/spec.md, "Order and
determinism"). The epoch's permutation is global: ranks in lockstep stand
at one global position, any rank's state loaded by every new rank is
enough, and the new ranks take the tail by the new partition.

Partition ranks are loaders of one pipeline in this process; field "y" of
sample i is i, so each row says which sample it is. The permutation is
read from a rank 0 of 1 (its order is the epoch's permutation itself)."""

import json
import time

import numpy as np
import pytest

import loaderd

from test_package import npy_dataset, npy_spec


def make(ld, workdir, n, name="el", batch_size=2, drop_last=False, epochs=2):
    _, _, paths = npy_dataset(workdir, n=n)
    spec = npy_spec(paths, name=name, batch_size=batch_size, shuffle=True, seed=5,
                    drop_last=drop_last, epochs=epochs)
    with loaderd.Client(ld.socket) as c:
        c.create_pipeline(spec)
    return name


def loader(ld, name, rank, world, **kw):
    # the automatic window: 8 ranks read by one thread (test_lockstep_revoke)
    return loaderd.DataLoader(name, socket=ld.socket, as_numpy=True, mode="partition",
                              rank=rank, world_size=world, **kw)


def perms(ld, name, epochs=2):
    """The permutation of each epoch: position -> sample (rank 0 of 1)."""
    with loader(ld, name, 0, 1) as dl:
        return [[int(i) for b in dl for i in b["y"]] for _ in range(epochs)]


def lockstep(loaders, steps):
    """@steps batches of each loader's current `for`, rank after rank per
    step (as ranks in lockstep); the sample ids of each, and the iterators."""
    its = [iter(dl) for dl in loaders]
    got = [[] for _ in loaders]
    for _ in range(steps):
        for r, it in enumerate(its):
            got[r] += [int(i) for i in next(it)["y"]]
    return got, its


def cdiv(a, b):
    return -(-a // b)


def count_into(count, ids):
    for i in ids:
        count[i] += 1


@pytest.mark.parametrize("n, padded", [(120, 0), (100, 2)])
def test_resume_8_4_6(ld, workdir, n, padded):
    """8 ranks read 2 batches of 2 (positions [0, 32)), 4 ranks resume from
    rank 5's state and read 2 (to 48), 6 ranks resume from rank 2's state
    and read the rest of epoch 0: rank r positions 48 + r + 6j. n = 120: 72
    left, 12 a rank, every sample once. n = 100: 52 left, 9 a rank, padded
    by wrapping to the epoch's positions 0 and 1 (DistributedSampler pads
    from its list's start): those two samples twice, every other once. Then
    epoch 1 is the plain share at 6."""
    name = make(ld, workdir, n)
    perm, perm1 = perms(ld, name)
    count = [0] * n

    eight = [loader(ld, name, r, 8) for r in range(8)]
    got, its = lockstep(eight, 2)
    for r in range(8):
        assert got[r] == [perm[r + 8 * j] for j in range(4)]
        count_into(count, got[r])
    states = [dl.state_dict() for dl in eight]
    assert {s["position"] for s in states} == {32}  # lockstep: one global position
    state = states[5]
    for dl in eight:
        dl.close()

    four = [loader(ld, name, r, 4) for r in range(4)]
    for dl in four:
        dl.load_state_dict(state)
        dl.set_epoch(0)  # Lightning's call at the epoch's head keeps the position
        assert len(dl) == cdiv(cdiv(n - 32, 4), 2) and dl.epoch == 0
    got, its = lockstep(four, 2)
    for r in range(4):
        assert got[r] == [perm[32 + r + 4 * j] for j in range(4)]
        count_into(count, got[r])
    states = [dl.state_dict() for dl in four]
    assert {(s["position"], s["tail_start"], s["_num_yielded"]) for s in states} == {(48, 32, 2)}
    state = states[2]
    for dl in four:
        dl.close()

    six = [loader(ld, name, r, 6) for r in range(6)]
    for dl in six:
        dl.load_state_dict(state)
    with loaderd.Client(ld.socket) as c:  # status names each attachment's tail
        tails = [(a["rank"], a["world_size"], a.get("tail")) for cl in c.status()["clients"]
                 for a in cl["attachments"]]
    assert sorted(tails) == [(r, 6, {"epoch": 0, "position": 48}) for r in range(6)]
    share = cdiv(n - 48, 6)
    for r, dl in enumerate(six):
        dl.load_state_dict(state)
        assert len(dl) == cdiv(share, 2) and dl.samples_per_epoch == share
        ids = [int(i) for b in dl for i in b["y"]]
        assert ids == [perm[(48 + r + 6 * j) % n] for j in range(share)]
        count_into(count, ids)
    assert count == [1 + (i in perm[:padded]) for i in range(n)]

    # epoch 1: the plain share of 6 ranks (padded by wrapping as always)
    for r, dl in enumerate(six):
        assert dl.epoch == 1 and len(dl) == cdiv(cdiv(n, 6), 2)
        assert dl.state_dict()["position"] == 0
        ids = [int(i) for b in dl for i in b["y"]]
        assert ids == [perm1[(r + 6 * j) % n] for j in range(cdiv(n, 6))]
        dl.close()


def positions(ld, name):
    """rank -> the position of its attachment's cursor (status)."""
    with loaderd.Client(ld.socket) as c:
        return {a["rank"]: a["position"] for cl in c.status()["clients"]
                for a in cl["attachments"] if a["pipeline"] == name}


def wait_delivered(ld, name, ranks, epochs):
    """Until the daemon delivered every batch of @ranks (and their End)."""
    deadline = time.monotonic() + 30
    while True:
        pos = positions(ld, name)
        if all(pos.get(r) == {"epoch": epochs, "batch": 0} for r in ranks):
            return
        assert time.monotonic() < deadline, pos
        time.sleep(0.01)


def test_lockstep_revoke(ld, workdir):
    """8 partition ranks of one pipeline read by one thread in lockstep, with
    the automatic window (docs/protocol.md, "Sharing slots"). Ranks 0-3 come
    first: at 16 slots each they are delivered their whole stream, End
    included, while the trainer takes one batch of each. Ranks 4-7 then
    attach: the share falls to 8 with every slot leased, and ranks 0-3 must
    hand back what their trainer has not taken (the batches below their End)
    while the thread waits in rank 4's next(). Every rank reads both epochs
    exactly: DistributedSampler's share of the epoch's permutation."""
    n, w = 100, 8
    name = make(ld, workdir, n)
    perm = perms(ld, name)
    share = [[perm[e][(r + w * j) % n] for j in range(cdiv(n, w))] for e in range(2)
             for r in range(w)]
    loaders = [loader(ld, name, r, w, timeout=30) for r in range(4)]
    its = [iter(dl) for dl in loaders]
    got = [[int(i) for i in next(it)["y"]] for it in its]
    wait_delivered(ld, name, range(4), 2)
    loaders += [loader(ld, name, r, w, timeout=30) for r in range(4, w)]
    its += [iter(dl) for dl in loaders[4:]]
    got += [[int(i) for i in next(it)["y"]] for it in its[4:]]
    for _ in range(1, cdiv(cdiv(n, w), 2)):
        for r, it in enumerate(its):
            got[r] += [int(i) for i in next(it)["y"]]
    assert got == share[:w]
    got, _ = lockstep(loaders, cdiv(cdiv(n, w), 2))  # epoch 1
    assert got == share[w:]
    with loaderd.Client(ld.socket) as c:
        atts = [a for cl in c.status()["clients"] for a in cl["attachments"]]
    # ranks 0-3 were asked, and gave back (4-7 may be too, attached one by one)
    assert sorted(a["rank"] for a in atts if a["revokes"] and a["returned"])[:4] == [0, 1, 2, 3]
    for dl in loaders:
        dl.close()


def test_resume_drop_last(ld, workdir):
    """drop_last: 8 ranks of 12 samples read 2 batches of 3 (to 48); 6 ranks
    take floor(52 / 6) = 8 samples, 2 whole batches: positions [48, 84),
    each once; [84, 100) are dropped in that epoch, as drop_last drops."""
    n = 100
    name = make(ld, workdir, n, batch_size=3, drop_last=True)
    perm = perms(ld, name)[0]  # 99: 1 of 1 drops the short last batch, position 99
    perm += sorted(set(range(n)) - set(perm))
    count = [0] * n
    eight = [loader(ld, name, r, 8) for r in range(8)]
    got, _ = lockstep(eight, 2)
    for ids in got:
        count_into(count, ids)
    state = eight[0].state_dict()
    assert state["position"] == 48
    for dl in eight:
        dl.close()
    for r in range(6):
        with loader(ld, name, r, 6) as dl:
            dl.load_state_dict(state)
            assert len(dl) == 2
            ids = [int(i) for b in dl for i in b["y"]]
            assert ids == [perm[48 + r + 6 * j] for j in range(6)]
            count_into(count, ids)
    assert [count[perm[p]] for p in range(n)] == [1] * 84 + [0] * 16

    # a state after the epoch's last batch: the next epoch from its start
    with loader(ld, name, 0, 8) as dl:
        for _ in dl:
            pass
        st = dl.state_dict()
        assert (st["epoch"], st["_num_yielded"], st["position"]) == (1, 0, 0)


def test_unchanged_world_is_distributed_sampler(ld, workdir):
    """The unchanged world: each rank's share is torch's DistributedSampler
    (shuffle=False) over the epoch's permutation, padded as it pads, and a
    resume from any rank's state goes on with DistributedSampler's list."""
    torch = pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler
    n, w, bs = 100, 8, 3
    for drop_last in (False, True):
        name = make(ld, workdir, n, name=f"ds{int(drop_last)}", batch_size=bs,
                    drop_last=drop_last, epochs=1)
        perm = perms(ld, name, 1)[0]
        for r in range(w):
            ds = DistributedSampler(perm, num_replicas=w, rank=r, shuffle=False,
                                    drop_last=drop_last)
            ref = [perm[i] for i in ds]
            if drop_last:
                ref = ref[:len(ref) // bs * bs]  # and the short last batch dropped
            with loader(ld, name, r, w) as dl:
                assert [int(i) for b in dl for i in b["y"]] == ref
            with loader(ld, name, r, w) as dl:
                it = iter(dl)
                head = [int(i) for _ in range(2) for i in next(it)["y"]]
                state = dl.state_dict()
            assert head == ref[:2 * bs]
            with loader(ld, name, (r + 3) % w, w) as dl:  # another rank's state
                dl.load_state_dict(state)
                assert len(dl) == (len(ds) // bs if drop_last else cdiv(len(ds), bs))
                assert [int(i) for b in dl for i in b["y"]] == \
                    [perm[i] for i in DistributedSampler(perm, num_replicas=w, rank=(r + 3) % w,
                                                         shuffle=False, drop_last=drop_last)
                     ][2 * bs:len(ref)]
    del torch


def test_state_shape(ld, workdir):
    """torchdata's StatefulDataLoader keys, loaderd's beside them, all plain
    values (json and torch.save keep them); an older loaderd state (no
    global position) of another world resumes from batch * batch_size *
    world_size; _num_yielded is what a load follows (accelerate lowers it)."""
    n = 120
    name = make(ld, workdir, n, epochs=1)
    perm = perms(ld, name, 1)[0]
    with loader(ld, name, 1, 4) as dl:
        it = iter(dl)
        next(it)
        next(it)
        st = dl.state_dict()
    keys = {"_num_yielded", "_sampler_iter_yielded", "_iterator_finished",
            "_index_sampler_state", "_sampler_iter_state", "_IterableDataset_len_called",
            "_shared_seed", "fetcher_state", "dataset_state"}
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
        keys = set(StatefulDataLoader(list(range(6)), batch_size=2).state_dict())
    except ImportError:  # torch 1.13 (Debian's): no torchdata
        pass
    assert keys <= set(st)
    assert {k: st[k] for k in set(st) - keys} == {
        "pipeline": name, "epoch": 0, "batch": 2, "rank": 1, "world_size": 4, "batch_size": 2,
        "samples": n, "tail_start": 0, "position": 16}
    assert json.loads(json.dumps(st)) == st

    old = {"pipeline": name, "epoch": 0, "batch": 2, "rank": 1, "world_size": 4}
    with loader(ld, name, 2, 3) as dl:
        dl.load_state_dict(old)
        assert [int(i) for b in dl for i in b["y"]] == [perm[(16 + 2 + 3 * j) % n]
                                                        for j in range(cdiv(n - 16, 3))]
    lowered = dict(st, _num_yielded=1, _sampler_iter_yielded=1)  # position says 16: not read
    with loader(ld, name, 0, 6) as dl:
        dl.load_state_dict(lowered)
        assert [int(i) for b in dl for i in b["y"]] == [perm[(8 + 6 * j) % n]
                                                        for j in range(cdiv(n - 8, 6))]


def test_bad_states(ld, workdir):
    name = make(ld, workdir, 40, epochs=1)
    with loader(ld, name, 0, 2) as dl:
        st = dl.state_dict()
        with pytest.raises(ValueError, match=r"the state is of an epoch of 41 samples, "
                                             r"pipeline 'el' has 40"):
            dl.load_state_dict(dict(st, world_size=3, samples=41))
        with pytest.raises(ValueError, match=r"tail_start 41 \(batch_size 2\) is outside an "
                                             r"epoch of 40 samples"):
            dl.load_state_dict(dict(st, tail_start=41))
        with pytest.raises(ValueError, match=r"the state's 'world_size' is -1"):
            dl.load_state_dict(dict(st, world_size=-1))
        with pytest.raises(ValueError, match=r"rank 5 of world_size 3 is no rank"):
            dl.load_state_dict(dict(st, world_size=3, rank=5))
        # a state at the epoch's end of 3 ranks: nothing of it left
        dl.load_state_dict(dict(st, world_size=3, _num_yielded=7, batch=7))
        assert dl.epoch == 1 and dl.exhausted
