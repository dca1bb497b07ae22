# SPDX-License-Identifier: MIT
"""The object part of a python pipeline's rows (docs/python.md, "Batches").

What is not a fixed-shape numeric leaf of a sample or of a collate_fn's
output (a str, None, a dataclass, a custom batch class, a tensor of another
shape than its field's, a ragged list of tensors) travels in the pad field
OBJ (uint8, OBJ_LEN its bytes) of the rows: pickled with protocol 5, the
data of the CPU tensors and numpy arrays in it kept out of band and copied
after the pickle, so that the trainer rebuilds them as zero-copy views of
the slot (they keep the batch's lease alive as the fields' tensors do).

A blob: "LDO1", u32 buffers, u64 pickle bytes, per buffer (u64 offset, u64
bytes), the pickle, then each buffer 64-byte aligned; offsets are from the
blob's start. A row's blob is in its own row; a collated batch's (a
collate_fn's output) spans the rows of the batch, its length in the first.

Unpickling: a trainer of the pipeline owner's uid unpickles as pickle does
(those bytes were written by its own user's code); any other (a pipeline of
another user, attached by name) with RestrictedUnpickler, which builds only
builtin containers and numbers, tensors and numpy arrays by loaderd's own
functions, and refuses every other class (docs/security.md). No torch import
at module level: the workers' host imports this package.
"""

import io
import pickle
import struct
import sys

OBJ = "__obj__"              # the pad field of the object part
OBJ_LEN = OBJ + "_len"
WHOLE = ""                   # the key of a sample (output) that did not match the structure
DEFAULT_MIN = 64 * 1024      # bytes per row at least, by default
_MAGIC = b"LDO1"
_HEAD = struct.Struct("=4sIQ")
_BUF = struct.Struct("=QQ")
_ALIGN = 64


class TooBig(Exception):
    """A blob of @needed bytes for a region of @capacity."""

    def __init__(self, needed, capacity):
        super().__init__(needed, capacity)
        self.needed, self.capacity = needed, capacity


def default_bytes(probe_bytes):
    """The object part's bytes per row from the blob of the probed sample
    (dataset[0] or collate_fn([dataset[0]])): max(64 KiB, 4x), 64-aligned."""
    return round_up(max(DEFAULT_MIN, 4 * probe_bytes))


def round_up(n):
    """@n up to a multiple of 64."""
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


# ------------------------------------------------------------------ tensors

def _tensor(buf, dtype, shape):
    """A tensor of torch dtype name @dtype and @shape over @buf (an
    out-of-band buffer: the slot's memory)."""
    import numpy as np
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    dt = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(dt, torch.dtype):
        raise pickle.UnpicklingError(f"loaderd: {dtype!r} is not a torch dtype")
    a = np.frombuffer(buf, dtype=np.uint8)
    if not a.flags.writeable:
        a = a.copy()  # torch.from_numpy warns on a read-only array
    return torch.from_numpy(a).view(dt).reshape(tuple(int(d) for d in shape))


def _array(buf, dtype, shape):
    import numpy as np
    dt = np.dtype(dtype)
    if dt.kind not in "biufc":
        raise pickle.UnpicklingError(f"loaderd: dtype {dtype!r} is not numeric")
    return np.frombuffer(buf, dtype=dt).reshape(tuple(int(d) for d in shape))


def _scalar(dtype, raw):
    import numpy as np
    dt = np.dtype(dtype)
    if dt.kind not in "biufc" or not isinstance(raw, bytes) or len(raw) != dt.itemsize:
        raise pickle.UnpicklingError(f"loaderd: bad numpy scalar {dtype!r}")
    return np.frombuffer(raw, dtype=dt)[0]


