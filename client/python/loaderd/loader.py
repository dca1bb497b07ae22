# SPDX-License-Identifier: MIT
"""loaderd.DataLoader and loaderd.Client: the Python face of libloader.

Object graph and lifetimes (no cycles, so CPython frees in this order):

    DataLoader ──► _Attachment ──► _Client          (ldr_attachment*, ldr_client*)
    tensor ► ndarray ► _Mem ► _Lease ──► _Attachment (ldr_batch*)
    object part's tensor ► its field's ndarray ► _Mem   (a python pipeline, _objpart)
    Batch (dict) ─────────────► _Lease
    _Lease ┄┄► _Mem (weak, one per field: which fields are still alive)

A batch's lease is released (ldr_release) when the last array/tensor/Batch of
it is gone, or at once by Batch.release(). When the batches the trainer holds
reach the attachment's share of slots, the oldest are *kept* before the next
ldr_next: ldr_batch_keep copies the fields still alive to private memory at
the same addresses and gives the slot back, so holding batches never blocks
the stream. DataLoader.close() (and re-attaching for a new epoch or
load_state_dict) detaches at once; batches still alive stay valid: libloader
keeps them at detach. Host batches are copy-on-write (libloader maps the slab
MAP_PRIVATE): writable, and what the trainer writes stays in its process.
Objects inherited across fork never call into nng: every finalizer checks the
pid first (libloader checks it too).
"""

import collections.abc
import ctypes
import errno
import itertools
import json
import os
import pwd
import subprocess
import sys
import time
import types
import warnings
import weakref

import numpy as np

from . import _cuda, _lib, _objpart, _order, _pystart, pydataset
from .errors import Error, ForkedError, InvalidSpec, dataset_error, from_code

try:  # torch is optional: without it batches are numpy arrays
    import torch as _torch
except Exception:  # pragma: no cover - depends on the machine
    _torch = None
# torch 2's DataLoader: prefetch_factor defaults to None, and its checks word it so
_TORCH2 = _torch is not None and int(_torch.__version__.split(".")[0]) >= 2

_POLL_MS = 200  # ldr_next waits in slices, so that Ctrl-C gets through


# os.getpid() without its system call on every batch: forgotten at a fork
_self_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _self_pid.__setitem__(0, os.getpid()))


def _err(code, operation):
    msg = _lib.lib().ldr_client_error(None)
    msg = msg.decode("utf-8", "replace") if msg else ""
    return from_code(code, msg, operation)


def _forked(pid, what):
    return ForkedError(_lib.LDR_EFORKED,
                       f"this {what} was created in process {pid} and used in process "
                       f"{os.getpid()} after fork", "")


# ------------------------------------------------------------------ handles

def _reconnect_ms(seconds):
    """reconnect_timeout= in seconds (0: never reconnect) as libloader's ms."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
            not 0 <= seconds <= 2073600:
        raise ValueError(f"reconnect_timeout must be a number of seconds from 0 (never "
                         f"reconnect) to 2073600, not {seconds!r}")
    ms = int(round(seconds * 1000))
    return 1 if seconds > 0 and ms == 0 else ms


class _Client:
    """Owns one ldr_client* (one connection to the daemon)."""

    def __init__(self, socket=None, name=None, reconnect_timeout=None):
        self.pid = os.getpid()
        self.ptr = None
        self.closed = False
        L = _lib.lib()
        self.socket_arg = os.fspath(socket) if socket is not None else None
        out = ctypes.c_void_p()
        sock = self.socket_arg.encode() if self.socket_arg else None
        cname = (name or f"python pid {self.pid}").encode()[:63]
        r = L.ldr_connect(ctypes.byref(out), sock, cname)
        if r < 0:
            raise _err(r, "connect")
        self.ptr = out.value
        self._close_fn = L.ldr_close
        if reconnect_timeout is not None:
            r = L.ldr_client_set_reconnect(self.ptr, _reconnect_ms(reconnect_timeout))
            if r < 0:
                raise _err(r, "reconnect_timeout")

    def reconnects(self):
        return int(_lib.lib().ldr_client_reconnects(self.ptr)) if self.ptr else 0

    def check(self):
        if self.pid != os.getpid():
            raise _forked(self.pid, "loaderd client")
        if self.closed:
            raise Error(-errno.EBADF, "the client is closed", "")

    def close(self):
        if self.closed or self.ptr is None:
            return
        self.closed = True
        if self.pid == os.getpid():
            self._close_fn(self.ptr)  # detaches whatever is still attached
        self.ptr = None

    __del__ = close

    def __reduce__(self):
        raise TypeError("a loaderd client cannot be pickled: create it in the process that uses it")


class _Attachment:
    """Owns one ldr_attachment*; keeps its _Client alive."""

    def __init__(self, client, pipeline, mode, rank, world, start, inflight, device=None,
                 augment_seed=None, job=None, client_order=False):
        self.ptr = None
        self.device = device  # None: host memory; N: cuda:N
        self.detached = False
        self.client = client
        L = _lib.lib()
        client.check()
        # delivery number -> weakref to its _Lease: a plain dict of weakrefs
        # (cheaper per batch than a WeakValueDictionary), the dead ones
        # dropped by prune_leases()
        self.leases = {}
        self.seq = 0
        self.prune_at = 64
        opts = _lib.ldr_attach_opts()
        opts.mode = _lib.MODES[mode]
        opts.rank = rank
        opts.world_size = world
        if start is not None:
            opts.has_start = 1
            opts.start_epoch, opts.start_batch = start[:2]
            if len(start) > 2:  # an elastic resume's tail (docs/spec.md)
                opts.has_start_position = 1
                opts.start_position = start[2]
        opts.inflight = inflight or 0
        if device is not None:
            opts.device_kind = 1  # LDR_DEVICE_CUDA
            opts.device_index = device
        if augment_seed is not None:
            opts.has_augment_seed = 1
            opts.augment_seed = augment_seed
        if job is not None:
            opts.job = job.encode()  # libloader copies it
        opts.client_order = int(client_order)
        out = ctypes.c_void_p()
        r = L.ldr_attach(client.ptr, pipeline.encode(), ctypes.byref(opts), ctypes.byref(out))
        if r < 0:
            raise _err(r, f"attach {pipeline!r}")
        self.ptr = out.value
        self.nfields = L.ldr_attachment_nfields(self.ptr)
        self.batches_per_epoch = L.ldr_attachment_batches_per_epoch(self.ptr)
        self.samples_per_epoch = L.ldr_attachment_samples_per_epoch(self.ptr)
        self.epochs = L.ldr_attachment_epochs(self.ptr)
        self.batch_size = L.ldr_attachment_batch_size(self.ptr)
        uid = ctypes.c_uint32()
        # whose code wrote the batches (a python pipeline's object part)
        self.owner = uid.value if L.ldr_attachment_owner(self.ptr, ctypes.byref(uid)) == 0 \
            else None
        # what ldr_next_described() fills, one call per batch: the batch, its
        # fields, the keeping counters (held, share, kept) at that moment
        self.info = _lib.ldr_batch_info()
        self.fields = (_lib.ldr_field * max(1, self.nfields))()
        self.out = ctypes.c_void_p()
        self.next_args = (ctypes.byref(self.out), ctypes.byref(self.info), self.fields,
                          self.nfields)
        self.described = False  # self.info holds counters from a call
        self._next_fn = L.ldr_next_described
        # host: the slab is mapped copy-on-write, batches are writable;
        # device memory is shared by every client on that GPU
        self.writable = device is None
        self._detach_fn = L.ldr_detach
        self._L = L

    @property
    def slab(self):
        """(base, size) of the mapped slab: the new daemon's after a restart."""
        if self.ptr is None:
            return 0, 0
        size = ctypes.c_size_t()
        base = self._L.ldr_attachment_slab(self.ptr, ctypes.byref(size))
        return base or 0, size.value

    # ------------------------------------------------------------ keeping

    def held(self):
        """Batches the trainer holds: taken, neither released nor kept."""
        return int(self._L.ldr_attachment_held(self.ptr))

    def share(self):
        """Leases this attachment may hold now."""
        return int(self._L.ldr_attachment_share(self.ptr))

    def kept(self):
        """(batches, bytes) kept so far, by this package and by libloader."""
        if self.ptr is None:
            return 0, 0
        nb, nbytes = ctypes.c_uint64(), ctypes.c_uint64()
        self._L.ldr_attachment_kept(self.ptr, ctypes.byref(nb), ctypes.byref(nbytes))
        return nb.value, nbytes.value

    def next(self, wait):
        """ldr_next_described(): 0 and self.out/info/fields set, or an error."""
        r = self._next_fn(self.ptr, wait, *self.next_args)
        self.described = r != _lib.LDR_EFORKED
        return r

    def order(self, epoch, first, batches, last):
        """ldr_order(): batches @first.. of @epoch (lists of dataset
        indices) are this client_order attachment's next ones."""
        sizes = np.fromiter((len(b) for b in batches), dtype=np.uint32, count=len(batches))
        idx = np.fromiter(itertools.chain.from_iterable(batches), dtype=np.uint64,
                          count=int(sizes.sum()))
        r = self._L.ldr_order(self.ptr, epoch, first,
                              sizes.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)), len(batches),
                              idx.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), int(last))
        if r == -errno.ERANGE:
            # an index past the dataset: what torch's Dataset would raise
            raise IndexError(f"loaderd: {_err(r, 'order')}") from None
        if r < 0:
            raise _err(r, "order")

    def failed(self):
        """(error code, epoch, index) of the batch ldr_next just said failed."""
        epoch, index = ctypes.c_uint64(), ctypes.c_uint64()
        code = self._L.ldr_attachment_failed(self.ptr, ctypes.byref(epoch), ctypes.byref(index))
        return code, epoch.value, index.value

    def live_leases(self):
        """The leases still alive, oldest first."""
        return [l for l in (ref() for _, ref in sorted(self.leases.items())) if l is not None]

    def add_lease(self, lease):
        # loaderd._fast (client/python/pyfast.c) does the same for its leases
        self.leases[self.seq] = weakref.ref(lease)
        self.seq += 1
        if len(self.leases) >= self.prune_at:
            self.prune_leases()

    def prune_leases(self):
        self.leases = {k: r for k, r in self.leases.items() if r() is not None}
        self.prune_at = 2 * len(self.leases) + 64

    def fast_host(self, fields, batch_type):
        """A loaderd._fast.Host that takes this host attachment's batches in
        one C call (the same Batch, leases and arrays as _next_raw builds),
        or None: no such module, a device attachment, no fields."""
        fast = _lib.fast()
        if fast is None or self.device is not None or self.nfields < 1:
            return None
        L = self._L
        meta = []
        for name, typestr, dtname, conv, _shapes in fields:
            if conv is not None and _dlpack_ok(dtname):
                # the tensor straight from the slot, no numpy array between
                meta.append((name, typestr, _torch._C._from_dlpack, True))
            else:
                meta.append((name, typestr, conv))
        return fast.Host(self, ctypes.cast(L.ldr_next_described, ctypes.c_void_p).value, self.ptr,
                         ctypes.addressof(self.info), ctypes.addressof(self.fields), self.nfields,
                         meta, batch_type, np.asarray)

    def keep_for_share(self):
        """Before ldr_next: when the trainer holds its whole share, keep its
        oldest batches (the fields still alive only) until it holds about
        half of it, so that the stream can go on (and prefetch) meanwhile."""
        if self.device is not None:
            return  # device batches cannot be kept: ldr_next says ENOBUFS
        info = self.info
        if self.described and info.held < info.share:
            # it holds at most what it held after the last call (only
            # ldr_next adds to it): below the share then, below it now. A
            # share lowered since is still met: ldr_next keeps then itself.
            return
        share = self.share()
        if share <= 0 or self.held() < share:
            return
        target = share - max(1, share // 2)
        for lease in self.live_leases():
            if lease.ptr is None or lease.kept:
                continue
            self.keep(lease)
            if self.held() <= target:
                break

    def keep(self, lease):
        if self._L.ldr_batch_is_kept(lease.ptr):
            lease.kept = True  # libloader kept it already (ldr_next)
            return
        mask = 0
        for i, ref in enumerate(lease.mems):
            if ref() is not None:
                mask |= 1 << i
        if not mask:  # no array of it is alive (only its Batch dict, emptied)
            lease.release()
            return
        r = self._L.ldr_batch_keep(lease.ptr, mask)
        if r < 0:
            raise _err(r, "keep")
        lease.kept = True

    # ------------------------------------------------------------ detaching

    def warn_device_batches(self):
        """Before detaching a CUDA attachment: device batches cannot be kept
        (host ones are, by ldr_detach), so say that those still alive may be
        overwritten."""
        if self.device is None or self.detached or self.ptr is None or \
                self.client.pid != os.getpid():
            return
        alive = [l for l in self.live_leases() if l.ptr]
        if alive:
            warnings.warn(f"loaderd: {len(alive)} batches in GPU memory are still alive at "
                          "close(): the daemon may reuse their device memory; copy (clone) "
                          "batches you keep", RuntimeWarning, stacklevel=4)

    def detach(self):
        if self.detached or self.ptr is None:
            return
        self.detached = True
        c = self.client
        # after ldr_close the attachment is gone already; in a forked child
        # nothing may touch nng
        if not c.closed and c.pid == os.getpid():
            self._detach_fn(self.ptr)
        self.ptr = None

    __del__ = detach


class _Lease:
    """One ldr_batch*: released when the last array of the batch is gone."""

    __slots__ = ("ptr", "att", "device", "kept", "mems", "__weakref__")
    _release_fn = None
    _release_after_fn = None

    def __init__(self, ptr, att):
        self.ptr = ptr
        self.att = att
        self.device = att.device
        self.kept = False      # copied to private memory, the slot given back
        self.mems = ()         # weak references to each field's _Mem
        att.add_lease(self)

    def release(self, stream=None):
        p = self.ptr
        if p:
            self.ptr = None
            # safe in a forked child and after ldr_detach/ldr_close: libloader
            # then only frees its own memory
            if self.device is None:
                _Lease._release_fn(p)
            else:
                # after the kernels queued so far on torch's current stream
                if stream is None:
                    stream = _cuda.current_stream(self.device)
                _Lease._release_after_fn(p, stream or None)
        self.att = None

    def __del__(self):
        self.release()


class _Mem:
    """The base object of one field's array: numpy reads the pointer through
    __array_interface__, writable (the slab is mapped copy-on-write: a
    written page becomes private to this process). Weakly referenced by its
    _Lease: a field whose _Mem is gone is not copied when the batch is kept."""

    __slots__ = ("__array_interface__", "lease", "__weakref__")


# ------------------------------------------------------------------ batches

class Batch(dict):
    """One batch: a dict field name -> tensor (or numpy array), in the
    source's field order (tokens: input, target; npy: the order of the spec's
    paths; images: image, label).

    Iterating a Batch yields its **values** in that order, so that
    ``for x, y in loader`` and ``x, y = batch`` unpack it as they unpack
    torch's (input, target) batches; the names are in ``keys()`` and
    ``items()``, and ``batch["input"]``, ``"input" in batch``, ``dict(batch)``,
    ``len(batch)`` behave as for any dict.

    ``epoch``, ``index`` (the batch number within the epoch, in this
    attachment's share's numbering as the daemon reports it) and ``rows``.
    The arrays are views of the daemon's shared memory (copy-on-write: an
    in-place op changes this process's copy only), valid while any of them (or
    this dict) is alive. ``release()`` hands the memory back at once: the
    arrays must not be used after it (the daemon may reuse the slot)."""

    __slots__ = ("epoch", "index", "rows", "_lease")

    def __iter__(self):
        """The fields' values in field order (x, y = batch); keys() for the names."""
        return iter(self.values())

    def release(self, stream=None):
        """Give the batch's slot back to the daemon now. A batch in GPU memory
        goes back once the work queued so far on @stream (a torch.cuda.Stream
        or a CUstream as int; default: torch's current stream) is done."""
        lease = self._lease
        if lease is not None:
            self._lease = None
            if stream is not None and not isinstance(stream, int):
                stream = int(stream.cuda_stream)
            lease.release(stream)

    @property
    def released(self):
        return self._lease is None or self._lease.ptr is None

    @property
    def kept(self):
        """True once the batch was copied out of its slot into private memory
        (docs/python.md, "Keeping batches")."""
        lease = self._lease
        if lease is None or lease.ptr is None:
            return False
        if not lease.kept and _lib.lib().ldr_batch_is_kept(lease.ptr):
            lease.kept = True
        return lease.kept

    def __repr__(self):
        fields = ", ".join(f"{k}: {getattr(v, 'dtype', '?')}{list(v.shape)}" for k, v in self.items())
        return f"<loaderd.Batch epoch {self.epoch} index {self.index} rows {self.rows} {{{fields}}}>"

    def __reduce__(self):
        # pickling copies the data out of shared memory into plain arrays
        return (dict, (dict(self.items()),))


_TORCH_DIRECT = None          # numpy dtypes torch.from_numpy takes (probed once)
_widen_warned = set()
_WIDEN = {"uint16": np.int32, "uint32": np.int64, "uint64": np.int64}


def _probe_torch():
    global _TORCH_DIRECT
    ok = set()
    for name in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                 "uint64", "float16", "float32", "float64"):
        try:
            _torch.from_numpy(np.zeros(1, dtype=name))
            ok.add(name)
        except (TypeError, RuntimeError):
            pass
    _TORCH_DIRECT = ok


