# SPDX-License-Identifier: MIT
"""Your own Dataset with real Unix users (docs/python.md, "Who runs what";
docs/security.md): the workers of a python pipeline are its creator's
processes, read what the creator may read, and nobody else can take their
place or write the batches; a broadcast pipeline whose creating trainer
exits goes on serving the others.

The daemon runs as root; alice (ldr-alice) and bob (ldr-bob) are real users
(users.py). Their trainers are /usr/bin/python3 scripts in a directory both
can read, with this checkout's loaderd package.
"""

import errno
import fcntl
import json
import os
import subprocess
import textwrap
import time

import numpy as np
import pytest

from ldrtest import python_client_env, sanitizer_report
from users import open_to_all, shared_config, users  # noqa: F401 (fixture)

pytest.importorskip("torch")

F_GET_SEALS = 1034
F_SEAL_WRITE, F_SEAL_FUTURE_WRITE = 0x0008, 0x0010

UDATA = textwrap.dedent("""
    import os
    import numpy as np
    import torch

    class Private(torch.utils.data.Dataset):
        \"\"\"Sample i: the i-th int64 of a file only its owner may read, and
        the uid of the process that read it.\"\"\"
        def __init__(self, path, n):
            self.path, self.n = path, n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            with open(self.path, "rb") as f:
                f.seek(8 * i)
                v = int(np.frombuffer(f.read(8), dtype="<i8")[0])
            return {"value": v, "uid": os.getuid()}

    class Open(torch.utils.data.Dataset):
        def __init__(self, n):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            return {"x": torch.full((4,), i, dtype=torch.int32), "uid": os.getuid()}
""")

PRELUDE = textwrap.dedent("""
    import errno, json, mmap, os, socket, struct, sys, time
    import loaderd
    SOCK = sys.argv[1]
    def out(**kw):
        print("RESULT " + json.dumps(kw), flush=True)
""")


