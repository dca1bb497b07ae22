# SPDX-License-Identifier: MIT
"""What one user may take of the daemon, and what it may not do to its paths
(issue 29, items 5, 6, 9, 10 and 11; docs/security.md, "Bounds per user").

Real users where two are involved: ldr-alice and ldr-bob (users.py); the
tests and the daemon run as root, an admin.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest

from ldrtest import LOADERD, RawReq, npy_spec, python_client_env, random_tokens, token_spec
from users import open_to_all, shared_config, users  # noqa: F401  (fixture)

MIB = 1 << 20


# --------------------------------------------------- item 9: 1 MiB message

def test_spec_over_a_message_gets_the_limit_not_a_reset(daemon, workdir):
    """A spec over 1 MiB (100k npy paths) is refused with the limit, and the
    daemon serves everyone after it, a raw peer that sends one included."""
    d = daemon()
    paths = [os.path.join(workdir, f"shard-{i:06d}.npy") for i in range(100_000)]
    spec = npy_spec("huge", paths)
    r = d.create(spec, check=False)
    assert r.returncode != 0
    assert "(its spec " in r.stderr, r.stderr
    assert ("a message to loaderd is at most 1048576 bytes (1 MiB), a spec at most 256 KiB; "
            "list fewer files (a directory, a glob)") in r.stderr, r.stderr
    assert "reset" not in r.stderr.lower(), r.stderr

    # the same from the Python package (libloader underneath)
    code = textwrap.dedent("""
        import json, sys, loaderd
        c = loaderd.Client(sys.argv[1])
        try:
            c.create_pipeline(json.load(open(sys.argv[2])))
        except loaderd.Error as e:
            print("ERR", e)
    """)
    p = subprocess.run([sys.executable, "-c", code, d.socket, d.spec_file(spec)],
                       capture_output=True, text=True, timeout=120, env=python_client_env())
    assert "a message to loaderd is at most 1048576 bytes (1 MiB)" in p.stdout, (p.stdout, p.stderr)

    # a raw peer that sends one anyway loses only its own connection
    raw = RawReq(d.socket)
    with pytest.raises((ConnectionError, OSError)):
        raw.send_frame(b"\x00" * (MIB + 64))
        raw.recv_reply()
    raw.close()
    assert d.status()["memory_used"] == 0
    assert "huge" not in d.ctl("pipelines").stdout


# --------------------------------------- item 11: the socket paths' owner

def _sticky_dir():
    d = tempfile.mkdtemp(prefix="ldr-sticky-", dir="/tmp")
    os.chmod(d, 0o1777)
    return d


BINDER = textwrap.dedent("""
    import socket, sys
    socks = []
    for p in sys.argv[1:]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(p)
        s.listen(8)
        socks.append(s)
    print("bound", flush=True)
    sys.stdin.readline()
