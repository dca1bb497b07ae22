# SPDX-License-Identifier: MIT
"""Slabs are written by the daemon alone (daemon/engine/slab.c): a client that
reopens its slab's memfd read-write through /proc (a memfd's inode is mode
0777) can neither map it writable and shared nor write() it; its own
copy-on-write writes never reach another client."""

import ctypes
import errno
import mmap
import os

import numpy as np

import loaderd


def _slab_paths():
    """Paths that reopen this process's loaderd slabs: an fd of the memfd if
    libloader keeps one, else the mapping's /proc/self/map_files entry."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            t = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if t.startswith("/memfd:loaderd:"):
            out.append(f"/proc/self/fd/{fd}")
    if out:
        return out
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:loaderd:" in line:
                out.append("/proc/self/map_files/" + line.split()[0])
    return out


def test_reopened_slab_cannot_be_written(ld, workdir):
    t = np.arange(40000, dtype=np.uint16) % 50000
    p = os.path.join(workdir, "tok.bin")
    t.tofile(p)
    spec = {"name": "sealed", "source": {"kind": "tokens", "path": p, "dtype": "uint16",
                                         "seq_len": 64}, "batch_size": 8, "shuffle": False}
    a = loaderd.DataLoader(spec, socket=ld.socket, mode="broadcast", as_numpy=True, timeout=20)
    b = loaderd.DataLoader("sealed", socket=ld.socket, mode="broadcast", as_numpy=True, timeout=20)
    paths = _slab_paths()
    assert paths, "no loaderd slab found in this process"
    for path in paths:
        fd = os.open(path, os.O_RDWR)       # allowed: the memfd's inode is 0777
        try:
            size = os.fstat(fd).st_size
            try:
                mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                raise AssertionError(f"{path}: mapped writable and shared")
            except PermissionError as e:
                assert e.errno == errno.EPERM
            try:
                os.pwrite(fd, b"\xff" * 64, 0)
                raise AssertionError(f"{path}: write() went through")
            except PermissionError as e:
                assert e.errno == errno.EPERM
            try:
                os.ftruncate(fd, 0)
                raise AssertionError(f"{path}: truncated")
            except PermissionError as e:
                assert e.errno == errno.EPERM
        finally:
            os.close(fd)
    # both clients still read exact batches
    for k in range(20):
        x, y = a.next_batch(), b.next_batch()
        for batch in (x, y):
            i = batch.index
            want = t[i * 8 * 64:(i + 1) * 8 * 64].reshape(8, 64).astype(np.int64)
            np.testing.assert_array_equal(np.asarray(batch["input"]), want)
    a.close()
    b.close()