class _Pickler(pickle.Pickler):
    """protocol 5, CPU tensors and numeric numpy arrays out of band."""

    def reducer_override(self, obj):
        t = type(obj)
        torch = sys.modules.get("torch")
        if torch is not None and t is torch.Tensor:
            if obj.device.type != "cpu" or obj.layout != torch.strided or obj.requires_grad or \
                    obj.is_quantized:
                return NotImplemented
            a = obj.detach()
            if hasattr(a, "resolve_conj"):
                a = a.resolve_conj().resolve_neg()
            shape = tuple(a.shape)
            raw = a.contiguous().reshape(-1).view(torch.uint8).numpy()
            return _tensor, (pickle.PickleBuffer(raw), str(a.dtype).replace("torch.", ""), shape)
        np = sys.modules.get("numpy")
        if np is None:
            return NotImplemented
        if t is np.ndarray:
            if obj.dtype.kind not in "biufc" or obj.dtype.fields is not None:
                return NotImplemented
            raw = np.ascontiguousarray(obj).reshape(-1).view(np.uint8)
            return _array, (pickle.PickleBuffer(raw), obj.dtype.str, obj.shape)
        if isinstance(obj, np.generic) and obj.dtype.kind in "biufc":
            return _scalar, (obj.dtype.str, obj.tobytes())
        return NotImplemented


def blob_size(obj):
    """(pickle bytes, buffers, total bytes) of @obj's blob."""
    bufs = []
    f = io.BytesIO()
    _Pickler(f, protocol=5, buffer_callback=bufs.append).dump(obj)
    data = f.getbuffer()
    raws = [b.raw() for b in bufs]
    pos = round_up(_HEAD.size + _BUF.size * len(raws)) + len(data)
    for r in raws:
        pos = round_up(pos) + r.nbytes
    return data, raws, pos


def pack(obj, dst):
    """Write @obj's blob into @dst (a writable uint8 numpy array): its
    bytes, or TooBig."""
    data, raws, total = blob_size(obj)
    if total > dst.shape[0]:
        raise TooBig(total, dst.shape[0])
    import numpy as np
    _HEAD.pack_into(dst, 0, _MAGIC, len(raws), len(data))
    pos = round_up(_HEAD.size + _BUF.size * len(raws))
    dst[pos:pos + len(data)] = np.frombuffer(data, dtype=np.uint8)
    pos += len(data)
    for i, r in enumerate(raws):
        pos = round_up(pos)
        _BUF.pack_into(dst, _HEAD.size + i * _BUF.size, pos, r.nbytes)
        dst[pos:pos + r.nbytes] = np.frombuffer(r, dtype=np.uint8)
        pos += r.nbytes
    return total


# ---------------------------------------------------------------- unpickle

# what another user's bytes may name: loaderd's builders and plain values
_ALLOWED = {
    (__name__, "_tensor"), (__name__, "_array"), (__name__, "_scalar"),
    ("builtins", "complex"), ("builtins", "set"), ("builtins", "frozenset"),
    ("collections", "OrderedDict"), ("torch", "Size"), ("torch", "device"),
}


class Refused(pickle.UnpicklingError):
    """A class another user's pipeline names: never imported here."""


class RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler that finds only _ALLOWED (and torch dtypes)."""

    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        torch = sys.modules.get("torch")
        if module == "torch" and torch is not None and \
                isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise Refused(f"{module}.{name}")


def unpack(region, trusted):
    """The object of the blob at the start of @region (a uint8 numpy array
    of the slot, the blob's bytes long), its out-of-band buffers views of
    @region. @trusted: unpickle as pickle does, else RestrictedUnpickler."""
    n = region.shape[0]
    if n < _HEAD.size:
        raise pickle.UnpicklingError("loaderd: an object part shorter than its header")
    magic, nbuf, plen = _HEAD.unpack_from(region, 0)
    first = round_up(_HEAD.size + _BUF.size * nbuf)
    if magic != _MAGIC or first > n or plen > n - first:
        raise pickle.UnpicklingError("loaderd: a malformed object part")
    bufs = []
    for i in range(nbuf):
        off, size = _BUF.unpack_from(region, _HEAD.size + i * _BUF.size)
        if off < first + plen or off > n or size > n - off:
            raise pickle.UnpicklingError("loaderd: a malformed object part (buffer out of it)")
        bufs.append(region[off:off + size])
    data = region[first:first + plen].tobytes()
    if trusted:
        return pickle.loads(data, buffers=bufs)
    return RestrictedUnpickler(io.BytesIO(data), buffers=bufs).load()