_DLPACK = {}                  # dtype name -> torch makes that tensor from DLPack


def _dlpack_ok(dtname):
    """Does this torch take a DLPack capsule of @dtname (numpy's layout) and
    give the tensor torch.from_numpy would? Integers and floats only: bool,
    bfloat16 and the unsigned types torch < 2.3 lacks keep from_numpy."""
    ok = _DLPACK.get(dtname)
    if ok is None:
        ok = False
        if (dtname in ("int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64")
                and hasattr(_torch._C, "_from_dlpack")):
            try:
                a = np.arange(6, dtype=dtname).reshape(2, 3)
                t = _torch._C._from_dlpack(a.__dlpack__())
                ok = t.dtype == _torch.from_numpy(a).dtype and t.tolist() == a.tolist()
            except (AttributeError, TypeError, RuntimeError, BufferError):
                ok = False
        _DLPACK[dtname] = ok
    return ok


def _to_torch(arr, dtname):
    """Zero-copy torch tensor over the (writable, copy-on-write) array @arr."""
    if _TORCH_DIRECT is None:
        _probe_torch()
    if dtname == "bfloat16":
        return _torch.from_numpy(arr.view(np.int16)).view(_torch.bfloat16)
    if dtname in _TORCH_DIRECT:
        return _torch.from_numpy(arr)
    # uint16/uint32/uint64 without a torch dtype (torch < 2.3): widen, a copy
    if dtname not in _widen_warned:
        _widen_warned.add(dtname)
        warnings.warn(f"loaderd: this torch has no {dtname}; {dtname} fields are copied into "
                      f"{np.dtype(_WIDEN[dtname]).name} tensors (use as_numpy=True, or an "
                      f"int64 output_dtype in the spec, for zero-copy)", RuntimeWarning, stacklevel=3)
    return _torch.from_numpy(arr.astype(_WIDEN[dtname]))


# --------------------------------------------------------- torch arguments

_COMPAT_ACCEPT = {
    "num_workers": "loaderd's daemon decodes and collates in its own worker threads "
                   "(loaderd --workers N); num_workers is ignored",
    "pin_memory": "batches arrive in the daemon's shared-memory slots without a copy, and "
                  "with device='cuda:N' in GPU memory, copied from the daemon's pinned memory; "
                  "pin_memory pins no tensor (your own Dataset: an object of the batch gets "
                  "its pin_memory() called where torch's DataLoader calls it)",
    "pin_memory_device": "see pin_memory; pin_memory_device is ignored",
    "prefetch_factor": "the daemon prefetches the spec's 'prefetch' slots and libloader keeps "
                       "'inflight' requests out; prefetch_factor is ignored",
    "persistent_workers": "the daemon's workers always persist; persistent_workers is ignored",
    "multiprocessing_context": "loaderd starts no worker processes; multiprocessing_context is ignored",
}
_NOT_YET = "not supported yet (issue 26, \"a real drop-in\")"
_COMPAT_REJECT = {
    "collate_fn": "loaderd collates in the daemon, in place; transform the batch dict in "
                  "your loop instead of passing collate_fn",
    "worker_init_fn": "loaderd runs no Python workers; worker_init_fn has nothing to run in",
}
_compat_warned = set()

# torch's DataLoader arguments the loader keeps as attributes, and their
# defaults there (prefetch_factor: 2 in 1.13; None in 2.x, 2 once num_workers > 0)
_TORCH_DEFAULTS = {"num_workers": 0, "collate_fn": None, "pin_memory": False, "timeout": 0,
                   "worker_init_fn": None, "multiprocessing_context": None, "generator": None,
                   "prefetch_factor": None if _TORCH2 else 2, "persistent_workers": False,
                   "pin_memory_device": ""}
# set after __init__: torch's ValueError
_FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
_UNSET = object()  # batch_size not given


def _torch_compat(kwargs):
    for key, value in kwargs.items():
        if key in _COMPAT_REJECT:
            if value is None:
                continue
            raise TypeError(f"loaderd.DataLoader: {key} is not supported: {_COMPAT_REJECT[key]}")
        if key not in _COMPAT_ACCEPT:
            raise TypeError(f"loaderd.DataLoader got an unexpected keyword argument {key!r}")
        if key not in _compat_warned:
            _compat_warned.add(key)
            warnings.warn(f"loaderd.DataLoader: {_COMPAT_ACCEPT[key]}", UserWarning, stacklevel=3)


