# SPDX-License-Identifier: MIT
"""Helpers shared by the examples: import loaderd from the source tree, start
a private daemon (unless $LOADERD_SOCKET names one), write small datasets."""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "client", "python"))
BUILD = os.environ.get("LOADERD_BUILD") or os.path.join(REPO, "build")
if "LOADERD_LIBRARY" not in os.environ and os.path.exists(os.path.join(BUILD, "client", "libloader.so")):
    os.environ["LOADERD_LIBRARY"] = os.path.join(BUILD, "client", "libloader.so")

QUICK = os.environ.get("LOADERD_EXAMPLE_QUICK") == "1"  # the tests run a shorter version


def workdir():
    d = tempfile.mkdtemp(prefix="ldr-ex-", dir="/tmp")
    atexit.register(shutil.rmtree, d, True)
    return d


def daemon(d, workers=2):
    """The socket of a daemon: $LOADERD_SOCKET, or a private one started here
    (and stopped at exit)."""
    if os.environ.get("LOADERD_SOCKET"):
        return os.environ["LOADERD_SOCKET"]
    sock = os.path.join(d, "loaderd.sock")
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if "LOADERD_CHILD_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["LOADERD_CHILD_ASAN_OPTIONS"]
    log = open(os.path.join(d, "loaderd.log"), "w")
    p = subprocess.Popen([os.path.join(BUILD, "daemon", "loaderd"), "--socket", sock,
                          "--workers", str(workers), "--log-level", "warning"],
                         stdout=log, stderr=subprocess.STDOUT, env=env)

    def stop():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    atexit.register(stop)
    deadline = time.monotonic() + 10
    while not os.path.exists(sock + ".fds") or not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"loaderd did not start: see {d}/loaderd.log")
        time.sleep(0.02)
    time.sleep(0.05)
    os.environ["LOADERD_SOCKET"] = sock  # for child processes
    return sock


def classification_npy(d, n=20000, features=32, classes=10, seed=0):
    """A generated classification set as two .npy files: x float32 [n, features],
    label int64 [n] (a random linear teacher with noise). Returns their paths."""
    import numpy as np
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((features, classes)).astype(np.float32)
    x = rng.standard_normal((n, features)).astype(np.float32)
    logits = x @ w + 0.5 * rng.standard_normal((n, classes)).astype(np.float32)
    label = logits.argmax(1).astype(np.int64)
    xp, lp = os.path.join(d, "x.npy"), os.path.join(d, "label.npy")
    np.save(xp, x)
    np.save(lp, label)
    return xp, lp
