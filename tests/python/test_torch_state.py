# SPDX-License-Identifier: MIT
"""torch's DataLoader contract, second part (issue 26): num_workers=0 (the
Dataset runs in the trainer), state_dict()/load_state_dict() in torchdata's
StatefulDataLoader shape and set_epoch() after a restore, the seeds a
Dataset sees, and worker_init_fn's seeding. Each test runs against torch's
DataLoader (torchdata's StatefulDataLoader for the state, where it is
installed) and loaderd's: the `L` fixture of test_torch_contract.py.

The Datasets are module-level classes: loaderd's workers import them."""

import os

import pytest

torch = pytest.importorskip("torch")

import loaderd  # noqa: E402
from test_torch_contract import L, Loaders  # noqa: E402,F401  (the both-loaders fixture)

M63 = (1 << 63) - 1


def is_torch(L):
    return L.cls is not loaderd.DataLoader


# ------------------------------------------------------------------- seeds

class Seeds(torch.utils.data.Dataset):
    """Per sample: torch.initial_seed() as a tensor (an int64, as torch's
    own seeds always are) and the worker's get_worker_info().seed."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()  # None: dataset[0] learnt in the trainer
        return torch.tensor(torch.initial_seed()), torch.tensor(info.seed if info else 0)


@pytest.mark.parametrize("workers", [1, 3])
def test_seeds_are_torchs_int64(L, workers):
    # sample seeds above 2^63 made torch.tensor(torch.initial_seed()) raise
    # "Overflow when unpacking long" inside __getitem__
    dl = L.make(Seeds(), batch_size=4, num_workers=workers)
    seeds, wseeds = [], []
    for s, w in dl:
        seeds += s.tolist()
        wseeds += w.tolist()
    assert len(seeds) == 16 and all(0 <= s <= M63 for s in seeds + wseeds)
    if not is_torch(L):  # per sample: the same seeds whatever the worker count
        from loaderd import pydataset as P
        assert seeds == [P.sample_seed(0, 0, i) for i in range(16)]


# ---------------------------------------------------------- num_workers=0

class Pids(torch.utils.data.Dataset):
    """(the index, the pid that ran __getitem__, a caption): a str, which
    default_collate makes a list of."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor(i), os.getpid(), f"image {i}"


