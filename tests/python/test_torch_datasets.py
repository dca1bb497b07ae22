# SPDX-License-Identifier: MIT
"""Datasets and collate functions as torch's DataLoader takes them (issue 26,
classes 2 and 3), each test run against torch's DataLoader and loaderd's
(the `L` fixture of test_torch_contract): a Dataset class defined in the
test, a lambda transform, an open file handle, a callable collate object, a
Dataset of a script under torch.multiprocessing.spawn, a dataset[0] that
raises or segfaults (in a worker: the trainer lives on), len() read per
epoch, and a spawn multiprocessing_context that pickles as torch does."""

import os
import textwrap

import pytest

torch = pytest.importorskip("torch")

from conftest import needs_forked_host, run_python  # noqa: E402
from test_torch_contract import L, Loaders  # noqa: E402,F401

TORCH = torch.utils.data.DataLoader

# indices __getitem__ was called with in this process (the trainer): torch's
# workers and loaderd's are other processes, so these stay empty there
CALLED_HERE = []


def values(dl):
    return [[x.tolist() if isinstance(x, torch.Tensor) else x for x in
             (b.values() if isinstance(b, dict) else b)] for b in dl]


class BadSample(ValueError):
    pass


# ---------------------------------------------------------- what torch takes

@needs_forked_host
def test_local_class(L):
    class Local(torch.utils.data.Dataset):   # not importable: only fork sees it
        def __len__(self):
            return 5

        def __getitem__(self, i):
            CALLED_HERE.append(i)
            return torch.tensor([i, 10 * i]), i

    CALLED_HERE.clear()
    dl = L.make(Local(), batch_size=2, num_workers=2)
    assert values(dl) == [[[[0, 0], [1, 10]], [0, 1]], [[[2, 20], [3, 30]], [2, 3]],
                          [[[4, 40]], [4]]]
    assert CALLED_HERE == []   # never in the trainer, dataset[0] included


class Transformed(torch.utils.data.Dataset):
    def __init__(self, n, transform):
        self.n, self.transform = n, transform

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.transform(torch.full((2,), i))


@needs_forked_host
def test_lambda_transform(L):
    scale = 3
    dl = L.make(Transformed(4, lambda x: x * scale + 1), batch_size=4, num_workers=1)
    assert [b.tolist() for b in dl] == [[[1, 1], [4, 4], [7, 7], [10, 10]]]


class Records(torch.utils.data.Dataset):
    """h5py-like: an open file held by the Dataset, read in __getitem__."""

    def __init__(self, path):
        self.f = open(path, "rb")

    def __len__(self):
        return os.fstat(self.f.fileno()).st_size // 4

    def __getitem__(self, i):
        raw = os.pread(self.f.fileno(), 4, 4 * i)
        return torch.frombuffer(bytearray(raw), dtype=torch.int32)


@needs_forked_host
def test_open_file_handle(L, workdir):
    path = os.path.join(workdir, "records.bin")
    with open(path, "wb") as f:
        f.write(torch.arange(100, 106, dtype=torch.int32).numpy().tobytes())
    ds = Records(path)
    dl = L.make(ds, batch_size=3, num_workers=2)
    assert [b.tolist() for b in dl] == [[[100], [101], [102]], [[103], [104], [105]]]
    ds.f.close()


class Plain(torch.utils.data.Dataset):
    def __init__(self, n=6, w=None):
        self.n, self.w = n, w

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.arange(i % 3 + 1) + i   # lengths 1, 2, 3, 1, ...


class PadCollator:
    """A callable collate object, as DataCollatorWithPadding(tokenizer)."""

    def __init__(self, width, pad):
        self.width, self.pad = width, pad

    def __call__(self, batch):
        out = torch.full((len(batch), self.width), self.pad)
        for r, t in enumerate(batch):
            out[r, :len(t)] = t
        return {"input_ids": out, "lengths": torch.tensor([len(t) for t in batch])}


def test_callable_collate_object(L):
    dl = L.make(Plain(), batch_size=3, num_workers=1, collate_fn=PadCollator(4, -1))
    assert values(dl) == [
        [[[0, -1, -1, -1], [1, 2, -1, -1], [2, 3, 4, -1]], [1, 2, 3]],
        [[[3, -1, -1, -1], [4, 5, -1, -1], [5, 6, 7, -1]], [1, 2, 3]]]


# ------------------------------------------------------- dataset[0] fails