def _is_iterable_dataset(obj):
    if _torch is not None and isinstance(obj, _torch.utils.data.IterableDataset):
        return True
    return hasattr(obj, "__iter__") and not hasattr(obj, "__getitem__") and \
        not isinstance(obj, (str, dict))


def _torch_checks(ds, batch_size, shuffle, drop_last, timeout, args):
    """torch's DataLoader argument checks (1.13's order, types and words)
    for the combinations it refuses, before what loaderd cannot do yet."""
    nw, pf = args.get("num_workers", 0), args.get("prefetch_factor")
    sampler, batch_sampler = args.get("sampler"), args.get("batch_sampler")
    if nw < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                         "disable multiprocessing.")
    if timeout is not None and timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if _TORCH2:  # the words of the torch this trainer runs
        if nw == 0 and pf is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                             "let num_workers > 0 to enable multiprocessing, otherwise set "
                             "prefetch_factor to None.")
        if pf is not None and pf < 0:
            raise ValueError("prefetch_factor option should be non-negative")
    else:
        if nw == 0 and pf is not None and pf != 2:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                             "let num_workers > 0 to enable multiprocessing.")
        if pf is not None and pf <= 0:
            raise ValueError(f"prefetch_factor must be > 0, not {pf!r}")
    if args.get("persistent_workers") and nw == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    if _is_iterable_dataset(ds):
        if shuffle not in {False, None}:
            raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                             f"option, but got shuffle={shuffle}")
        if sampler is not None:
            raise ValueError("DataLoader with IterableDataset: expected unspecified sampler "
                             f"option, but got sampler={sampler}")
        if batch_sampler is not None:
            raise ValueError("DataLoader with IterableDataset: expected unspecified "
                             f"batch_sampler option, but got batch_sampler={batch_sampler}")
        # loaderd.DataLoader itself hands it to torch's loader (__new__)
        raise TypeError("loaderd.DataLoader: an IterableDataset "
                        f"({type(ds).__name__}) is iterated by torch's own DataLoader, which "
                        "loaderd.DataLoader(dataset) uses; a subclass of loaderd.DataLoader "
                        "takes a map-style Dataset (__getitem__ and __len__) or a spec")
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size not in (1, _UNSET) or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last")
    elif batch_size is None:
        if drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
    elif batch_size is not _UNSET:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError("batch_size should be a positive integer value, but got "
                             f"batch_size={batch_size}")
    if drop_last is not None and batch_size is not None and not isinstance(drop_last, bool):
        raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")


class Sampler:
    """loader.sampler: what code asks of torch's sampler. The order itself is
    the daemon's (docs/spec.md, "Order and determinism"): ``set_epoch(e)``
    is the loader's (the next ``for`` is epoch e), ``len()`` the samples of
    this loader's share per epoch; it cannot be iterated in the trainer."""

    __slots__ = ("_loader",)

    def __init__(self, loader):
        self._loader = weakref.ref(loader)  # no cycle: the loader frees at once

    def _get(self):
        dl = self._loader()
        if dl is None:
            raise ReferenceError("loaderd: the sampler's DataLoader is gone")
        return dl

    def set_epoch(self, epoch):
        self._get().set_epoch(epoch)

    def __len__(self):
        return self._get().samples_per_epoch

    def __iter__(self):
        raise TypeError("loaderd.DataLoader's sampler is the daemon's: its indices are not "
                        f"iterable in the trainer ({_NOT_YET})")


class BatchSampler(Sampler):
    """loader.batch_sampler: ``batch_size``, ``drop_last``, ``sampler`` and
    ``len()`` (batches per epoch of this loader's share) as torch's."""

    __slots__ = ()

    @property
    def batch_size(self):
        return self._get().batch_size

    @property
    def drop_last(self):
        return self._get().drop_last

    @property
    def sampler(self):
        return self._get().sampler

    def __len__(self):
        return len(self._get())


def _frozen(name):
    attr = "_" + name

    def get(self):
        return getattr(self, attr)

    def set_(self, value):
        if getattr(self, "_initialized", False):
            raise ValueError(f"{name} attribute should not be set after "
                             f"{self.__class__.__name__} is initialized")
        object.__setattr__(self, attr, value)
    return property(get, set_, doc=f"torch's DataLoader.{name} (read-only after __init__)")


# ----------------------------------------------------- state, torchdata's shape

# torchdata's StatefulDataLoader (num_workers=0) state keys: Lightning and the
# HF Trainer (accelerate) checkpoint the dict as it is, and accelerate adjusts
# _num_yielded, _sampler_iter_yielded and _iterator_finished in it, so those
# say where the epoch stands; loaderd's own keys ("pipeline", "epoch",
# "batch", "rank", "world_size", older loaderd's whole state) stay beside them.
_STATE_NONE = ("_index_sampler_state", "_sampler_iter_state", "_IterableDataset_len_called",
               "_shared_seed", "fetcher_state", "dataset_state")


def _state(epoch, num_yielded, own):
    """A state_dict() in torchdata's shape: @num_yielded batches of epoch
    @epoch yielded (its iterator not finished: a number of batches equal to
    the epoch's resumes at the next epoch), loaderd's keys @own added."""
    st = dict.fromkeys(_STATE_NONE)
    st.update({"_sampler_iter_yielded": int(num_yielded), "_num_yielded": int(num_yielded),
               "_iterator_finished": False})
    st.update(own)
    st.update({"epoch": int(epoch), "batch": int(num_yielded)})
    return st


def _share(n, world, drop_last):
    """Samples of a rank's share of @n positions over @world ranks."""
    return n // world if drop_last else -(-n // world)


def _batches(samples, batch_size, drop_last):
    return samples // batch_size if drop_last else -(-samples // batch_size)


def _state_int(state, key, default=None):
    v = state.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"load_state_dict: the state's {key!r} is {v!r}, not an integer >= 0")
    return v


def _state_position(state, batches_per_epoch=None):
    """(epoch, batch) of the next batch a state_dict() points at: its epoch
    from _num_yielded on (older loaderd's states: "batch"), or the next
    epoch's start when that epoch's iterator finished (or yielded all
    @batches_per_epoch)."""
    if not isinstance(state, dict) or "epoch" not in state or \
            ("_num_yielded" not in state and "batch" not in state):
        raise ValueError("load_state_dict: not a loaderd.DataLoader state (it has no 'epoch' "
                         "and '_num_yielded'): give what state_dict() returned")
    epoch = int(state["epoch"])
    n = max(0, int(state["_num_yielded"] if "_num_yielded" in state else state["batch"]))
    if state.get("_iterator_finished") or (batches_per_epoch and n >= batches_per_epoch):
        return epoch + 1, 0
    return epoch, n


# ------------------------------------------------------------------- client

def _set_store(client, name, if_changed=False, access_key_id=None, secret_access_key=None,
               session_token=None, expires=None):
    """ldr_set_store() on a _Client: True handed, False the same keys."""
    if (access_key_id is None) != (secret_access_key is None):
        raise ValueError("set_store: access_key_id and secret_access_key, both or neither")
    if hasattr(expires, "timestamp"):
        expires = expires.timestamp()
    opts = _lib.ldr_store_opts(
        if_changed=1 if if_changed else 0,
        access_key_id=access_key_id.encode() if access_key_id is not None else None,
        secret_access_key=secret_access_key.encode() if secret_access_key is not None else None,
        session_token=session_token.encode() if session_token else None,
        expires=int(expires or 0))
    client.check()
    r = _lib.lib().ldr_set_store(client.ptr, name.encode(), ctypes.byref(opts))
    if r < 0:
        raise _err(r, f"set_store {name!r}")
    return r == 1


# Codes of a store's refusal of a pipeline's keys (docs/storage.md): what
# the DataLoader hands fresh credentials for.
_KEYS_REFUSED = ("ExpiredToken", "InvalidToken", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                 "AccessDenied", "token has expired")


def _keys_refused(code, message):
    """A read that failed because the store refused the pipeline's keys."""
    return code in (-errno.EACCES, -errno.EIO) and any(w in (message or "") for w in _KEYS_REFUSED)


class Client:
    """An admin connection to the daemon: create, drop, list, status.

    ``socket``: the daemon's socket path; None resolves it as libloader does
    ($LOADERD_SOCKET, $RUNTIME_DIRECTORY, $XDG_RUNTIME_DIR, /run/loaderd)."""

    def __init__(self, socket=None, name=None, reconnect_timeout=None):
        self._c = _Client(socket, name, reconnect_timeout)

    @property
    def reconnects(self):
        """Times this connection followed a restarted daemon."""
        return self._c.reconnects()

    def _ptr(self):
        self._c.check()
        return self._c.ptr

    def create_pipeline(self, spec, exist_ok=False, owner=None):
        """Create a pipeline from a spec (dict or JSON text). Returns
        (name, created): created is False when exist_ok found it there.
        exist_ok joins only your own identical pipeline (or the daemon's);
        owner (a user name or uid, implies exist_ok) also joins that user's
        (docs/security.md, "Whose pipeline, whose daemon")."""
        text = spec if isinstance(spec, str) else json.dumps(spec)
        name = ctypes.create_string_buffer(_lib.LDR_NAME_MAX + 1)
        if owner is not None:
            uid = owner if isinstance(owner, int) else pwd.getpwnam(owner).pw_uid
            r = _lib.lib().ldr_create_pipeline_of(self._ptr(), text.encode(), uid,
                                                  name, ctypes.sizeof(name))
        else:
            r = _lib.lib().ldr_create_pipeline(self._ptr(), text.encode(), 1 if exist_ok else 0,
                                               name, ctypes.sizeof(name))
        if r < 0:
            raise _err(r, "create")
        return name.value.decode(), r == 1

    def set_store(self, name, if_changed=False, access_key_id=None, secret_access_key=None,
                  session_token=None, expires=None):
        """Hand pipeline ``name`` fresh object-store credentials without
        creating it again (docs/storage.md, "Fresh credentials"): this
        process's, read as a create reads them (AWS_* environment, the
        ~/.aws files), or the keys given. ``expires``: their expiry, Unix
        seconds or a datetime (with given keys). ``if_changed``: hand them
        only when they differ from the keys this client last sent for it.
        Only the pipeline's owner (or root) may. Returns True when handed."""
        return _set_store(self._c, name, if_changed, access_key_id, secret_access_key,
                          session_token, expires)

    def drop_pipeline(self, name, force=False):
        r = _lib.lib().ldr_drop_pipeline(self._ptr(), name.encode(), 1 if force else 0)
        if r < 0:
            raise _err(r, f"drop {name!r}")

    def _json(self, fn, what):
        out = ctypes.c_void_p()
        r = fn(self._ptr(), ctypes.byref(out))
        if r < 0:
            raise _err(r, what)
        try:
            return json.loads(ctypes.string_at(out.value).decode())
        finally:
            _lib.lib().ldr_free(out.value)

    def status(self):
        """The daemon's status (what `loaderctl --json status` prints)."""
        return self._json(_lib.lib().ldr_status_json, "status")

    def pipelines(self):
        """The list of pipelines (dicts, each with its canonical 'spec')."""
        return self._json(_lib.lib().ldr_pipelines_json, "pipelines")["pipelines"]

    def set(self, key, value, pipeline=None):
        """Change a setting of the running daemon now (admins only;
        docs/config.md): key "workers", "log_level", "memory_limit" or
        "prefetch" (of `pipeline`). Returns {"key", "old", "new", ...}."""
        lib = _lib.lib()
        return self._json(lambda ptr, out: lib.ldr_set(ptr, key.encode(),
                                                       pipeline.encode() if pipeline else None,
                                                       str(value).encode(), out), f"set {key}")

    def reload(self):
        """Have the daemon re-read its config file, as SIGHUP does (admins
        only); returns what it did (docs/config.md, "Reload")."""
        return self._json(_lib.lib().ldr_reload, "reload")

    def pipeline(self, name):
        for p in self.pipelines():
            if p["name"] == name:
                return p
        raise from_code(-errno.ENOENT, f"no pipeline named {name!r}", "pipeline")

    @property
    def id(self):
        return _lib.lib().ldr_client_id(self._ptr())

    def close(self):
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        raise TypeError("a loaderd.Client cannot be pickled: create it in the process that uses it")


