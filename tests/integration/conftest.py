# SPDX-License-Identifier: MIT
"""Fixtures of the loaderd integration tests: those of the one harness,
tests/pyharness/loaderd_harness.py (the real daemon on a private socket).

Binaries come from $LOADERD_BUILD (default: <repo>/build): daemon/loaderd and
client/loaderctl. Every test gets a private directory under /tmp (`workdir`)
and starts its own daemon(s) through the `daemon` factory (`ld`: one with the
default options). On teardown each daemon gets SIGTERM and must exit 0
within 10 s, remove its socket, and have printed no sanitizer report.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "pyharness"))

from loaderd_harness import (ConsumeResult, Consumer, Daemon, DaemonFactory,  # noqa: E402,F401
                             daemon, workdir)


@pytest.fixture
def ld(daemon):
    """One daemon with the default options."""
    return daemon()
