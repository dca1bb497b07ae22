# SPDX-License-Identifier: MIT
"""torch's DataLoader contract, checked against torch's own DataLoader and
loaderd's (issue 26, first part): defaults (batch_size 1, batch_size=None),
the attributes torch exposes and its set-after-init ValueError,
DataLoader[T], argument validation (types and words), exception types
(a timeout is a RuntimeError, the Dataset's own exception type) and their
pickling. Every test runs once per loader (the `L` fixture); what loaderd
does not support yet raises at construction, saying what to do instead.

The Datasets are module-level classes: loaderd's workers import them."""

import pickle
import time
import typing

import pytest

torch = pytest.importorskip("torch")

import loaderd  # noqa: E402
from conftest import run_python  # noqa: E402
from torch.utils.data import _utils as torch_utils  # noqa: E402

# what differs between torch 1.13 and 2.x: expected as the torch at hand does it
TORCH2 = int(torch.__version__.split(".")[0]) >= 2


# ---------------------------------------------------------------- datasets

class Pairs(torch.utils.data.Dataset):
    """(a float32 tensor [i, i + 0.5], the int i)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.tensor([i, i + 0.5], dtype=torch.float32), i


class Chunks(torch.utils.data.Dataset):
    """A Dataset that returns batches itself: {"x": [4i, 4i+4)}."""

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return {"x": torch.arange(4 * i, 4 * i + 4)}


class BadSample(ValueError):
    pass


class Raises(torch.utils.data.Dataset):
    """Sample 3 raises @kind."""

    def __init__(self, kind):
        self.kind = kind

    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 3:
            raise self.kind(f"bad sample {i}")
        return torch.tensor(i)


class Slow(torch.utils.data.Dataset):
    """Sample 0 at once, every other one after 2 minutes (the workers are
    stopped before: torch's at shutdown, loaderd's with the pipeline)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i:
            time.sleep(120)
        return torch.tensor(i)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(4))


# ------------------------------------------------------------------ loaders

class Loaders:
    """One loader class: `cls` itself, make(dataset, **kw) a loader of it.
    @workers: the num_workers a loader gets where the test gives none (the
    daemon's worker processes for loaderd; torch's default 0 runs the
    Dataset in the trainer, loaderd's too)."""

    def __init__(self, cls, extra, workers=None):
        self.cls, self.extra, self.made, self.workers = cls, extra, [], workers

    @property
    def in_trainer(self):
        """loaderd with num_workers=0: torch's own single-process loading."""
        return self.cls is loaderd.DataLoader and self.workers is None

    def make(self, dataset, **kw):
        if self.workers is not None and "num_workers" not in kw and \
                not isinstance(dataset, (str, dict)):
            kw["num_workers"] = self.workers
        dl = self.cls(dataset, **kw, **self.extra)
        self.made.append(dl)
        return dl


@pytest.fixture(params=["torch", "loaderd", "loaderd-workers"])
def L(request):
    if request.param == "torch":
        yield Loaders(torch.utils.data.DataLoader, {})
        return
    ld = request.getfixturevalue("ld")
    loaders = Loaders(loaderd.DataLoader, {"socket": ld.socket},
                      2 if request.param == "loaderd-workers" else None)
    yield loaders
    for dl in loaders.made:
        dl.close()


def as_lists(batch):
    return [x.tolist() if isinstance(x, torch.Tensor) else x for x in batch]


# ----------------------------------------------------------------- defaults

def test_batch_size_defaults_to_one(L):
    dl = L.make(Pairs(3))
    assert dl.batch_size == 1 and len(dl) == 3
    got = [as_lists(b) for b in dl]
    assert got == [[[[0.0, 0.5]], [0]], [[[1.0, 1.5]], [1]], [[[2.0, 2.5]], [2]]]


