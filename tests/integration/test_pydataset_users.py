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
import pickle
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


def start(user, d, shared, name, body, cwd=None):
    """Run a trainer as @user (in @cwd, default @shared, where its script
    is). Its output goes to files: the workers' host it spawns inherits them
    and may outlive it (a persistent pipeline)."""
    path = os.path.join(shared, f"{name}.py")
    with open(path, "w") as f:
        f.write(PRELUDE + textwrap.dedent(body))
    os.chmod(path, 0o644)
    outs = [open(os.path.join(shared, f"{name}.{k}"), "w+") for k in ("out", "err")]
    p = subprocess.Popen(["/usr/bin/python3", path, d.socket], stdout=outs[0], stderr=outs[1],
                         text=True, cwd=cwd or shared,
                         **user.popen_kwargs(env=python_client_env()))
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
    """Raw HELLO on <socket>.workers (daemon/engine/pyw-wire.h): (type, status, text)."""
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


# ---------------------- another user's code never runs in a reader (item 4)

BOBDATA = """
import numpy as np
PAYLOAD = {payload!r}
class Evil:
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return {{"p": np.frombuffer(PAYLOAD.ljust(256, b"\\0"), dtype=np.uint8), "n": i}}
"""

BOBMOD = """
import os
with open({marker!r}, "a") as f:
    f.write("bobmod imported by uid %d\\n" % os.getuid())
class Evil(tuple):
    pass
"""


class _RunAs:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def test_reader_runs_nothing_a_spec_names(env):
    """bob's python pipeline ("access": "all") has a structure whose
    "type"s name pickle.loads (over a field that holds his pickle, which
    would run a shell command) and a module he planted beside alice's
    script; alice attaches by name and reads a batch: nothing of bob's runs
    in her process, and she gets the fields, as a list and as loaderd's own
    namedtuple of the names the spec gives."""
    d, alice, bob, shared, priv, values = env
    marker = os.path.join(shared, "marker")
    pay = pickle.dumps(_RunAs(f"echo pickle ran as uid $(id -u) >> {marker}"))
    assert len(pay) < 256
    for name, text in (("bobdata.py", BOBDATA.format(payload=pay)),
                       ("bobmod.py", BOBMOD.format(marker=marker))):
        path = os.path.join(shared, name)
        with open(path, "w") as f:
            f.write(text)
        os.chown(path, bob.uid, bob.gid)
        os.chmod(path, 0o644)
    structure = {"dict": [["x", {"tuple": [{"f": "p"}], "type": "pickle:loads"}],
                          ["y", {"tuple": [{"f": "n"}], "type": "bobmod:Evil", "names": ["n"]}]]}
    rb = finish(start(bob, d, shared, "bob-evil", f"""
        spec = {{"name": "shared-py", "access": "all", "persist": True, "batch_size": 4,
                "source": {{"kind": "python", "dataset": "bobdata:Evil", "args": {{"n": 12}},
                           "fields": [{{"name": "p", "dtype": "uint8", "shape": [256]}},
                                      {{"name": "n", "dtype": "int64", "shape": []}}],
                           "structure": {structure!r}}}}}
        dl = loaderd.DataLoader(spec, socket=SOCK, num_workers=1, timeout=120, as_numpy=True)
        out(created=dl.created)
        dl.close()
    """), "bob", d)
    assert rb == {"created": True}

    ra = finish(start(alice, d, shared, "alice-reads", """
        dl = loaderd.DataLoader("shared-py", socket=SOCK, timeout=120, as_numpy=True)
        b = next(iter(dl))
        try:
            x, y = b["x"], b["y"]
            out(keys=list(b), x=[type(x).__name__, len(x), list(x[0].shape)],
                rows=sorted({bytes(r).rstrip(b"\\0").hex() for r in x[0]}),
                y=[type(y).__name__, list(type(y)._fields), type(y).__module__, y.n.tolist()],
                bobmod="bobmod" in sys.modules)
        except Exception as e:
            out(batch=repr(b)[:300], error=repr(e))
        dl.close()
    """), "alice", d)
    assert not os.path.exists(marker), open(marker).read()
    assert ra == {"keys": ["x", "y"], "x": ["list", 1, [4, 256]], "rows": [pay.hex()],
                  "y": ["Evil", ["n"], "loaderd.pydataset", [0, 1, 2, 3]], "bobmod": False}
    bob.ctl(d, "drop", "shared-py", check=True)


