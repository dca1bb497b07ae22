# SPDX-License-Identifier: MIT
"""Batches in GPU memory: device parsing, CudaArray (``__cuda_array_interface__``
and DLPack), torch CUDA tensors over the daemon's device slab.

The daemon copied the batch to the device before delivering it (docs/gpu.md),
so no stream has to wait for anything: the interface says ``"stream": None``
(CUDA Array Interface v3: no synchronisation needed) and the DLPack export
ignores the consumer's stream for the same reason. When the last user of a
batch is gone, its lease goes back through ldr_release_after() with torch's
current stream of that device (or the legacy default stream), so the daemon
refills the slot only after the kernels queued on it so far.
"""

import ctypes

DL_CUDA = 2  # DLDeviceType kDLCUDA

# typestr -> DLPack (type code, bits): 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
_DL_TYPES = {
    "|b1": (6, 8), "|i1": (0, 8), "|u1": (1, 8), "<i2": (0, 16), "<u2": (1, 16),
    "<i4": (0, 32), "<u4": (1, 32), "<i8": (0, 64), "<u8": (1, 64), "<f2": (2, 16),
    "<f4": (2, 32), "<f8": (2, 64),
}


def parse_device(device):
    """None/'cpu' -> None; 'cuda', 'cuda:N', torch.device -> N. Else ValueError."""
    if device is None:
        return None
    s = str(device)
    if s == "cpu":
        return None
    if s == "cuda":
        try:
            import torch
            if torch.cuda.is_available():
                return int(torch.cuda.current_device())
        except Exception:  # pragma: no cover - depends on the machine
            pass
        return 0
    if s.startswith("cuda:"):
        try:
            n = int(s[5:])
        except ValueError:
            n = -1
        if n >= 0:
            return n
    raise ValueError(f"loaderd.DataLoader: device must be 'cpu', 'cuda' or 'cuda:N', not {device!r}")


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]

# The destructor gets the dying capsule as a raw pointer: turning it into a
# Python object there would revive it, so these take it as void *.
_CAPSULE_DTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DTOR)(
    ("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))

# DLManagedTensor address -> (the struct, its shape array, the CudaArray): kept
# alive until the consumer (or the unconsumed capsule) calls the deleter
_exported = {}


@_DELETER
def _dl_deleter(ptr):
    _exported.pop(ctypes.cast(ptr, ctypes.c_void_p).value, None)


@_CAPSULE_DTOR
def _capsule_dtor(capsule):
    # a capsule nobody consumed still owns its tensor; a consumed one was
    # renamed "used_dltensor" and its consumer calls the deleter
    if _capsule_is_valid(capsule, b"dltensor"):
        _exported.pop(_capsule_pointer(capsule, b"dltensor"), None)


class CudaArray:
    """One field of a batch in GPU memory, read-only, valid while this object
    (or anything made from it) is alive. Consumers: CuPy (``cupy.asarray``),
    Numba, torch (``torch.as_tensor(a, device="cuda")``) through
    ``__cuda_array_interface__``; JAX and torch through DLPack."""

    __slots__ = ("__cuda_array_interface__", "lease", "device", "nbytes", "dtype_name")

    def __init__(self, ptr, shape, typestr, device, lease, nbytes, dtype_name):
        self.__cuda_array_interface__ = {"version": 3, "shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, True), "strides": None, "stream": None}
        self.lease = lease
        self.device = device
        self.nbytes = nbytes
        self.dtype_name = dtype_name

    @property
    def shape(self):
        return self.__cuda_array_interface__["shape"]

    @property
    def ptr(self):
        return self.__cuda_array_interface__["data"][0]

    def __dlpack_device__(self):
        return (DL_CUDA, self.device)

    def __dlpack__(self, stream=None, **kwargs):
        # the data is on the device already: no stream needs to wait
        cai = self.__cuda_array_interface__
        typestr = "<u2" if self.dtype_name == "bfloat16" else cai["typestr"]
        code, bits = (4, 16) if self.dtype_name == "bfloat16" else _DL_TYPES[typestr]
        shape = (ctypes.c_int64 * max(1, len(cai["shape"])))(*cai["shape"])
        m = _DLManagedTensor()
        m.dl_tensor.data = cai["data"][0]
        m.dl_tensor.device = _DLDevice(DL_CUDA, self.device)
        m.dl_tensor.ndim = len(cai["shape"])
        m.dl_tensor.dtype = _DLDataType(code, bits, 1)
        m.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        m.dl_tensor.strides = None
        m.dl_tensor.byte_offset = 0
        m.manager_ctx = None
        m.deleter = _dl_deleter
        addr = ctypes.addressof(m)
        _exported[addr] = (m, shape, self)
        return _capsule_new(addr, b"dltensor", _capsule_dtor)

    def __repr__(self):
        return (f"<loaderd.CudaArray cuda:{self.device} {self.dtype_name}{list(self.shape)} "
                f"at 0x{self.ptr:x}>")

    def __reduce__(self):
        raise TypeError("a loaderd.CudaArray lives in the daemon's GPU memory and cannot be "
                        "pickled; copy it first (e.g. cupy.asarray(a).get())")


class _Retyped:
    """@arr's memory for torch: under @typestr, and without the read-only flag,
    which torch refuses ("the read only flag is not supported"); torch tensors
    cannot be read-only anyway (docs/python.md). Keeps @arr alive."""

    __slots__ = ("__cuda_array_interface__", "base")

    def __init__(self, arr, typestr):
        cai = arr.__cuda_array_interface__
        self.__cuda_array_interface__ = dict(cai, typestr=typestr, data=(cai["data"][0], False))
        self.base = arr


# unsigned fields torch (< 2.3) has no dtype for: read signed, widen on the device
_WIDEN = {"uint16": ("<i2", "int32", 0xFFFF), "uint32": ("<i4", "int64", 0xFFFFFFFF)}


def to_torch(arr, torch):
    """A torch CUDA tensor over @arr (zero-copy; it keeps @arr alive). bfloat16
    is viewed, uint16/uint32 without a torch dtype are widened (a device copy)."""
    dev = f"cuda:{arr.device}"
    name = arr.dtype_name
    if name == "bfloat16":
        return torch.as_tensor(_Retyped(arr, "<i2"), device=dev).view(torch.bfloat16)
    try:
        return torch.as_tensor(_Retyped(arr, arr.__cuda_array_interface__["typestr"]), device=dev)
    except (TypeError, RuntimeError):
        if name not in _WIDEN:
            raise
    typestr, wide, mask = _WIDEN[name]
    t = torch.as_tensor(_Retyped(arr, typestr), device=dev)
    return t.to(getattr(torch, wide)).bitwise_and_(mask)


def current_stream(device):
    """torch's current CUstream on @device as an int, 0 (legacy default) without torch CUDA."""
    try:
        import sys
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_stream(device).cuda_stream)
    except Exception:  # pragma: no cover - interpreter shutdown, odd torch builds
        pass
    return 0
