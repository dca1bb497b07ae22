# SPDX-License-Identifier: MIT
"""num_workers=0, or an IterableDataset: torch's own loading, in the trainer.

torch's DataLoader with num_workers=0 calls __getitem__ (or iterates an
IterableDataset) in the trainer's process, with its sampler drawing from the
trainer's RNG, its collate_fn, pin_memory, and the Dataset's exceptions
raised as they are. loaderd.DataLoader(dataset) with num_workers=0 (the
default, as torch's) is exactly that: torch's own single-process DataLoader,
built from the same arguments (torch checks them, in its words), iterated
in this process; no daemon, no worker. What loaderd adds is what a drop-in
needs of it: state_dict()/load_state_dict() in torchdata's StatefulDataLoader
shape, resuming at the next batch with the order the interrupted epoch had
(the RNG state the sampler drew from is in the state), and set_epoch().

An IterableDataset with num_workers >= 1 is loaded the same way, by torch's
own DataLoader with its worker processes: each worker iterates its own copy
(get_worker_info() telling it which), batches come round-robin from the
workers, a worker whose iterator ends drops out: torch's per-worker
semantics by construction. The daemon's workers build samples by index, and
an iterator's order lives in each worker of each trainer: there is nothing
one pipeline could share.

The arguments that only mean something for the daemon's workers (mode,
rank, world_size, device, ...) are refused with what to do instead.
"""

import inspect
import os

import torch

from . import loader as _loader

# loaderd's own arguments that need the daemon's workers: refused here
_DAEMON_ONLY = {
    "mode": None, "rank": None, "world_size": None, "device": "cpu", "as_numpy": False,
    "epochs": None, "inflight": None, "on_error": None, "fields": None,
    "pipeline_name": None, "augment_seed": None, "seeding": None,
}
# (socket, name, reconnect_timeout, job: not used, there is nothing to connect to)
# torch's attributes, read and set on torch's DataLoader (its set-after-init
# ValueError included)
_ATTRS = ("dataset", "batch_size", "batch_sampler", "sampler", "drop_last", "num_workers",
          "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
          "generator", "prefetch_factor", "persistent_workers", "pin_memory_device")


def _forward(name):
    def get(self):
        return getattr(self._dl, name)

    def set_(self, value):
        setattr(self._dl, name, value)
    return property(get, set_, doc=f"torch's DataLoader.{name}")


