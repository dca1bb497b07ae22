# SPDX-License-Identifier: MIT
"""loaderd: batches from the loaderd daemon, in place of torch's DataLoader.

    import loaderd
    loader = loaderd.DataLoader({"name": "tok", "source": {...}, "batch_size": 32})
    for x, y in loader:           # one whole epoch per `for`, as torch's DataLoader
        ...                       # zero-copy tensors, copy-on-write (in-place ops are fine)

The package wraps the C library libloader with ctypes (see _lib.py for how it
is found). Documentation: docs/python.md.
"""

from ._lib import library_path
from .errors import (DatasetError, Disconnected, Error, ForkedError, InvalidSpec, NotFound, Timeout,
                     WorkerDied, WorkerError)
from ._cuda import CudaArray
from .pydataset import get_worker_info

# loader.py (DataLoader, Client, Batch) imports torch: it is imported at first
# use, so that `python -m loaderd._pyhost`, the zygote of a python pipeline's
# workers (docs/python.md, "Your own Dataset"), starts without torch.
_LAZY = {"Batch", "Client", "DataLoader"}


def __getattr__(name):
    if name in _LAZY:
        from . import loader
        return getattr(loader, name)
    raise AttributeError(f"module 'loaderd' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _LAZY)

__version__ = "0.1.0"


def version():
    """Versions of this package, libloader and nng."""
    from ._lib import lib
    L = lib()
    return {"loaderd": __version__, "libloader": L.ldr_version().decode(),
            "nng": L.ldr_nng_version().decode()}


__all__ = ["Batch", "Client", "CudaArray", "DataLoader", "DatasetError", "Disconnected", "Error",
           "ForkedError", "InvalidSpec", "NotFound", "Timeout", "WorkerDied", "WorkerError",
           "get_worker_info", "library_path", "version"]
