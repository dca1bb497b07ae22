# SPDX-License-Identifier: MIT
"""Fixtures of the Python package tests (tests/python).

Binaries and libloader come from $LOADERD_BUILD (default <repo>/build); the
package from <repo>/client/python. Each test gets a private directory
/tmp/ldr-XXXX and, through the `ld` fixture, its own daemon there. On
teardown the daemon gets SIGTERM and must exit 0 without a sanitizer report.

Sanitizer pass: scripts/test runs this suite with LD_PRELOAD=libasan (the
ASan-built libloader.so needs the runtime first) and ASAN_OPTIONS for the
Python process; the daemon and loaderctl get $LOADERD_CHILD_ASAN_OPTIONS and
no LD_PRELOAD (they are linked with the runtime themselves).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(TESTS_DIR))
BUILD_DIR = os.environ.get("LOADERD_BUILD") or os.path.join(REPO_ROOT, "build")
LOADERD = os.path.join(BUILD_DIR, "daemon", "loaderd")
LOADERCTL = os.path.join(BUILD_DIR, "client", "loaderctl")
LIBLOADER = os.path.join(BUILD_DIR, "client", "libloader.so")
PYDIR = os.path.join(REPO_ROOT, "client", "python")
EXAMPLES = os.path.join(REPO_ROOT, "examples")
SANITIZER_MARKERS = ("AddressSanitizer", "LeakSanitizer", "runtime error:",
                     "UndefinedBehaviorSanitizer")

# the package under test, against the library of the build under test
os.environ["LOADERD_LIBRARY"] = LIBLOADER
os.environ.pop("RANK", None)
os.environ.pop("LOADERD_SOCKET", None)
os.environ.pop("WORLD_SIZE", None)
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)
os.environ["PYTHONPATH"] = PYDIR + (os.pathsep + os.environ["PYTHONPATH"]
                                    if os.environ.get("PYTHONPATH") else "")


def child_env(extra=None):
    """Environment of the daemon and loaderctl: no LD_PRELOAD, their own ASAN_OPTIONS."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if "LOADERD_CHILD_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["LOADERD_CHILD_ASAN_OPTIONS"]
    if extra:
        env.update(extra)
    return env


def sanitizer_report(text):
    for m in SANITIZER_MARKERS:
        if m in text:
            return m
    return None


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="ldr-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Daemon:
    def __init__(self, workdir, workers=2, args=()):
        for p in (LOADERD, LOADERCTL, LIBLOADER):
            if not os.path.exists(p):
                pytest.fail(f"not built: {p} (run scripts/build, or set LOADERD_BUILD)", pytrace=False)
        self.dir = workdir
        self.socket = os.path.join(workdir, "ld.sock")
        self.log_path = os.path.join(workdir, "loaderd.log")
        self._log = open(self.log_path, "w")
        self.cmd = [LOADERD, "--socket", self.socket, "--workers", str(workers)] + list(args)
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=child_env())
        self.stopped = False
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"loaderd exited {self.proc.returncode}:\n{self.log()}")
            r = subprocess.run([LOADERCTL, "--socket", self.socket, "status"], capture_output=True,
                               env=child_env(), timeout=30)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"loaderd not ready:\n{self.log()}")
            time.sleep(0.05)

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def ctl(self, *args, check=True):
        r = subprocess.run([LOADERCTL, "--socket", self.socket] + [str(a) for a in args],
                           capture_output=True, text=True, env=child_env(), timeout=60)
        m = sanitizer_report(r.stderr)
        assert m is None, f"loaderctl printed a {m} report:\n{r.stderr}"
        if check:
            assert r.returncode == 0, f"loaderctl {args}: exit {r.returncode}\n{r.stderr}"
        return r

    def status(self):
        """`loaderctl --json status` minus loaderctl's own client entry."""
        p = subprocess.Popen([LOADERCTL, "--socket", self.socket, "--json", "status"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=child_env())
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        st = json.loads(out)
        st["clients"] = [c for c in st["clients"] if c.get("pid") != p.pid]
        return st

    def pipeline(self, name):
        for p in self.status()["pipelines"]:
            if p["name"] == name:
                return p
        raise AssertionError(f"no pipeline {name}")

    def leases(self):
        """Leases held by clients of this (test) process."""
        return sum(c["leases"] for c in self.status()["clients"] if c["pid"] == os.getpid())

    def wait_for(self, pred, what, timeout=5.0):
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            st = self.status()
            if pred(st):
                return st
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}:\n{json.dumps(st, indent=1)}")

    def kill9(self):
        self.stopped = True
        self.proc.kill()
        self.proc.wait()
        self._log.close()

    def stop(self):
        if self.stopped:
            return
        self.stopped = True
        if self.proc.poll() is not None:
            self._log.close()
            raise AssertionError(f"loaderd died during the test ({self.proc.returncode}):\n{self.log()}")
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"loaderd did not stop on SIGTERM:\n{self.log()}")
        finally:
            self._log.close()
        log = self.log()
        assert rc == 0, f"loaderd exited {rc}:\n{log}"
        m = sanitizer_report(log)
        assert m is None, f"loaderd printed a {m} report:\n{log}"


@pytest.fixture
def ld(workdir):
    d = Daemon(workdir)
    yield d
    import gc
    gc.collect()
    d.stop()


def run_python(code_or_args, env=None, timeout=120, cwd=None):
    """Run the machine's python (this interpreter) with the package importable."""
    args = [sys.executable] + (["-c", code_or_args] if isinstance(code_or_args, str) else
                               list(code_or_args))
    e = dict(os.environ)
    if env:
        e.update(env)
    r = subprocess.run(args, capture_output=True, text=True, env=e, timeout=timeout, cwd=cwd)
    m = sanitizer_report(r.stderr)
    assert m is None, f"python printed a {m} report:\n{r.stderr}"
    return r


def pytest_configure(config):
    config.addinivalue_line("markers", "install: pip-installs client/python into a fresh venv "
                                       "(needs PyPI for numpy)")
