# SPDX-License-Identifier: MIT
"""Exceptions of the loaderd package.

Every failure of libloader or the daemon becomes an :class:`Error` (or a
subclass) carrying ``code``, libloader's negative errno (or ``LDR_E*``), and
``message``, the daemon's own words when the daemon refused the request.
"""

import errno as _errno

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


class NotFound(Error, LookupError):
    """No such pipeline (-ENOENT)."""


class InvalidSpec(Error, ValueError):
    """The daemon refused a pipeline spec or an argument (-EINVAL)."""


class Disconnected(Error, ConnectionError):
    """The daemon went away, closed the connection or cannot be reached."""


class Timeout(Error, TimeoutError):
    """No batch within the timeout (-ETIMEDOUT)."""


class ForkedError(Error):
    """A loader (or client) was used in a process forked after it was made.

    libloader's handles (nng) do not survive fork: create the loader inside
    the process that uses it (after fork, or in a spawned worker)."""


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
    if code == -_errno.ENOENT:
        return NotFound(code, message, operation)
    if code == -_errno.EINVAL:
        return InvalidSpec(code, message, operation)
    return Error(code, message, operation)
