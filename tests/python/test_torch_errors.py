# SPDX-License-Identifier: MIT
"""Errors as torch's DataLoader raises them (issue 26, class 4), checked
against torch's own DataLoader and loaderd's (the `L` fixture, as in
test_torch_contract.py): a batch whose sample raises re-raises the Dataset's
own exception type in the trainer, its message carrying the worker's
traceback, and the next next() goes on with the batch after it; a `for`
ends at the exception (Python's `for` propagates it) and the next `for` is
a new pass. A worker that dies (a segfault) is a RuntimeError naming its pid.
Then what only loaderd has: two readers of one shared pipeline meet the
error at the same place, the pipeline's status counts failed batches, and
their slots all go back.

The Datasets are module-level classes: loaderd's workers import them."""

import ctypes
import os
import pickle
import re
import time

import pytest

torch = pytest.importorskip("torch")

import loaderd  # noqa: E402
from test_torch_contract import Loaders  # noqa: E402


class BadRecord(Exception):
    """A training script's own exception class."""


class FailsAt(torch.utils.data.Dataset):
    """12 samples (the tensor i); those in @bad raise @kind."""

    def __init__(self, bad, kind=KeyError, n=12):
        self.bad, self.kind, self.n = set(bad), kind, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise self.kind(f"bad sample {i}")
        return torch.tensor(i)


class GatedFailsAt(FailsAt):
    """FailsAt whose samples past 0 wait for the file @gate: no batch is
    built before both readers are there (a broadcast reader joins the
    stream where it stands)."""

    def __init__(self, bad, gate):
        super().__init__(bad)
        self.gate = gate

    def __getitem__(self, i):
        while i > 0 and not os.path.exists(self.gate):
            time.sleep(0.01)
        return super().__getitem__(i)