class FirstRaises(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        CALLED_HERE.append(i)
        if i == 0:
            raise BadSample(f"bad sample {i}")
        return torch.tensor(i)


def test_dataset0_raises_its_own_type_with_the_workers_traceback(L):
    CALLED_HERE.clear()
    with pytest.raises(BadSample) as e:
        list(L.make(FirstRaises(), num_workers=1))
    text = str(e.value)
    assert "bad sample 0" in text and "Traceback" in text and "in __getitem__" in text, text
    assert CALLED_HERE == []   # it raised in a worker, not here


class SlowFirst(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        CALLED_HERE.append(i)
        if i == 0:
            import time
            time.sleep(30)   # the worker is stopped before (torch's at shutdown)
        return torch.tensor(i)


def test_dataset0_that_hangs_is_bounded_by_timeout(L):
    CALLED_HERE.clear()
    with pytest.raises(RuntimeError) as e:
        next(iter(L.make(SlowFirst(), num_workers=1, timeout=1)))
    assert "DataLoader timed out after 1 seconds" in str(e.value), str(e.value)
    assert CALLED_HERE == []


SEGV_SCRIPT = """
import ctypes, os, sys, torch, loaderd

class Crashes(torch.utils.data.Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        ctypes.string_at(0)   # a segfault, as an extension's bug

class Fine(torch.utils.data.Dataset):
    def __len__(self):
        return 2
    def __getitem__(self, i):
        return torch.tensor(i)

if __name__ == "__main__":
    which, sock = sys.argv[1], sys.argv[2]
    kw = {} if which == "torch" else {"socket": sock}
    DL = torch.utils.data.DataLoader if which == "torch" else loaderd.DataLoader
    try:
        for b in DL(Crashes(), num_workers=1, **kw):
            pass
        print("no error")
    except RuntimeError as e:
        print("RuntimeError:", str(e).splitlines()[0])
    print("alive", [b.tolist() for b in DL(Fine(), num_workers=1, **kw)])
"""


@needs_forked_host
def test_segfault_in_getitem_leaves_the_trainer_alive(L, workdir):
    path = os.path.join(workdir, "segv.py")
    with open(path, "w") as f:
        f.write(SEGV_SCRIPT)
    which = "torch" if L.cls is TORCH else "loaderd"
    r = run_python([path, which, L.extra.get("socket", "")], timeout=180)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-3000:])
    lines = r.stdout.splitlines()
    assert lines[0].startswith("RuntimeError: DataLoader worker (pid"), r.stdout
    if which == "loaderd":  # torch says this, or "exited unexpectedly", as its timing goes
        assert "is killed by signal: Segmentation fault" in lines[0], r.stdout
    assert lines[1] == "alive [[0], [1]]", r.stdout


# ------------------------------------------------------------ len per epoch

