# SPDX-License-Identifier: MIT
"""The batch ring (docs/protocol.md, "The batch ring"): host attachments take
their deliveries out of shared memory and put their releases there. A client
that scribbles on its own ring (a lease it was not given, a release head
that moves back or far past the ring, a delivery tail past what was written)
is detached with an error naming what was wrong, in its next() and in the
daemon's log, while another client of the same broadcast stream reads it
exactly to the end; a client killed holding batches gives its leases back;
another Unix user can neither open nor map a ring that is not its own; and
$LOADERD_RING=0 takes the socket's batch path, with the same stream."""

import json
import os
import signal
import subprocess

import pytest

from ldrtest import python_client_env, random_tokens, sequential_batches, token_dump, token_spec
from users import open_to_all, shared_config, users  # noqa: F401 (fixture)

L = 16
N = 400          # samples
BS = 8           # 50 batches

# The client: attach to broadcast pipeline argv[2], take 3 batches, then do
# argv[3] to its own ring (found in /proc/self/fd: the memfd, and its eventfd
# right after it, as the fd channel brings them), wake the daemon, and report
# what its next() says.
CLIENT = r"""
import json, mmap, os, struct, sys, time
import loaderd
sock, name, kind = sys.argv[1:4]
dl = loaderd.DataLoader(name, socket=sock, timeout=20, as_numpy=True, mode="broadcast")
it = iter(dl)
batches = [next(it) for _ in range(3)]
if kind != "hold":
    for b in batches:
        b.release()
rings = []
for f in os.listdir("/proc/self/fd"):
    try:
        if os.readlink("/proc/self/fd/" + f).startswith("/memfd:loaderd-ring"):
            rings.append(int(f))
    except OSError:
        pass
assert len(rings) == 1, rings
fd = rings[0]
efd = fd + 1
assert os.readlink("/proc/self/fd/%d" % efd) == "anon_inode:[eventfd]"
m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
get = lambda off: struct.unpack_from("<Q", m, off)[0]
put = lambda off, v: struct.pack_into("<Q", m, off, v)
dcap, rcap = struct.unpack_from("<II", m, 8)
D_HEAD, R_TAIL, D_TAIL, R_HEAD, RELS = 64, 72, 128, 136, 20480 + dcap * 64
if kind == "hold":
    print(json.dumps({"pid": os.getpid(), "fd": fd}), flush=True)
    time.sleep(600)
# the three leases back and read: the library has nothing more to write
deadline = time.monotonic() + 10
while get(R_TAIL) != 3 and time.monotonic() < deadline:
    time.sleep(0.01)
t = get(R_TAIL)
assert t == 3 == get(R_HEAD), (t, get(R_HEAD))
if kind == "lease":
    put(RELS + 8 * (t % rcap), 987654321)
    put(R_HEAD, t + 1)
elif kind == "backwards":
    put(R_HEAD, t - 1)
elif kind == "huge":
    put(R_HEAD, t + (1 << 40))
elif kind == "tail":
    h = get(D_HEAD)          # read once: the daemon may write more right after
    put(D_TAIL, h + 5)
facts = {"r_tail": t, "d_head": h if kind == "tail" else get(D_HEAD), "rcap": rcap}
os.eventfd_write(efd, 1)
# until the daemon has read it (the next release would overwrite it)
c = loaderd.Client(sock)
deadline = time.monotonic() + 10
while time.monotonic() < deadline and not any(
        "error" in a for x in c.status()["clients"] if x["pid"] == os.getpid()
        for a in x["attachments"]):
    time.sleep(0.01)
try:
    for _ in range(100):
        next(it)
    facts["error"] = None
except loaderd.Error as e:
    facts["error"] = str(e)
print(json.dumps(facts), flush=True)
"""


def expected_error(kind, f):
    if kind == "lease":
        return (r"batch ring: release: no lease 987654321 on attachment \d+ "
                r"\(not delivered to it, or released already\)")
    if kind == "backwards":
        return (f"batch ring: the release head moved back to {f['r_tail'] - 1}, "
                f"below the {f['r_tail']} releases read")
    if kind == "huge":
        return (f"batch ring: the release head {f['r_tail'] + (1 << 40)} is {1 << 40} entries past "
                f"the {f['r_tail']} read, beyond the ring's {f['rcap']}")
    # the daemon may have written one more meanwhile: still fewer than the tail
    return (f"batch ring: the delivery tail {f['d_head'] + 5} is past the "
            f"({'|'.join(str(f['d_head'] + i) for i in range(5))}) deliveries written")


def stream(ld, workdir, name):
    path = os.path.join(workdir, "tok.bin")
    tok = random_tokens(path, N * L + 1, "uint16", seed=5)
    ld.create(token_spec(name, path, L, "uint16", batch_size=BS, min_clients=2, prefetch=4))
    return token_dump(tok, L, sequential_batches(N, BS))