class Segfaults(torch.utils.data.Dataset):
    """Sample 5 reads address 0: the worker dies of SIGSEGV."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 5:
            ctypes.string_at(0)
        return torch.tensor(i)


@pytest.fixture(params=["torch", "loaderd"])
def L(request):
    if request.param == "torch":
        loaders = Loaders(torch.utils.data.DataLoader, {})
        loaders.torch = True
        yield loaders
        return
    ld = request.getfixturevalue("ld")
    loaders = Loaders(loaderd.DataLoader, {"socket": ld.socket, "timeout": 120})
    loaders.torch = False
    yield loaders
    for dl in loaders.made:
        dl.close()


def drain(it, n, kind):
    """@n next() calls on @it: each batch as a list, a @kind raised as its
    exception; then the end must follow."""
    got = []
    for _ in range(n):
        try:
            got.append(next(it).tolist())
        except kind as e:
            got.append(e)
    with pytest.raises(StopIteration):
        next(it)
    return got


@pytest.mark.parametrize("kind", [KeyError, BadRecord])
def test_next_goes_on_after_a_failed_batch(L, kind):
    # sample 5 of 12, batch_size 2: batch 2 fails, batches 3..5 still come
    dl = L.make(FailsAt({5}, kind), batch_size=2, num_workers=2)
    got = drain(iter(dl), 6, kind)
    assert [g if isinstance(g, list) else "raised" for g in got] == \
        [[0, 1], [2, 3], "raised", [6, 7], [8, 9], [10, 11]]
    e = got[2]
    assert type(e) is not kind or L.torch  # loaderd's: a DatasetError that is a `kind` too
    text = str(e)
    assert "bad sample 5" in text and "Traceback" in text, text


def test_for_ends_at_the_exception_and_the_next_for_is_a_new_pass(L):
    dl = L.make(FailsAt({5}), batch_size=2, num_workers=2)
    for _ in range(2):
        got = []
        with pytest.raises(KeyError):
            for b in dl:
                got.append(b.tolist())
        assert got == [[0, 1], [2, 3]]


def test_every_failed_batch_in_its_place(L):
    # two failed batches in a row, and the epoch's last one
    dl = L.make(FailsAt({4, 7, 11}, ValueError), batch_size=2, num_workers=2)
    got = drain(iter(dl), 6, ValueError)
    assert [g if isinstance(g, list) else "raised" for g in got] == \
        [[0, 1], [2, 3], "raised", "raised", [8, 9], "raised"]


TORCH_WORDS = re.compile(r"DataLoader worker \(pid\(s\) (\d+)\) exited unexpectedly")


def test_segfault_is_a_runtime_error_naming_the_worker(L, monkeypatch):
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        # a sanitizer build's suite: the workers inherit the runtime, whose
        # SEGV handler would make the death an exit 1
        monkeypatch.setenv("ASAN_OPTIONS", os.environ.get("ASAN_OPTIONS", "") + ":handle_segv=0")
    dl = L.make(Segfaults(), batch_size=2, num_workers=2)
    it = iter(dl)
    got = []
    with pytest.raises(RuntimeError) as e:
        for _ in range(3):
            got.append(next(it).tolist())
    # torch's SIGCHLD handler raises at the first next() after the death,
    # whichever batch it waits for; loaderd's error is batch 2's
    assert L.torch or got == [[0, 1], [2, 3]]
    text = str(e.value)
    m = TORCH_WORDS.search(text)
    assert m, text
    pid = int(m.group(1))
    assert pid != os.getpid()
    if L.torch:
        return  # torch's iterator stops there: its workers are shut down
    assert isinstance(e.value, loaderd.WorkerError)
    assert f"(pid {pid}) was killed by signal 11 (Segmentation fault)" in text, text
    assert "building batch 2 of epoch 0" in text, text
    # the trainer survived, and the epoch goes on
    assert [next(it).tolist() for _ in range(3)] == [[6, 7], [8, 9], [10, 11]]
    with pytest.raises(StopIteration):
        next(it)


# ------------------------------------------------------------ loaderd only

def wait_for(cond, what, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def two_readers(ld, mode):
    """Two loaders of one FailsAt({5}) in @mode: one pipeline (the same
    Dataset), both attached before its first batch is built."""
    gate = os.path.join(ld.dir, "gate")
    ds = GatedFailsAt({5}, gate)
    readers = [loaderd.DataLoader(ds, batch_size=2, num_workers=2, mode=mode, socket=ld.socket,
                                  timeout=120, epochs=1) for _ in range(2)]
    open(gate, "w").close()
    return readers


def test_broadcast_readers_meet_the_error_in_the_same_place(ld):
    a, b = two_readers(ld, "broadcast")
    try:
        assert a.created and not b.created
        got = {"a": [], "b": []}
        for _ in range(6):   # in turns, so both read every batch of the one stream
            for name, dl in (("a", a), ("b", b)):
                try:
                    got[name].append(dl.next_batch().tolist())
                except KeyError as e:
                    assert "bad sample 5" in str(e)
                    got[name].append("raised")
        want = [[0, 1], [2, 3], "raised", [6, 7], [8, 9], [10, 11]]
        assert got == {"a": want, "b": want}
        assert a.pipeline == b.pipeline
        st = loaderd.Client(ld.socket).pipeline(a.pipeline)
        assert st["batches_failed"] == 1 and st["state"] != "failed", st
    finally:
        a.close()
        b.close()


def test_dynamic_readers_one_gets_the_error(ld):
    # dynamic: each batch to one client, whoever asks first; the failed one too
    a, b = two_readers(ld, "dynamic")
    try:
        got, raised = [], 0
        done = set()
        while len(done) < 2:
            for name, dl in (("a", a), ("b", b)):
                if name in done:
                    continue
                try:
                    x = dl.next_batch()
                except KeyError as e:
                    assert "bad sample 5" in str(e)
                    raised += 1
                    continue
                if x is None:
                    done.add(name)
                else:
                    got.append(x.tolist())
        assert raised == 1 and sorted(got) == [[0, 1], [2, 3], [6, 7], [8, 9], [10, 11]]
    finally:
        a.close()
        b.close()


def test_status_counts_failed_batches_and_their_slots_go_back(ld):
    # 100 batches of 1, the 50 odd ones fail, two epochs: none may keep a slot
    ds = FailsAt(set(range(1, 100, 2)), n=100)
    dl = loaderd.DataLoader(ds, batch_size=1, num_workers=2, socket=ld.socket, timeout=120,
                            epochs=2)
    want = [[i] if i % 2 == 0 else None for i in range(100)]
    for _ in range(2):
        assert [g if isinstance(g, list) else None for g in drain(iter(dl), 100, KeyError)] == want
    c = loaderd.Client(ld.socket)
    st = c.pipeline(dl.pipeline)
    assert st["batches_failed"] == 100 and st["state"] != "failed", st
    assert re.match(r"dataset\[\d*[13579]\] raised KeyError: 'bad sample \d+' \(at ",
                    st["last_batch_error"]), st
    st = wait_for(lambda: (lambda s: s if s["slots_in_use"] == 0 else None)(
        c.pipeline(dl.pipeline)), "slots still in use after the last epoch")
    assert st["slots_leased"] == 0
    c.close()
    dl.close()


def test_state_dict_counts_the_failed_batch(ld):
    ds = FailsAt({5})
    dl = loaderd.DataLoader(ds, batch_size=2, num_workers=2, socket=ld.socket, timeout=120)
    it = iter(dl)
    next(it), next(it)
    with pytest.raises(KeyError):
        next(it)
    state = dl.state_dict()
    assert (state["epoch"], state["batch"]) == (0, 3)
    dl.close()
    dl2 = loaderd.DataLoader(ds, batch_size=2, num_workers=2, socket=ld.socket, timeout=120)
    dl2.load_state_dict(state)
    assert [b.tolist() for b in dl2] == [[6, 7], [8, 9], [10, 11]]
    # resumed at the failed batch itself: its error first, then the rest
    dl2.load_state_dict(dict(state, batch=2, _num_yielded=2))
    got = drain(iter(dl2), 4, KeyError)
    assert isinstance(got[0], KeyError) and got[1:] == [[6, 7], [8, 9], [10, 11]]
    dl2.close()


def test_worker_error_pickles_as_a_runtime_error():
    e = loaderd.WorkerError(-10, "DataLoader worker (pid(s) 42) exited unexpectedly", "next")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is loaderd.WorkerError and isinstance(back, RuntimeError)
    assert (back.code, back.message, back.operation) == (e.code, e.message, e.operation)