""")


def _squat(user, paths):
    p = subprocess.Popen(["/usr/bin/python3", "-c", BINDER, *paths], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         **user.popen_kwargs())
    assert p.stdout.readline() == "bound\n", p.stderr.read()
    return p


def _start(path):
    env = dict(os.environ, LOADERD_NO_LISTENER_WATCHDOG="1")
    return subprocess.run([LOADERD, "--socket", path, "--workers", "1"], capture_output=True,
                          text=True, timeout=30, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("squatted", [(".fds", ".workers"), (".workers",)])
def test_socket_paths_of_another_user_are_named(users, squatted):  # noqa: F811
    """bob binds <socket>.fds and/or <socket>.workers first in a sticky shared
    directory: loaderd refuses to start and says whose they are and why,
    never "another loaderd"."""
    _, bob = users
    shared = _sticky_dir()
    try:
        path = os.path.join(shared, "ld.sock")
        squat = _squat(bob, [path + s for s in squatted])
        try:
            r = _start(path)
        finally:
            squat.stdin.close()
            squat.wait(timeout=30)
        assert r.returncode == 1, (r.returncode, r.stderr)
        assert "another loaderd" not in r.stderr, r.stderr
        first = path + squatted[0]
        assert (f"loaderd: {first} is owned by ldr-bob (uid {bob.uid}), not by loaderd's user "
                f"root (uid 0): the socket directory {shared} is writable by others (mode 1777); "
                f"use a directory only loaderd's user can write, e.g. /run/loaderd\n") in r.stderr, r.stderr
        assert not os.path.exists(path)
        # bob's paths are his still: nothing of his was replaced
        for s in squatted:
            assert os.stat(path + s).st_uid == bob.uid
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_shared_socket_directory_is_warned_about(daemon, workdir):
    """A daemon that starts in a directory others may write says so."""
    shared = _sticky_dir()
    try:
        d = daemon(socket=os.path.join(shared, "ld.sock"))
        assert (f"the socket directory {shared} is writable by others (mode 1777): another user "
                "can take the socket's paths while loaderd is down; use a directory only "
                "loaderd's user can write, e.g. /run/loaderd") in d.log()
        d.stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# ------------------------- item 5: a worker host that keeps a dropped slab

# A hand-made worker host: HELLO, the slab's fd with WELCOME, a read-write
# mapping, MAPPED; then it keeps the mapping (closing the fd) and ignores the
# daemon's hang-up when the pipeline is dropped, until told to exit.
HOST = textwrap.dedent("""
    import mmap, os, sys
    from loaderd import _pywire as W
    sock, name = sys.argv[1:3]
    s = W.connect(sock + ".workers")
    W.hello(s, W.ROLE_HOST, name, nworkers=1)
    fds = []
    w = W.parse_welcome(W.expect(s, W.WELCOME, "WELCOME", fds))
    assert len(fds) == 1, fds
    m = mmap.mmap(fds[0], w["slab_size"])
    os.close(fds[0])
    m[0:4] = b"host"
    W.send(s, W.MAPPED)
    print("mapped", flush=True)
    sys.stdin.readline()