PLANTED = """
import os, sys
with open({marker!r}, "a") as f:
    f.write("planted %s ran as uid %d\\n" % (__name__, os.getuid()))
# then the real host, so that only the marker tells
os.chdir("/")
os.execv(sys.executable, [sys.executable, "-m", "loaderd._pyhost"])
"""


def test_host_code_never_from_the_trainers_directory(env):
    """bob plants loaderd/_pyhost.py (and a loaderd/__init__.py) in a shared
    directory alice trains from (her script is elsewhere): her pipeline's
    host is loaderd's own, the plant never runs, and her training works."""
    d, alice, bob, shared, priv, values = env
    plant = os.path.join(os.path.dirname(shared), "plant")
    marker = os.path.join(plant, "marker")
    os.makedirs(os.path.join(plant, "loaderd"))
    for rel in ("loaderd/__init__.py", "loaderd/_pyhost.py"):
        with open(os.path.join(plant, rel), "w") as f:
            f.write(PLANTED.format(marker=marker))
    for root, dirs, files in os.walk(plant):
        for n in [root] + [os.path.join(root, x) for x in files]:
            os.chown(n, bob.uid, bob.gid)
    os.chmod(plant, 0o1777)
    os.chmod(os.path.join(plant, "loaderd"), 0o755)
    r = finish(start(alice, d, shared, "alice-plant", f"""
        spec = {{"name": "alice-plant", "source": {{"kind": "python", "dataset": "udata:Private",
                                                   "args": {{"path": {priv!r}, "n": 24}}}}}}
        dl = loaderd.DataLoader(spec, batch_size=6, num_workers=2, socket=SOCK, timeout=120,
                                as_numpy=True)
        got = [b for b in dl]
        host = loaderd.Client(SOCK).pipeline("alice-plant")["python"]["host_pid"]
        out(values=[int(v) for b in got for v in b["value"]], cwd=os.getcwd(),
            uids=sorted({{int(u) for b in got for u in b["uid"]}}),
            host_cwd=os.readlink(f"/proc/{{host}}/cwd"))
        dl.close()
    """, cwd=plant), "alice", d)
    assert not os.path.exists(marker), open(marker).read()
    assert r["values"] == values.tolist() and r["uids"] == [alice.uid]
    assert r["cwd"] == plant and r["host_cwd"] == plant   # the Dataset's relative paths hold


# ---------- a Dataset's exception type: only in its own trainer (issue 26)

BOBRAISE = """
import os
import numpy as np
FLAG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fail-now")
class Raiser:
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        if os.path.exists(FLAG):
            raise ValueError("bad sample %d" % i)
        return {"n": np.int64(i)}
"""

READ_UNTIL_ERROR = """
        dl = loaderd.DataLoader({pipe}, socket=SOCK, timeout=120, as_numpy=True)
        it = iter(dl)
        got = len(next(it)["n"])
        print("READY", flush=True)
        # read on once the Dataset raises (the test sets the flag when both
        # trainers are ready): the epoch cannot end before it
        deadline = time.monotonic() + 300
        while not os.path.exists({flag!r}) and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            for b in it:
                got += len(b["n"])
            out(got=got, error=None)
        except Exception as e:
            out(value_error=isinstance(e, ValueError),
                dataset_error=isinstance(e, loaderd.DatasetError),
                loaderd_error=isinstance(e, loaderd.Error), says="bad sample" in str(e))
"""


def wait_ready(p):
    deadline = time.monotonic() + 120
    while "READY" not in lines(p) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "READY" in lines(p), lines(p)


