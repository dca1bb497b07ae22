# SPDX-License-Identifier: MIT
"""Map-style Datasets of the "python" source tests (tests/python/
test_pydataset_unit.py, tests/integration/test_pydataset.py). A module of its
own, importable by the workers (they unpickle these classes by reference):
no pytest, no harness; torch and torchvision only where a class needs them.
"""

import os
import random
import time

import numpy as np


def make_image(index, size=(48, 40)):
    """A deterministic uint8 image [3, H, W] of sample @index."""
    rng = np.random.default_rng(1000 + index)
    return rng.integers(0, 256, size=(3,) + tuple(size), dtype=np.uint8)


class RandomAugment:
    """Generated images through torchvision's RandomResizedCrop and
    RandomHorizontalFlip (torch's RNG), plus numpy and Python random draws:
    what a sample holds depends on the seeding of all three."""

    def __init__(self, n=40, out=24):
        self.n, self.out = n, out
        self._tf = None

    def _transform(self):
        if self._tf is None:
            import torchvision.transforms as T
            self._tf = T.Compose([T.RandomResizedCrop(self.out, antialias=True),
                                  T.RandomHorizontalFlip()])
        return self._tf

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        img = torch.from_numpy(make_image(i)).float() / 255
        x = self._transform()(img)
        noise = np.float32(np.random.random())
        return x + noise, i % 7, random.random()

    def __getstate__(self):
        return {"n": self.n, "out": self.out}

    def __setstate__(self, st):
        self.n, self.out, self._tf = st["n"], st["out"], None


class DictSamples:
    def __init__(self, n=30):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        return {"x": torch.arange(4, dtype=torch.float32) * i,
                "y": i,
                "m": np.array([i % 2 == 0, i % 3 == 0]),
                "nested": {"s": np.int16(i), "f": float(i) / 3}}


import collections

Pair = collections.namedtuple("Pair", ["image", "label"])


class NamedSamples:
    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return Pair(np.full(2, i, dtype=np.float32), i)


class TupleSamples:
    def __init__(self, n=30):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        return (torch.full((2, 3), i, dtype=torch.int32), np.float64(i) / 7, (i % 2 == 1, [i, -i]))


class Plain:
    """Pure numpy: sample i is [i, i+1, i+2] as float32 plus i as label."""

    def __init__(self, n=25, fail=(), sleep=0.0):
        self.n, self.fail, self.sleep = n, set(fail), sleep

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.fail:
            raise ValueError(f"bad sample {i}")
        if self.sleep:
            time.sleep(self.sleep)
        return np.arange(i, i + 3, dtype=np.float32), i


class Counting(Plain):
    """Plain, and each call appends the index to the file $PYDS_COUNT_DIR/<pid>."""

    def __init__(self, n=25, count_dir=None, sleep=0.0):
        super().__init__(n, sleep=sleep)
        self.count_dir = count_dir

    def __getitem__(self, i):
        if self.count_dir:
            with open(os.path.join(self.count_dir, str(os.getpid())), "a") as f:
                f.write(f"{i}\n")
        return super().__getitem__(i)


class VarLen:
    """{"tok": int64 [i % 5 + 1]}: a variable first dimension (pad)."""

    def __init__(self, n=20):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"tok": np.arange(i % 5 + 1, dtype=np.int64) + i, "y": i}


class BadShape(Plain):
    def __getitem__(self, i):
        if i == 3:
            return np.zeros(4, dtype=np.float32), i
        return super().__getitem__(i)


class WithString:
    def __len__(self):
        return 3

    def __getitem__(self, i):
        return {"x": np.zeros(2, np.float32), "name": f"s{i}"}


def stack_collate(samples):
    """A collate_fn: x stacked, y as int32."""
    import torch
    return (torch.stack([torch.from_numpy(s[0]) for s in samples]) * 2,
            torch.tensor([s[1] for s in samples], dtype=torch.int32))


def init_marker(worker_id):
    """A worker_init_fn: remembers the worker id in an env var."""
    os.environ["PYDS_WORKER_INIT"] = str(worker_id)


class WorkerInfoSamples:
    """Returns the worker's ids: torch's get_worker_info and loaderd's.

    With @meet (a number of workers), a worker's samples but sample 0 (the
    one loaderd's DataLoader learns the fields from, alone) wait until that
    many workers have each begun one (files in a folder made here), so every
    worker builds samples however the tasks' timing falls: a worker that
    waits asks for no task, and the others get them."""

    def __init__(self, n=8, meet=0):
        self.n = n
        self.meet = meet
        import tempfile  # here: the line numbers above are in tests' expected tracebacks
        self.dir = tempfile.mkdtemp(prefix="pyds-meet-") if meet else None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch.utils.data
        import loaderd
        ti = torch.utils.data.get_worker_info()
        li = loaderd.get_worker_info()
        tid = -1 if ti is None else ti.id
        lid = -1 if li is None else li.id
        if self.meet and li is not None and i > 0:
            open(os.path.join(self.dir, str(lid)), "w").close()
            deadline = time.monotonic() + 60
            while len(os.listdir(self.dir)) < self.meet and time.monotonic() < deadline:
                time.sleep(0.01)
        init = int(os.environ.get("PYDS_WORKER_INIT", "-1"))
        return np.array([tid, lid, init, torch.get_num_threads()], dtype=np.int64)


def raise_in_init(worker_id):
    raise RuntimeError("init boom")


class Changing(Plain):
    """Sample 3 has another structure: a 1-tuple, then a dict."""

    def __getitem__(self, i):
        if i == 3:
            return (np.zeros(3, dtype=np.float32),)
        if i == 4:
            return {"0": np.zeros(3, dtype=np.float32), "1": 4}
        return super().__getitem__(i)


class Deep(Plain):
    """Sample 5 raises from 20 calls deep, with a 3000-character message:
    the whole traceback must reach the trainer, not its first 256 bytes."""

    def _deep(self, k, i):
        if k == 0:
            raise RuntimeError("long " + "x" * 3000 + f" END-OF-MESSAGE-{i}")
        return self._deep(k - 1, i)

    def __getitem__(self, i):
        if i == 5:
            return self._deep(20, i)
        return super().__getitem__(i)