""")


def python_spec(name, slots=3):
    # 16 rows of 64 KiB: 1 MiB a slot
    return {"name": name, "persist": True, "batch_size": 16, "prefetch": slots,
            "source": {"kind": "python", "dataset": "nosuch:Dataset", "samples": 64,
                       "fields": [{"name": "v", "dtype": "uint8", "shape": [65536]}]}}


class Host:
    def __init__(self, d, name, **kw):
        kw.setdefault("env", python_client_env())
        self.p = subprocess.Popen(["/usr/bin/python3", "-c", HOST, d.socket, name],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, **kw)
        line = self.p.stdout.readline()
        assert line == "mapped\n", f"host: {line!r}\n{self.p.stderr.read()}\n{d.log()[-3000:]}"
        self.pid = self.p.pid

    def exit(self):
        self.p.stdin.close()
        assert self.p.wait(timeout=30) == 0, self.p.stderr.read()


def test_worker_host_that_keeps_a_dropped_slab_stays_counted(daemon):
    d = daemon(memory_limit=8 * MIB)
    hosts = []
    for name in ("py-a", "py-b"):
        d.create(python_spec(name))
        hosts.append(Host(d, name))
        assert d.pipeline(name)["python"]["host_pid"] == hosts[-1].pid
    for name in ("py-a", "py-b"):
        d.ctl("drop", name)
    st = d.status()
    # both hosts ignored the hang-up and still map their 3 MiB slabs
    assert st["memory_used"] == 6 * MIB
    assert st["memory_held_after_drop"] == 6 * MIB
    assert sorted(st["held_after_drop"][0]["pipelines"]) == ["py-a", "py-b"]
    assert st["held_after_drop"][0]["uid"] == os.getuid()
    assert sorted(st["held_after_drop"][0]["pids"]) == sorted(h.pid for h in hosts)
    # and against its user, who owns nothing any more
    assert [u for u in st["users"] if u["uid"] == os.getuid()] == [
        {"uid": os.getuid(), "user": None, "pipelines": 0, "memory_bytes": 0,
         "held_after_drop_bytes": 6 * MIB}]
    r = d.create(python_spec("py-c"), check=False)
    assert r.returncode != 0
    assert (f"memory limit: pipeline 'py-c' needs {3 * MIB} bytes (3 slots of {MIB}), {2 * MIB} "
            f"of {8 * MIB} bytes are free (--memory-limit); {6 * MIB} bytes are held by slabs of "
            f"dropped pipelines still mapped by uid {os.getuid()} (pids ") in r.stderr, r.stderr
    for h in hosts:
        h.exit()
    d.wait_for(lambda st: st["memory_held_after_drop"] == 0 and st["memory_used"] == 0,
               "the hosts' slabs let go", timeout=10)
    d.create(python_spec("py-c"))


# ------------------------------------------ items 6 and 10: bounds per user

@pytest.fixture
def shared(workdir, users):  # noqa: F811
    """(data, cfg path maker): a token file every user may read, and configs
    whose sockets every user may connect to."""
    open_to_all(workdir)
    data = os.path.join(workdir, "tok.bin")
    random_tokens(data, 1 << 16)
    os.chmod(data, 0o644)
    return data, lambda **keys: shared_config(workdir, **keys)


def big(data, name, slots=2):
    # 64 rows of input and target, 1024 int64 each: 1 MiB a slot
    return token_spec(name, data, 1024, "uint16", batch_size=64, prefetch=slots, persist=True)


def tiny(data, name):
    return token_spec(name, data, 16, "uint16", batch_size=4, prefetch=2, persist=True)


def create_as(user, d, spec):
    return user.ctl(d, "create", "--spec", d.spec_file(spec))


def status_as(user, d):
    import json
    r = user.ctl(d, "status", json_out=True, check=True)
    return json.loads(r.stdout)


def test_memory_per_user_names_the_holders(daemon, users, shared):  # noqa: F811
    alice, bob = users
    data, config = shared
    cfg = config()
    d = daemon("--config", cfg, memory_limit=8 * MIB)
    for n in ("a1", "a2"):
        r = create_as(alice, d, big(data, n))
        assert r.returncode == 0, r.stderr
    # alice has her 4 MiB: a third is refused, naming her pipelines
    r = create_as(alice, d, big(data, "a3"))
    assert r.returncode != 0
    assert (f"memory limit per user: pipeline 'a3' needs {2 * MIB} bytes; ldr-alice (uid "
            f"{alice.uid}) has {4 * MIB} of its {4 * MIB} bytes (memory_limit_per_user): "
            f"{4 * MIB} bytes in pipelines a2, a1; drop some first") in r.stderr, r.stderr
    assert d.status()["memory_limit_per_user"] == 4 * MIB          # half of the limit
    # bob still has his share
    r = create_as(bob, d, big(data, "b1"))
    assert r.returncode == 0, r.stderr
    # the daemon's limit: the refusal says who holds what, most first
    r = d.create(big(data, "r1", slots=3), check=False)
    assert r.returncode != 0
    assert (f"memory limit: pipeline 'r1' needs {3 * MIB} bytes (3 slots of {MIB}), {2 * MIB} "
            f"of {8 * MIB} bytes are free (--memory-limit); ldr-alice (uid {alice.uid}) holds "
            f"{4 * MIB} bytes in pipelines a2, a1; ldr-bob (uid {bob.uid}) holds {2 * MIB} "
            "bytes in pipelines b1") in r.stderr, r.stderr
    # an admin sees every user; alice only herself
    users_root = {u["user"]: u for u in d.status()["users"]}
    assert users_root["ldr-alice"] == {"uid": alice.uid, "user": "ldr-alice", "pipelines": 2,
                                       "memory_bytes": 4 * MIB, "held_after_drop_bytes": 0}
    assert users_root["ldr-bob"]["memory_bytes"] == 2 * MIB
    assert [u["user"] for u in status_as(alice, d)["users"]] == ["ldr-alice"]
    # root is an admin: its own rule is the daemon's limit only
    d.create(big(data, "r1", slots=2))
    # reloaded: alice gets 6 MiB, and her third fits... once memory is free
    d.ctl("drop", "r1")
    with open(cfg, "w") as f:
        f.write('{"socket_mode": "0666", "memory_limit_per_user": "6M"}')
    d.ctl("reload")
    assert d.status()["memory_limit_per_user"] == 6 * MIB
    r = create_as(alice, d, big(data, "a3"))
    assert r.returncode == 0, r.stderr
    assert alice.ctl(d, "consume", "a3", "--batches", "2").returncode == 0


def test_pipelines_per_user_bounded(daemon, users, shared):  # noqa: F811
    alice, bob = users
    data, config = shared
    d = daemon("--config", config(max_pipelines_per_user=3))
    for i in range(3):
        r = create_as(bob, d, tiny(data, f"bob-{i}"))
        assert r.returncode == 0, r.stderr
    r = create_as(bob, d, tiny(data, "bob-3"))
    assert r.returncode != 0
    assert (f"pipelines per user: ldr-bob (uid {bob.uid}) owns 3 pipelines (bob-2, bob-1, "
            "bob-0), the most max_pipelines_per_user allows (3); pipeline 'bob-3' not created: "
            "drop some first (loaderctl drop NAME)") in r.stderr, r.stderr
    assert d.status()["max_pipelines_per_user"] == 3
    # alice and root connect, create and read
    for who, name in ((alice, "alice-0"), (None, "root-0")):
        if who:
            assert create_as(who, d, tiny(data, name)).returncode == 0
            r = who.ctl(d, "consume", name, "--batches", "3")
            assert r.returncode == 0, r.stderr
        else:
            d.create(tiny(data, name))
            d.consume(name, "--batches", "3")
    # one dropped, one more fits
    assert bob.ctl(d, "drop", "bob-0").returncode == 0
    r = create_as(bob, d, tiny(data, "bob-3"))
    assert r.returncode == 0, r.stderr


def _fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_descriptors_kept_for_admins(daemon, users, shared):  # noqa: F811
    """bob creates pipelines until the daemon's last descriptors: he is
    refused there, and root still connects, creates and reads, alice still
    connects."""
    alice, bob = users
    data, config = shared
    d = daemon("--config", config())
    # room for about 40 descriptors above the 64 kept for admins
    limit = _fds(d.pid) + 64 + 40
    subprocess.run(["prlimit", f"--pid={d.pid}", f"--nofile={limit}:{limit}"], check=True)
    created = 0
    for i in range(200):
        r = create_as(bob, d, tiny(data, f"bob-{i}"))
        if r.returncode != 0:
            break
        created += 1
    assert 5 <= created < 40, created
    assert (f"create 'bob-{created}': loaderd has ") in r.stderr, r.stderr
    assert (f" of its {limit} file descriptors open and keeps the last 64 for admins (root, its "
            "own user, admin_group); try again once pipelines are dropped") in r.stderr, r.stderr
    # an admin is not bound by it: root creates and reads
    d.create(tiny(data, "root-0"))
    d.consume("root-0", "--batches", "3")
    assert d.status()["fds"]["reserved_for_admins"] == 64
    # alice connects and is told the same
    assert alice.ctl(d, "status").returncode == 0
    r = create_as(alice, d, tiny(data, "alice-0"))
    assert r.returncode != 0 and "keeps the last 64 for admins" in r.stderr, r.stderr


def test_a_users_kept_slab_counts_against_that_user(daemon, users, shared):  # noqa: F811
    """alice's own worker host keeps her dropped pipeline's slab: it counts
    against her memory_limit_per_user, not against bob's, until it exits."""
    alice, bob = users
    data, config = shared
    d = daemon("--config", config(), memory_limit=8 * MIB)
    r = create_as(alice, d, python_spec("a-py", slots=2))
    assert r.returncode == 0, r.stderr
    host = Host(d, "a-py", **alice.popen_kwargs(env=python_client_env()))
    assert alice.ctl(d, "drop", "a-py").returncode == 0
    assert d.status()["held_after_drop"] == [{"uid": alice.uid, "bytes": 2 * MIB,
                                              "pids": [host.pid], "pipelines": ["a-py"]}]
    assert create_as(alice, d, big(data, "a2")).returncode == 0
    r = create_as(alice, d, big(data, "a3"))
    assert r.returncode != 0
    assert (f"memory limit per user: pipeline 'a3' needs {2 * MIB} bytes; ldr-alice (uid "
            f"{alice.uid}) has {4 * MIB} of its {4 * MIB} bytes (memory_limit_per_user): "
            f"{2 * MIB} bytes in pipelines a2, {2 * MIB} bytes of dropped pipelines' slabs it "
            "still maps; drop some first") in r.stderr, r.stderr
    assert [u["held_after_drop_bytes"] for u in status_as(alice, d)["users"]] == [2 * MIB]
    # bob's share is his
    assert create_as(bob, d, big(data, "b1")).returncode == 0
    host.exit()
    d.wait_for(lambda st: st["memory_held_after_drop"] == 0, "alice's host let go", timeout=10)
    r = create_as(alice, d, big(data, "a3"))
    assert r.returncode == 0, r.stderr
