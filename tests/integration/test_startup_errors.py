# SPDX-License-Identifier: MIT
"""loaderd refusing to start: the message names what failed, and nothing leaks.

Every failure of server_new() must fill in the message main prints (it used to
print an uninitialised buffer when, e.g., lstat of the socket path failed), and
must free what it set up: the handles it put on the loop are closed and the
server freed in their close callbacks (a sanitizer build checks for leaks;
ASAN_OPTIONS=detect_leaks=1 is forced here, and harmless without one).
"""

import os
import signal
import subprocess

from ldrtest import LOADERD, REPO_ROOT, sanitizer_report


def _env():
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=1"
    env["LSAN_OPTIONS"] = ("suppressions=" + os.path.join(REPO_ROOT, "tests", "lsan.supp") +
                           ":print_suppressions=0")
    env["LOADERD_NO_LISTENER_WATCHDOG"] = "1"
    return env


def _run(path, timeout=30):
    return subprocess.run([LOADERD, "--socket", path, "--workers", "1"], capture_output=True,
                          text=True, timeout=timeout, env=_env(), stdin=subprocess.DEVNULL)


def test_socket_path_under_a_regular_file(workdir):
    f = os.path.join(workdir, "file")
    open(f, "w").close()
    path = os.path.join(f, "ld.sock")
    r = _run(path)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr == f"loaderd: cannot use socket path {path}: Not a directory\n", repr(r.stderr)


def test_fd_channel_path_under_a_regular_file_frees_everything(workdir):
    """The nng socket path is fine, its .fds is not: fails after the loop
    handles and the engine exist, which must all be closed and freed."""
    path = os.path.join(workdir, "ld.sock")
    os.mkdir(path + ".fds")
    os.mkdir(os.path.join(path + ".fds", "x"))   # a directory: not a socket
    r = _run(path)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr == f"loaderd: {path}.fds exists and is not a socket\n", repr(r.stderr)
    assert not os.path.exists(path)


def test_listener_failure_frees_everything(workdir):
    """nng cannot bind the listener's temporary name (a directory holds it):
    the socket, the fd channel, the engine and the handles are all undone."""
    path = os.path.join(workdir, "ld.sock")
    os.mkdir(path + ".0")
    os.mkdir(os.path.join(path + ".0", "x"))     # unlink() of it fails
    r = _run(path)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr.startswith(f"loaderd: cannot listen on {path}: "), repr(r.stderr)
    assert r.stderr.count("\n") == 1, repr(r.stderr)
    assert not os.path.exists(path) and not os.path.exists(path + ".fds")


def test_start_stop_leaks_nothing(workdir):
    """A plain start and SIGTERM: exit 0 with no (leak) report."""
    path = os.path.join(workdir, "ld.sock")
    p = subprocess.Popen([LOADERD, "--socket", path, "--workers", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=_env())
    try:
        for _ in range(200):
            if os.path.exists(path) and os.path.exists(path + ".fds"):
                break
            if p.poll() is not None:
                break
            subprocess.run(["sleep", "0.05"])
        assert p.poll() is None, p.stdout.read()
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, out
    assert sanitizer_report(out) is None, out
    assert not os.path.exists(path)


def _sanitized():
    out = subprocess.run(["ldd", LOADERD], capture_output=True, text=True).stdout
    return "libasan" in out or "libtsan" in out


def test_out_of_files_at_every_step_exits_cleanly(workdir):
    """Too few file descriptors for the event loop, its handles, the fd
    channel, nng or the listener: from 6 (libuv itself aborts in its one-time
    setup below that) up to the first limit it starts with, each run exits 1
    with one line that says files ran out, never a crash, and leaves no socket
    behind (a warning before the last line is fine). The loop's and the
    handles' results used to be ignored: with 6 to 8 it aborted or crashed in
    libuv."""
    import resource
    import pytest
    if _sanitized():
        pytest.skip("the sanitizer runtime needs file descriptors of its own")
    started = None
    for n in range(6, 64):
        path = os.path.join(workdir, f"n{n}.sock")
        p = subprocess.Popen([LOADERD, "--socket", path, "--workers", "1"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=_env(), stdin=subprocess.DEVNULL,
                             preexec_fn=lambda n=n: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)))
        try:
            for _ in range(400):
                if p.poll() is not None or (os.path.exists(path) and os.path.exists(path + ".fds")):
                    break
                subprocess.run(["sleep", "0.05"])
            if p.poll() is None:
                started = n
                p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        if started is not None:
            assert p.returncode == 0, (n, err)
            break
        assert p.returncode == 1, (n, p.returncode, err)
        lines = err.splitlines()
        assert lines and all(ln.startswith("loaderd: ") for ln in lines), (n, err)
        assert "too many open files" in lines[-1].lower() or "out of files" in lines[-1].lower(), \
            (n, err)
        for suffix in ("", ".fds", ".workers"):
            assert not os.path.exists(path + suffix), (n, suffix, err)
    assert started is not None and started > 6, started