# --------------------------------------------------------------- DataLoader

def _env_int(name):
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"loaderd: ${name}={v!r} is not an integer") from None


class DataLoader:
    """An iterable of batches served by loaderd, in place of
    torch.utils.data.DataLoader. See docs/python.md.

    Each ``for`` over the loader is one whole epoch from its first batch, as
    with torch: by default the loader reads a private stream (rank 0 of world
    1, or $RANK of $WORLD_SIZE under torchrun) and re-attaches at batch 0 of
    the wanted epoch when a loop was broken off or set_epoch() chose another
    epoch. mode="broadcast" and mode="dynamic" share one stream between
    loaders instead (docs/python.md, "Epochs and iteration").

    torch's attributes (dataset, batch_size, drop_last, sampler, ...) are
    there too (docs/python.md, "torch DataLoader arguments")."""

    batch_size = _frozen("batch_size")
    batch_sampler = _frozen("batch_sampler")
    sampler = _frozen("sampler")
    drop_last = _frozen("drop_last")
    dataset = _frozen("dataset")
    persistent_workers = _frozen("persistent_workers")

    def __new__(cls, pipeline_or_spec=None, *args, **kwargs):
        # num_workers=0 (torch's default) with your own Dataset: it runs in
        # this process, as torch's does; an IterableDataset with workers runs
        # in torch's own worker processes (loaderd._inprocess)
        if cls is DataLoader and _torch is not None and (
                _is_iterable_dataset(pipeline_or_spec) or
                (kwargs.get("num_workers", 0) == 0 and pydataset.is_dataset(pipeline_or_spec))):
            from ._inprocess import InProcessLoader
            cls = InProcessLoader
        return object.__new__(cls)

    def __class_getitem__(cls, item):
        # DataLoader[T], as torch's Generic[T_co] DataLoader
        return types.GenericAlias(cls, item)

    def __init__(self, pipeline_or_spec, batch_size=_UNSET, shuffle=None, seed=None,
                 drop_last=None, mode=None, rank=None, world_size=None, socket=None,
                 timeout=None, device="cpu", as_numpy=False, progress=False, epochs=None,
                 inflight=None, name=None, on_error=None, fields=None, pipeline_name=None,
                 reconnect_timeout=None, augment_seed=None, job=None, object_bytes=None,
                 **torch_compat):
        # your own Dataset (docs/python.md, "Your own Dataset"): a map-style
        # Dataset object, or a spec whose source.kind is "python"
        self._py = pydataset.is_dataset(pipeline_or_spec) or (
            isinstance(pipeline_or_spec, dict) and
            isinstance(pipeline_or_spec.get("source"), dict) and
            pipeline_or_spec["source"].get("kind") == "python")
        _torch_checks(pipeline_or_spec, batch_size, shuffle, drop_last, timeout, torch_compat)
        given = {k: torch_compat[k] for k in _TORCH_DEFAULTS if k in torch_compat}
        own = pydataset.is_dataset(pipeline_or_spec)  # a Dataset object: torch's defaults
        # batch_size=None: no automatic batching, each sample as it is
        # (torch's default_convert); your own Dataset only
        self._unbatched = batch_size is None
        if self._unbatched and not own:
            raise ValueError("batch_size=None (no automatic batching) is for your own Dataset "
                             "object; a pipeline's batches are built by the daemon: leave "
                             "batch_size out for its spec's batch_size, or give a number")
        if self._unbatched and torch_compat.get("collate_fn") is not None:
            raise TypeError(f"loaderd.DataLoader: collate_fn with batch_size=None is {_NOT_YET}: "
                            "call it on each sample in your loop instead")
        if own and batch_size is _UNSET:
            batch_size = 1  # torch's default
        py_args = {}
        if self._py:
            for k in ("num_workers", "collate_fn", "worker_init_fn", "seeding",
                      "multiprocessing_context"):
                py_args[k] = torch_compat.pop(k, None)
        elif fields is not None or pipeline_name is not None or object_bytes is not None:
            raise TypeError("loaderd.DataLoader: fields=, pipeline_name= and object_bytes= are "
                            "for your own Dataset (a Dataset object or a spec of source kind "
                            "\"python\")")
        # torch's sampler=, batch_sampler=, generator=: this loader's own order,
        # sent to the daemon epoch by epoch (_order.py)
        sampler = torch_compat.pop("sampler", None)
        batch_sampler = torch_compat.pop("batch_sampler", None)
        generator = torch_compat.pop("generator", None)
        self._corder = sampler is not None or batch_sampler is not None or generator is not None
        largest = None
        if self._corder:
            if _torch is None:
                raise TypeError("loaderd.DataLoader: sampler=, batch_sampler= and generator= "
                                "need torch, which this interpreter cannot import")
            if mode not in (None, "partition") or rank is not None or world_size is not None:
                raise ValueError("loaderd.DataLoader: with sampler=, batch_sampler= or generator= "
                                 "the sampler gives this loader's batches (a stream of its own): "
                                 "leave mode=, rank= and world_size= out (a DistributedSampler "
                                 "gives a rank its share)")
            if batch_sampler is not None:
                largest = _order.largest_batch(batch_sampler)  # the slots' rows
                if not isinstance(pipeline_or_spec, str):
                    batch_size = largest
        _torch_compat(torch_compat)
        for k, v in _TORCH_DEFAULTS.items():
            setattr(self, k, given.get(k, v))
        self.timeout = timeout if timeout is not None else 0
        if self.prefetch_factor is None and (not _TORCH2 or self.num_workers > 0):
            self.prefetch_factor = 2
        self.collate_fn = py_args.get("collate_fn")
        if self.collate_fn is None and own and _torch is not None:
            from torch.utils.data import _utils as _tu
            self.collate_fn = (_tu.collate.default_convert if self._unbatched
                               else _tu.collate.default_collate)
        self._scalars = set()    # unbatched: the fields that were Python numbers in dataset[0]
        self._host = None        # the workers' host this loader started (python source)
        self._py_create = None   # python source: what made its pipeline (_follow_len)
        self._structure = None   # python source: how a batch is rebuilt from its fields
        self._types = None       # python source: its namedtuple classes (pydataset.own_types)
        self._own_code = False   # python source: created here, from this trainer's Dataset
        self._obj = False        # python source: its rows have an object part (_objpart)
        self._pin = _pins(self.pin_memory, self.pin_memory_device)
        self._cuda = _cuda.parse_device(device)
        if not as_numpy and _torch is None:
            as_numpy = True  # no torch here: numpy arrays (CudaArray on a GPU)
        if self._cuda is not None and not as_numpy and not _torch.cuda.is_available():
            raise ValueError(f"loaderd.DataLoader: device={device!r} gives torch CUDA tensors, but "
                             "this torch has no CUDA (torch.cuda.is_available() is False); "
                             "as_numpy=True gives loaderd.CudaArray objects instead "
                             "(__cuda_array_interface__, DLPack)")
        self.as_numpy = bool(as_numpy)
        self.device = "cpu" if self._cuda is None else f"cuda:{self._cuda}"
        self.progress = progress
        self._timeout = timeout if timeout else None  # seconds, None: forever
        if inflight is not None and not 1 <= inflight <= _lib.LDR_INFLIGHT_MAX:
            raise ValueError(f"inflight must be in 1..{_lib.LDR_INFLIGHT_MAX}")
        self._inflight = inflight
        if augment_seed is not None and (isinstance(augment_seed, bool) or
                                         not isinstance(augment_seed, int) or
                                         not 0 <= augment_seed < 1 << 63):
            raise ValueError("augment_seed must be an integer in 0..2**63-1 (a spec seed), "
                             f"not {augment_seed!r}")
        self.augment_seed = augment_seed
        if job is not None and (not isinstance(job, str) or not job or len(job) > 128 or
                                not all(" " <= ch <= "~" for ch in job)):
            raise ValueError("job must be a name of 1..128 printable ASCII characters, "
                             f"not {job!r}")
        self.job = job

        # mode, rank, world: a private stream (partition rank 0 of 1) unless
        # torchrun's RANK/WORLD_SIZE or the arguments say otherwise; sharing
        # one stream between loaders (broadcast, dynamic) is asked for
        env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
        if self._corder:
            env_rank, env_world = 0, 1  # the sampler says what this rank reads
        if mode is None:
            mode = "partition"
        if mode not in _lib.MODES:
            raise ValueError(f"mode must be one of broadcast, partition, dynamic, not {mode!r}")
        if mode == "partition":
            rank = rank if rank is not None else (env_rank if env_rank is not None else 0)
            world_size = world_size if world_size is not None else \
                (env_world if env_world is not None else 1)
            if world_size < 1 or not 0 <= rank < world_size:
                raise ValueError(f"need 0 <= rank < world_size, got rank {rank} world_size {world_size}")
        elif rank is not None or world_size is not None:
            raise ValueError(f"rank/world_size are for mode='partition', not {mode!r}")
        else:
            rank, world_size = 0, 1
        if augment_seed is not None and mode == "dynamic":
            raise ValueError("augment_seed is for mode='broadcast' and 'partition': a dynamic "
                             "stream's batches go to whichever loader asks first")
        self.mode, self.rank, self.world_size = mode, int(rank), int(world_size)
        # broadcast and dynamic loops follow the shared stream; partition
        # loops are torch's epochs
        self._shared = mode != "partition"

        self._pid = os.getpid()
        self._closed = True
        self._att = None
        self._reconnects_final = 0
        if reconnect_timeout is not None:
            _reconnect_ms(reconnect_timeout)  # a bad value fails before connecting
        self._client = _Client(socket, name, reconnect_timeout)
        self._closed = False
        if self._unbatched:
            batch_size, drop_last = 1, False  # one sample a batch, its dimension taken off
        overrides = {k: v for k, v in (("batch_size", batch_size), ("shuffle", shuffle),
                                       ("seed", seed), ("drop_last", drop_last),
                                       ("epochs", epochs), ("on_error", on_error))
                     if v is not None and v is not _UNSET}
        if self._py:
            self._create_python(pipeline_or_spec, overrides, fields, py_args, pipeline_name,
                                object_bytes)
        elif isinstance(pipeline_or_spec, dict):
            spec = dict(pipeline_or_spec)
            spec.update(overrides)
            spec.setdefault("epochs", 0)  # endless: each `for` is one epoch
            self.spec = spec
            cl = Client.__new__(Client)
            cl._c = self._client
            self.pipeline, self.created = cl.create_pipeline(spec, exist_ok=True)
        elif isinstance(pipeline_or_spec, str):
            self.pipeline, self.created, self.spec = pipeline_or_spec, False, None
            if overrides:
                cl = Client.__new__(Client)
                cl._c = self._client
                have = cl.pipeline(pipeline_or_spec)["spec"]
                bad = [f"{k}={v!r} (the pipeline has {have.get(k)!r})"
                       for k, v in overrides.items() if have.get(k) != v]
                if bad:
                    raise InvalidSpec(-errno.EINVAL, f"pipeline {pipeline_or_spec!r} exists with "
                                      f"other settings: " + ", ".join(bad), "attach")
        else:
            raise TypeError("loaderd.DataLoader takes a pipeline name (str), a spec (dict) or a "
                            "map-style Dataset (with __getitem__ and __len__), not "
                            f"{type(pipeline_or_spec).__name__}")

        self._fields = None     # _field_meta() of the first batch
        self._pending = None    # shared stream: a batch of the next epoch, read ahead
        self._fast = None       # (attachment, loaderd._fast.Host): its batches in one C call
        self._fast_off = False  # no Host for this loader (no module, a device attachment)
        self._ended = False
        self._pos = None        # (epoch, batch) of the attachment's next batch
        self._want = (0, 0)     # private stream: where the next `for` starts
        self._loop = None       # private stream: (token, epoch) of the active `for`
        self._restored = None   # private stream: the position load_state_dict() set
        self._tail = None       # elastic resume: (epoch, position, skip, samples): that
                                # epoch is the tail from that position, its first skip
                                # batches empty (docs/spec.md, "Order and determinism")
        self._broken = None     # private stream: where the last `for`, broken off, stood
        self._kept_warned = False
        self._kept_prev = (0, 0)  # kept by attachments detached since
        self._order_at = None   # own order: where the attachment's next Order goes on
        self._seeded = False    # own order: torch's base seed drawn (persistent_workers)
        cl = Client.__new__(Client)
        cl._c = self._client
        info = cl.pipeline(self.pipeline)
        src = (info.get("spec") or {}).get("source") or {}
        if not self._py and src.get("kind") == "python":
            # attached by name: rebuild as its creator does (the daemon keeps
            # the structure), and wait for its workers as well
            # (another user may have written it: nothing it names is imported)
            self._py = True
            try:
                self._structure, self._pads, self._types = pydataset.reader_structure(src)
            except pydataset.SampleError as e:
                raise InvalidSpec(-errno.EINVAL, f"pipeline {self.pipeline!r}: {e}",
                                  "attach") from None
            self._obj = pydataset.object_bytes_of(src["fields"]) is not None
            self._check_obj_device(self.pipeline)
        self.slots_total = int(info.get("slots_total", 0))
        self.dataset = _Dataset(self.pipeline, int(info.get("samples", 0)))
        self._nsamples = int(info.get("samples", 0))  # the source's: the positions of an epoch
        if self._py and own:
            self.dataset = pipeline_or_spec  # as torch's loader.dataset
        self._attach(None if self._shared else (0, 0))
        if self._corder:
            self._order_setup(sampler, batch_sampler, generator, shuffle, drop_last, largest)
        else:
            self.batch_size = None if self._unbatched else int(self._att.batch_size)
            self.drop_last = bool((info.get("spec") or {}).get("drop_last", False))
            self.sampler = Sampler(self)
            self.batch_sampler = None if self._unbatched else BatchSampler(self)
        self._initialized = True
        if _Lease._release_fn is None:
            _Lease._release_after_fn = _lib.lib().ldr_release_after
            _Lease._release_fn = _lib.lib().ldr_release

    # ---------------------------------------------------------- own order

    def _order_setup(self, sampler, batch_sampler, generator, shuffle, drop_last, largest):
        """torch's samplers for sampler=, batch_sampler=, generator= (the
        user's objects are loader.sampler and loader.batch_sampler)."""
        cap = 1 if self._unbatched else int(self._att.batch_size)
        if largest is not None and largest > cap:
            raise ValueError(f"loaderd.DataLoader: the batch_sampler's largest batch has {largest} "
                             f"samples, and pipeline {self.pipeline!r} holds {cap} a batch (its "
                             "batch_size): create it with batch_size at least that")
        bsz = None if self._unbatched or batch_sampler is not None else cap
        self.sampler, self.batch_sampler, self._index_sampler = _order.samplers(
            self.dataset, sampler, batch_sampler, generator, shuffle, bsz, drop_last)
        self._order_cap = cap
        self.batch_size = bsz
        self.drop_last = bool(drop_last) if batch_sampler is None else False

    def _order_iter(self):
        """iter() of a loader with its own order: what torch's iterator does
        at its start (iter(batch_sampler), the base seed from the generator,
        its workers' prefetch), then the epoch (_order.py)."""
        epoch, start = self._want
        it = iter(self._index_sampler)
        if not (self._seeded and self.persistent_workers and self.num_workers > 0):
            _torch.empty((), dtype=_torch.int64).random_(generator=self.generator)
            self._seeded = True
        at = self._order_at
        if at is None or not ((epoch, start) == at or (epoch > at[0] and start == 0)):
            self._attach((epoch, start))  # a loop broken off, a resume
        for _ in itertools.islice(it, start):
            pass  # load_state_dict: the batches before the restored one
        ahead = self.prefetch_factor * self.num_workers if self.num_workers > 0 else 0
        feed = _order.Feed(self._att, it, epoch, start, self._order_cap, self._unbatched, ahead,
                           _order._draws_once(self._index_sampler))
        token = object()
        self._loop = (token, epoch)
        self._want = (epoch + 1, 0)  # the next `for`, whether this one ends or breaks
        self._order_at = None        # mid-epoch until it ends
        feed.start()
        return self._order_epoch(feed, epoch, token)

    def _order_epoch(self, feed, epoch, token):
        k = 0
        self._broken = None
        done = False
        try:
            while True:
                if self._loop is None or self._loop[0] is not token:
                    done = True
                    return  # load_state_dict or another `for` took over
                if feed.beyond(k):
                    break
                b = self._next_raw()
                if b is None:
                    done = True
                    return
                self._pos = (epoch, feed.first + k + 1)
                feed.handed(k)
                k += 1
                # the frame keeps no reference while the trainer has the batch
                box, b = [b], None
                yield self._out_safe(box.pop())
            done = True
            self._order_at = self._pos = (epoch + 1, 0)
        finally:
            self._loop_ended(token, epoch, done)

    # ------------------------------------------------------ python source

    def _check_obj_device(self, pipeline):
        if self._obj and self._cuda is not None:
            raise ValueError(f"loaderd.DataLoader: pipeline {pipeline!r} has batches with parts "
                             "that are not fixed-shape arrays (strings, objects, tensors of "
                             "varying shapes, a collate_fn's output), which "
                             f"device={self.device!r} cannot deliver (not supported yet, issue "
                             "26): use device='cpu' and move the tensors yourself "
                             "(.to(device, non_blocking=True))")

    def _create_python(self, ds, overrides, fields, py_args, pipeline_name, object_bytes):
        """Create the python pipeline of @ds (exist_ok) and, when this loader
        created it, have its workers' host serve it. The host starts first
        (forked from here or exec'd: _pystart) and its worker 0 learns the
        fields; this process never runs __getitem__."""
        self._py_create = (ds, overrides, fields, py_args, pipeline_name,
                           object_bytes)  # _follow_len
        method = _pystart.start_method(py_args.get("multiprocessing_context"),
                                       py_args.get("num_workers"))
        spec, payload = pydataset.plan_spec(
            ds, overrides=overrides, num_workers=py_args.get("num_workers"),
            collate_fn=py_args.get("collate_fn"), worker_init_fn=py_args.get("worker_init_fn"),
            fields=fields, name=pipeline_name, forked=method == "fork",
            seeding=py_args.get("seeding"), object_bytes=object_bytes)
        host = None
        try:
            learnt = None
            if payload["learn"]["samples"] or payload["learn"]["fields"]:
                host = _pystart.start(payload, method)
                learnt = host.learn(self._timeout)
            spec, payload = pydataset.finish_spec(spec, payload, learnt, self._scalars)
            spec.setdefault("epochs", 0)  # endless: each `for` is one epoch
            self.spec = spec
            src = spec["source"]
            self._structure = src["structure"]
            self._pads = {f["name"] for f in src["fields"]
                          if f["pad"] and f["name"] != _objpart.OBJ}
            self._obj = pydataset.object_bytes_of(src["fields"]) is not None
            self._check_obj_device(spec["name"])  # before anything is created
            pydataset.adopt_types(self._structure)
            self._types = pydataset.own_types(self._structure)
            self._own_code = True    # its workers run this trainer's code (dataset_error)
            cl = Client.__new__(Client)
            cl._c = self._client
            self.pipeline, self.created = cl.create_pipeline(spec, exist_ok=True)
            if not self.created:
                return  # another trainer's host serves it (ours, if started, exits)
            buf = ctypes.create_string_buffer(4096)
            sarg = self._client.socket_arg
            r = _lib.lib().ldr_socket_path(buf, ctypes.sizeof(buf),
                                           sarg.encode() if sarg else None)
            if r < 0:
                raise _err(r, "socket path")
            if host is None:
                host = _pystart.start(payload, method)
            # the daemon libloader checked (docs/security.md): the host and its
            # workers talk to <socket>.workers only when it is that uid's
            payload["pipeline"] = self.pipeline
            host.go(payload, os.path.abspath(buf.value.decode()),
                    int(_lib.lib().ldr_client_daemon_uid(self._client.ptr)))
            self._host, host = host, None
        finally:
            if host is not None:
                host.close()

    def _follow_len(self):
        """len() read per epoch, as torch's sampler reads it: when the
        trainer's own Dataset object has another len() than its pipeline's
        samples, its pipeline from now on is a new one of that many samples
        (the same settings; another name: the length is part of the spec),
        attached at the epoch the next `for` iterates. Not inside a `for`
        (its epoch goes on as it began), nor for a resume in mid-epoch."""
        if self._py_create is None or self._closed or (not self._shared and self._loop):
            return
        if (self._pos or (0, 0))[1] if self._shared else self._want[1]:
            return  # in mid-epoch
        if self._tail is not None and self._tail[0] == (self._want[0] if not self._shared else
                                                         (self._pos or (0, 0))[0]):
            return  # an elastic resume's tail: its positions are this length's
        ds, overrides, fields, py_args, pipeline_name, object_bytes = self._py_create
        if not pydataset.is_dataset(ds) or len(ds) == self.spec["source"]["samples"]:
            return
        if pipeline_name is not None:
            raise ValueError(f"loaderd: len(dataset) is {len(ds)} now, pipeline "
                             f"{pipeline_name!r} (pipeline_name=) has "
                             f"{self.spec['source']['samples']} samples: a pipeline's length "
                             "is fixed; leave pipeline_name= out to follow len() per epoch "
                             "(a new pipeline of the new length)")
        host, self._host = self._host, None
        if host is not None:
            host.close()  # it serves the old pipeline on, as long as that lives
        self._create_python(ds, overrides, fields, py_args, pipeline_name, object_bytes)
        self._fields = None
        self._attach(None if self._shared else self._want)

    def _out_safe(self, b):
        """_out(), an exception of it (torch's default_collate of a batch's
        objects: TypeError for None, RuntimeError for tensors of different
        shapes) the batch's error in its place: the iterator goes on after
        it, as torch's does."""
        try:
            return self._out(b)
        except Exception as e:
            return _Failed(None, None, e)

    def _out(self, b):
        """The batch as the trainer gets it: a python pipeline's structure
        rebuilt (as torch's default_collate), else the Batch."""
        if b is None or self._structure is None or b.__class__ is _Failed:
            return b
        objects = self._objects(b) if self._obj else None
        if self._unbatched:
            # torch's default_convert of one sample: its batch dimension off,
            # Python numbers as numbers
            s = self._scalars
            b = {k: (v[0].item() if k in s else v[0]) for k, v in b.items()}
        out = pydataset.rebuild(self._structure, b, self._pads, self._types, objects)
        if objects is not None and self._pin:
            out = _pin_objects(out)
        return out

    def _objects(self, b):
        """The object part of batch @b (taken out of it), unpickled: a
        pydataset.Objects, or None when no row has one. Its tensors and
        arrays are views of the slot, keeping the batch's lease."""
        data, lens = b.pop(_objpart.OBJ), b.pop(_objpart.OBJ_LEN)
        if not isinstance(lens, np.ndarray):
            data, lens = data.numpy(), lens.numpy()
        if not lens.any():
            return None
        owner = self._att.owner
        trusted = owner is not None and owner == os.geteuid()
        collated = "collated" in self._structure
        try:
            if collated:
                rows = [_objpart.unpack(data.reshape(-1)[:int(lens[0])], trusted)]
            else:
                rows = [_objpart.unpack(data[r, :n], trusted) if n else {}
                        for r, n in enumerate(lens.tolist())]
        except _objpart.Refused as e:
            raise Error(-errno.EPERM, f"a batch of pipeline {self.pipeline!r} holds a {e} "
                        f"object: the pipeline is another user's (uid {owner}), whose classes "
                        "are never imported here (their pickles could run that user's code "
                        "in this process); only str, bytes, numbers, None, lists, tuples, "
                        "dicts, sets, tensors and numpy arrays are rebuilt (docs/security.md, "
                        "\"Python pipelines: nobody else's code\")", "next") from None
        except Exception as e:
            raise Error(-errno.EINVAL, f"a batch of pipeline {self.pipeline!r}: its part "
                        "that travels pickled (strings, objects, tensors of varying shapes) "
                        f"could not be unpickled here ({type(e).__name__}: {e}): the classes "
                        "in a batch must be importable in the trainer", "next") from e
        if self.as_numpy or _torch is None:
            collate = _np_collate
        elif self._unbatched:
            collate = _convert_one
        else:
            collate = _torch.utils.data._utils.collate.default_collate
        return pydataset.Objects(rows, collated, collate, self._scalars, self._unbatched)

    def _attach_python(self, start):
        """Attach, waiting while the pipeline's Python workers start (the
        daemon refuses with EAGAIN until they are ready)."""
        limit = self._timeout or 120.0
        deadline = time.monotonic() + limit
        while True:
            try:
                return self._attach_once(start)
            except Error as e:
                if e.code != -errno.EAGAIN:
                    raise
                why = self._host.failure() if self._host is not None else None
                if why is not None:
                    raise Error(-errno.ECHILD, f"the Python workers' host of pipeline "
                                f"{self.pipeline!r} {why}, before its workers started",
                                "attach") from None
                if time.monotonic() >= deadline:
                    raise from_code(-errno.ETIMEDOUT, f"pipeline {self.pipeline!r}: its Python "
                                    f"workers did not start within {limit:g} s ({e.message})",
                                    "attach") from None
                host = self._host
                if host is not None and not host.ready and not host.eof:
                    host.pump(0.1)  # back at once when the host says its slab is mapped
                else:
                    time.sleep(0.05)

    # --------------------------------------------------------- attachment

    def _attach(self, start):
        if self._py:
            return self._attach_python(start)
        return self._attach_once(start)

    def _attach_once(self, start):
        # detach the old attachment now: batches of it still alive stay valid
        # (kept by libloader, or frozen here), but no longer hold their slots
        old, self._att = self._att, None
        self._pending = None
        self._fast = None  # the old attachment's C path goes with it
        if old is not None:
            n, nbytes = old.kept()  # the loader's count goes on across attachments
            self._kept_prev = (self._kept_prev[0] + n, self._kept_prev[1] + nbytes)
            old.warn_device_batches()
            old.detach()  # libloader keeps the host batches still alive
        mode = self.mode
        if start is not None:
            start = (start[0], max(start[1], self._skip(start[0])))
        if start is not None and mode == "broadcast":
            mode = "partition"  # resume: a private stream, identical content (rank 0 of 1)
        tail = self._tail
        self._att = _Attachment(self._client, self.pipeline, mode, self.rank, self.world_size,
                                start + (tail[1],) if tail and start and start[0] == tail[0]
                                else start, self._inflight, self._cuda, self.augment_seed, self.job,
                                self._corder)
        if self._corder:
            self._order_at = tuple(start) if start is not None else (0, 0)
        self._attached_mode = mode
        self._ended = False
        self._pos = tuple(start) if start is not None else None

    def _check(self):
        if self._pid != _self_pid[0]:
            raise _forked(self._pid, "loaderd.DataLoader")
        if self._closed:
            raise Error(-errno.EBADF, "the loader is closed", "")

    # ------------------------------------------------------------ properties

    @property
    def reconnects(self):
        """Times this loader's connection followed a restarted daemon
        (docs/reliability.md, "Restart without killing training")."""
        c = self._client
        return c.reconnects() if c is not None else self._reconnects_final

    def __len__(self):
        """Batches per epoch of this loader's share (per rank in partition;
        in dynamic mode an upper bound). With a sampler: torch's, the
        batch sampler's len()."""
        if self._corder:
            return len(self._index_sampler)
        self._follow_len()
        return int(self._att.batches_per_epoch) - self._skip(self.epoch) if self._att else 0

    @property
    def samples_per_epoch(self):
        """Samples of this loader's share of the epoch it is at (an elastic
        resume's epoch: its tail's)."""
        self._follow_len()
        tail = self._tail
        if tail is not None and tail[0] == self.epoch:
            return tail[3]
        return int(self._att.samples_per_epoch)

    def _skip(self, epoch):
        """Batches of @epoch this rank does not read: an elastic resume's
        tail is the last batches of its epoch (docs/spec.md)."""
        tail = self._tail
        return tail[2] if tail is not None and tail[0] == epoch else 0

    @property
    def epochs(self):
        """Epochs the pipeline serves (0: endless)."""
        return int(self._att.epochs)

    @property
    def slab(self):
        """(base address, size) of the shared memory batches live in."""
        return self._att.slab

    @property
    def writable(self):
        """True when batches may be modified in place (a copy-on-write
        mapping: the changes stay in this process)."""
        return bool(self._att.writable) if self._att else False

    @property
    def epoch(self):
        """Private stream: the epoch the running `for` iterates, else the one
        the next `for` will. Shared stream: the epoch of its next batch (None
        before the first)."""
        if self._shared:
            return self._pos[0] if self._pos else None
        if self._loop is not None:
            return self._loop[1]
        return self._want[0]

    @property
    def exhausted(self):
        """True once a finite pipeline has nothing more for the next `for`."""
        if self._shared:
            return self._ended and self._pending is None
        e = self._pos[0] if self._loop is not None and self._pos else self._want[0]
        return bool(self.epochs) and e >= self.epochs

    # ------------------------------------------------------------- batches

    def refresh_credentials(self):
        """Hand the pipeline this process's object-store credentials when
        they differ from those this loader last sent (its create, an
        earlier refresh): what the loader does by itself when a read fails
        because the store refused its keys (docs/storage.md). True when
        handed; False when the same, or when they cannot be handed (another
        user's pipeline, none from a store)."""
        try:
            return _set_store(self._client, self.pipeline, if_changed=True)
        except Error:
            return False

    def _next_raw(self):
        """The next batch of the stream, or None at its end."""
        att = self._att
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        refreshed = False
        while True:
            # the trainer at its share: keep the oldest batches it holds (the
            # fields still alive) so that the stream goes on
            att.keep_for_share()
            if deadline is None:
                wait = _POLL_MS
            else:
                wait = int(max(0.0, min(_POLL_MS / 1000, deadline - time.monotonic())) * 1000)
            # one call: the batch, its fields and the keeping counters
            host = self._fast
            if host is not None and host[0] is att and att.ptr is not None:
                r = host[1].next(wait)
                if r.__class__ is not int:
                    att.described = True
                    return r
                att.described = r != _lib.LDR_EFORKED
            else:
                r = att.next(wait)
            if r == 0:
                break
            if r == _lib.LDR_EOF:
                self._ended = True
                return None
            if r == _lib.LDR_EBATCH:
                # this position's batch failed (on_error "raise"): its error
                # in its place, raised by the iterator; the stream goes on
                code, epoch, index = att.failed()
                msg = _lib.lib().ldr_client_error(None)
                msg = msg.decode("utf-8", "replace") if msg else ""
                if _keys_refused(code, msg):
                    # later reads use fresh keys; this position's failure
                    # is not skipped silently (docs/storage.md)
                    self.refresh_credentials()
                # a dead worker is a RuntimeError (WorkerError), as torch's;
                # else the code is the worker's word, no cause of ours
                e = (from_code if code == -errno.ECHILD else Error)(code, msg, "next")
                return _Failed(epoch, index, dataset_error(e) if self._own_code else e)
            if r == -errno.ETIMEDOUT and (deadline is None or time.monotonic() < deadline):
                continue
            if r == -errno.ETIMEDOUT:
                # torch's words (its timeout is a RuntimeError; Timeout is one)
                raise from_code(r, f"DataLoader timed out after {self.timeout} seconds: no "
                                f"batch from pipeline {self.pipeline!r}", "next")
            if r == -errno.ENOBUFS and att.device is not None:
                raise Error(r, f"this process holds {att.held()} batches of pipeline "
                            f"{self.pipeline!r} in GPU memory, its whole share of the slots: "
                            "device batches cannot be kept (copied out) as host batches are; "
                            "clone() the tensors you store, or raise the spec's 'prefetch'",
                            "next")
            e = _err(r, "next")
            if not refreshed and _keys_refused(e.code, e.message) and self.refresh_credentials():
                # the store refused the keys and this process has others
                # now: handed, and that read tried once more
                refreshed = True
                continue
            # the Dataset's own exception type only for this trainer's own
            # Dataset: an error text of another user's pipeline picks no class
            raise (dataset_error(e) if self._own_code else e)
        lease = _Lease(att.out.value, att)
        info = att.info
        b = Batch()
        b._lease = lease
        b.epoch = info.epoch
        b.index = info.index
        rows = b.rows = info.rows
        fs = att.fields
        fields = self._fields
        if fields is None:
            fields = self._fields = self._field_meta(fs, att.nfields)
        as_numpy = self.as_numpy
        if att.device is not None:
            for (name, typestr, dtname, _conv, _shapes), f in zip(fields, fs):
                arr = _cuda.CudaArray(f.data or 0, f.shape[:f.ndim], typestr, att.device, lease,
                                      f.nbytes, dtname)
                b[name] = arr if as_numpy else _cuda.to_torch(arr, _torch)
            return b
        mems = []
        for (name, typestr, dtname, conv, shapes), f in zip(fields, fs):
            shape = shapes.get(rows)
            if shape is None:
                shape = shapes[rows] = (rows,) + tuple(f.shape[1:f.ndim])
            m = _Mem()
            m.lease = lease
            m.__array_interface__ = {"version": 3, "typestr": typestr, "shape": shape,
                                     "data": (f.data or 0, False)}  # writable: copy-on-write
            mems.append(weakref.ref(m))
            arr = np.asarray(m)
            b[name] = arr if as_numpy else conv(arr)
        lease.mems = tuple(mems)
        if self._fast is None or self._fast[0] is not att:
            # the next batches of this attachment in one C call (pyfast.c)
            self._fast = (att, att.fast_host(fields, Batch)) if not self._fast_off else None
            if self._fast is not None and self._fast[1] is None:
                self._fast_off = True
                self._fast = None
        return b

    def _field_meta(self, fs, nfields):
        """Per field, from the first batch: (name, typestr, dtype name, the
        array -> tensor conversion, {rows: shape}): what every batch reuses."""
        out = []
        for f in fs[:nfields]:
            dtname, typestr = _lib.DTYPES[f.dtype]
            conv = None
            if _torch is not None and not self.as_numpy:
                if _TORCH_DIRECT is None:
                    _probe_torch()
                conv = (_torch.from_numpy if dtname in _TORCH_DIRECT and dtname != "bfloat16"
                        else (lambda arr, dtname=dtname: _to_torch(arr, dtname)))
            out.append((f.name.decode(), typestr, dtname, conv, {}))
        return out

    def _advance(self, b):
        """The position after @b; True when @b ends its epoch."""
        nxt = b.index + 1
        last = nxt >= self._att.batches_per_epoch
        self._pos = (b.epoch + 1, self._skip(b.epoch + 1)) if last else (b.epoch, nxt)
        return last

    def _private_epoch(self):
        """One `for` over a private stream: epoch self._want[0] from batch
        self._want[1] (0 unless load_state_dict said otherwise)."""
        self._check()
        epoch, start = self._want
        if self.epochs and epoch >= self.epochs:
            return  # a finite pipeline after its last epoch: nothing
        if self._pos != (epoch, start):
            self._attach((epoch, start))  # a loop broken off, set_epoch, resume
        token = object()
        self._loop = (token, epoch)
        self._restored = None
        self._broken = None
        self._want = (epoch + 1, self._skip(epoch + 1))  # the next `for`, ended or broken
        done = False
        try:
            while self._loop is not None and self._loop[0] is token:
                if self._pos[0] != epoch:
                    done = True
                    return  # next_batch() took the rest of this epoch
                b = self._next_raw()
                if b is None:
                    done = True
                    return
                last = self._advance(b)
                # the frame keeps no reference while the trainer has the
                # batch: a `del` in the loop body gives its slot back at once
                box, b = [b], None
                yield self._out_safe(box.pop())
                if last:
                    done = True
                    return
        finally:
            self._loop_ended(token, epoch, done)

    def _loop_ended(self, token, epoch, done):
        """The end of the private `for` @token over @epoch (@done: it read
        the epoch out; else it was broken off, and state_dict() says the rest
        of it, as torchdata's does)."""
        if self._loop is not None and self._loop[0] is token:
            self._loop = None
            if not done and self._pos is not None and self._pos[0] == epoch:
                self._broken = self._pos
        # warn, _warn_kept, _loop_ended, the generator, _EpochIter, the trainer
        self._warn_kept(5)

    def _shared_epoch(self):
        """One `for` over a shared stream (broadcast, dynamic): from the next
        batch of the stream to the end of its epoch."""
        self._check()
        epoch = None
        try:
            while True:
                if self._pending is not None:
                    b, self._pending = self._pending, None
                else:
                    if self._ended:
                        return
                    b = self._next_raw()
                    if b is None:
                        return
                if epoch is None:
                    epoch = b.epoch
                elif b.epoch != epoch:
                    self._pending = b  # first batch of the next epoch: keep it for the next loop
                    return
                last = self._advance(b)
                # the frame keeps no reference while the trainer has the
                # batch: a `del` in the loop body gives its slot back at once
                box, b = [b], None
                yield self._out_safe(box.pop())
                if last:
                    return
        finally:
            self._warn_kept(4)  # warn, _warn_kept, this generator, _EpochIter, the trainer

    def __iter__(self):
        """One epoch. Private stream (the default): the whole epoch the
        loader is at (the next after the last `for`, or set_epoch's), from its
        first batch. Shared stream: from the stream's next batch to the end of
        its epoch."""
        self._check()
        if not self._corder:
            self._follow_len()
        if self._corder:
            e, start = self._want
            it = self._order_iter()
        elif self._shared:
            it = self._shared_epoch()
            start = self._pos[1] if self._pos is not None else 0
            e = self.epoch
        else:
            it = self._private_epoch()
            e, start = self._want
        if self.progress:
            from ._progress import progress
            total = max(0, len(self) - (start - self._skip(e)))
            it = progress(it, total, self.pipeline + (f" epoch {e}" if e is not None else ""))
        return _EpochIter(it)

    def next_batch(self):
        """The next batch of the stream regardless of epochs, or None at its
        end. Private stream: outside a `for` it starts where the next `for`
        would (set_epoch, load_state_dict), and a `for` after it goes on from
        there to the end of that epoch."""
        self._check()
        if self._corder:
            raise TypeError("loaderd.DataLoader: next_batch() reads the daemon's order; a loader "
                            "with sampler=, batch_sampler= or generator= reads its sampler's: "
                            "iterate it (next(iter(loader)))")
        if self._loop is None:
            self._follow_len()
        if self._shared:
            if self._pending is not None:
                b, self._pending = self._pending, None
            else:
                b = None if self._ended else self._next_raw()
            if b is not None:
                self._advance(b)
        else:
            outside = self._loop is None
            self._broken = None
            if outside and self._pos != self._want:
                if self.epochs and self._want[0] >= self.epochs:
                    return None
                self._attach(self._want)
            b = None if self._ended else self._next_raw()
            if b is not None:
                self._advance(b)
            if outside:
                self._want = self._pos
        self._warn_kept(3)  # at the trainer's line: warn, _warn_kept, next_batch, its caller
        if b.__class__ is _Failed:
            raise b.exc
        return self._out(b)

    def _warn_kept(self, stacklevel):
        """Once per loader: batches copied out of their slots because the
        trainer held more than the attachment's share."""
        att = self._att
        if self._kept_warned or att is None or att.ptr is None:
            return
        if att.described and not att.info.kept_batches and not self._kept_prev[0]:
            return  # nothing kept as of the last ldr_next (nor by an older attachment)
        n, nbytes = att.kept()
        n, nbytes = n + self._kept_prev[0], nbytes + self._kept_prev[1]
        if not n:
            return
        self._kept_warned = True
        share = att.share()
        warnings.warn(
            f"loaderd: this process kept more batches of pipeline {self.pipeline!r} than its "
            f"share of the slots ({share}): it copied {n} batch{'es' if n != 1 else ''} "
            f"({_size(nbytes)}) out of shared memory so that the stream could go on (only the "
            "fields still used). To "
            "avoid the copies, raise the spec's 'prefetch', or store copies of just what you "
            "keep (t.clone(), np.array(a)). This is said once per loader.",
            RuntimeWarning, stacklevel=stacklevel)

    # --------------------------------------------------- epochs and resume

    def set_epoch(self, epoch):
        """Private stream: the next `for` iterates epoch @epoch from its first
        batch (re-attaching there if the stream is elsewhere; nothing to do
        when the last loop ended just before it), or, when load_state_dict()
        restored a position in epoch @epoch, from that position. Broadcast and
        dynamic: the shared stream decides the epoch, a different one only
        warns."""
        self._check()
        epoch = int(epoch)
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
        if not self._shared:
            if self._restored is not None and self._restored == self._want and \
                    self._restored[0] == epoch:
                return  # the loop head of the restored epoch: keep its position
            self._broken = None
            self._want = (epoch, self._skip(epoch))
            self._restored = None
            return
        if self._pos is not None and self._pos[0] != epoch:
            warnings.warn(f"loaderd: set_epoch({epoch}) has no effect in {self.mode} mode: the "
                          f"shared stream is at epoch {self._pos[0]}", UserWarning, stacklevel=2)

    def state_dict(self):
        """The position of the next batch this loader will yield, in
        torchdata's StatefulDataLoader shape (docs/python.md, "Exact
        resume"): inside a `for`, the rest of that loop; after a `for`
        broken off (and no set_epoch() since), the rest of that loop too, as
        torchdata's StatefulDataLoader has it; else the start of the next
        `for`."""
        self._check()
        if self.mode == "dynamic":
            raise Error(-errno.EINVAL, "dynamic mode has no fixed assignment of batches: "
                        "it cannot be resumed exactly (use partition or broadcast)", "state_dict")
        if self._shared:
            epoch, batch = self._pos if self._pos is not None else (0, 0)
        elif self._loop is not None:
            epoch, batch = self._pos
            if epoch != self._loop[1]:  # the loop's last batch is in hand
                epoch, batch = self._loop[1], self._grid_len()
        elif self._broken is not None:
            # a `for` broken off (a preempted job checkpoints after it): the
            # rest of that loop, as torchdata's StatefulDataLoader says it
            epoch, batch = self._broken
        else:
            epoch, batch = self._want
        if self._corder:  # its sampler's batches: no global position
            return _state(epoch, batch, {"pipeline": self.pipeline, "rank": self.rank,
                                         "world_size": self.world_size})
        return self._state_of(epoch, batch)

    def _grid_len(self):
        """Batches of an epoch in the daemon's numbering (an elastic resume's
        tail counts from its first batch: len() is then less)."""
        return len(self) if self._corder else int(self._att.batches_per_epoch)

    def _state_of(self, epoch, batch):
        """The state of batch @batch of @epoch (the daemon's numbering: an
        elastic resume's tail counts from its first batch, as len() does),
        with the global position of the epoch's permutation it stands at."""
        tail = self._tail if self._tail is not None and self._tail[0] == epoch else None
        skip, start = (tail[2], tail[1]) if tail else (0, 0)
        num = max(0, batch - skip)
        bsz = int(self._att.batch_size)
        n = self._nsamples
        done = num >= int(self._att.batches_per_epoch) - skip
        position = n if done else min(n, start + num * bsz * self.world_size)
        return _state(epoch, num, {"pipeline": self.pipeline, "rank": self.rank,
                                   "world_size": self.world_size, "batch_size": bsz,
                                   "samples": n, "tail_start": start, "position": position})

    def load_state_dict(self, state):
        """Resume exactly where @state (from state_dict(); loaderd's older
        {"pipeline", "epoch", "batch", "rank", "world_size"} too) stood: the
        next `for` (or next_batch()) yields the batches from that position
        on, set_epoch() of its epoch keeping it. A state of this world size
        (any rank: ranks in lockstep stand at one global position)
        re-attaches this rank's share there; one of another world size (or
        from an elastic resume's tail) re-attaches the rest of that epoch
        from its global position, this world's partition of it, then the
        plain share (docs/python.md, "Exact resume")."""
        self._check()
        if self.mode == "dynamic":
            raise Error(-errno.EINVAL, "dynamic mode cannot resume (see state_dict)", "load_state_dict")
        for k in ("pipeline", "epoch", "rank", "world_size"):
            if not isinstance(state, dict) or k not in state:
                raise ValueError(f"load_state_dict: the state has no {k!r}")
        if state["pipeline"] != self.pipeline:
            raise ValueError(f"load_state_dict: the state is of pipeline {state['pipeline']!r}, "
                             f"this loader reads {self.pipeline!r}")
        bsz = int(self._att.batch_size)
        world = _state_int(state, "world_size")
        same = world == self.world_size and _state_int(state, "tail_start", 0) == 0 and \
            _state_int(state, "batch_size", bsz) == bsz
        if self._corder and (state["rank"], world) != (self.rank, self.world_size):
            raise ValueError(f"load_state_dict: the state is of rank {state['rank']}/{world}, "
                             f"this loader is {self.rank}/{self.world_size}: a loader with its own "
                             "sampler resumes its own rank's state")
        if same or self._corder:
            tail, pos = None, _state_position(state, len(self) if self._corder else
                                              int(self._att.batches_per_epoch))
        else:
            tail, pos = self._elastic(state, world)
        self._loop = None  # a `for` still running ends here
        self._broken = None
        self._tail = tail
        self._want = self._restored = pos
        self._attach(pos)

    def _elastic(self, state, world):
        """(tail, position) of a state of @world ranks (or of a tail): the
        global position its ranks stood at, and this rank's part of the rest
        of that epoch (docs/spec.md, "Order and determinism")."""
        n = self._nsamples
        if _state_int(state, "samples", n) != n:
            raise ValueError(f"load_state_dict: the state is of an epoch of {state['samples']} "
                             f"samples, pipeline {self.pipeline!r} has {n}: its positions are "
                             "another order's")
        if world < 1 or not 0 <= _state_int(state, "rank") < world:
            raise ValueError(f"load_state_dict: the state's rank {state['rank']} of world_size "
                             f"{world} is no rank")
        bsz = int(self._att.batch_size)
        drop = self.drop_last
        epoch = _state_int(state, "epoch")
        start = _state_int(state, "tail_start", 0)
        sbsz = _state_int(state, "batch_size", bsz)
        num = _state_int(state, "_num_yielded" if "_num_yielded" in state else "batch")
        if start > n or sbsz < 1:
            raise ValueError(f"load_state_dict: the state's tail_start {start} (batch_size "
                             f"{sbsz}) is outside an epoch of {n} samples")
        if state.get("_iterator_finished") or num >= _batches(_share(n - start, world, drop),
                                                              sbsz, drop):
            return None, (epoch + 1, 0)
        position = start + num * sbsz * world  # < n: the share's last batch not reached
        samples = _share(n - position, self.world_size, drop)
        batches = _batches(samples, bsz, drop)
        if batches == 0:
            return None, (epoch + 1, 0)  # nothing left for this world: the next epoch
        skip = int(self._att.batches_per_epoch) - batches
        return (epoch, position, skip, samples), (epoch, skip)

    # ------------------------------------------------------------- closing

    def close(self):
        """Detach and disconnect now. Batches still alive stay valid: they
        are kept (copied to private memory at the same addresses) first."""
        if self._closed:
            return
        self._closed = True
        self._pending = None
        self._loop = None
        att, self._att = self._att, None
        client, self._client = self._client, None
        host, self._host = self._host, None
        if host is not None:
            host.close()  # the trainer's end of its channel: the host serves on
        if att is not None:
            att.warn_device_batches()
            att.detach()
        if client is not None:
            self._reconnects_final = client.reconnects()
            client.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        raise TypeError("a loaderd.DataLoader cannot be pickled or sent to another process: "
                        "create it in the process that uses it")

    def __repr__(self):
        return (f"<loaderd.DataLoader {self.pipeline!r} mode {self.mode} rank {self.rank}/"
                f"{self.world_size} batches/epoch {len(self)}>")


