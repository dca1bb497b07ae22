# SPDX-License-Identifier: MIT
"""torch's sampler=, batch_sampler= and generator= (issue 26, class 7),
checked against torch's own DataLoader and loaderd's (the `L` fixture, as
tests/python/test_torch_contract.py): the same batches in the same order for
the same sampler and generator, epoch after epoch, batches of varying sizes,
DistributedSampler.set_epoch through loader.sampler (as Lightning calls it),
the generator's and the global RNG's states after an epoch and after a loop
broken off, len(), torch's construction errors, and what loaderd refuses: a
batch larger than the loader's slots.

Each expectation is torch's: a torch DataLoader built the same way, from the
same seeds, gives the reference. The Datasets and samplers are module-level
classes: loaderd's workers import them."""

import os

import pytest

torch = pytest.importorskip("torch")

import loaderd  # noqa: E402
from loaderd_harness import daemon  # noqa: E402,F401  (the fixture)
# torch's loader and loaderd's, and the Dataset: those of the contract's tests
from test_torch_contract import L, Pairs  # noqa: E402,F401
from torch.utils.data import (DistributedSampler, RandomSampler,  # noqa: E402
                              SequentialSampler, SubsetRandomSampler, WeightedRandomSampler)


class Grouped(torch.utils.data.Sampler):
    """A grouped batch sampler as detection code writes them (torchvision's
    GroupedBatchSampler): the indices of a shuffle, grouped by i % 3 (an
    aspect-ratio group), each group cut into batches of 2 to 4 of a size that
    varies with the group. @batch_size: set as the attribute, or not at all."""

    def __init__(self, n, generator, batch_size=None):
        self.n, self.generator = n, generator
        if batch_size is not None:
            self.batch_size = batch_size

    def __iter__(self):
        perm = torch.randperm(self.n, generator=self.generator).tolist()
        for g in range(3):
            group = [i for i in perm if i % 3 == g]
            size = 2 + g
            for k in range(0, len(group), size):
                yield group[k:k + size]

    def __len__(self):
        return sum(-(-len(range(g, self.n, 3)) // (2 + g)) for g in range(3))


class Oversize:
    """Says batch_size 2, and yields a batch of 3."""
    batch_size = 2

    def __iter__(self):
        return iter([[0, 1], [2, 3, 4], [5]])

    def __len__(self):
        return 3


def ids(batch):
    """The sample indices of a collated batch of Pairs."""
    x, i = batch
    assert x[:, 0].tolist() == [float(v) for v in i.tolist()]
    return i.tolist()


def epochs(dl, n=2, before=None):
    out = []
    for e in range(n):
        if before:
            before(e)
        out.append([ids(b) for b in dl])
    return out


def gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def reference(ds, n=2, before=None, **kw):
    """torch's DataLoader's batches, @n epochs."""
    return epochs(torch.utils.data.DataLoader(ds, **kw), n, before)


# --------------------------------------------------------------- samplers

def test_sequential_sampler(L):
    ds = Pairs(7)
    s = SequentialSampler(ds)
    dl = L.make(ds, sampler=s, batch_size=3)
    assert dl.sampler is s and dl.batch_sampler.sampler is s
    assert (dl.batch_size, dl.drop_last, len(dl), len(dl.batch_sampler)) == (3, False, 3, 3)
    assert epochs(dl) == [[[0, 1, 2], [3, 4, 5], [6]]] * 2


def test_shuffle_with_generator_as_torch(L):
    """generator= with shuffle=True: RandomSampler(dataset, generator=g),
    the same permutations epoch after epoch, and g drawn from as torch does
    (its base seed each iter(), then the permutation)."""
    ds = Pairs(23)
    g = gen(7)
    dl = L.make(ds, batch_size=4, shuffle=True, generator=g)
    assert dl.generator is g and type(dl.sampler) is RandomSampler and dl.sampler.generator is g
    got = epochs(dl, 3)
    g2 = gen(7)
    assert got == reference(ds, 3, batch_size=4, shuffle=True, generator=g2)
    assert got[0] != got[1] and sorted(sum(got[0], [])) == list(range(23))
    assert torch.equal(g.get_state(), g2.get_state())


def test_random_sampler_global_rng_as_torch(L):
    """RandomSampler without a generator seeds itself from torch's global RNG
    at each epoch: the same orders after the same torch.manual_seed(), and
    the global RNG where torch leaves it."""
    ds = Pairs(17)
    dl = L.make(ds, sampler=RandomSampler(ds), batch_size=5, drop_last=True)
    torch.manual_seed(11)
    got = epochs(dl)
    after = torch.rand(3)
    torch.manual_seed(11)
    ref = reference(ds, sampler=RandomSampler(ds), batch_size=5, drop_last=True)
    assert got == ref and len(got[0]) == 3 and got[0] != got[1]
    assert torch.equal(after, torch.rand(3))


def test_weighted_random_sampler(L):
    """num_samples 10 of 6 samples, with replacement: len() is the sampler's."""
    ds = Pairs(6)
    weights = [0.1, 0.9, 0.4, 0.0, 2.0, 0.5]
    make = lambda g: WeightedRandomSampler(weights, num_samples=10, replacement=True,  # noqa
                                           generator=g)
    dl = L.make(ds, sampler=make(gen(3)), batch_size=3)
    assert len(dl) == 4
    got = epochs(dl)
    assert got == reference(ds, sampler=make(gen(3)), batch_size=3)
    assert [len(b) for b in got[0]] == [3, 3, 3, 1] and 3 not in sum(got[0] + got[1], [])


def test_subset_random_sampler(L):
    ds = Pairs(12)
    dl = L.make(ds, sampler=SubsetRandomSampler([1, 3, 5, 7, 11], generator=gen(5)), batch_size=2)
    got = epochs(dl)
    assert got == reference(ds, sampler=SubsetRandomSampler([1, 3, 5, 7, 11], generator=gen(5)),
                            batch_size=2)
    assert sorted(sum(got[0], [])) == [1, 3, 5, 7, 11] and len(dl) == 3


def test_unbatched_sampler(L):
    """batch_size=None: the sampler's indices one sample at a time."""
    ds = Pairs(5)
    dl = L.make(ds, sampler=[4, 0, 2], batch_size=None)
    got = [(x.tolist(), i) for x, i in dl]
    assert got == [([4.0, 4.5], 4), ([0.0, 0.5], 0), ([2.0, 2.5], 2)] and len(dl) == 3


@pytest.mark.parametrize("attr", [4, None], ids=["batch_size-attribute", "found-by-iterating"])
def test_grouped_batch_sampler_variable_sizes(L, attr):
    """A grouped batch sampler: batches of 2, 3 and 4 samples, exactly
    torch's; without a batch_size attribute the loader finds the largest
    batch by iterating a copy, and the sampler's order is not disturbed."""
    ds = Pairs(24)
    bs = Grouped(24, gen(9), attr)
    dl = L.make(ds, batch_sampler=bs)
    assert dl.batch_sampler is bs and type(dl.sampler) is SequentialSampler
    assert (dl.batch_size, dl.drop_last, len(dl)) == (None, False, 9)
    got = epochs(dl)
    assert got == reference(ds, batch_sampler=Grouped(24, gen(9), attr))
    assert sorted({len(b) for b in got[0]}) == [2, 3, 4] and got[0] != got[1]
    assert sorted(sum(got[1], [])) == list(range(24))


def test_distributed_sampler_set_epoch(L):
    """Rank 1 of 3: its share, and set_epoch() through loader.sampler (as
    Lightning and the HF Trainer call it) gives each epoch its order."""
    ds = Pairs(20)
    make = lambda: DistributedSampler(ds, num_replicas=3, rank=1, shuffle=True, seed=5)  # noqa
    dl = L.make(ds, sampler=make(), batch_size=3)
    got = epochs(dl, 2, before=dl.sampler.set_epoch)
    ref_dl = torch.utils.data.DataLoader(ds, sampler=make(), batch_size=3)
    assert got == epochs(ref_dl, 2, before=ref_dl.sampler.set_epoch)
    assert got[0] != got[1] and len(dl) == 3 and [len(b) for b in got[0]] == [3, 3, 1]
    # without set_epoch, the same epoch again (as torch)
    assert epochs(dl, 1) == [got[1]]
    # rank 0 of the same job: its own share, in the same pipeline (workers, slots)
    dl0 = L.make(ds, sampler=DistributedSampler(ds, num_replicas=3, rank=0, shuffle=True, seed=5),
                 batch_size=3)
    mine = sum(epochs(dl0, 1)[0], [])
    assert len(mine) == 7 and not set(mine) & set(sum(got[0], []))
    if L.cls is loaderd.DataLoader:
        assert dl0.pipeline == dl.pipeline


def test_loop_broken_off_as_torch(L):
    """A loop broken after one batch: the generator drew what torch's did
    (a sampler drawing as it goes is pulled when torch's iterator pulls it),
    so the next epoch is torch's too. With num_workers=2: torch's prefetch of
    prefetch_factor * num_workers batches."""
    ds = Pairs(40)
    for nw in (0, 2):
        make = lambda g: RandomSampler(ds, replacement=True, num_samples=64, generator=g)  # noqa
        g = gen(21)
        dl = L.make(ds, sampler=make(g), batch_size=4, num_workers=nw)
        first = ids(next(iter(dl)))
        rest = epochs(dl, 1)
        g2 = gen(21)
        ref = torch.utils.data.DataLoader(ds, sampler=make(g2), batch_size=4, num_workers=nw)
        assert [first] + rest == [ids(next(iter(ref)))] + epochs(ref, 1), nw
        assert torch.equal(g.get_state(), g2.get_state())


def test_state_dict_resumes_the_samplers_epoch(L):
    """state_dict() mid-epoch and load_state_dict() in a new loader: the rest
    of that epoch of the sampler (DistributedSampler, set_epoch(1))."""
    ds = Pairs(30)
    make = lambda: DistributedSampler(ds, num_replicas=2, rank=0, seed=3)  # noqa
    ref_dl = torch.utils.data.DataLoader(ds, sampler=make(), batch_size=4)
    ref_dl.sampler.set_epoch(1)
    ref = [ids(b) for b in ref_dl]
    if L.cls is torch.utils.data.DataLoader:
        return  # torch's DataLoader has no state_dict: the reference is above
    dl = L.make(ds, sampler=make(), batch_size=4)
    dl.set_epoch(1)
    dl.sampler.set_epoch(1)
    it = iter(dl)
    head = [ids(next(it)) for _ in range(2)]
    state = dl.state_dict()
    assert (state["epoch"], state["batch"]) == (1, 2)
    dl2 = L.make(ds, sampler=make(), batch_size=4)
    dl2.sampler.set_epoch(1)
    dl2.load_state_dict(state)
    assert head + [ids(b) for b in dl2] == ref


# --------------------------------------------------------------- refusals

@pytest.mark.parametrize("kw,message", [
    (dict(sampler=[0, 1], shuffle=True), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=[[0, 1]], batch_size=2), "batch_sampler option is mutually exclusive "
     "with batch_size, shuffle, sampler, and drop_last"),
], ids=["sampler+shuffle", "batch_sampler+batch_size"])
def test_construction_errors_as_torch(L, kw, message):
    with pytest.raises(ValueError) as e:
        L.make(Pairs(4), **kw)
    assert str(e.value) == message


def test_batch_over_capacity(L):
    """A batch sampler whose batch_size attribute is below a batch it yields:
    torch takes it; loaderd's slots hold batch_size rows, and it says so."""
    if L.in_trainer:
        pytest.skip("the daemon's slots and order: num_workers >= 1")
    ds = Pairs(6)
    dl = L.make(ds, batch_sampler=Oversize())
    if L.cls is torch.utils.data.DataLoader:
        assert epochs(dl, 1) == [[[0, 1], [2, 3, 4], [5]]]
        return
    with pytest.raises(ValueError) as e:
        epochs(dl, 1)
    assert "batch 1 of epoch 0 has 3 samples, more than the 2 the loader's slots hold" \
        in str(e.value)
    assert "give the batch_sampler a batch_size attribute that is its largest batch" in str(e.value)


def test_index_out_of_range_is_index_error(L):
    """A sampler's index past the dataset: torch's Dataset raises IndexError
    in its worker; loaderd's daemon refuses the index, as an IndexError."""
    dl = L.make(Pairs(4), sampler=[1, 9], batch_size=2)
    with pytest.raises(IndexError) as e:
        epochs(dl, 1)
    if L.cls is loaderd.DataLoader and not L.in_trainer:
        assert "index 9 is out of range for the 4 samples of pipeline" in str(e.value)


def test_mode_with_a_sampler_refused(L):
    if L.in_trainer:
        pytest.skip("the daemon's slots and order: num_workers >= 1")
    if L.cls is torch.utils.data.DataLoader:
        return  # torch has no mode=: nothing to compare
    with pytest.raises(ValueError) as e:
        L.make(Pairs(4), sampler=[0, 1], rank=1, world_size=2)
    assert "a DistributedSampler gives a rank its share" in str(e.value)


def test_sampler_loader_follows_a_restart(daemon, workdir):
    """torch's sampler= on a native pipeline (a DistributedSampler, as DDP
    scripts give one; the loader gives the daemon its own order): the
    daemon killed and a new one started mid-epoch, the loader goes on with
    exactly the batches torch's DataLoader gives for the same sampler, that
    epoch and the next (docs/python.md, "Samplers")."""
    import numpy as np
    from torch.utils.data import DataLoader
    n, bs, sl = 300, 7, 8
    path = os.path.join(workdir, "pos.bin")
    np.arange(n * sl + 1, dtype=np.uint32).tofile(path)  # a row says its sample
    spec = {"name": "samp", "source": {"kind": "tokens", "path": path, "dtype": "uint32",
                                       "seq_len": sl}}

    def sampler():
        return DistributedSampler(range(n), num_replicas=2, rank=1, shuffle=True, seed=7)

    want, ref = [], DataLoader(list(range(n)), batch_size=bs, sampler=sampler())
    for e in range(2):
        ref.sampler.set_epoch(e)
        want.append([b.tolist() for b in ref])

    d1 = daemon()
    got = [[], []]
    ld = loaderd.DataLoader(spec, socket=d1.socket, batch_size=bs, sampler=sampler(),
                            as_numpy=True, reconnect_timeout=60)
    try:
        for e in range(2):
            ld.sampler.set_epoch(e)
            for k, b in enumerate(ld):
                got[e].append([int(x) // sl for x in b["input"][:, 0]])
                if e == 0 and k == 4:
                    d1.kill9()
                    daemon(socket=d1.socket)
        assert ld.reconnects == 1
    finally:
        ld.close()
    assert got == want
