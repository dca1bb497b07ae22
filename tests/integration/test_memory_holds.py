# SPDX-License-Identifier: MIT
"""Slabs that clients still hold after their pipeline was dropped (issue 13):
they stay in --memory-limit until the holder lets go (daemon/engine/holds.c,
docs/security.md "Memory that clients hold").

A real daemon with an 8 MiB limit; a Python process (the loaderd package over
the build's libloader) attaches to a 5 MiB pipeline, reads a batch, keeps the
slab (a dup of the memfd, or only a mapping of it) and detaches; the pipeline
is dropped. A create that fits only if that slab were free is refused with the
holder's uid and pid, the holder's uid may not attach (above
max_held_after_drop, by default a quarter of the limit); once the holder exits
(or closes what it kept) the same create succeeds.
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from ldrtest import python_client_env, random_tokens, token_spec, wait_log

LIMIT = 8 << 20
MIB = 1 << 20

HOLDER = textwrap.dedent("""
    import mmap, os, sys
    import loaderd
    sock, name, keep = sys.argv[1:4]
    dl = loaderd.DataLoader(name, socket=sock, as_numpy=True)
    b = next(iter(dl))
    fds = []
    for f in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + f).startswith("/memfd:loaderd:" + name):
                fds.append(int(f))
        except OSError:
            pass
    assert len(fds) == 1, fds
    kept = os.dup(fds[0])
    m = None
    if keep == "map":
        m = mmap.mmap(kept, 0, prot=mmap.PROT_READ)
        os.close(kept)
    elif keep == "none":
        os.close(kept)
    elif keep == "unlock":
        # lift the daemon's lock on this description (l_type F_UNLCK, whole file)
        import fcntl, struct
        fcntl.fcntl(kept, fcntl.F_OFD_SETLK, struct.pack("hhxxxxqqixxxx", fcntl.F_UNLCK, 0, 0, 0, 0))
    del b
    dl.close()
    print("holding", flush=True)
    line = sys.stdin.readline()
    if line.strip() == "release":
        if m is not None:
            m.close()
        elif keep == "fd":
            os.close(kept)
        print("released", flush=True)
        sys.stdin.readline()