class _Failed:
    """A batch that failed to build (on_error "raise"): its place in the
    stream, and what the iterator raises there."""

    __slots__ = ("epoch", "index", "exc")

    def __init__(self, epoch, index, exc):
        self.epoch, self.index, self.exc = epoch, index, exc


class _EpochIter:
    """One epoch's iterator: raises a failed batch's error in its place and
    stays usable, as torch's iterator does (a `for` ends at the exception;
    next() after it gives the batch after the failed one)."""

    __slots__ = ("_it",)

    def __init__(self, it):
        self._it = it

    def __iter__(self):
        return self

    def __next__(self):
        b = next(self._it)
        if b.__class__ is _Failed:
            raise b.exc
        return b

    def close(self):
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


class _HostProcess(subprocess.Popen):
    """The workers' host outlives its loader by design (it lives as long as
    the pipeline): no ResourceWarning when the Popen is collected while it
    runs (subprocess still reaps it later)."""

    def __del__(self, _maxsize=sys.maxsize, _warn=None):
        super().__del__(_maxsize, lambda *a, **k: None)


def host_command():
    """(argv, cwd, env) that start the workers' host: `python -m
    loaderd._pyhost` with no directory but loaderd's own before the
    interpreter's: -P where Python has it (3.11), and loaderd's parent
    directory as the working directory, which is what `-m` puts first
    otherwise. The trainer's working directory (anyone may write a shared
    one: a planted loaderd/ or select.py there would run as this user) never
    supplies the host's code; the host goes there, and takes the trainer's
    sys.path for the Dataset's module, only after its own imports."""
    env = dict(os.environ)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"]
                                      if env.get("PYTHONPATH") else "")
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable] + safe + ["-m", "loaderd._pyhost"], pkg_parent, env


