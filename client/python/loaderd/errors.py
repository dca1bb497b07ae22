# SPDX-License-Identifier: MIT
"""Exceptions of the loaderd package.

Every failure of libloader or the daemon becomes an :class:`Error` (or a
subclass) carrying ``code``, libloader's negative errno (or ``LDR_E*``), and
``message``, the daemon's own words when the daemon refused the request.
"""

import builtins as _builtins
import errno as _errno
import re as _re
import sys as _sys

from . import _lib


class Error(Exception):
    """A libloader call or the daemon failed.

    ``code``: the negative errno value (or LDR_E* code) libloader returned;
    ``message``: the daemon's (or libloader's) message;
    ``operation``: what was being done ("attach", "create", "next"...)."""

    def __init__(self, code, message="", operation=""):
        self.code = code
        self.message = message or _lib.strerror(code)
        self.operation = operation
        text = f"{operation}: {self.message}" if operation else self.message
        super().__init__(text)

    def __reduce__(self):
        # args holds the text only: rebuild from what __init__ takes
        return (type(self), (self.code, self.message, self.operation))


class NotFound(Error, LookupError):
    """No such pipeline (-ENOENT)."""


class InvalidSpec(Error, ValueError):
    """The daemon refused a pipeline spec or an argument (-EINVAL)."""


class Disconnected(Error, ConnectionError):
    """The daemon went away, closed the connection or cannot be reached."""


class Timeout(Error, TimeoutError, RuntimeError):
    """No batch within the timeout (-ETIMEDOUT). A RuntimeError too, as
    torch's DataLoader timeout is."""


class WorkerError(Error, RuntimeError):
    """A worker died building a batch (-ECHILD: a segfault, os._exit, the
    OOM killer) or its host went: a RuntimeError too, as torch's "DataLoader
    worker (pid(s) N) exited unexpectedly" is; the message names the pid and
    how it ended."""


class ForkedError(Error):
    """A loader (or client) was used in a process forked after it was made.

    libloader's handles (nng) do not survive fork: create the loader inside
    the process that uses it (after fork, or in a spawned worker)."""


# a worker that died learning dataset[0] at construction: the same error
WorkerDied = WorkerError


class DatasetError(Error):
    """The Dataset (or collate_fn) raised in a worker. What is raised is a
    subclass of this and of the Dataset's own exception type when the trainer
    knows that type (dataset_error()), as torch re-raises it; the message
    carries the worker's traceback."""


_DATASET_TYPES = {}   # the Dataset's exception class -> its DatasetError subclass
# 'dataset[IDX] raised TYPE: ' or 'collate_fn of the batch of dataset[IDX], ...
# (N rows) raised TYPE: ' (_pyworker._exc_text): TYPE is a builtin's name or
# module.qualname
# (or 'len(dataset) raised TYPE: ', when a worker learns a Dataset's length)
_RAISED = _re.compile(r"(?:dataset\[\d+\]|\(\d+ rows\)|len\(dataset\)) raised ([A-Za-z_][\w.]*): ")


def _raised_type(name):
    """The exception class @name names, found among the builtins and the
    modules this process imported already (nothing is imported): None when
    unknown or not an Exception."""
    cls = None
    if "." not in name:
        cls = getattr(_builtins, name, None)
    else:
        parts = name.split(".")
        for i in range(len(parts) - 1, 0, -1):
            mod = _sys.modules.get(".".join(parts[:i]))
            if mod is None:
                continue
            cls = mod
            for attr in parts[i:]:
                cls = getattr(cls, attr, None)
            break
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, Error):
        return cls
    return None


def _dataset_class(cls):
    sub = _DATASET_TYPES.get(cls)
    if sub is None:
        try:
            sub = type(cls.__name__, (DatasetError, cls), {"__module__": __name__,
                                                          "__reduce__": _dataset_reduce,
                                                          # KeyError's repr()s its text
                                                          "__str__": BaseException.__str__})
        except TypeError:  # a layout that cannot be combined with Exception's
            sub = DatasetError
        _DATASET_TYPES[cls] = sub
    return sub


def _dataset_reduce(self):
    return (_remake_dataset_error, (self._raised, self.code, self.message, self.operation))


def _remake_dataset_error(cls, code, message, operation):
    e = _dataset_class(cls)(code, message, operation)
    e._raised = cls
    return e


def dataset_error(err):
    """@err (an Error whose message says the Dataset raised) as a DatasetError
    that is also the Dataset's exception type, when that type is known here;
    else @err itself."""
    m = _RAISED.search(err.message)
    cls = _raised_type(m.group(1)) if m else None
    if cls is None:
        return err
    try:
        return _remake_dataset_error(cls, err.code, err.message, err.operation)
    except Exception:  # its __init__ wants other arguments (UnicodeError)
        return DatasetError(err.code, err.message, err.operation)


_DISCONNECTED = {_lib.LDR_EDISCONNECTED, -_errno.ECONNREFUSED, -_errno.ECONNRESET,
                 -_errno.EPIPE, -_errno.ESHUTDOWN, -_errno.ECONNABORTED}


def from_code(code, message="", operation=""):
    """The exception for libloader's return value @code."""
    if code == _lib.LDR_EFORKED:
        msg = message or "handle used after fork"
        if "spawn" not in msg:
            msg += (" (a loaderd loader cannot be used in a process forked after it was "
                    "created: create it in the child, or use the spawn start method)")
        return ForkedError(code, msg, operation)
    if code in _DISCONNECTED:
        return Disconnected(code, message, operation)
    if code == -_errno.ETIMEDOUT:
        return Timeout(code, message, operation)
    if code == -_errno.ECHILD:
        return WorkerError(code, message, operation)
    if code == -_errno.ENOENT:
        return NotFound(code, message, operation)
    if code == -_errno.EINVAL:
        return InvalidSpec(code, message, operation)
    return Error(code, message, operation)