""")


class Holder:
    def __init__(self, d, name, keep):
        self.p = subprocess.Popen([sys.executable, "-c", HOLDER, d.socket, name, keep],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=python_client_env())
        line = self.p.stdout.readline()
        assert line == "holding\n", f"holder: {line!r}\n{self.p.stderr.read()}\n{d.log()[-3000:]}"
        self.pid = self.p.pid

    def release(self):
        self.p.stdin.write("release\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline() == "released\n"

    def exit(self):
        self.p.stdin.close()
        assert self.p.wait(timeout=30) == 0, self.p.stderr.read()


@pytest.fixture
def setup(daemon, workdir):
    d = daemon(memory_limit=LIMIT)
    data = os.path.join(workdir, "tok.bin")
    random_tokens(data, 1 << 16)
    # 64 rows of input and target, 1024 int64 each: 1 MiB a slot; 5 slots
    big = lambda name: token_spec(name, data, 1024, "uint16", batch_size=64, prefetch=5)  # noqa: E731
    small = token_spec("small", data, 16, "uint16", batch_size=4, prefetch=2)
    d.create(small)
    return d, big


def _slab(d, name):
    p = d.pipeline(name)
    return p["slots_total"] * p["slot_bytes"]


@pytest.mark.parametrize("keep", ["fd", "map"])
def test_held_slab_counts_until_holder_exits(setup, keep):
    d, big = setup
    d.create(big("a"))
    slab = _slab(d, "a")
    assert slab == 5 * MIB
    small = _slab(d, "small")
    h = Holder(d, "a", keep)
    d.ctl("drop", "a")
    st = d.status()
    assert st["memory_used"] == small + slab
    assert st["memory_held_after_drop"] == slab
    assert st["held_after_drop"] == [{"uid": os.getuid(), "bytes": slab, "pids": [h.pid],
                                      "pipelines": ["a"]}]
    assert st["max_held_after_drop"] == LIMIT // 4
    assert "slab.release" not in d.log()

    # the same spec again does not fit: 5 MiB of the 8 are still mapped
    r = d.create(big("b"), check=False)
    assert r.returncode != 0
    free = LIMIT - small - slab
    assert (f"memory limit: pipeline 'b' needs {slab} bytes (5 slots of {MIB}), {free} of "
            f"{LIMIT} bytes are free (--memory-limit); {slab} bytes are held by slabs of dropped "
            f"pipelines still mapped by uid {os.getuid()} (pid {h.pid})") in r.stderr, r.stderr

    # its uid holds 5 MiB > 2 MiB: it may not attach to anything meanwhile
    r = d.ctl("consume", "small", "--batches", "1", check=False)
    assert r.returncode != 0
    assert (f"attach: uid {os.getuid()} (pid {h.pid}) holds {slab} bytes of slabs of dropped "
            f"pipelines still mapped, above max_held_after_drop of {LIMIT // 4} bytes: detach "
            f"from them (ldr_detach) or end those processes first") in r.stderr, r.stderr

    h.exit()
    d.create(big("b"))          # tested at once, no timer needed
    st = d.status()
    assert st["memory_used"] == small + slab
    assert st["memory_held_after_drop"] == 0
    assert st["held_after_drop"] == []
    assert f"slab.release pipeline=a bytes={slab} " in d.log()
    d.consume("small", "--batches", "1")


def test_released_while_running(setup):
    """A holder that closes what it kept lets go without exiting; one that
    kept nothing past its detach never held anything after the drop."""
    d, big = setup
    d.create(big("a"))
    slab = _slab(d, "a")
    h = Holder(d, "a", "fd")
    none = Holder(d, "small", "none")
    d.ctl("drop", "a")
    assert d.status()["memory_held_after_drop"] == slab
    h.release()
    d.wait_for(lambda st: st["memory_held_after_drop"] == 0, "the slab let go", timeout=5)
    d.create(big("b"))
    d.ctl("drop", "--force", "small")
    st = d.status()
    assert st["memory_held_after_drop"] == 0
    assert st["memory_used"] == slab
    h.exit()
    none.exit()


def test_dropped_while_attached(setup):
    """A force drop under a reader: the slab stays counted while the reader
    maps it, and is let go when it exits."""
    d, big = setup
    d.create(big("a"))
    slab = _slab(d, "a")
    h = Holder(d, "a", "map")
    d.ctl("drop", "--force", "a")
    st = d.status()
    assert st["memory_held_after_drop"] == slab
    h.exit()
    d.wait_for(lambda st: st["memory_held_after_drop"] == 0 and st["memory_used"] == _slab(d, "small"),
               "the slab let go", timeout=5)


def test_max_held_after_drop_config(daemon, workdir):
    cfg = os.path.join(workdir, "ld.json")
    with open(cfg, "w") as f:
        f.write('{"max_held_after_drop": "1.5M"}')
    d = daemon("--config", cfg, memory_limit=LIMIT)
    assert d.status()["max_held_after_drop"] == 3 * MIB // 2
    with open(cfg, "w") as f:
        f.write('{"max_held_after_drop": 0}')
    r = subprocess.run([d.cmd[0], "--config", cfg, "--socket", os.path.join(workdir, "x.sock")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert (f"{cfg}: max_held_after_drop: must be bytes or a size like \"1G\"") in r.stderr, r.stderr


def test_lifted_lock_still_counts(setup):
    """A holder that lifts its hold's lock but keeps the fd still holds: /proc
    says it has the file."""
    d, big = setup
    d.create(big("a"))
    slab = _slab(d, "a")
    h = Holder(d, "a", "unlock")
    d.ctl("drop", "a")
    # the 1 s timer ran and looked in /proc: it says so
    wait_log(d, f"pid {h.pid} (uid {os.getuid()}) lifted its hold's lock but still has the slab: "
             f"it holds it while it has it", "the timer's look at the unlocked hold")
    st = d.status()
    assert st["memory_held_after_drop"] == slab
    assert st["held_after_drop"][0]["pids"] == [h.pid]
    assert d.create(big("b"), check=False).returncode != 0
    h.exit()
    d.create(big("b"))