class _Dataset:
    """loader.dataset: what training scripts ask of torch's dataset object,
    len(loader.dataset) (the samples of the whole source, as torch's len of
    the dataset, not of this rank's share)."""

    __slots__ = ("pipeline", "samples")

    def __init__(self, pipeline, samples):
        self.pipeline, self.samples = pipeline, samples

    def __len__(self):
        return self.samples

    def __repr__(self):
        return f"<loaderd pipeline {self.pipeline!r} source: {self.samples} samples>"


def _convert_one(values):
    """Objects' collate when unbatched: torch's default_convert of the one
    value (a numpy array becomes a tensor, the rest stays)."""
    return _torch.utils.data._utils.collate.default_convert(values[0])


def _np_collate(values):
    """Objects' collate with as_numpy (or no torch): arrays (tensors as
    numpy arrays) and numbers stacked (ValueError when their shapes
    differ), anything else a list."""
    arrays = []
    for v in values:
        if _torch is not None and isinstance(v, _torch.Tensor):
            v = v.numpy()
        if not isinstance(v, (np.ndarray, np.generic, int, float)):
            return list(values)
        arrays.append(np.asarray(v))
    return np.stack(arrays)


def _pins(pin_memory, device):
    """Would torch's DataLoader pin (call pin_memory on) its batches here:
    pin_memory and an accelerator (torch 2 with torch.accelerator), CUDA or
    a pin_memory_device (torch 1.13 and early 2.x)."""
    if not pin_memory or _torch is None:
        return False
    acc = getattr(_torch, "accelerator", None)
    if acc is not None:
        return bool(acc.is_available())
    return bool(device) or _torch.cuda.is_available()