def test_dataset_exception_type_only_in_its_own_trainer(env):
    """bob's Dataset starts raising ValueError while his trainer and alice's
    (attached to his pipeline by name) read it: his own trainer gets it as
    torch gives it (a ValueError, also a loaderd.DatasetError); alice gets a
    plain loaderd.Error with the same text: a class the error text of another
    user's pipeline names is never built in her process (docs/security.md,
    "Python pipelines: nobody else's code")."""
    d, alice, bob, shared, priv, values = env
    path = os.path.join(shared, "bobraise.py")
    with open(path, "w") as f:
        f.write(BOBRAISE)
    os.chown(path, bob.uid, bob.gid)
    os.chmod(path, 0o644)
    flag = os.path.join(shared, "fail-now")
    spec = ('{"name": "shared-raise", "access": "all", "persist": True, "batch_size": 4, '
            '"source": {"kind": "python", "dataset": "bobraise:Raiser", '
            '"args": {"n": 100000}, "fields": [{"name": "n", "dtype": "int64", "shape": []}]}}')
    b = start(bob, d, shared, "bob-raise", READ_UNTIL_ERROR.format(pipe=spec, flag=flag))
    wait_ready(b)
    a = start(alice, d, shared, "alice-raise", READ_UNTIL_ERROR.format(pipe='"shared-raise"', flag=flag))
    wait_ready(a)
    open(flag, "w").close()   # from now on every sample raises
    rb, ra = finish(b, "bob", d), finish(a, "alice", d)
    assert rb == {"value_error": True, "dataset_error": True, "loaderd_error": True,
                  "says": True}
    assert ra == {"value_error": False, "dataset_error": False, "loaderd_error": True,
                  "says": True}
    bob.ctl(d, "drop", "shared-raise", check=True)


BOBFREE = """
import os
import torch
MARKER = {marker!r}

class Run:
    def __init__(self, cmd):
        self.cmd = cmd
    def __reduce__(self):   # unpickling it runs the command
        return (os.system, (self.cmd,))

class Texts(torch.utils.data.Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return {{"text": "t%d" % i, "ids": torch.arange(i % 3 + 1) + i}}

def collate(batch):
    n = max(len(b["ids"]) for b in batch)
    ids = torch.stack([torch.cat([b["ids"], torch.zeros(n - len(b["ids"]), dtype=torch.int64)])
                       for b in batch])
    out = {{"texts": [b["text"] for b in batch], "ids": ids}}
    if batch[0]["text"] == "t4":   # the second batch carries an object of bob's
        out["evil"] = Run("echo unpickled as uid $(id -u) >> " + MARKER)
    return out
"""


def test_free_form_batches_of_another_user_never_unpickle_his_classes(env):
    """bob's pipeline ("access": "all") has a collate_fn whose output (a
    list of str, a tensor padded per batch, in its second batch an object
    whose pickle runs a shell command) travels pickled in the object part.
    alice attaches by name: she gets the strings and the tensor (a view of
    the slab), and the batch with bob's object raises a loaderd.Error
    naming it, without running anything of bob's."""
    d, alice, bob, shared, priv, values = env
    marker = os.path.join(shared, "free-marker")
    path = os.path.join(shared, "bobfree.py")
    with open(path, "w") as f:
        f.write(BOBFREE.format(marker=marker))
    os.chown(path, bob.uid, bob.gid)
    os.chmod(path, 0o644)
    rb = finish(start(bob, d, shared, "bob-free", """
        spec = {"name": "shared-free", "access": "all", "persist": True, "batch_size": 4,
                "source": {"kind": "python", "dataset": "bobfree:Texts",
                           "collate": "bobfree:collate"}}
        dl = loaderd.DataLoader(spec, socket=SOCK, num_workers=1, timeout=120)
        out(created=dl.created, fields=[f["name"] for f in dl.spec["source"]["fields"]])
        dl.close()
    """), "bob", d)
    assert rb == {"created": True, "fields": ["ids", "__obj__", "__obj___len"]}

    ra = finish(start(alice, d, shared, "alice-free", """
        import errno
        dl = loaderd.DataLoader("shared-free", socket=SOCK, timeout=120)
        it = iter(dl)
        b = next(it)
        base, size = dl.slab
        first = dict(texts=b["texts"], ids=b["ids"].tolist(),
                     in_slab=base <= b["ids"].data_ptr() < base + size)
        try:
            next(it)
            second = "no error"
        except loaderd.Error as e:
            second = [e.code == -errno.EPERM, str(e)]
        out(first=first, second=second, bobfree="bobfree" in sys.modules)
        dl.close()
    """), "alice", d)
    assert not os.path.exists(marker), open(marker).read()
    assert ra["first"] == {"texts": ["t0", "t1", "t2", "t3"],
                           "ids": [[0, 0, 0], [1, 2, 0], [2, 3, 4], [3, 0, 0]], "in_slab": True}
    code_ok, text = ra["second"]
    assert code_ok and "holds a posix.system object" in text, text
    assert f"another user's (uid {bob.uid})" in text and "docs/security.md" in text, text
    assert ra["bobfree"] is False
    bob.ctl(d, "drop", "shared-free", check=True)