class InProcessLoader(_loader.DataLoader):
    """loaderd.DataLoader(dataset, num_workers=0), or of an IterableDataset:
    torch's own loading (docs/python.md, "num_workers=0" and "An
    IterableDataset"). DataLoader.__new__ makes one."""

    def __init__(self, *args, **kwargs):
        bound = inspect.signature(_loader.DataLoader.__init__).bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        a.pop("self")
        targs = dict(a.pop("torch_compat", {}))
        a["seeding"] = targs.pop("seeding", None)  # loaderd's, in **torch_compat
        dataset = a.pop("pipeline_or_spec")
        self._iterable = _loader._is_iterable_dataset(dataset)
        workers = targs.get("num_workers", 0)
        bad = [k for k, default in _DAEMON_ONLY.items() if k in a and a[k] != default]
        if bad:
            s = f"{', '.join(f'{k}=' for k in bad)} {'is' if len(bad) == 1 else 'are'}"
            if self._iterable:
                raise ValueError(
                    f"loaderd.DataLoader: {s} for the daemon's worker processes, which build "
                    f"samples by index: an IterableDataset ({type(dataset).__name__}) is "
                    "iterated by torch's own DataLoader, in this process or torch's workers; "
                    "give a map-style Dataset (__getitem__ and __len__) for them" +
                    ("; for a rank's share of an IterableDataset, split it in __iter__ by "
                     "torch.distributed's rank" if {"mode", "rank", "world_size"} & set(bad)
                     else ""))
            raise ValueError(
                f"loaderd.DataLoader: {s} for the daemon's worker processes: with "
                "num_workers=0 the Dataset runs in this process, as torch's DataLoader runs it; "
                "give num_workers >= 1 for them" +
                ("; for a rank's share here, pass sampler=DistributedSampler(dataset)"
                 if {"mode", "rank", "world_size"} & set(bad) else ""))
        seed = a.get("seed")
        if seed is not None:
            if targs.get("generator") is not None:
                raise ValueError("loaderd.DataLoader: give seed= or generator=, not both")
            g = torch.Generator()
            g.manual_seed(int(seed))
            targs["generator"] = g  # the shuffle's order: reproducible from seed=
        if a.get("batch_size") is not _loader._UNSET:
            targs["batch_size"] = a["batch_size"]
        for k in ("shuffle", "drop_last"):
            if a.get(k) is not None:
                targs[k] = a[k]
        timeout = a.get("timeout")
        if timeout is not None:
            targs["timeout"] = timeout
        # torch's checks first, in its words
        self._dl = torch.utils.data.DataLoader(dataset, **targs)
        if timeout and not workers:  # torch's single-process iterator asserts it, at iter()
            raise ValueError(f"loaderd.DataLoader: timeout={timeout!r} is for num_workers > 0: "
                             "with num_workers=0 the Dataset runs in this process, and torch's "
                             "single-process loading requires timeout=0")
        self.progress = a.get("progress", False)
        self._pid = os.getpid()
        self._closed = False
        self._att = None
        self._client = None
        self._reconnects_final = 0
        self.pipeline, self.spec, self.created = None, None, False
        self.mode = "torch-workers" if workers else "in-process"
        self.rank, self.world_size = 0, 1
        self.device, self.as_numpy, self.augment_seed, self.job = "cpu", False, None, None
        self._epoch = 0         # the epoch the next `for` iterates
        self._cur = None        # the running or last `for`: its epoch, RNG states, yielded, ended
        self._loaded = None     # load_state_dict()'s state, for the next `for`
        self._loop = None       # the running `for`'s token

    # ------------------------------------------------------------ iterating

    def _start(self, rng, gen_state, skip):
        """(torch's iterator, the trainer's RNG state and the generator's its
        sampler draws from). @rng None: a new epoch; else a restore: @rng and
        @gen_state those states, the first @skip batches passed over."""
        gen = self._dl.generator
        if rng is None:  # a new epoch: from the RNG states as they are now
            rng = torch.get_rng_state()
            gen_state = gen.get_state() if gen is not None else None
            return iter(self._dl), rng, gen_state
        # the sampler draws at its first index (torch's samplers are
        # generators): from the epoch's RNG states until the skip is done
        saved = torch.get_rng_state()
        torch.set_rng_state(rng)
        if gen is not None and gen_state is not None:
            gen.set_state(gen_state)
        try:
            it = iter(self._dl)
            if self._dl._dataset_kind == torch.utils.data.dataloader._DatasetKind.Map:
                for _ in range(skip):
                    it._next_index()  # the indices only: no __getitem__
                it._num_yielded = skip
            else:
                for _ in range(skip):  # an IterableDataset: iterated past them
                    next(it)
        finally:
            torch.set_rng_state(saved)  # the trainer's RNG goes on as it was
        return it, rng, gen_state

    def _epoch_iter(self):
        state, self._loaded = self._loaded, None
        if state is not None and state["epoch"] == self._epoch and state["yielded"]:
            rng = state["rng"] if state["rng"] is not None else torch.get_rng_state()
            it, rng, gen = self._start(rng, state["gen"], state["yielded"])
            cur = {"epoch": state["epoch"], "rng": rng, "gen": gen, "yielded": state["yielded"]}
        else:
            it, rng, gen = self._start(None, None, 0)
            cur = {"epoch": self._epoch, "rng": rng, "gen": gen, "yielded": 0}
        self._cur = cur
        self._epoch = cur["epoch"] + 1  # the next `for`, whether this one ends or breaks
        token = object()
        self._loop = token
        try:
            while True:
                try:
                    b = next(it)
                except StopIteration:
                    break
                except Exception as e:
                    # torch's iterator goes on after a batch that raised: the
                    # error in its place (_EpochIter raises it), then the next
                    cur["yielded"] += 1
                    yield _loader._Failed(None, None, e)
                    continue
                cur["yielded"] += 1
                box, b = [b], None  # no reference kept while the loop body runs
                yield box.pop()
        finally:
            if self._loop is token:
                self._loop = None

    def __iter__(self):
        it = self._epoch_iter()
        if self.progress:
            from ._progress import progress
            try:
                total = len(self._dl)
            except TypeError:
                total = 0
            it = progress(it, total, f"in-process epoch {self._epoch}")
        return _loader._EpochIter(it)

    def __len__(self):
        return len(self._dl)

    def next_batch(self):
        raise TypeError("loaderd.DataLoader.next_batch() reads the daemon's stream; with "
                        "num_workers=0 iterate the loader (next(iter(loader)))")

    # --------------------------------------------------- epochs and resume

    def set_epoch(self, epoch):
        """The next `for` is epoch @epoch (from the position load_state_dict()
        restored when it is of that epoch); the sampler's (and the batch
        sampler's) set_epoch(@epoch) is called where it has one, as
        Lightning does (DistributedSampler)."""
        epoch = int(epoch)
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
        if self._loaded is not None and self._loaded["epoch"] != epoch:
            self._loaded = None
        self._epoch = epoch
        for s in (self._dl.sampler, getattr(self._dl.batch_sampler, "sampler", None)):
            if hasattr(s, "set_epoch"):
                s.set_epoch(epoch)

    @property
    def epoch(self):
        return self._cur["epoch"] if self._loop is not None else self._epoch

    def state_dict(self):
        """torchdata's StatefulDataLoader state (docs/python.md, "Exact
        resume"): inside a `for`, the rest of that loop; else the start of
        the next `for`. "in_process" holds the RNG states the epoch's sampler
        drew from."""
        if self._loaded is not None:
            st = self._loaded
        elif self._loop is not None:
            st = self._cur
        else:
            st = {"epoch": self._epoch, "rng": None, "gen": None, "yielded": 0}
        return _loader._state(st["epoch"], st["yielded"], {
            "pipeline": None, "rank": 0, "world_size": 1,
            "in_process": {"rng_state": st["rng"], "generator_state": st["gen"]}})

    def load_state_dict(self, state):
        """The next `for` resumes where @state (state_dict()'s) stood, with
        the order its epoch had; set_epoch() of that epoch keeps it."""
        own = state.get("in_process") if isinstance(state, dict) else None
        if not isinstance(own, dict):
            raise ValueError("load_state_dict: not the state of a loaderd.DataLoader with "
                             "num_workers=0 (it has no 'in_process'): give what its "
                             "state_dict() returned")
        try:
            n = len(self._dl)
        except TypeError:
            n = None
        epoch, batch = _loader._state_position(state, n)
        self._loop = None
        self._epoch = epoch
        self._loaded = {"epoch": epoch, "rng": own.get("rng_state") if batch else None,
                        "gen": own.get("generator_state") if batch else None, "yielded": batch}

    # ------------------------------------------------------------ the rest

    @property
    def reconnects(self):
        return 0

    @property
    def samples_per_epoch(self):
        return len(self._dl.sampler)

    @property
    def epochs(self):
        return 0

    @property
    def exhausted(self):
        return False

    @property
    def slab(self):
        return 0, 0

    @property
    def writable(self):
        return True

    def close(self):
        self._closed = True
        self._loop = None
        it, self._dl._iterator = getattr(self._dl, "_iterator", None), None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()  # persistent_workers: torch's kept them

    def __repr__(self):
        name = type(self._dl.dataset).__name__
        if self._dl.num_workers:
            return (f"<loaderd.DataLoader of {name} by torch's DataLoader "
                    f"(num_workers={self._dl.num_workers})>")
        return f"<loaderd.DataLoader in-process (num_workers=0) of {name}>"


for _n in _ATTRS:
    setattr(InProcessLoader, _n, _forward(_n))
del _n
