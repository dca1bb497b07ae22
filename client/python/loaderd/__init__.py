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
from .errors import Disconnected, Error, ForkedError, InvalidSpec, NotFound, Timeout
from ._cuda import CudaArray
from .loader import Batch, Client, DataLoader

__version__ = "0.1.0"


def version():
    """Versions of this package, libloader and nng."""
    from ._lib import lib
    L = lib()
    return {"loaderd": __version__, "libloader": L.ldr_version().decode(),
            "nng": L.ldr_nng_version().decode()}


__all__ = ["Batch", "Client", "CudaArray", "DataLoader", "Disconnected", "Error", "ForkedError",
           "InvalidSpec", "NotFound", "Timeout", "library_path", "version"]
