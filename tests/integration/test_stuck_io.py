# SPDX-License-Identifier: MIT
"""SIGTERM with worker threads stuck in a read that never returns (issue 13,
"SIGTERM stops the daemon within a bounded time even with workers stuck in
I/O"; docs/reliability.md).

A real FUSE file system (python3-fusepy over /dev/fuse, mounted in the test's
directory, direct_io so that nothing is served from the page cache) serves a
tokens file whose reads hang once the test says so: the daemon's workers are
then inside pread() of a file that does not answer, as with a hung NFS or
FUSE mount. The daemon must still stop on SIGTERM: it waits 5 s for its
workers, says how many it leaves, removes its sockets and exits (status 0
once the kernel lets the stuck threads go).
"""

import os
import platform
import signal
import textwrap
import time

import pytest
from ldrtest import fuse_mount

FS = textwrap.dedent("""
    import errno, os, stat, sys, time
    from fusepy import FUSE, Operations, FuseOSError
    HANG = sys.argv[2]
    SIZE = 4 << 20

    class Hang(Operations):
        def getattr(self, path, fh=None):
            now = time.time()
            if path == "/":
                return dict(st_mode=stat.S_IFDIR | 0o755, st_nlink=2, st_ctime=now,
                            st_mtime=now, st_atime=now)
            if path == "/t.bin":
                return dict(st_mode=stat.S_IFREG | 0o644, st_nlink=1, st_size=SIZE,
                            st_ctime=now, st_mtime=now, st_atime=now)
            raise FuseOSError(errno.ENOENT)
        def readdir(self, path, fh):
            return [".", "..", "t.bin"]
        def open(self, path, flags):
            return 0
        def read(self, path, size, offset, fh):
            while os.path.exists(HANG):
                time.sleep(0.1)
            size = max(0, min(size, SIZE - offset))
            return bytes((offset + i) % 251 for i in range(size))

    FUSE(Hang(), sys.argv[1], foreground=True, direct_io=True)
""")


@pytest.fixture
def hung_fs(workdir):
    mnt = os.path.join(workdir, "mnt")
    hang = os.path.join(workdir, "hang")
    with fuse_mount(workdir, FS, mnt, "t.bin", hang):
        yield mnt, hang
        if os.path.exists(hang):
            os.unlink(hang)


# pread64's number, for the /proc/PID/task/TID/syscall of a thread inside it
PREAD64 = {"x86_64": 17, "aarch64": 67}


def threads_in_pread(pid):
    """How many threads of @pid are inside pread() now."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                n += f.read().split()[0] == str(PREAD64[platform.machine()])
        except (OSError, IndexError):
            pass
    return n


def test_sigterm_with_workers_stuck_in_a_read(daemon, hung_fs):
    if platform.machine() not in PREAD64:
        pytest.skip(f"pread64's syscall number on {platform.machine()} is not listed here")
    mnt, hang = hung_fs
    d = daemon()
    d.create({"name": "hung", "source": {"kind": "tokens", "path": os.path.join(mnt, "t.bin"),
                                         "seq_len": 4096}, "batch_size": 8, "epochs": 0})
    # the file reads fine until the test hangs it
    assert d.consume("hung", "--batches", "4", dump=False).rc == 0
    with open(hang, "w"):
        pass
    c = d.popen_consume("hung", "--batches", "1000000", dump=False)
    # once it reads (before, the slots may be full of batches built before the
    # hang, and idle workers would produce nothing either)...
    d.wait_for(lambda s: any(cl["pid"] == c.pid and cl["attachments"] for cl in s["clients"]),
               "the consumer attached", timeout=60)
    # ...both workers end up inside pread() of the hung file: nothing more is produced
    deadline = time.monotonic() + 60
    while threads_in_pread(d.pid) < 2:
        assert time.monotonic() < deadline, \
            f"{threads_in_pread(d.pid)} of the daemon's 2 workers inside pread() after 60 s"
        time.sleep(0.05)
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    deadline = t0 + 60
    while "loaderd: notice: stopped" not in d.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    took = time.monotonic() - t0
    log = d.log()
    assert "loaderd: notice: stopped" in log, log
    # both, as both were inside pread()
    assert "stopping: 2 worker threads are still reading after 5000 ms (a dataset file that " \
           "does not answer: a hung network or FUSE mount?); exiting without them" in log, log
    # the daemon is done: its sockets are gone, a new one could start now
    for p in (d.socket, d.socket + ".fds", d.socket + ".workers"):
        assert not os.path.exists(p), p
    # the kernel lets a thread out of a FUSE read only once the file system
    # answers (or its connection is aborted): until then the process is a
    # zombie whose stuck threads hold it; then it is reaped with status 0
    with open(f"/proc/{d.pid}/status") as f:
        state = [line.split()[1] for line in f if line.startswith("State:")][0]
    assert state in ("Z", "S", "D"), state
    os.unlink(hang)
    log = d.stop(signal.SIGTERM, timeout=60, reap_first=False)
    c.proc.kill()
    c.proc.wait()
    print(f"stopped {took:.1f} s after SIGTERM (process state then: {state})")