def _pin_objects(data):
    """torch's pin_memory() walk over a rebuilt batch, for the objects of
    its object part: an object's own pin_memory() is called as torch calls
    it (a custom batch class); tensors and arrays stay where they are (the
    slot: docs/python.md, "torch DataLoader arguments", pin_memory)."""
    if isinstance(data, (np.ndarray, str, bytes)) or \
            (_torch is not None and isinstance(data, _torch.Tensor)):
        return data
    if _TORCH2 and hasattr(data, "pin_memory"):  # torch 2 asks first
        return data.pin_memory()
    if isinstance(data, collections.abc.Mapping):
        try:
            return type(data)({k: _pin_objects(v) for k, v in data.items()})
        except TypeError:
            return {k: _pin_objects(v) for k, v in data.items()}
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):
            return type(data)(*(_pin_objects(v) for v in data))
        return type(data)(_pin_objects(v) for v in data) if _TORCH2 else \
            [_pin_objects(v) for v in data]  # torch 1.13: a list
    if isinstance(data, collections.abc.Sequence):
        try:
            return type(data)([_pin_objects(v) for v in data])
        except TypeError:
            return [_pin_objects(v) for v in data]
    if hasattr(data, "pin_memory"):
        return data.pin_memory()
    return data


def _size(n):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
