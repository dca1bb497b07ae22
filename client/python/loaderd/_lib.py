# SPDX-License-Identifier: MIT
"""ctypes bindings of libloader (include/loader/loader.h).

This is the only place that knows the C API. The package speaks the protocol
through libloader alone: there is no second implementation in Python.

Where the library comes from, first match wins:

1. ``$LOADERD_LIBRARY``: a path to ``libloader.so`` (or any name dlopen takes);
2. the copy bundled in an installed package: ``libloader.so`` beside this
   file (``pip install ./client/python`` builds it into the wheel; a source
   checkout never has one);
3. the build tree of the source checkout this package sits in:
   ``<repo>/build/client/libloader.so`` (``client/python/loaderd`` → ``<repo>``);
4. the system: ``ctypes.util.find_library("loader")``, then ``libloader.so.0``.

The package's per-batch path in C, ``loaderd._fast`` (client/python/pyfast.c), is
looked for beside the libloader that was loaded (a wheel carries both in the
package; a build tree has it in build/client/), for this interpreter's
extension suffix: :func:`fast` returns it, or None where it was not built
(the pure Python path then, the same batches) or ``$LOADERD_PYFAST`` is 0.
"""

import ctypes
import ctypes.util
import importlib.machinery
import importlib.util
import os
import threading

LDR_EOF = -4095
LDR_EFORKED = -4094
LDR_EDISCONNECTED = -4093
LDR_EVERSION = -4092
LDR_EBATCH = -4091  # this batch failed to build; the next ldr_next goes on
LDR_NAME_MAX = 63
LDR_MAX_DIMS = 8
LDR_INFLIGHT_MAX = 64  # most batches in one window; tests/python/test_abi.py checks it

MODES = {"broadcast": 0, "partition": 1, "dynamic": 2}

# enum ldr_dtype -> (name, numpy typestr)
DTYPES = {
    0: ("bool", "|b1"),
    1: ("int8", "|i1"),
    2: ("uint8", "|u1"),
    3: ("int16", "<i2"),
    4: ("uint16", "<u2"),
    5: ("int32", "<i4"),
    6: ("uint32", "<u4"),
    7: ("int64", "<i8"),
    8: ("uint64", "<u8"),
    9: ("float16", "<f2"),
    10: ("bfloat16", "<u2"),  # numpy has no bfloat16: raw bits as uint16
    11: ("float32", "<f4"),
    12: ("float64", "<f8"),
}
DTYPE_BFLOAT16 = 10


class ldr_field(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * LDR_MAX_DIMS),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
    ]


class ldr_batch_info(ctypes.Structure):
    """struct ldr_batch_info: a batch and its attachment's counters, one call."""
    _fields_ = [
        ("epoch", ctypes.c_uint64),
        ("index", ctypes.c_uint64),
        ("rows", ctypes.c_uint32),
        ("held", ctypes.c_uint32),
        ("share", ctypes.c_uint32),
        ("nfields", ctypes.c_int),
        ("kept_batches", ctypes.c_uint64),
        ("kept_bytes", ctypes.c_uint64),
    ]


