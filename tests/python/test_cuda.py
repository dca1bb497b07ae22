# SPDX-License-Identifier: MIT
"""device="cuda:N" in the Python package, over the emulated driver.

There is no GPU on the machines that run this suite. tests/unit/gpu/fakecuda
(built with -Dcuda) is an emulated driver whose device memory is host memory
shared through memfds, so the daemon's copy engine, the device slab's export and
libloader's mapping all run for real, and a test can read "device" bytes
directly. It proves the logic, not the hardware: tests/gpu/run.sh does that
on a machine with an NVIDIA GPU (docs/gpu.md). Torch CUDA tensors need a
torch with CUDA; here the CudaArray objects (as_numpy=True) are checked.
"""

import ctypes
import gc
import os

import numpy as np
import pytest

import loaderd
from loaderd import _cuda
from conftest import BUILD_DIR, Daemon

FAKE = os.path.join(BUILD_DIR, "tests", "unit", "gpu", "libfakecuda.so")

pytestmark = pytest.mark.skipif(not os.path.exists(FAKE),
                                reason=f"no emulated CUDA driver at {FAKE} (loaderd built without CUDA)")


@pytest.fixture
def gd(workdir, monkeypatch):
    """A daemon and this process both on the emulated driver, one device."""
    monkeypatch.setenv("LOADERD_CUDA_LIBRARY", FAKE)
    d = Daemon(workdir)
    yield d
    gc.collect()
    d.stop()


def tok_spec(workdir, name, n=4000, seed=3, **kw):
    rng = np.random.default_rng(seed)
    p = os.path.join(workdir, "tok.bin")
    if not os.path.exists(p):
        rng.integers(0, 60000, size=n).astype(np.uint16).tofile(p)
    spec = {"name": name, "source": {"kind": "tokens", "path": p, "dtype": "uint16", "seq_len": 32},
            "batch_size": 8, "epochs": 1, "prefetch": 4}
    spec.update(kw)
    return spec


def device_bytes(a):
    # the emulated device's memory is host memory: readable in place
    return ctypes.string_at(a.__cuda_array_interface__["data"][0], a.nbytes)


def test_cuda_arrays_equal_host_batches(gd, workdir):
    host = loaderd.DataLoader(tok_spec(workdir, "h"), socket=gd.socket, as_numpy=True)
    dev = loaderd.DataLoader(tok_spec(workdir, "g"), socket=gd.socket, as_numpy=True, device="cuda:0")
    assert dev.device == "cuda:0" and host.device == "cpu"
    n = 0
    for bh, bg in zip(host, dev):
        assert (bg.epoch, bg.index, bg.rows) == (bh.epoch, bh.index, bh.rows)
        assert list(bg.keys()) == ["input", "target"]
        for k in bh.keys():
            a = bg[k]
            assert isinstance(a, loaderd.CudaArray)
            cai = a.__cuda_array_interface__
            assert cai["version"] == 3 and cai["stream"] is None and cai["strides"] is None
            assert cai["data"][1] is True  # read-only
            assert cai["shape"] == bh[k].shape and cai["typestr"] == "<i8"
            assert a.device == 0 and a.__dlpack_device__() == (2, 0)
            # a device pointer, not into the host slab
            base, size = dev.slab
            assert not base <= a.ptr < base + size
            assert device_bytes(a) == bh[k].tobytes()
        n += 1
    assert n == len(host) == len(dev) == 4000 // 32 // 8 + 1
    pl = gd.pipeline("g")
    assert [(d["device"], d["memory"], d["clients"], d["copies"]) for d in pl["devices"]] == \
        [("cuda:0", "vmm", 1, n)]
    assert gd.pipeline("h")["devices"] == []
    bh = bg = a = None
    host.close()
    dev.close()


def test_two_cuda_loaders_share_one_copy(gd, workdir):
    spec = tok_spec(workdir, "s", min_clients=2)
    a = loaderd.DataLoader(spec, socket=gd.socket, as_numpy=True, device="cuda", mode="broadcast")
    b = loaderd.DataLoader(spec, socket=gd.socket, as_numpy=True, device="cuda:0", mode="broadcast")
    n = 0
    for ba, bb in zip(a, b):
        for k in ba.keys():
            assert device_bytes(ba[k]) == device_bytes(bb[k])
        n += 1
    ba = bb = None
    # one copy per batch for both clients of the device
    assert gd.pipeline("s")["devices"][0]["copies"] == n
    st = gd.status()["cuda"]
    assert st["driver"] == FAKE
    assert st["devices"]["cuda:0"]["copies"] == n and st["devices"]["cuda:0"]["host_registered"] == 1
    a.close()
    b.close()


def test_leases_return_on_release_with_stream(gd, workdir):
    # prefetch 4: three batches kept leave one slot; only returned leases let
    # the stream go on
    dev = loaderd.DataLoader(tok_spec(workdir, "r", epochs=0), socket=gd.socket, as_numpy=True,
                             device="cuda:0", timeout=20)
    kept = [dev.next_batch() for _ in range(3)]
    kept[0].release(stream=0)     # the legacy default stream
    kept[1].release()             # torch's current stream (none here: the default)
    del kept[2]                   # the last reference
    kept = None
    gc.collect()
    for _ in range(40):
        b = dev.next_batch()
        assert b["input"].shape[1:] == (32,)
        b = None
    dev.close()
    gd.wait_for(lambda st: st["clients"] == [], "the loader gone")


