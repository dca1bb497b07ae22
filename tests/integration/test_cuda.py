# SPDX-License-Identifier: MIT
"""CUDA attach requests against the real daemon, on a machine with or without
a GPU (docs/gpu.md).

The driver is loaded only when a client asks for a CUDA device, from
$LOADERD_CUDA_LIBRARY when set: the toolkit's stub libcuda.so must give the
stub message, a path that does not exist the not-found message, and on the
same daemon host delivery must go on exactly as before. What needs a real GPU
skips itself, saying why.
"""

import ctypes
import glob
import json
import os
import subprocess
import time

import pytest

from ldrtest import BUILD_DIR, random_tokens, sequential_batches, token_dump, token_spec

L = 8
NO_CUDA_BUILD = "built without CUDA support"


def find_stub():
    """The CUDA toolkit's stub libcuda.so, or None."""
    env = os.environ.get("LOADERD_CUDA_STUB")
    if env:
        return env if os.path.isfile(env) else None
    roots = ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"))
    for root in roots:
        for sub in ("lib64/stubs", "lib/stubs", "targets/x86_64-linux/lib/stubs",
                    "targets/sbsa-linux/lib/stubs"):
            p = os.path.join(root, sub, "libcuda.so")
            if os.path.isfile(p):
                return p
    return None


