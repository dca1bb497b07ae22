# SPDX-License-Identifier: MIT
"""An IterableDataset with worker processes, checked against torch's own
DataLoader (issue 26, class 8): each worker iterates its own copy and tells
itself apart by get_worker_info() (the webdataset pattern: shards split by
worker), batches come round-robin from the workers and a worker whose
iterator ends drops out, worker_init_fn configures the copy, the workers'
seeds follow the trainer's RNG, an exception raised in one worker's
iterator is the trainer's in its place, and a state_dict() resumes at the
next batch. loaderd.DataLoader hands an IterableDataset to torch's own
loader: these tests hold it to torch's results, computed in the test."""

import pytest

torch = pytest.importorskip("torch")

import loaderd  # noqa: E402
from torch.utils.data import IterableDataset, get_worker_info  # noqa: E402
from test_torch_contract import L  # noqa: E402,F401 (the fixture)


class Shards(IterableDataset):
    """webdataset's pattern: shards of given lengths, split between the
    workers by get_worker_info(); each sample (shard, row, a draw from the
    worker's RNG)."""

    def __init__(self, lengths):
        self.lengths = lengths

    def __iter__(self):
        wi = get_worker_info()
        mine = range(len(self.lengths)) if wi is None else \
            range(wi.id, len(self.lengths), wi.num_workers)
        for s in mine:
            for j in range(self.lengths[s]):
                yield torch.tensor([s, j, int(torch.randint(0, 1 << 30, ()))])


class Range(IterableDataset):
    """torch's documented pattern: worker_init_fn narrows [start, end) of
    the worker's copy (get_worker_info().dataset)."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def __iter__(self):
        return iter(range(self.start, self.end))


def split_range(worker_id):
    wi = get_worker_info()
    ds = wi.dataset
    per = -(-(ds.end - ds.start) // wi.num_workers)
    ds.start, ds.end = ds.start + worker_id * per, min(ds.start + (worker_id + 1) * per, ds.end)


class Lines(IterableDataset):
    """A reader whose line 3 of worker 1 is bad: its iterator raises there
    (a generator then ends, as torch's worker then finds)."""

    def __iter__(self):
        wid = get_worker_info().id if get_worker_info() else 0
        for i in range(5):
            if wid == 1 and i == 3:
                raise ValueError(f"worker {wid}: line {i} is not utf-8")
            yield torch.tensor([wid, i])


def outcomes(dl):
    """Every next() of one epoch: a batch's lists, or the exception's type
    and first line (both loaders go on after a failed batch)."""
    got, it = [], iter(dl)
    while True:
        try:
            got.append(next(it).tolist())
        except StopIteration:
            return got
        except Exception as e:  # noqa: BLE001 (what the Dataset raised)
            got.append((type(e).__name__, str(e).splitlines()[0]))


def torch_result(dataset, **kw):
    """torch's own DataLoader's batches for @dataset, seeded as the test seeds."""
    torch.manual_seed(11)
    return outcomes(torch.utils.data.DataLoader(dataset, **kw))


def workers_of(L, kw):
    kw.setdefault("num_workers", L.workers or 2)
    return kw


def test_shards_split_by_worker_info_as_torch(L):
    kw = workers_of(L, {"batch_size": 2})
    want = torch_result(Shards([3, 5, 1, 2]), **kw)
    torch.manual_seed(11)
    dl = L.make(Shards([3, 5, 1, 2]), **kw)
    got = outcomes(dl)
    assert got == want
    # every row of every shard once; round-robin across the workers while
    # they last (worker w's first batch is batch w)
    assert sorted((s, j) for b in got for s, j, _ in b) == \
        [(s, j) for s, n in enumerate([3, 5, 1, 2]) for j in range(n)]
    assert [[(s, j) for s, j, _ in b] for b in got] == [  # worker 0 ends after two
        [(0, 0), (0, 1)], [(1, 0), (1, 1)], [(0, 2), (2, 0)], [(1, 2), (1, 3)],
        [(1, 4), (3, 0)], [(3, 1)]]
    # the next epoch: new seeds from the trainer's RNG, the same rows
    again = outcomes(dl)
    assert [[r[:2] for r in b] for b in again] == [[r[:2] for r in b] for b in got]
    assert again != got


def test_worker_init_fn_configures_each_copy(L):
    kw = workers_of(L, {"batch_size": 4, "worker_init_fn": split_range})
    want = torch_result(Range(0, 20), **kw)
    dl = L.make(Range(0, 20), **kw)
    assert outcomes(dl) == want
    assert sorted(x for b in want for x in b) == list(range(20))


def test_an_iterator_that_raises_as_torch(L):
    kw = workers_of(L, {"batch_size": 2, "num_workers": 2})
    want = torch_result(Lines(), **kw)
    assert want == [[[0, 0], [0, 1]], [[1, 0], [1, 1]], [[0, 2], [0, 3]],
                    ("ValueError", "Caught ValueError in DataLoader worker process 1."),
                    [[0, 4]]]
    dl = L.make(Lines(), **kw)
    assert outcomes(dl) == want


@pytest.mark.parametrize("persistent", [False, True])
def test_epochs_and_persistent_workers(L, persistent):
    kw = workers_of(L, {"batch_size": 3, "persistent_workers": persistent, "num_workers": 2})
    torch.manual_seed(3)
    ref = torch.utils.data.DataLoader(Shards([4, 4]), **kw)
    want = [outcomes(ref), outcomes(ref)]
    torch.manual_seed(3)
    dl = L.make(Shards([4, 4]), **kw)
    assert [outcomes(dl), outcomes(dl)] == want


def test_state_dict_resumes_at_the_next_batch(L):
    if L.cls is torch.utils.data.DataLoader:
        pytest.skip("torch's DataLoader has no state_dict()")
    kw = workers_of(L, {"batch_size": 2})
    torch.manual_seed(5)
    a = L.make(Shards([3, 5, 1, 2]), **kw)
    it = iter(a)
    first = [next(it).tolist() for _ in range(3)]
    state = a.state_dict()
    rest = [b.tolist() for b in it]
    assert state["_num_yielded"] == 3 and len(first + rest) == 6
    torch.manual_seed(99)  # another trainer: the state holds the epoch's RNG
    b = L.make(Shards([3, 5, 1, 2]), **kw)
    b.load_state_dict(state)
    assert [x.tolist() for x in b] == rest  # the same seeds: the same draws


def test_daemon_arguments_refused_with_what_to_do(L):
    if L.cls is torch.utils.data.DataLoader:
        pytest.skip("loaderd's own arguments")
    with pytest.raises(ValueError) as e:
        L.make(Range(0, 4), num_workers=2, mode="partition", rank=0, world_size=2)
    msg = str(e.value)
    assert msg.startswith("loaderd.DataLoader: mode=, rank=, world_size= are for the daemon's "
                          "worker processes, which build samples by index: an IterableDataset "
                          "(Range) is iterated by torch's own DataLoader")
    assert "split it in __iter__ by torch.distributed's rank" in msg
    dl = L.make(Range(0, 4), num_workers=2, batch_size=2, timeout=30)  # torch's own timeout
    assert repr(dl) == "<loaderd.DataLoader of Range by torch's DataLoader (num_workers=2)>"
    assert sorted(x for b in dl for x in b.tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]