def test_batch_size_none_gives_samples_unbatched(L):
    dl = L.make(Pairs(3), batch_size=None)
    assert dl.batch_size is None and dl.batch_sampler is None and len(dl) == 3
    got = list(dl)
    for i, (x, y) in enumerate(got):
        assert isinstance(x, torch.Tensor) and x.shape == (2,) and x.tolist() == [i, i + 0.5]
        assert type(y) is int and y == i  # default_convert leaves Python numbers alone


def test_batch_size_none_dataset_returns_batches(L):
    dl = L.make(Chunks(), batch_size=None)
    got = [b["x"].tolist() for b in dl]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


# --------------------------------------------------------------- attributes

def test_attributes_as_torch(L):
    ds = Pairs(6)
    dl = L.make(ds, batch_size=2, drop_last=True)
    assert dl.dataset is ds
    nw = L.workers or 0
    assert (dl.batch_size, dl.drop_last, dl.num_workers, dl.pin_memory, dl.timeout) == \
        (2, True, nw, False, 0)
    assert dl.worker_init_fn is None and dl.multiprocessing_context is None
    assert dl.generator is None
    assert dl.prefetch_factor == (None if TORCH2 and not nw else 2)
    assert dl.persistent_workers is False
    assert dl.collate_fn is torch_utils.collate.default_collate
    bs = dl.batch_sampler
    assert (bs.batch_size, bs.drop_last, len(bs)) == (2, True, 3)
    assert bs.sampler is dl.sampler and len(dl.sampler) == 6
    unbatched = L.make(Pairs(2), batch_size=None)
    assert unbatched.collate_fn is torch_utils.collate.default_convert
    assert unbatched.drop_last is False


@pytest.mark.parametrize("attr", ["batch_size", "batch_sampler", "sampler", "drop_last",
                                  "dataset", "persistent_workers"])
def test_set_after_init_is_refused(L, attr):
    dl = L.make(Pairs(4), batch_size=2)
    before = getattr(dl, attr)
    with pytest.raises(ValueError) as e:
        setattr(dl, attr, 3)
    assert str(e.value) == f"{attr} attribute should not be set after DataLoader is initialized"
    assert getattr(dl, attr) is before or getattr(dl, attr) == before
    dl.num_workers = 0  # the others may be set, as torch's


def test_subscriptable(L):
    alias = L.cls[int]
    assert typing.get_origin(alias) is L.cls and typing.get_args(alias) == (int,)


# ------------------------------------------------------- argument validation

BAD = [
    (dict(batch_size=0), "batch_size should be a positive integer value, but got batch_size=0"),
    (dict(batch_size=-2), "batch_size should be a positive integer value, but got batch_size=-2"),
    (dict(batch_size=2.5),
     "batch_size should be a positive integer value, but got batch_size=2.5"),
    (dict(drop_last="yes"), "drop_last should be a boolean value, but got drop_last=yes"),
    (dict(num_workers=-1), "num_workers option should be non-negative; use num_workers=0 to "
                           "disable multiprocessing."),
    (dict(timeout=-1), "timeout option should be non-negative"),
    (dict(prefetch_factor=4), "prefetch_factor option could only be specified in "
                              "multiprocessing.let num_workers > 0 to enable multiprocessing" +
                              (", otherwise set prefetch_factor to None." if TORCH2 else ".")),
    (dict(persistent_workers=True), "persistent_workers option needs num_workers > 0"),
    (dict(sampler=[0, 1], shuffle=True), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_size=None, drop_last=True), "batch_size=None option disables auto-batching "
                                            "and is mutually exclusive with drop_last"),
] + [(dict(batch_sampler=[[0, 1]], **kw), "batch_sampler option is mutually exclusive with "
      "batch_size, shuffle, sampler, and drop_last")
     for kw in (dict(batch_size=2), dict(shuffle=True), dict(sampler=[0]), dict(drop_last=True))]


@pytest.mark.parametrize("kw,message", BAD, ids=[",".join(k) for k, _ in BAD])
def test_bad_arguments_as_torch(L, kw, message):
    if L.workers and kw.keys() & {"prefetch_factor", "persistent_workers"}:
        pytest.skip("an error of num_workers=0 only")
    with pytest.raises(ValueError) as e:
        L.make(Pairs(4), **kw)
    assert str(e.value) == message