def client(ld, name, kind, **kw):
    return subprocess.Popen(["/usr/bin/python3", "-c", CLIENT, ld.socket, name, kind],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=python_client_env(), **kw)


@pytest.mark.parametrize("kind", ["lease", "backwards", "huge", "tail"])
def test_garbage_in_a_ring_detaches_only_its_client(ld, workdir, kind):
    import re
    expected = stream(ld, workdir, "bc")
    other = ld.popen_consume("bc")
    bad = client(ld, "bc", kind)
    out, err = bad.communicate(timeout=120)
    assert bad.returncode == 0, err
    facts = json.loads(out.strip().splitlines()[-1])
    want = expected_error(kind, facts)
    assert facts["error"] is not None and re.search(want, facts["error"]), (facts, want)
    log = ld.log()
    assert "client.ring_garbage" in log and re.search(want + "; the attachment is detached", log), log
    r = other.wait(check=True)
    assert r.dump == expected, "the other client's stream is not exact"
    assert ld.alive()


def test_killed_client_gives_its_ring_leases_back(ld, workdir):
    expected = stream(ld, workdir, "bk")
    other = ld.popen_consume("bk")
    holder = client(ld, "bk", "hold")
    info = json.loads(holder.stdout.readline())
    st = ld.status()
    mine = [a for c in st["clients"] if c["pid"] == info["pid"] for a in c["attachments"]]
    assert len(mine) == 1 and mine[0]["ring"] is True and mine[0]["leases"] >= 1, mine
    holder.send_signal(signal.SIGKILL)
    holder.communicate(timeout=30)
    r = other.wait(check=True)
    assert r.dump == expected
    ld.wait_for(lambda s: all(c["pid"] != info["pid"] for c in s["clients"]), "the killed client gone")


def test_socket_path_when_asked(ld, workdir):
    """LOADERD_RING=0: the attachment has no ring, the stream is the same."""
    expected = stream(ld, workdir, "sk")
    env = python_client_env()
    env["LOADERD_RING"] = "0"
    code = ("import json, os, sys, loaderd\n"
            "c = loaderd.Client(sys.argv[1])\n"
            "dl = loaderd.DataLoader('sk', socket=sys.argv[1], timeout=20, as_numpy=True, mode='broadcast')\n"
            "it = iter(dl); b = next(it)\n"
            "st = c.status()\n"
            "print(json.dumps([a['ring'] for x in st['clients'] if x['pid'] == os.getpid()\n"
            "                  for a in x['attachments']]))\n"
            "n = 1 + sum(1 for _ in it)\n"
            "print(n)\n")
    a = ld.popen_consume("sk")
    p = subprocess.run(["/usr/bin/python3", "-c", code, ld.socket], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    rings, n = p.stdout.split("\n")[:2]
    assert json.loads(rings) == [False] and int(n) == N // BS
    assert a.wait(check=True).dump == expected


def test_another_user_cannot_open_a_ring(daemon, workdir, users):  # noqa: F811
    """Alice's client holds its ring; bob can open neither her process's fd
    of it nor the daemon's (a memfd has no path: /proc/PID/fd is the only
    way in, and it is closed to other users)."""
    alice, bob = users
    d = daemon("--config", shared_config(workdir))
    open_to_all(workdir)
    path = os.path.join(workdir, "tok.bin")
    random_tokens(path, N * L + 1, "uint16", seed=5)
    os.chmod(path, 0o644)
    d.create(token_spec("ab", path, L, "uint16", batch_size=BS, epochs=0, access="all"))
    holder = subprocess.Popen(["/usr/bin/python3", "-c", CLIENT, d.socket, "ab", "hold"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              **alice.popen_kwargs(env=python_client_env()))
    try:
        info = json.loads(holder.stdout.readline())
        daemon_rings = [f for f in os.listdir(f"/proc/{d.proc.pid}/fd")
                        if os.readlink(f"/proc/{d.proc.pid}/fd/{f}").startswith("/memfd:loaderd-ring")]
        assert daemon_rings
        probe = ("import os, sys\n"
                 "for p in sys.argv[1:]:\n"
                 "    try:\n"
                 "        os.close(os.open(p, os.O_RDWR)); print('opened', p)\n"
                 "    except OSError as e:\n"
                 "        print(e.errno)\n")
        paths = [f"/proc/{info['pid']}/fd/{info['fd']}", f"/proc/{d.proc.pid}/fd/{daemon_rings[0]}"]
        r = bob.run(["/usr/bin/python3", "-c", probe, *paths])
        assert r.stdout.split() == ["13", "13"], r.stdout + r.stderr
    finally:
        holder.kill()
        holder.communicate(timeout=30)