@pytest.fixture
def env(daemon, workdir, users):
    """A daemon all may connect to, the dataset module in a directory all may
    read, a file of 24 int64 only alice may read."""
    alice, bob = users
    open_to_all(workdir)
    shared = os.path.join(workdir, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    with open(os.path.join(shared, "udata.py"), "w") as f:
        f.write(UDATA)
    os.chmod(os.path.join(shared, "udata.py"), 0o644)
    adir = os.path.join(workdir, "alice")
    os.mkdir(adir)
    values = (np.arange(24, dtype="<i8") * 7 + 1000)
    priv = os.path.join(adir, "values.bin")
    values.tofile(priv)
    for p in (adir, priv):
        os.chown(p, alice.uid, alice.gid)
    os.chmod(adir, 0o700)
    os.chmod(priv, 0o600)
    d = daemon("--config", shared_config(workdir))
    return d, alice, bob, shared, priv, values


def start(user, d, shared, name, body):
    """Run a trainer as @user. Its output goes to files: the workers' host it
    spawns inherits them and may outlive it (a persistent pipeline)."""
    path = os.path.join(shared, f"{name}.py")
    with open(path, "w") as f:
        f.write(PRELUDE + textwrap.dedent(body))
    os.chmod(path, 0o644)
    outs = [open(os.path.join(shared, f"{name}.{k}"), "w+") for k in ("out", "err")]
    p = subprocess.Popen(["/usr/bin/python3", path, d.socket], stdout=outs[0], stderr=outs[1],
                         text=True, cwd=shared, **user.popen_kwargs(env=python_client_env()))
    p.outs = outs
    return p


def lines(p):
    """What the trainer printed so far."""
    p.outs[0].seek(0)
    return p.outs[0].read()


def finish(p, who, d, timeout=180):
    p.wait(timeout=timeout)
    out = lines(p)
    p.outs[1].seek(0)
    err = p.outs[1].read()
    for f in p.outs:
        f.close()
    m = sanitizer_report(err)
    assert m is None, f"{who} printed a {m} report:\n{err}"
    res = [line[7:] for line in out.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and res, (f"{who} failed (exit {p.returncode}):\nstdout: {out[-3000:]}"
                                       f"\nstderr: {err[-5000:]}\ndaemon log:\n{d.log()[-3000:]}")
    return json.loads(res[-1])


def hello(sock, role, pipeline, nworkers=1):
    """Raw HELLO on <socket>.workers (daemon/pyw-wire.h): (type, status, text)."""
    return textwrap.dedent(f"""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(SOCK + ".workers")
    s.sendall(struct.pack("=IHHI", 0x5750444c, 1, 0, 88) +
              struct.pack("=IIIIII64s", 1, {role}, {nworkers}, 0, os.getpid(), 0, {pipeline!r}.encode()))
    data = b""
    while True:
        c = s.recv(4096)
        if not c:
            break
        data += c
    magic, typ, flags, ln = struct.unpack("=IHHI", data[:12])
    status = struct.unpack("=i", data[12:16])[0]
    replies.append([typ, status, data[16:12 + ln].decode()])
    """)


def memfd_seals(pid, name):
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith(f"/memfd:loaderd:{name} "):
            f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY)
            try:
                return fcntl.fcntl(f, F_GET_SEALS)
            finally:
                os.close(f)
    return None


def test_workers_run_as_the_creator_and_nobody_else_may_build(env):
    d, alice, bob, shared, priv, values = env
    # alice's Dataset reads her private file: it works because her workers
    # are hers; the host is her process too
    r = finish(start(alice, d, shared, "alice", f"""
        spec = {{"name": "alice-py", "persist": True,
                "source": {{"kind": "python", "dataset": "udata:Private",
                           "args": {{"path": {priv!r}, "n": 24}}}}}}
        dl = loaderd.DataLoader(spec, batch_size=6, num_workers=2, socket=SOCK, timeout=120,
                                as_numpy=True)
        got = [b for b in dl]
        st = loaderd.Client(SOCK).pipeline("alice-py")
        host = st["python"]["host_pid"]
        with open(f"/proc/{{host}}/status") as f:
            huid = [l.split()[1] for l in f if l.startswith("Uid:")][0]
        out(values=[int(v) for b in got for v in b["value"]],
            uids=sorted({{int(u) for b in got for u in b["uid"]}}), host_uid=int(huid),
            python=st["python"], state=st["state"])
        dl.close()
    """), "alice", d)
    assert r["values"] == values.tolist()
    assert r["uids"] == [alice.uid]
    assert r["host_uid"] == alice.uid
    assert r["python"]["workers"] == 2 and r["python"]["samples_built"] >= 24
    # the slab is sealed: only the host's mapping (inherited by its workers) writes
    seals = memfd_seals(d.pid, "alice-py")
    assert seals is not None and seals & F_SEAL_FUTURE_WRITE, seals

    # bob can neither be its host nor one of its workers
    r = finish(start(bob, d, shared, "bob", "replies = []\n" +
                     hello(None, 1, "alice-py", 2) + hello(None, 2, "alice-py") +
                     "out(replies=replies)\n"), "bob", d)
    uid = alice.uid
    want = (f"pipeline 'alice-py' belongs to uid {uid}: only its owner's processes build its "
            "batches")
    assert r["replies"] == [[3, -errno.EPERM, want], [3, -errno.EPERM, want]]
    # nor alice a second host: the slab is sealed
    r = finish(start(alice, d, shared, "alice2", "replies = []\n" + hello(None, 1, "alice-py") +
                     "out(replies=replies)\n"), "alice", d)
    typ, status, text = r["replies"][0]
    assert (typ, status) == (3, -errno.EBUSY)
    assert "has had its worker host already" in text and "sealed" in text
    assert "belongs to uid" in d.log()
    alice.ctl(d, "drop", "alice-py", check=True)


BROADCAST = """
    spec = {{"name": "bc-py", "access": "all", "min_clients": 2,
            "source": {{"kind": "python", "dataset": "udata:Open", "args": {{"n": 30}}}}}}
    dl = loaderd.DataLoader({pipe}, batch_size=5, num_workers=2, socket=SOCK, timeout=120,
                            mode="broadcast", as_numpy=True)
    print("ATTACHED", dl.created, flush=True)
    got = []
    for b in dl:
        got.append(b)
        if len(got) == {stop}:
            break
    {extra}
    out(created=dl.created, x=[int(r[0]) for b in got for r in b["x"]],
        uids=sorted({{int(u) for b in got for u in b["uid"]}}))
    dl.close()
"""

BOB_TRIES_WRITE = """
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            t = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if t.startswith("/memfd:loaderd:bc-py"):
            paths.append(f"/proc/self/fd/{fd}")
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:loaderd:bc-py" in line:
                paths.append("/proc/self/map_files/" + line.split()[0])
    wrote = []
    for p in paths:
        try:
            fd = os.open(p, os.O_RDWR)
        except OSError:
            continue
        try:
            try:
                os.pwrite(fd, b"\\xff" * 64, 0)
                wrote.append(p)
            except OSError:
                pass
            try:
                mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                wrote.append(p)
            except OSError:
                pass
        finally:
            os.close(fd)
    assert paths and not wrote, (paths, wrote)
"""


def test_broadcast_goes_on_when_its_creator_exits(env):
    d, alice, bob, shared, priv, values = env
    # alice creates it (min_clients 2: the stream waits for bob), reads two
    # batches and exits; bob reads the whole epoch, built by alice's workers
    a = start(alice, d, shared, "alice-bc", BROADCAST.format(pipe="spec", stop=2, extra=""))
    deadline = time.monotonic() + 120
    while "ATTACHED" not in lines(a) and a.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "ATTACHED True" in lines(a), lines(a)
    # bob reads alice's pipeline by its name: a create (exist_ok) would join
    # only a pipeline of his own (docs/security.md, "Whose pipeline, whose daemon")
    b = start(bob, d, shared, "bob-bc", BROADCAST.format(pipe='"bc-py"', stop=-1,
                                                         extra=BOB_TRIES_WRITE))
    ra = finish(a, "alice", d)
    assert ra["created"] and ra["x"] == list(range(10))
    rb = finish(b, "bob", d)
    assert not rb["created"]
    assert rb["x"] == list(range(30))           # the whole epoch, in order, nothing lost
    assert rb["uids"] == [alice.uid]            # built by alice's workers, not bob's
    st = json.loads(alice.ctl(d, "status", json_out=True, check=True).stdout)
    pl = [p for p in st["pipelines"] if p["name"] == "bc-py"]
    if pl:  # it may have lingered out already
        assert pl[0]["python"]["samples_built"] >= 30
    assert "Python worker host pid" in d.log()