def test_iterable_dataset_shuffle_as_torch(L):
    with pytest.raises(ValueError) as e:
        L.make(Stream(), shuffle=True)
    assert str(e.value) == ("DataLoader with IterableDataset: expected unspecified shuffle "
                            "option, but got shuffle=True")


def test_iterable_dataset_with_workers_is_torchs(L):
    # the rest of the contract: test_torch_iterable.py
    assert [t.tolist() for t in L.make(Stream(), num_workers=1)] == [[0], [1], [2], [3]]


# ------------------------------------------------------------------ errors

def roundtrip(e):
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is type(e) and str(back) == str(e)
    return back


def test_timeout_is_runtime_error(L):
    # 10 s: loaderd waits as long for its workers to start, on a loaded machine
    dl = L.make(Slow(), num_workers=1, timeout=10)
    it = iter(dl)
    assert next(it).tolist() == [0]
    with pytest.raises(RuntimeError) as e:
        next(it)
    assert "DataLoader timed out after 10 seconds" in str(e.value)
    roundtrip(e.value)


@pytest.mark.parametrize("kind", [BadSample, KeyError, ZeroDivisionError])
def test_dataset_exception_type_reraised(L, kind):
    dl = L.make(Raises(kind), num_workers=1)
    got = []
    with pytest.raises(kind) as e:
        for b in dl:
            got.append(b.tolist())
    assert got == [[0], [1], [2]]
    text = str(e.value)
    assert "bad sample 3" in text and "Traceback" in text, text
    back = roundtrip(e.value)
    assert isinstance(back, kind)


MAIN_SCRIPT = """
import sys, torch, loaderd

class MyError(Exception):
    pass

class Fails(torch.utils.data.Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        if i == 2:
            raise MyError(f"sample {i} is bad")
        return torch.tensor(i)

if __name__ == "__main__":
    if sys.argv[1] == "torch":
        dl = torch.utils.data.DataLoader(Fails(), num_workers=1)
    else:
        dl = loaderd.DataLoader(Fails(), num_workers=1, socket=sys.argv[2])
    got = []
    try:
        for b in dl:
            got.append(b.item())
    except MyError as e:
        print("caught MyError", got, "sample 2 is bad" in str(e))
        print(str(e).splitlines()[0])
"""


def test_exception_type_of_the_trainers_script(L, workdir):
    # a training script's own exception class: its module is __main__ there
    # and __mp_main__ in the workers
    path = f"{workdir}/train.py"
    with open(path, "w") as f:
        f.write(MAIN_SCRIPT)
    which = "torch" if L.cls is torch.utils.data.DataLoader else "loaderd"
    sock = L.extra.get("socket", "")
    r = run_python([path, which, sock], timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "caught MyError [0, 1] True", r.stdout + r.stderr
    if which == "loaderd":  # named as the trainer knows it, not as __mp_main__.MyError
        assert "dataset[2] raised __main__.MyError: sample 2 is bad (at train.py:" in lines[1], \
            lines[1]


@pytest.mark.parametrize("name,args", [
    ("Error", (-5, "boom", "next")), ("NotFound", (-2, "no pipe", "attach")),
    ("InvalidSpec", (-22, "bad spec", "create")), ("Disconnected", (-104, "gone", "next")),
    ("Timeout", (-110, "slow", "next")), ("ForkedError", (-1000, "forked", "")),
    ("DatasetError", (-5, "raised", "next"))])
def test_loaderd_exceptions_pickle(name, args):
    cls = getattr(loaderd, name)
    e = cls(*args)
    back = roundtrip(e)
    assert (back.code, back.message, back.operation) == args
    if cls is loaderd.Timeout:
        assert isinstance(back, RuntimeError) and isinstance(back, TimeoutError)