def test_dlpack_capsule(gd, workdir):
    dev = loaderd.DataLoader(tok_spec(workdir, "d"), socket=gd.socket, as_numpy=True, device="cuda:0")
    b = dev.next_batch()
    a = b["input"]
    cap = a.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    m = _cuda._DLManagedTensor.from_address(get(cap, b"dltensor"))
    t = m.dl_tensor
    assert t.data == a.ptr and (t.device.device_type, t.device.device_id) == (2, 0)
    assert t.ndim == 2 and [t.shape[i] for i in range(2)] == [8, 32]
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (0, 64, 1) and not t.strides
    assert len(_cuda._exported) == 1
    # a consumer renames the capsule and calls the deleter when done
    rename = ctypes.pythonapi.PyCapsule_SetName
    rename.argtypes = [ctypes.py_object, ctypes.c_char_p]
    assert rename(cap, b"used_dltensor") == 0
    m.deleter(ctypes.pointer(m))
    assert len(_cuda._exported) == 0
    del cap, m, t
    # a capsule nobody consumed frees its tensor with it
    cap = a.__dlpack__()
    assert len(_cuda._exported) == 1
    del cap
    assert len(_cuda._exported) == 0
    del a, b
    dev.close()


def test_device_errors(gd, workdir):
    spec = tok_spec(workdir, "e")
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N', not 'gpu'"):
        loaderd.DataLoader(spec, socket=gd.socket, device="gpu")
    with pytest.raises(loaderd.Error, match=r"cuda:5 requested, 1 device present"):
        loaderd.DataLoader(spec, socket=gd.socket, as_numpy=True, device="cuda:5")
    try:
        import torch
    except Exception:
        torch = None
    if torch is not None and not torch.cuda.is_available():
        with pytest.raises(ValueError, match="this torch has no CUDA"):
            loaderd.DataLoader(spec, socket=gd.socket, device="cuda:0")
    # host delivery is untouched
    host = loaderd.DataLoader(spec, socket=gd.socket, as_numpy=True)
    assert sum(1 for _ in host) == len(host)
    host.close()


def test_legacy_ipc(workdir, monkeypatch):
    monkeypatch.setenv("LOADERD_CUDA_LIBRARY", FAKE)
    monkeypatch.setenv("LOADERD_CUDA_IPC", "1")  # the daemon uses cuIpcGetMemHandle
    d = Daemon(workdir)
    try:
        host = loaderd.DataLoader(tok_spec(workdir, "h"), socket=d.socket, as_numpy=True)
        dev = loaderd.DataLoader(tok_spec(workdir, "g"), socket=d.socket, as_numpy=True,
                                 device="cuda:0")
        for bh, bg in zip(host, dev):
            for k in bh.keys():
                assert device_bytes(bg[k]) == bh[k].tobytes()
        assert [x["memory"] for x in d.pipeline("g")["devices"]] == ["ipc"]
        bh = bg = None
        host.close()
        dev.close()
    finally:
        gc.collect()
        d.stop()


class _TorchDouble:
    """Stands in for a torch with CUDA, which this machine lacks: records what
    torch.as_tensor is handed (a real one reads the same dict)."""

    bfloat16, int32, int64 = "torch.bfloat16", "torch.int32", "torch.int64"

    def __init__(self, refuse=()):
        self.calls, self.refuse = [], refuse

    def as_tensor(self, obj, device):
        cai = obj.__cuda_array_interface__
        self.calls.append((dict(cai), device))
        if cai["typestr"] in self.refuse:
            raise TypeError(f"unsupported typestr {cai['typestr']}")
        return _TensorDouble(cai["typestr"])


class _TensorDouble:
    def __init__(self, typestr):
        self.ops = [typestr]

    def view(self, dtype):
        self.ops.append(("view", dtype))
        return self

    def to(self, dtype):
        self.ops.append(("to", dtype))
        return self

    def bitwise_and_(self, mask):
        self.ops.append(("and", mask))
        return self


def test_torch_gets_a_writable_interface_over_the_same_memory():
    lease = object()
    a = _cuda.CudaArray(0x7000, (4, 8), "<i8", 1, lease, 256, "int64")
    t = _TorchDouble()
    out = _cuda.to_torch(a, t)
    (cai, device), = t.calls
    # torch refuses the read-only flag: same pointer, flag off, same layout
    assert device == "cuda:1" and cai["data"] == (0x7000, False)
    assert cai["shape"] == (4, 8) and cai["typestr"] == "<i8" and cai["stream"] is None
    assert a.__cuda_array_interface__["data"] == (0x7000, True)  # the CudaArray stays read-only
    assert out.ops == ["<i8"]
    # bfloat16: int16 memory viewed as bfloat16, no copy
    t = _TorchDouble()
    out = _cuda.to_torch(_cuda.CudaArray(0x8000, (2,), "<u2", 0, lease, 4, "bfloat16"), t)
    assert t.calls[0][0]["typestr"] == "<i2" and out.ops == ["<i2", ("view", "torch.bfloat16")]
    # uint16 on a torch without it: read as int16, widened on the device
    t = _TorchDouble(refuse=("<u2",))
    out = _cuda.to_torch(_cuda.CudaArray(0x9000, (2,), "<u2", 0, lease, 4, "uint16"), t)
    assert [c[0]["typestr"] for c in t.calls] == ["<u2", "<i2"]
    assert out.ops == ["<i2", ("to", "torch.int32"), ("and", 0xFFFF)]
