# SPDX-License-Identifier: MIT
"""Fixtures of the Python package tests (tests/python): those of the one
harness, tests/pyharness/loaderd_harness.py (the real daemon on a private
socket), plus the package's environment.

Binaries and libloader come from $LOADERD_BUILD (default <repo>/build); the
package from <repo>/client/python. Each test gets a private directory
/tmp/ldr-XXXX and, through the `ld` fixture, its own daemon there. On
teardown the daemon gets SIGTERM and must exit 0 without a sanitizer report.

Sanitizer build: tests/python/meson.build runs this suite with
LD_PRELOAD=libasan:libubsan (the ASan-built libloader.so needs the runtime
first) and detect_leaks=0 added to ASAN_OPTIONS for the Python process; the
daemon and loaderctl get $LOADERD_CHILD_ASAN_OPTIONS (the options as they
were) and no LD_PRELOAD (they are linked with the runtime themselves).
"""

import gc
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "pyharness"))

from loaderd_harness import (BUILD_DIR, EXAMPLES, LIBLOADER, LOADERCTL, LOADERD,  # noqa: E402,F401
                             PYDIR, REPO_ROOT, SANITIZER_MARKERS, Daemon, child_env, run_python,
                             sanitizer_report, workdir)

# the package under test, against the library of the build under test
os.environ["LOADERD_LIBRARY"] = LIBLOADER
os.environ.pop("RANK", None)
os.environ.pop("LOADERD_SOCKET", None)
os.environ.pop("WORLD_SIZE", None)
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)
os.environ["PYTHONPATH"] = PYDIR + (os.pathsep + os.environ["PYTHONPATH"]
                                    if os.environ.get("PYTHONPATH") else "")


@pytest.fixture
def ld(workdir):
    d = Daemon(workdir)
    yield d
    gc.collect()
    d.stop()


def pytest_configure(config):
    config.addinivalue_line("markers", "install: pip-installs client/python into a fresh venv "
                                       "(needs PyPI for numpy)")


# A sanitizer runtime in this process (the sanitizer builds' pytest-python):
# loaderd.DataLoader's default context then starts the workers' host by exec,
# not by fork (docs/python.md, "Who runs what, and for how long"), so what
# only a forked host does (the trainer's own objects, unpickled) is not there.
def _sanitized():
    from loaderd import _pystart
    return _pystart.sanitizer_runtime() is not None


needs_forked_host = pytest.mark.skipif(
    _sanitized(), reason="a sanitizer runtime: the default context starts the workers' host "
                         "by exec (its allocator is not fork-safe with threads)")