class Growing(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(i)


def test_len_read_per_epoch(L):
    ds = Growing(6)
    dl = L.make(ds, batch_size=4, num_workers=1)
    assert len(dl) == 2
    assert [b.tolist() for b in dl] == [[0, 1, 2, 3], [4, 5]]
    ds.n = 9
    assert len(dl) == 3 and len(dl.sampler) == 9
    assert [b.tolist() for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    ds.n = 3
    assert [b.tolist() for b in dl] == [[0, 1, 2]] and len(dl) == 1


# ---------------------------------------- spawn pickles, as torch does

def test_spawn_context_pickles_as_torch(L):
    class Local(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return torch.tensor(i)

    with pytest.raises(AttributeError) as e:
        list(L.make(Local(), num_workers=1, multiprocessing_context="spawn"))
    assert "Can't pickle local object" in str(e.value) and "Local" in str(e.value)


@pytest.mark.parametrize("ctx", ["spawn", "forkserver", "context"])
def test_spawn_context_module_level_dataset(L, ctx):
    import multiprocessing
    ctx = multiprocessing.get_context("spawn") if ctx == "context" else ctx
    dl = L.make(Growing(5), batch_size=2, num_workers=1, multiprocessing_context=ctx)
    assert [b.tolist() for b in dl] == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("kw,err,message", [
    (dict(multiprocessing_context="spawn", num_workers=0), ValueError,
     "multiprocessing_context can only be used with multi-process loading (num_workers > 0), "
     "but got num_workers=0"),
    (dict(multiprocessing_context="nope", num_workers=1), ValueError,
     "multiprocessing_context option should specify a valid start method in ['fork', 'spawn', "
     "'forkserver'], but got multiprocessing_context='nope'"),
    (dict(multiprocessing_context=3, num_workers=1), TypeError,
     "multiprocessing_context option should be a valid context object or a string specifying "
     "the start method, but got multiprocessing_context=3")], ids=["workers0", "name", "type"])
def test_bad_multiprocessing_context_as_torch(L, kw, err, message):
    with pytest.raises(err) as e:
        L.make(Growing(2), **kw)
    assert str(e.value) == message


# ------------------------------------ a script under torch.multiprocessing.spawn

MP_SPAWN_SCRIPT = """
import sys, torch, torch.multiprocessing as mp, loaderd

class Squares(torch.utils.data.Dataset):      # a class of __mp_main__ in the ranks
    def __len__(self):
        return 6
    def __getitem__(self, i):
        return torch.tensor([i * i])

def rank(r, which, sock, ctx):
    kw = {} if which == "torch" else {"socket": sock}
    DL = torch.utils.data.DataLoader if which == "torch" else loaderd.DataLoader
    dl = DL(Squares(), batch_size=3, num_workers=2, multiprocessing_context=ctx or None, **kw)
    print("rank", r, [b.view(-1).tolist() for b in dl], flush=True)

if __name__ == "__main__":
    mp.spawn(rank, args=tuple(sys.argv[1:4]), nprocs=1)
"""


@pytest.mark.parametrize("ctx", ["", "spawn"])
def test_dataset_of_a_script_under_mp_spawn(L, workdir, ctx):
    path = os.path.join(workdir, "ddp.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(MP_SPAWN_SCRIPT))
    which = "torch" if L.cls is TORCH else "loaderd"
    r = run_python([path, which, L.extra.get("socket", ""), ctx], timeout=240, cwd=workdir)
    assert r.returncode == 0, (r.stdout, r.stderr[-4000:])
    assert r.stdout.splitlines() == ["rank 0 [[0, 1, 4], [9, 16, 25]]"], r.stdout


# ------------------------------ the forked host keeps none of the trainer's sockets

@needs_forked_host
def test_forked_host_holds_no_socket_of_the_trainers(ld):
    """The host outlives the trainer: a socket of the trainer's it held
    would keep a DDP rendezvous port listening (and the trainer's connection
    to the daemon open) after the trainer is gone, a pipe the end of file
    mp.spawn's join waits for. Its open files it keeps."""
    import socket
    import loaderd
    store = socket.create_server(("127.0.0.1", 0))   # a TCPStore's listening socket
    sentinel_r, sentinel_w = os.pipe()   # multiprocessing's sentinel, mp.spawn joins on it
    ds = Transformed(4, lambda x: x + 1)
    with loaderd.DataLoader(ds, batch_size=2, num_workers=1, socket=ld.socket) as dl:
        assert [b.tolist() for b in dl] == [[[1, 1], [2, 2]], [[3, 3], [4, 4]]]
        pid = dl._host.pid
        fds = {}
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                fds[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                pass
    mine = f"socket:[{os.fstat(store.fileno()).st_ino}]"
    assert fds.get(store.fileno()) == "/dev/null", fds   # the number stays taken
    assert mine not in fds.values(), fds
    pipe = f"pipe:[{os.fstat(sentinel_w).st_ino}]"
    assert fds.get(sentinel_w) == "/dev/null" and pipe not in fds.values(), fds
    store.close()
    os.close(sentinel_r)
    os.close(sentinel_w)


@needs_forked_host
def test_pipeline_identity_with_and_without_a_pickle(ld):
    """A picklable dataset: the same pipeline for the same dataset and
    settings, whichever context and process (the digest is of the pickles,
    never of the pid); an unpicklable one: a pipeline of each loader's own."""
    import loaderd
    from loaderd import pydataset
    a = loaderd.DataLoader(Growing(4), batch_size=2, socket=ld.socket, num_workers=1)
    b = loaderd.DataLoader(Growing(4), batch_size=2, socket=ld.socket,
                           multiprocessing_context="spawn", num_workers=1)
    assert (a.created, b.created, b.pipeline) == (True, False, a.pipeline)
    spec, _ = pydataset.build_spec(Growing(4), overrides={"batch_size": 2}, num_workers=1)
    assert spec["source"]["digest"] == a.spec["source"]["digest"]
    ds = Transformed(4, lambda x: x)
    c = loaderd.DataLoader(ds, batch_size=2, socket=ld.socket, num_workers=1)
    d = loaderd.DataLoader(ds, batch_size=2, socket=ld.socket, num_workers=1)
    assert c.created and d.created and c.pipeline != d.pipeline
    assert c.spec["source"]["digest"].startswith("unique-")
    assert [x.tolist() for x in d] == [[[0, 0], [1, 1]], [[2, 2], [3, 3]]]
    for dl in (a, b, c, d):
        dl.close()


def test_len_read_per_epoch_shared_stream(ld):
    """A broadcast loader follows len() too, between the epochs of its
    shared stream (the new pipeline's stream from its first batch)."""
    import loaderd
    ds = Growing(4)
    with loaderd.DataLoader(ds, batch_size=2, mode="broadcast", socket=ld.socket,
                            num_workers=1) as dl:
        assert [b.tolist() for b in dl] == [[0, 1], [2, 3]]
        ds.n = 6
        assert len(dl) == 3
        assert [b.tolist() for b in dl] == [[0, 1], [2, 3], [4, 5]]