class Count(torch.utils.data.IterableDataset):
    """A generator over 0..n-1, as a file or a stream is read."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return (torch.tensor(i) for i in range(self.n))


class BadSample(ValueError):
    pass


class Raises(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 3:
            raise BadSample(f"bad sample {i}")
        return torch.tensor(i)


def flat(batches):
    return [[x.tolist() if isinstance(x, torch.Tensor) else x for x in b] for b in batches]


def test_num_workers_0_is_torchs_single_process_loading(L):
    if L.workers:
        pytest.skip("num_workers=0 only")
    # torch's own sampler in this process: the trainer's RNG orders it
    torch.manual_seed(5)
    want = flat(torch.utils.data.DataLoader(Pids(), batch_size=3, shuffle=True))
    dl = L.make(Pids(), batch_size=3, shuffle=True)
    torch.manual_seed(5)
    got = flat(dl)
    assert got == want
    assert sorted(i for b in got for i in b[0]) == list(range(10))
    assert all(p == os.getpid() for b in got for p in b[1])  # in the trainer
    assert list(got[0][2]) == [f"image {i}" for i in got[0][0]]
    assert dl.num_workers == 0 and len(dl) == 4


def test_num_workers_0_takes_torchs_samplers(L):
    if L.workers:
        pytest.skip("num_workers=0 only")
    ds = Pids()
    weights = [float(i % 3) for i in range(10)]
    kws = [dict(sampler=torch.utils.data.WeightedRandomSampler(weights, 12), batch_size=4),
           dict(batch_sampler=[[3, 1], [0, 2, 4, 9], [7]]),
           dict(shuffle=True, batch_size=4, generator=torch.Generator().manual_seed(3))]
    for kw in kws:
        torch.manual_seed(11)
        want = flat(torch.utils.data.DataLoader(ds, **kw))
        if "generator" in kw:
            kw["generator"].manual_seed(3)
        torch.manual_seed(11)
        assert flat(L.make(ds, **kw)) == want, kw


def test_num_workers_0_raises_the_datasets_own_exception(L):
    if L.workers:
        pytest.skip("num_workers=0 only")
    dl = L.make(Raises())
    got = []
    with pytest.raises(BadSample) as e:
        for b in dl:
            got.append(b.tolist())
    assert got == [[0], [1], [2]]
    assert type(e.value) is BadSample and str(e.value) == "bad sample 3"  # not wrapped


@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_dataset_num_workers_0(L, drop_last):
    if L.workers:
        pytest.skip("num_workers=0 only")
    dl = L.make(Count(10), batch_size=3, drop_last=drop_last)
    want = [[0, 1, 2], [3, 4, 5], [6, 7, 8]] + ([] if drop_last else [[9]])
    assert [b.tolist() for b in dl] == want
    assert [b.tolist() for b in dl] == want  # each `for` iterates it again


def test_num_workers_0_daemon_arguments_refused(ld):
    with pytest.raises(ValueError) as e:
        loaderd.DataLoader(Pids(), rank=1, world_size=2, socket=ld.socket)
    assert "rank=, world_size= are for the daemon's worker processes" in str(e.value)
    assert "sampler=DistributedSampler(dataset)" in str(e.value)
    with pytest.raises(ValueError) as e:
        loaderd.DataLoader(Pids(), timeout=5)
    assert "timeout=5 is for num_workers > 0" in str(e.value)


# ------------------------------------------------------------------ state

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
except Exception:  # torch 1.13 (Debian's): no torchdata
    StatefulDataLoader = None

# torchdata's single-process state keys (accelerate reads and adjusts the first three)
TORCHDATA_KEYS = {"_num_yielded", "_sampler_iter_yielded", "_iterator_finished",
                  "_index_sampler_state", "_sampler_iter_state", "_IterableDataset_len_called",
                  "_shared_seed", "fetcher_state", "dataset_state"}


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return torch.tensor(i)


@pytest.fixture(params=["torchdata", "loaderd", "loaderd-workers"])
def S(request):
    """Stateful loaders: torchdata's StatefulDataLoader, loaderd's with
    num_workers=0 (in this process) and with 2 workers (the daemon's)."""
    if request.param == "torchdata":
        if StatefulDataLoader is None:
            pytest.skip("torchdata is not installed (torch 1.13)")
        yield Loaders(StatefulDataLoader, {})
        return
    ld = request.getfixturevalue("ld")
    extra = {"socket": ld.socket}
    if request.param == "loaderd-workers":
        extra.update(num_workers=2, seed=7)
    loaders = Loaders(loaderd.DataLoader, extra)
    yield loaders
    for dl in loaders.made:
        dl.close()


def shuffled(S):
    torch.manual_seed(7)  # the order's seed where it is the trainer's RNG
    return S.make(Numbers(), batch_size=3, shuffle=True)


def lightning_set_epoch(dl, epoch):
    """What Lightning does at each epoch's start: the samplers' set_epoch."""
    for s in (getattr(dl, "sampler", None), getattr(dl.batch_sampler, "sampler", None)):
        if hasattr(s, "set_epoch"):
            s.set_epoch(epoch)


def test_state_dict_mid_epoch_resumes_at_the_next_batch(S):
    a = shuffled(S)
    first = [b.tolist() for b in a]           # epoch 0
    it = iter(a)                              # epoch 1
    head = [next(it).tolist() for _ in range(2)]
    state = a.state_dict()
    rest = [b.tolist() for b in it]
    assert sorted(sum(head + rest, [])) == list(range(20)) and head + rest != first
    assert TORCHDATA_KEYS <= set(state)
    assert state["_num_yielded"] == 2 and state["_iterator_finished"] is False

    torch.manual_seed(1234)  # another trainer RNG: the state carries the order
    b = S.make(Numbers(), batch_size=3, shuffle=True)
    b.load_state_dict(state)
    lightning_set_epoch(b, 1)
    assert [x.tolist() for x in b] == rest


def test_set_epoch_after_load_keeps_the_position(S):
    if S.cls is StatefulDataLoader:
        pytest.skip("torchdata's StatefulDataLoader has no set_epoch")
    a = shuffled(S)
    list(a)
    it = iter(a)
    next(it)
    state = a.state_dict()
    rest = [x.tolist() for x in it]
    want_next = [x.tolist() for x in a]       # epoch 2
    b = S.make(Numbers(), batch_size=3, shuffle=True)
    b.load_state_dict(state)
    b.set_epoch(1)                            # the loop head of the restored epoch
    assert [x.tolist() for x in b] == rest
    if S.extra.get("num_workers"):            # the daemon's epochs: (seed, epoch)
        b.set_epoch(2)
        assert [x.tolist() for x in b] == want_next
    c = S.make(Numbers(), batch_size=3, shuffle=True)
    c.load_state_dict(state)
    c.set_epoch(2)                            # another epoch: its start
    assert len([x for x in c]) == 7


def accelerate_adjust(state, factor, batch_size):
    """What accelerate's DataLoaderAdapter.adjust_state_dict_for_prefetch
    does to a StatefulDataLoader state: @factor batches less."""
    st = dict(state)
    st["_sampler_iter_yielded"] -= factor
    st["_num_yielded"] -= factor
    if st.get("_index_sampler_state") is not None:
        st["_index_sampler_state"] = dict(st["_index_sampler_state"])
        st["_index_sampler_state"]["samples_yielded"] -= batch_size * factor
    return st


def test_state_as_accelerate_adjusts_it(S):
    # accelerate (the HF Trainer) subtracts its prefetch from _num_yielded
    # and sets _iterator_finished itself
    if S.cls is StatefulDataLoader:
        pytest.skip("torchdata's RandomSampler keeps its own count, which accelerate leaves")
    a = shuffled(S)
    it = iter(a)
    batches = [next(it).tolist() for _ in range(7)]
    state = a.state_dict()
    assert state["_num_yielded"] == 7
    back = accelerate_adjust(state, 2, 3)
    b = S.make(Numbers(), batch_size=3, shuffle=True)
    b.load_state_dict(back)
    assert [x.tolist() for x in b] == batches[5:]
    end = dict(state, _iterator_finished=True)   # the epoch's last batch was yielded
    c = S.make(Numbers(), batch_size=3, shuffle=True)
    c.load_state_dict(end)
    nxt = [x.tolist() for x in c]
    assert len(nxt) == 7 and sorted(sum(nxt, [])) == list(range(20))
    if S.cls is loaderd.DataLoader:
        assert c.epoch == 2 and c.state_dict()["epoch"] == 2  # epoch 1 was iterated


def test_iterable_dataset_state_resumes(S):
    a = S.make(Count(10), batch_size=3)
    it = iter(a)
    next(it)
    next(it)
    state = a.state_dict()
    assert state["_num_yielded"] == 2
    b = S.make(Count(10), batch_size=3)
    b.load_state_dict(state)  # iterated past the first two batches, as torchdata does
    rest = [x.tolist() for x in b]
    if S.extra.get("num_workers"):  # torch's workers: each iterates its own copy
        assert rest == [[3, 4, 5], [3, 4, 5], [6, 7, 8], [6, 7, 8], [9], [9]]
        assert [x.tolist() for x in it] == rest
    else:
        assert rest == [[6, 7, 8], [9]]


def test_older_loaderd_state_still_loads(ld):
    a = loaderd.DataLoader(Numbers(), batch_size=3, shuffle=True, seed=7, num_workers=1,
                           socket=ld.socket)
    it = iter(a)
    next(it)
    rest = [x.tolist() for x in it]
    b = loaderd.DataLoader(Numbers(), batch_size=3, shuffle=True, seed=7, num_workers=1,
                           socket=ld.socket)
    b.load_state_dict({"pipeline": b.pipeline, "epoch": 0, "batch": 1, "rank": 0,
                       "world_size": 1})
    assert [x.tolist() for x in b] == rest
    a.close()
    b.close()


# ---------------------------------------------------------------- seeding

class Draws(torch.utils.data.Dataset):
    """A random augmentation: one draw from torch's global RNG per sample."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.rand(1)


def seed_1234(worker_id):
    torch.manual_seed(1234 + worker_id)


def test_worker_init_fn_seeding_as_torchs(L):
    # torch: the one worker seeded by worker_init_fn, its draws going on
    # sample after sample; loaderd's seeding="worker" keeps that
    torch.manual_seed(1234)
    want = [torch.rand(1).item() for _ in range(6)]
    kw = {} if is_torch(L) else {"seeding": "worker"}
    dl = L.make(Draws(), batch_size=2, num_workers=1, worker_init_fn=seed_1234, **kw)
    assert [x for b in dl for x in b.flatten().tolist()] == want


def test_per_sample_seeding_overrides_worker_init_fn(ld):
    # the default: each sample seeded from (seed, epoch, index), after
    # worker_init_fn, whatever the number of workers
    from loaderd import pydataset as P
    want = []
    for i in range(6):
        P.seed_all(P.sample_seed(0, 0, i))
        want.append(torch.rand(1).item())
    for workers in (1, 3):
        dl = loaderd.DataLoader(Draws(), batch_size=2, num_workers=workers,
                                worker_init_fn=seed_1234, socket=ld.socket)
        assert [x for b in dl for x in b.flatten().tolist()] == want
        dl.close()
    with pytest.raises(ValueError) as e:
        loaderd.DataLoader(Draws(), num_workers=1, seeding="epoch", socket=ld.socket)
    assert "seeding must be \"sample\"" in str(e.value)