def real_gpu():
    """None when this machine has a working CUDA driver and a device, else why not."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"no CUDA driver here ({e})"
    r = lib.cuInit(0)
    if r != 0:
        return f"cuInit failed with CUresult {r}"
    n = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value < 1:
        return "the CUDA driver reports no device"
    return None


def env_with(**kw):
    env = dict(os.environ)
    env.update(kw)
    return env


@pytest.fixture
def tokens(workdir):
    n = 64
    path = os.path.join(workdir, "t.bin")
    tok = random_tokens(path, n * L + 1, "uint16", seed=5)
    return path, tok, n


def make_pipeline(d, tokens):
    path, tok, n = tokens
    d.create(token_spec("p", path, L, "uint16", batch_size=8, epochs=1))
    return tok, n


def host_still_works(d, tok, n):
    res = d.consume("p")
    assert res.dump == token_dump(tok, L, sequential_batches(n, 8))
    assert res.json["batches"] == n // 8


def cuda_attach(d, device="cuda:0"):
    res = d.consume("p", "--device", device, check=False, timeout=60)
    assert res.rc == 1, f"consume --device {device} should fail on this daemon:\n" + res.describe()
    if NO_CUDA_BUILD in res.stderr:
        pytest.skip("loaderd was built without CUDA (-Dcuda=disabled or no cuda.h)")
    return res


def test_stub_library(daemon, tokens):
    stub = find_stub()
    if not stub:
        pytest.skip("no CUDA toolkit stub libcuda.so on this machine (set LOADERD_CUDA_STUB)")
    d = daemon(env=env_with(LOADERD_CUDA_LIBRARY=stub))
    tok, n = make_pipeline(d, tokens)
    # no CUDA request yet: the driver has not been touched
    assert "CUDA" not in d.log()
    res = cuda_attach(d)
    assert f"the CUDA driver at {stub} is the toolkit's stub library, not a real driver" in res.stderr, \
        res.describe()
    # the answer is remembered; another device index gets the same cause
    res = cuda_attach(d, "cuda:3")
    assert "stub library" in res.stderr, res.describe()
    assert "stub library" in d.log()
    host_still_works(d, tok, n)
    assert d.status()["clients"] == []


def test_driver_not_found(daemon, workdir, tokens):
    missing = os.path.join(workdir, "no-such-dir", "libcuda.so.1")
    d = daemon(env=env_with(LOADERD_CUDA_LIBRARY=missing))
    tok, n = make_pipeline(d, tokens)
    res = cuda_attach(d)
    assert f"CUDA driver not found: {missing}: " in res.stderr, res.describe()
    assert "No such file or directory" in res.stderr, res.describe()
    host_still_works(d, tok, n)
    # and again after host delivery
    res = cuda_attach(d)
    assert "CUDA driver not found" in res.stderr, res.describe()


def test_device_option_parsing(ld, tokens):
    tok, n = make_pipeline(ld, tokens)
    for bad in ("gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", ""):
        r = ld.ctl("consume", "p", "--device", bad, check=False)
        assert r.returncode == 2, f"--device {bad!r}: exit {r.returncode}\n{r.stderr}"
        assert "invalid device" in r.stderr
    r = ld.ctl("consume", "--help", check=False)
    assert "--device" in r.stdout
    # cpu is the host path, explicitly
    res = ld.consume("p", "--device", "cpu")
    assert res.dump == token_dump(tok, L, sequential_batches(n, 8))


def fake_driver():
    """The emulated driver tests/unit/gpu/fakecuda (built with -Dcuda), or None."""
    p = os.path.join(BUILD_DIR, "tests", "unit", "gpu", "libfakecuda.so")
    return p if os.path.exists(p) else None


def test_fake_driver_consume(daemon, tokens, monkeypatch):
    """The whole device path (engine, export, client mapping) over the emulated
    driver: loaderctl's checksum reads each batch's host copy, the daemon
    counts its device copies."""
    fake = fake_driver()
    if not fake:
        pytest.skip("no emulated CUDA driver (loaderd built without CUDA)")
    monkeypatch.setenv("LOADERD_CUDA_LIBRARY", fake)  # the daemon's and loaderctl's
    d = daemon()
    tok, n = make_pipeline(d, tokens)
    res = d.consume("p", "--device", "cuda:0")
    assert res.dump == token_dump(tok, L, sequential_batches(n, 8))
    # a VMM device slab goes with its last client (the clients' mappings keep
    # the memory for as long as they need it)
    assert d.pipeline("p")["devices"] == []
    st = d.status()["cuda"]
    assert st["driver"] == fake and st["devices"]["cuda:0"]["copies"] == n // 8
    text = d.ctl("status").stdout
    assert f"cuda: driver {fake}\n" in text, text
    assert f"  cuda:0  loaderd fake CUDA device 0 (host memory)  copies {n // 8} (" in text, text
    res = d.consume("p", "--device", "cuda:1", check=False)
    assert res.rc == 1 and "cuda:1 requested, 1 device present" in res.stderr, res.describe()


def test_fake_driver_attachment_does_not_follow_a_restart(daemon, workdir, tokens, monkeypatch):
    """A restarted daemon (docs/reliability.md, "Restart without killing
    training"): the client reconnects, but a CUDA attachment does not follow
    (its device slab was the old daemon's) and says so."""
    fake = fake_driver()
    if not fake:
        pytest.skip("no emulated CUDA driver (loaderd built without CUDA)")
    monkeypatch.setenv("LOADERD_CUDA_LIBRARY", fake)
    d1 = daemon()
    path, tok, n = tokens
    d1.create(token_spec("p", path, L, "uint16", batch_size=8, epochs=0))
    c = d1.popen_consume("p", "--device", "cuda:0", "--delay", "20", dump=False)
    d1.wait_for(lambda st: any(x["pid"] == c.pid and x["delivered"] > 0 for x in st["clients"]),
                "the CUDA client streaming")
    d1.kill9()
    daemon(socket=d1.socket)
    res = c.wait(timeout=60)
    assert res.rc == 1, res.describe()
    assert f"loaderd: reconnected to the daemon at {d1.socket} after" in res.stderr, res.describe()
    assert (f"(pipeline 'p') lost: the daemon at {d1.socket} restarted, and an attachment in CUDA "
            "device memory does not follow it (the device slab was the old daemon's): attach "
            "pipeline 'p' again") in res.stderr, res.describe()


def wait_cuinit_entered(log_path, proc, timeout=30.0):
    """Wait until the daemon's emulated driver logged its cuInit call
    (FAKECUDA_LOG: one line at each call's entry, before FAKECUDA_INIT_MS):
    the CUDA attach is then parked in cuInit. A client listed by status has
    only said Hello; its Attach, which starts cuInit, may still be on its way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(log_path) as f:
                if "cuInit\n" in f.read():
                    return
        except FileNotFoundError:
            pass
        assert proc.poll() is None, f"the CUDA client exited {proc.returncode} before cuInit"
        time.sleep(0.01)
    raise AssertionError(f"the daemon's driver did not enter cuInit within {timeout} s")


def test_slow_cuinit_does_not_stall_other_clients(daemon, workdir, tokens, monkeypatch):
    """cuInit runs off the loop: while a CUDA attach waits for a driver that
    takes 8 s to initialise, host clients are served."""
    fake = fake_driver()
    if not fake:
        pytest.skip("no emulated CUDA driver (loaderd built without CUDA)")
    monkeypatch.setenv("LOADERD_CUDA_LIBRARY", fake)
    trace = os.path.join(workdir, "fakecuda-daemon.log")
    # cuInit's length is the time the host create and consume below have to
    # finish in (slow.poll() below): 8 s, so that a loaded machine's slow
    # process starts do not pass for a stalled loop
    d = daemon(env=env_with(LOADERD_CUDA_LIBRARY=fake, FAKECUDA_INIT_MS="8000",
                            FAKECUDA_LOG=trace))
    tok, n = make_pipeline(d, tokens)
    cmd, _ = d.consume_cmd("p", "--device", "cuda:0", dump=False)
    slow = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the CUDA client's attach waits in cuInit before the host one starts
    wait_cuinit_entered(trace, slow)
    d.create(token_spec("q", tokens[0], L, "uint16", batch_size=8, epochs=1))
    res = d.consume("q")
    assert res.dump == token_dump(tok, L, sequential_batches(n, 8))
    assert slow.poll() is None, "the CUDA attach returned before cuInit could have ended"
    out, err = slow.communicate(timeout=60)
    assert slow.returncode == 0, err
    assert json.loads(out)["batches"] == n // 8, out


def test_stop_during_slow_cuinit(daemon, workdir, tokens, monkeypatch):
    fake = fake_driver()
    if not fake:
        pytest.skip("no emulated CUDA driver (loaderd built without CUDA)")
    monkeypatch.setenv("LOADERD_CUDA_LIBRARY", fake)
    trace = os.path.join(workdir, "fakecuda-daemon.log")
    # 3 s of cuInit: the SIGTERM below must come while it runs (the daemon
    # waits up to 5 s for it at a stop)
    d = daemon(env=env_with(LOADERD_CUDA_LIBRARY=fake, FAKECUDA_INIT_MS="3000",
                            FAKECUDA_LOG=trace))
    make_pipeline(d, tokens)
    cmd, _ = d.consume_cmd("p", "--device", "cuda:0", dump=False)
    slow = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # not "listed by status": that is its Hello, and a SIGTERM before its
    # Attach arrives would find no cuInit to wait for
    wait_cuinit_entered(trace, slow)
    # SIGTERM while the attach waits in cuInit: the daemon waits for it (a
    # while), then stops cleanly (exit 0, socket gone, no sanitizer report);
    # the client, cut off like every client at a stop, says so
    log = d.stop(reap_first=False)
    assert "CUDA driver loaded" in log, log
    out, err = slow.communicate(timeout=60)
    assert slow.returncode == 1, (out, err)
    assert any(m in err for m in ("daemon is shutting down", "no reply from the daemon",
                                  "disconnected from the daemon")), err


def test_fake_driver_no_device(daemon, tokens, monkeypatch):
    fake = fake_driver()
    if not fake:
        pytest.skip("no emulated CUDA driver (loaderd built without CUDA)")
    monkeypatch.setenv("LOADERD_CUDA_LIBRARY", fake)
    monkeypatch.setenv("FAKECUDA_DEVICES", "0")
    d = daemon()
    tok, n = make_pipeline(d, tokens)
    res = cuda_attach(d)
    assert "no CUDA device: cuInit: CUDA_ERROR_NO_DEVICE" in res.stderr, res.describe()
    why = res.stderr.split("consume: ", 1)[1].strip()
    assert d.status()["cuda"] == {"error": why, "devices": {}}
    assert f"cuda: unavailable: {why}\n" in d.ctl("status").stdout
    host_still_works(d, tok, n)


def test_real_gpu(daemon, tokens):
    why = real_gpu()
    if why:
        pytest.skip("needs a GPU: " + why)
    d = daemon()
    tok, n = make_pipeline(d, tokens)
    res = d.consume("p", "--device", "cuda:0", check=False, timeout=120)
    if res.rc != 0 and NO_CUDA_BUILD in res.stderr:
        pytest.skip("loaderd was built without CUDA")
    assert res.rc == 0, res.describe()
    assert res.dump == token_dump(tok, L, sequential_batches(n, 8))
    assert d.pipeline("p")["devices"][0]["copies"] == n // 8
    res = d.consume("p", "--device", "cuda:999", check=False, timeout=60)
    assert res.rc == 1 and "cuda:999 requested" in res.stderr, res.describe()
    host_still_works(d, tok, n)