# The mirrors above and below must match include/loader/loader.h:
# tests/python/test_abi.py compares them with the C compiler's layout.
class ldr_attach_opts(ctypes.Structure):
    """struct ldr_attach_opts; a new one has ``size`` set to its sizeof."""
    _fields_ = [
        ("size", ctypes.c_size_t),         # versions the struct: sizeof as we know it
        ("mode", ctypes.c_int),
        ("rank", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("has_start", ctypes.c_int),
        ("start_epoch", ctypes.c_uint64),
        ("start_batch", ctypes.c_uint64),
        ("inflight", ctypes.c_uint32),
        ("device_kind", ctypes.c_int),     # enum ldr_device_kind: 0 host, 1 CUDA
        ("device_index", ctypes.c_int),
        ("has_augment_seed", ctypes.c_int),  # LDR_ATTACH_OPTS_SIZE_V2
        ("augment_seed", ctypes.c_uint64),
        ("job", ctypes.c_char_p),            # LDR_ATTACH_OPTS_SIZE_V3
        ("client_order", ctypes.c_int),      # LDR_ATTACH_OPTS_SIZE_V4
        ("has_start_position", ctypes.c_int),  # LDR_ATTACH_OPTS_SIZE_V5
        ("start_position", ctypes.c_uint64),
    ]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.size:
            self.size = ctypes.sizeof(ldr_attach_opts)


class ldr_store_opts(ctypes.Structure):
    """struct ldr_store_opts (ldr_set_store()); ``size`` set to its sizeof."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("if_changed", ctypes.c_int),
        ("access_key_id", ctypes.c_char_p),
        ("secret_access_key", ctypes.c_char_p),
        ("session_token", ctypes.c_char_p),
        ("expires", ctypes.c_int64),
    ]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.size:
            self.size = ctypes.sizeof(ldr_store_opts)


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)

_SIGNATURES = {
    "ldr_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "ldr_version": (ctypes.c_char_p, []),
    "ldr_nng_version": (ctypes.c_char_p, []),
    "ldr_protobuf_c_version": (ctypes.c_char_p, []),
    "ldr_socket_path": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p]),
    "ldr_connect": (ctypes.c_int, [_PP, ctypes.c_char_p, ctypes.c_char_p]),
    "ldr_close": (None, [_P]),
    "ldr_client_error": (ctypes.c_char_p, [_P]),
    "ldr_client_id": (ctypes.c_uint64, [_P]),
    "ldr_create_pipeline": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_int,
                                           ctypes.c_char_p, ctypes.c_size_t]),
    "ldr_create_pipeline_of": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_uint32,
                                              ctypes.c_char_p, ctypes.c_size_t]),
    "ldr_set_store": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(ldr_store_opts)]),
    "ldr_drop_pipeline": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_int]),
    "ldr_status_json": (ctypes.c_int, [_P, _PP]),
    "ldr_pipelines_json": (ctypes.c_int, [_P, _PP]),
    "ldr_set": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, _PP]),
    "ldr_reload": (ctypes.c_int, [_P, _PP]),
    "ldr_free": (None, [_P]),
    "ldr_attach": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(ldr_attach_opts), _PP]),
    "ldr_detach": (ctypes.c_int, [_P]),
    "ldr_attachment_nfields": (ctypes.c_int, [_P]),
    "ldr_attachment_batches_per_epoch": (ctypes.c_uint64, [_P]),
    "ldr_attachment_samples_per_epoch": (ctypes.c_uint64, [_P]),
    "ldr_attachment_epochs": (ctypes.c_uint64, [_P]),
    "ldr_attachment_batch_size": (ctypes.c_uint32, [_P]),
    "ldr_attachment_owner": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint32)]),
    "ldr_attachment_slab": (ctypes.c_void_p, [_P, ctypes.POINTER(ctypes.c_size_t)]),
    "ldr_next": (ctypes.c_int, [_P, ctypes.c_int, _PP]),
    "ldr_release": (None, [_P]),
    "ldr_release_after": (None, [_P, _P]),
    "ldr_batch_field_host": (ctypes.c_int, [_P, ctypes.c_int, ctypes.POINTER(ldr_field)]),
    "ldr_attachment_device": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int)]),
    "ldr_batch_epoch": (ctypes.c_uint64, [_P]),
    "ldr_batch_index": (ctypes.c_uint64, [_P]),
    "ldr_batch_rows": (ctypes.c_uint32, [_P]),
    "ldr_batch_nfields": (ctypes.c_int, [_P]),
    "ldr_batch_field": (ctypes.c_int, [_P, ctypes.c_int, ctypes.POINTER(ldr_field)]),
    # one call per batch (the package's per-batch path)
    "ldr_batch_describe": (ctypes.c_int, [_P, ctypes.POINTER(ldr_batch_info),
                                          ctypes.POINTER(ldr_field), ctypes.c_int]),
    "ldr_next_described": (ctypes.c_int, [_P, ctypes.c_int, _PP, ctypes.POINTER(ldr_batch_info),
                                          ctypes.POINTER(ldr_field), ctypes.c_int]),
    # keeping batches past their slots (docs/protocol.md, "Sharing slots", Keep)
    "ldr_batch_keep": (ctypes.c_int, [_P, ctypes.c_uint64]),
    "ldr_batch_is_kept": (ctypes.c_int, [_P]),
    "ldr_attachment_share": (ctypes.c_uint32, [_P]),
    "ldr_attachment_held": (ctypes.c_uint32, [_P]),
    "ldr_attachment_failed": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64),
                                             ctypes.POINTER(ctypes.c_uint64)]),
    "ldr_attachment_kept": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64),
                                           ctypes.POINTER(ctypes.c_uint64)]),
    # a client_order attachment's batches (docs/protocol.md, "Client order")
    "ldr_order": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.c_uint64,
                                 ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]),
    "ldr_attachment_release_refused": (ctypes.c_uint64, [_P, ctypes.c_char_p, ctypes.c_size_t]),
    # reconnecting to a restarted daemon (docs/reliability.md)
    "ldr_client_set_reconnect": (ctypes.c_int, [_P, ctypes.c_int]),
    "ldr_client_reconnect_timeout": (ctypes.c_int, [_P]),
    "ldr_client_reconnects": (ctypes.c_uint64, [_P]),
    "ldr_client_daemon_uid": (ctypes.c_uint32, [_P]),
}

_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("LOADERD_LIBRARY")
    if env:
        return [env], True
    out = []
    here = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(here, "libloader.so")
    if os.path.exists(bundled):
        out.append(bundled)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    tree = os.path.join(repo, "build", "client", "libloader.so")
    if os.path.exists(tree):
        out.append(tree)
    found = ctypes.util.find_library("loader")
    if found:
        out.append(found)
    out.append("libloader.so.0")
    return out, False


def lib():
    """The loaded libloader (a ctypes.CDLL, which releases the GIL in calls)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        names, from_env = _candidates()
        errors = []
        for name in names:
            try:
                handle = ctypes.CDLL(name)
            except OSError as e:
                errors.append(f"{name}: {e}")
                continue
            for fn, (restype, argtypes) in _SIGNATURES.items():
                f = getattr(handle, fn)
                f.restype = restype
                f.argtypes = argtypes
            _lib_path = name
            _lib = handle
            return handle
        hint = ("$LOADERD_LIBRARY is set but cannot be loaded" if from_env else
                "install the package with pip install ./client/python, build it with "
                "scripts/build, or point $LOADERD_LIBRARY at libloader.so")
        raise ImportError("loaderd: cannot load libloader (" + hint + "): " + "; ".join(errors))


def library_path():
    lib()
    return _lib_path


def strerror(code):
    return lib().ldr_strerror(code).decode("utf-8", "replace")


_fast = False          # not looked for yet
fast_error = None      # why loaderd._fast is not used, when it is not


def _load_fast():
    global fast_error
    where = os.path.dirname(_lib_path) if os.sep in (_lib_path or "") else None
    dirs = [d for d in (where, os.path.dirname(os.path.abspath(__file__))) if d]
    for d in dirs:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(d, "_fast" + suffix)
            if not os.path.exists(path):
                continue
            try:
                spec = importlib.util.spec_from_file_location("loaderd._fast", path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                return mod
            except (ImportError, OSError) as e:
                fast_error = f"{path}: {e}"
                return None
    fast_error = "not built beside " + " or ".join(dirs)
    return None


def fast():
    """loaderd._fast set up with the loaded libloader, or None (see above)."""
    global _fast, fast_error
    if _fast is not False:
        return _fast
    L = lib()
    with _lock:
        if _fast is False:
            mod = None
            if os.environ.get("LOADERD_PYFAST", "1") == "0":
                fast_error = "$LOADERD_PYFAST is 0"
            else:
                mod = _load_fast()
                if mod is not None:
                    mod.setup(ctypes.cast(L.ldr_release, ctypes.c_void_p).value)
            _fast = mod
    return _fast
