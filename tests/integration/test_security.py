# SPDX-License-Identifier: MIT
"""Two real Unix users against one daemon (docs/security.md): what the second
can read, write, attach to, drop or take the name of.

The daemon runs as root, as the systemd unit's daemon may (or with
CAP_SETUID/CAP_SETGID): it reads every dataset with the credentials of the
client that created the pipeline. alice (ldr-alice) owns the data; bob
(ldr-bob) is the other user; both are in the group ldr-team.
"""

import grp
import json
import os
import re
import stat
import subprocess
import textwrap

import numpy as np
import pytest

from ldrtest import (LOADERD, crc, python_client_env, random_tokens, sequential_batches, token_dump, token_spec)
from users import open_to_all, shared_config, users  # noqa: F401 (fixture)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.dirname(os.path.dirname(LOADERD))
SEQ = 16


def shared_dir(workdir):
    """@workdir open to every user, and in it a directory all may write."""
    open_to_all(workdir)
    shared = os.path.join(workdir, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    return shared


@pytest.fixture
def setup(daemon, workdir, users):
    """A daemon every user may connect to, alice's private data directory
    (0700) and a tokens file in it, a directory both may write dumps to."""
    alice, bob = users
    shared = shared_dir(workdir)
    adir = os.path.join(workdir, "alice")
    os.mkdir(adir)
    tok = os.path.join(adir, "tok.bin")
    tokens = random_tokens(tok, SEQ * 40 + 1, "uint16", seed=11)
    for p in (adir, tok):
        os.chown(p, alice.uid, alice.gid)
    os.chmod(adir, 0o700)
    os.chmod(tok, 0o600)
    d = daemon("--config", shared_config(workdir))
    return d, alice, bob, tok, tokens, shared


def spec_file(dirpath, spec, name="spec.json"):
    path = os.path.join(dirpath, name)
    with open(path, "w") as f:
        json.dump(spec, f)
    os.chmod(path, 0o644)
    return path


def consume_as(user, d, shared, name, *args):
    dump = os.path.join(shared, f"{user.name}-{name}.bin")
    if os.path.exists(dump):
        os.unlink(dump)
    r = user.ctl(d, "consume", name, "--dump", dump, *args, json_out=True)
    data = b""
    if r.returncode == 0:
        with open(dump, "rb") as f:
            data = f.read()
    return r, data


def expected(tokens, batch=8):
    n = (len(tokens) - 1) // SEQ
    return token_dump(tokens, SEQ, sequential_batches(n, batch))


# ------------------------------------------------------------ confused deputy

def test_bob_cannot_read_alices_private_file_through_the_daemon(setup):
    d, alice, bob, tok, tokens, shared = setup
    spec = token_spec("stolen", tok, SEQ, "uint16", batch_size=8)
    r = bob.ctl(d, "create", "--spec", spec_file(shared, spec, "bob.json"))
    assert r.returncode != 0
    assert f"{tok}: Permission denied (as ldr-bob (uid {bob.uid}))" in r.stderr, r.stderr
    assert "stolen" not in [p["name"] for p in d.status()["pipelines"]]

    # the file itself readable, its directory not: the walk is checked too
    os.chmod(os.path.dirname(tok), 0o700)
    os.chmod(tok, 0o644)
    r = bob.ctl(d, "create", "--spec", spec_file(shared, spec, "bob.json"))
    assert r.returncode != 0 and "Permission denied (as ldr-bob" in r.stderr, r.stderr

    # alice can, and reads exact batches
    spec["name"] = "mine"
    alice.ctl(d, "create", "--spec", spec_file(shared, spec, "alice.json"), check=True)
    r, data = consume_as(alice, d, shared, "mine")
    assert r.returncode == 0, r.stderr
    assert data == expected(tokens)


def test_token_globs_are_listed_as_the_creator(setup):
    """A tokens source's glob lists its directory with the creator's
    credentials: bob cannot learn what alice's private directory holds."""
    d, alice, bob, tok, tokens, shared = setup
    spec = token_spec("globbed", tok, SEQ, "uint16", batch_size=8)
    del spec["source"]["path"]
    spec["source"]["paths"] = [os.path.join(os.path.dirname(tok), "t*.bin")]
    r = bob.ctl(d, "create", "--spec", spec_file(shared, spec, "bob.json"))
    assert r.returncode != 0
    assert f"{os.path.dirname(tok)}: Permission denied (as ldr-bob (uid {bob.uid}))" \
        in r.stderr, r.stderr
    assert "globbed" not in [p["name"] for p in d.status()["pipelines"]]
    alice.ctl(d, "create", "--spec", spec_file(shared, spec, "alice.json"), check=True)
    r, data = consume_as(alice, d, shared, "globbed")
    assert r.returncode == 0, r.stderr
    assert data == expected(tokens)


def write_megatron_pair(prefix, docs):
    """A Megatron .bin/.idx pair (MMIDIDX, uint16) of @docs, each a document."""
    import struct
    lens = [len(t) for t in docs]
    with open(prefix + ".bin", "wb") as f:
        for t in docs:
            f.write(struct.pack(f"<{len(t)}H", *t))
    ptr = [2 * sum(lens[:i]) for i in range(len(lens))]
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(docs), len(docs) + 1))
        f.write(struct.pack(f"<{len(docs)}i", *lens) + struct.pack(f"<{len(docs)}q", *ptr))
        f.write(struct.pack(f"<{len(docs) + 1}q", *range(len(docs) + 1)))


def test_megatron_index_cache_is_no_way_into_alices_corpus(setup):
    """alice's megatron pipeline builds its index into the daemon's cache;
    bob's create over the same prefix is refused on opening her files as
    bob, also with her index cached, and the cache's files are the daemon's
    alone (0600 in a 0700 folder)."""
    d, alice, bob, tok, tokens, shared = setup
    adir = os.path.dirname(tok)
    prefix = os.path.join(adir, "corpus")
    write_megatron_pair(prefix, [list(range(i, i + 30 + i)) for i in range(20)])
    for ext in (".bin", ".idx"):
        os.chown(prefix + ext, alice.uid, alice.gid)
        os.chmod(prefix + ext, 0o600)
    spec = {"name": "amg", "source": {"kind": "megatron", "prefix": prefix, "seq_len": 16},
            "batch_size": 4}
    alice.ctl(d, "create", "--spec", spec_file(shared, spec, "amg.json"), check=True)
    st = d.pipeline("amg")
    assert st["cache"]["index"] == "built" and st["samples"] > 0
    bspec = dict(spec, name="bmg")
    r = bob.ctl(d, "create", "--spec", spec_file(shared, bspec, "bmg.json"))
    assert r.returncode != 0
    assert f"Permission denied (as ldr-bob (uid {bob.uid}))" in r.stderr, r.stderr
    assert "bmg" not in [p["name"] for p in d.status()["pipelines"]]
    # and alice's own pipeline is hers
    r = bob.ctl(d, "consume", "amg", "--batches", "1")
    assert r.returncode != 0 and "amg" in r.stderr, r.stderr
    cache = os.path.join(d.dir, "cache")
    files = [f for f in os.listdir(cache) if f.endswith(".index")]
    assert len(files) == 1
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(cache, files[0])).st_mode) == 0o600


def test_blend_index_cache_is_no_way_into_alices_corpus(setup):
    """A blend's index is cached too, keyed by its inputs (the parts'
    counts), looked at only once every part was opened as the creator: bob's
    blend of alice's 0600 prefixes is refused on her first file, with her
    blend's index cached; his own copy of a corpus of the same shape reuses
    that index (the same one he would build: nothing of hers is in it) while
    his parts' indexes are built from his files. The file is 0600."""
    d, alice, bob, tok, tokens, shared = setup
    adir = os.path.dirname(tok)
    bdir = os.path.join(shared, "bobcorpus")
    os.makedirs(bdir)
    os.chown(bdir, bob.uid, bob.gid)
    docs = [[[j % 50 + 1 for j in range(i, i + 20 + i)] for i in range(k, 12 + k)] for k in range(2)]
    for who, where in ((alice, adir), (bob, bdir)):
        for k in range(2):
            prefix = os.path.join(where, f"blend{k}")
            write_megatron_pair(prefix, docs[k])
            for ext in (".bin", ".idx"):
                os.chown(prefix + ext, who.uid, who.gid)
                os.chmod(prefix + ext, 0o600)

    def spec(name, where):
        return {"name": name, "batch_size": 2, "source": {
            "kind": "megatron", "seq_len": 8,
            "prefixes": [os.path.join(where, f"blend{k}") for k in range(2)]}}
    alice.ctl(d, "create", "--spec", spec_file(shared, spec("ablend", adir), "ab.json"),
              check=True)
    c = d.pipeline("ablend")["cache"]
    assert (c["index"], c["parts"], c["parts_built"]) == ("built", 2, 2)
    r = bob.ctl(d, "create", "--spec", spec_file(shared, spec("bblend", adir), "bb.json"))
    assert r.returncode != 0
    assert (f"source.sources[0]: {adir}/blend0.bin: Permission denied (as ldr-bob "
            f"(uid {bob.uid}))") in r.stderr, r.stderr
    assert "bblend" not in [p["name"] for p in d.status()["pipelines"]]
    bob.ctl(d, "create", "--spec", spec_file(shared, spec("bown", bdir), "bo.json"), check=True)
    c = d.pipeline("bown")["cache"]
    assert (c["index"], c["parts_built"], c["parts_reused"]) == ("reused", 2, 0)
    cache = os.path.join(d.dir, "cache")
    files = [f for f in os.listdir(cache) if f.startswith("blend-") and f.endswith(".index")]
    assert len(files) == 1
    assert stat.S_IMODE(os.stat(os.path.join(cache, files[0])).st_mode) == 0o600


def test_image_files_are_read_as_the_creator(setup, workdir):
    """Workers open each image with the creator's credentials: bob's pipeline
    over a folder he may list but whose files are alice's 0600 fails, naming
    the file and bob."""
    pytest.importorskip("PIL")
    from PIL import Image
    d, alice, bob, tok, tokens, shared = setup
    root = os.path.join(workdir, "imgs")
    os.makedirs(os.path.join(root, "cls"))
    for i in range(4):
        p = os.path.join(root, "cls", f"{i}.png")
        Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(p)
        os.chown(p, alice.uid, alice.gid)
        os.chmod(p, 0o600)
    spec = {"name": "bobimg", "source": {"kind": "image_folder", "path": root},
            "transforms": [{"op": "resize", "size": [8, 8]}], "output": {"dtype": "uint8"},
            "batch_size": 2, "on_error": "fail"}
    bob.ctl(d, "create", "--spec", spec_file(shared, spec, "bobimg.json"), check=True)
    r, _ = consume_as(bob, d, shared, "bobimg")
    assert r.returncode != 0
    # whichever sample a worker reached first
    assert re.search(rf"{root}/cls/[0-3]\.png: Permission denied \(as ldr-bob \(uid {bob.uid}\)\)",
                     r.stderr), r.stderr
    # alice's own pipeline over the same folder reads all four
    spec["name"] = "aliceimg"
    alice.ctl(d, "create", "--spec", spec_file(shared, spec, "aliceimg.json"), check=True)
    r, data = consume_as(alice, d, shared, "aliceimg")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["batches"] == 2
    assert len(data) == 4 * 3 * 8 * 8 + 4 * 8   # uint8 CHW images and int64 labels


# ------------------------------------------------------------ owners, access

def test_private_pipeline_refuses_bob(setup):
    d, alice, bob, tok, tokens, shared = setup
    spec = token_spec("priv", tok, SEQ, "uint16", batch_size=8)
    alice.ctl(d, "create", "--spec", spec_file(shared, spec, "a.json"), check=True)
    owner = f"pipeline 'priv' belongs to ldr-alice (uid {alice.uid}), access owner"

    r, _ = consume_as(bob, d, shared, "priv")
    assert r.returncode != 0 and owner in r.stderr, r.stderr
    r = bob.ctl(d, "drop", "priv", "--force")
    assert r.returncode != 0, r.stdout
    assert owner + ": only its owner or an admin may drop it" in r.stderr, r.stderr
    # taking the name: an error that names the owner
    other = token_spec("priv", os.path.join(shared, "x.bin"), SEQ, "uint16")
    r = bob.ctl(d, "create", "--spec", spec_file(shared, other, "b.json"), "--exist-ok")
    assert r.returncode != 0 and owner + "; use another name" in r.stderr, r.stderr

    # status as bob: the name and its owner, nothing of its data
    st = json.loads(bob.ctl(d, "status", json_out=True, check=True).stdout)
    (p,) = [p for p in st["pipelines"] if p["name"] == "priv"]
    assert p == {"name": "priv", "owner": {"uid": alice.uid, "user": "ldr-alice"}, "access": "owner"}
    # alice's pipeline is still whole
    r, data = consume_as(alice, d, shared, "priv")
    assert r.returncode == 0 and data == expected(tokens), r.stderr
    # root (an admin) sees it all and may drop it
    assert d.pipeline("priv")["spec"]["source"]["path"] == tok
    d.ctl("drop", "priv")


def test_access_all_and_group(setup):
    d, alice, bob, tok, tokens, shared = setup
    spec = token_spec("open", tok, SEQ, "uint16", batch_size=8, access="all")
    alice.ctl(d, "create", "--spec", spec_file(shared, spec, "open.json"), check=True)
    r, data = consume_as(bob, d, shared, "open")
    assert r.returncode == 0, r.stderr
    assert data == expected(tokens)                 # read with alice's rights, for bob
    r = bob.ctl(d, "drop", "open")                  # reading is not owning
    assert r.returncode != 0 and "only its owner or an admin may drop it" in r.stderr

    spec = token_spec("team", tok, SEQ, "uint16", batch_size=8, access="group", group="ldr-team")
    alice.ctl(d, "create", "--spec", spec_file(shared, spec, "team.json"), check=True)
    r, data = consume_as(bob, d, shared, "team")
    assert r.returncode == 0 and data == expected(tokens), r.stderr
    # bob without his ldr-team membership (a process that dropped it)
    dump = os.path.join(shared, "nogroup.bin")
    r = bob.run(d.ctl_cmd("consume", "team", "--dump", dump), team=False)
    assert r.returncode != 0
    assert f"pipeline 'team' belongs to ldr-alice (uid {alice.uid}), access group" in r.stderr
    st = json.loads(alice.ctl(d, "status", json_out=True, check=True).stdout)
    (p,) = [p for p in st["pipelines"] if p["name"] == "team"]
    assert p["access"] == "group"
    assert p["group"] == {"gid": grp.getgrnam("ldr-team").gr_gid, "name": "ldr-team"}


def test_group_must_be_the_creators(setup, workdir):
    d, alice, bob, tok, tokens, shared = setup
    spec = token_spec("g", tok, SEQ, "uint16", access="group", group="root")
    r = alice.ctl(d, "create", "--spec", spec_file(shared, spec, "g.json"))
    assert r.returncode != 0
    assert f"spec: group: ldr-alice (uid {alice.uid}) is not in group 0" in r.stderr, r.stderr
    for bad, msg in (({"access": "everyone"}, 'access: must be one of "owner", "group", "all"'),
                     ({"group": "ldr-team"}, 'group: only with "access": "group"'),
                     ({"access": "group", "group": "no-such-group-x"},
                      "group: no group no-such-group-x")):
        s = token_spec("g", tok, SEQ, "uint16", **bad)
        r = alice.ctl(d, "create", "--spec", spec_file(shared, s, "g.json"))
        assert r.returncode != 0 and msg in r.stderr, (bad, r.stderr)


def test_config_pipelines_are_everyones(daemon, workdir, users):
    alice, bob = users
    shared = shared_dir(workdir)
    tok = os.path.join(workdir, "cfg.bin")
    tokens = random_tokens(tok, SEQ * 24 + 1, "uint16", seed=3)
    os.chmod(tok, 0o600)                     # the daemon's (root's) file
    cfg = shared_config(workdir, pipelines=[token_spec("cfg", tok, SEQ, "uint16", batch_size=8)])
    d = daemon("--config", cfg)
    r, data = consume_as(bob, d, shared, "cfg")
    assert r.returncode == 0 and data == expected(tokens), r.stderr
    r = bob.ctl(d, "drop", "cfg", "--force")
    assert r.returncode != 0 and f"pipeline 'cfg' belongs to root (uid 0), access all" in r.stderr


def test_admin_group_may_drop(daemon, workdir, users):
    alice, bob = users
    open_to_all(workdir)
    tok = os.path.join(workdir, "t.bin")
    random_tokens(tok, SEQ * 24 + 1, "uint16", seed=3)
    os.chmod(tok, 0o644)
    d = daemon("--config", shared_config(workdir, admin_group="ldr-team"))
    spec = spec_file(workdir, token_spec("ap", tok, SEQ, "uint16"), "ap.json")
    alice.ctl(d, "create", "--spec", spec, check=True)
    st = json.loads(bob.ctl(d, "status", json_out=True, check=True).stdout)
    (p,) = [p for p in st["pipelines"] if p["name"] == "ap"]
    assert p["spec"]["source"]["path"] == tok         # an admin sees the details
    bob.ctl(d, "drop", "ap", check=True)
    assert "ap" not in [p["name"] for p in d.status()["pipelines"]]
    # without the group, bob is no admin
    alice.ctl(d, "create", "--spec", spec, check=True)
    r = bob.run(d.ctl_cmd("drop", "ap"), team=False)
    assert r.returncode != 0 and "only its owner or an admin may drop it" in r.stderr


# ------------------------------------------------------------ slabs

BOB_WRITES = textwrap.dedent("""
    import errno, mmap, os, sys
    import loaderd
    dl = loaderd.DataLoader("shared", socket=sys.argv[1], mode="broadcast", as_numpy=True,
                            timeout=20)
    b = dl.next_batch()
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            t = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if t.startswith("/memfd:loaderd:"):
            paths.append(f"/proc/self/fd/{fd}")
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:loaderd:" in line:
                paths.append("/proc/self/map_files/" + line.split()[0])
    assert paths, "no slab"
    held = [int(p.rsplit("/", 1)[1]) for p in paths if p.startswith("/proc/self/fd/")]
    for fd in held:                       # the fds it was given: no shared writable map
        try:
            mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            print("MAPPED", fd); sys.exit(1)
        except (PermissionError, OSError) as e:
            assert e.errno in (errno.EACCES, errno.EPERM), e
    for p in paths:
        try:
            fd = os.open(p, os.O_RDWR)
        except PermissionError:
            continue                      # refused at open: fine
        try:
            try:
                os.pwrite(fd, b"\\xff" * 4096, 0)
                print("WROTE", p); sys.exit(1)
            except PermissionError:
                pass
            try:
                mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED,
                          mmap.PROT_READ | mmap.PROT_WRITE)
                print("MAPPED", p); sys.exit(1)
            except PermissionError:
                pass
        finally:
            os.close(fd)
    # its own copy-on-write writes stay its own
    b["input"][:] = -1
    print("OK", len(paths))
    dl.close()
""")


def test_bob_cannot_write_alices_batches(setup):
    d, alice, bob, tok, tokens, shared = setup
    spec = token_spec("shared", tok, SEQ, "uint16", batch_size=8, access="all", epochs=0,
                      min_clients=2)
    alice.ctl(d, "create", "--spec", spec_file(shared, spec, "s.json"), check=True)
    script = os.path.join(shared, "bob_writes.py")
    with open(script, "w") as f:
        f.write(BOB_WRITES)
    os.chmod(script, 0o644)
    env = python_client_env()
    bob_p = subprocess.Popen(["/usr/bin/python3", script, d.socket], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             **{k: v for k, v in bob.popen_kwargs(env=env).items()})
    # alice reads 20 batches while bob tries: every byte is the file's
    dump = os.path.join(shared, "alice-shared.bin")
    r = alice.ctl(d, "consume", "shared", "--mode", "broadcast", "--batches", 20, "--dump", dump,
                  json_out=True)
    out, err = bob_p.communicate(timeout=60)
    assert bob_p.returncode == 0 and out.startswith("OK"), out + err
    assert r.returncode == 0, r.stderr
    with open(dump, "rb") as f:
        data = f.read()
    n = (len(tokens) - 1) // SEQ
    # min_clients 2: both started at batch 0; 5 batches an epoch, endless
    want = token_dump(tokens, SEQ, sequential_batches(n, 8, epochs=4))
    j = json.loads(r.stdout)
    assert (j["first_epoch"], j["first_batch"], j["batches"]) == (0, 0, 20)
    assert data == want
    assert int(j["checksum"], 16) == crc(data)


# ------------------------------------------------------------ dataset roots

def test_dataset_roots(daemon, workdir):
    root = os.path.join(workdir, "data")
    os.makedirs(os.path.join(root, "sub"))
    inside = os.path.join(root, "sub", "t.bin")
    tokens = random_tokens(inside, SEQ * 16 + 1, "uint16", seed=5)
    outside = os.path.join(workdir, "out.bin")
    random_tokens(outside, SEQ * 16 + 1, "uint16", seed=6)
    os.symlink(outside, os.path.join(root, "escape.bin"))
    os.symlink("sub/t.bin", os.path.join(root, "inner.bin"))
    cfg = os.path.join(workdir, "roots.json")
    with open(cfg, "w") as f:
        json.dump({"dataset_roots": [root]}, f)
    d = daemon("--config", cfg)

    def create(name, path):
        return d.create(token_spec(name, path, SEQ, "uint16", batch_size=4), check=False)

    assert create("in", inside).returncode == 0
    assert d.consume("in").dump == token_dump(tokens, SEQ, sequential_batches(16, 4))
    assert create("inner", os.path.join(root, "inner.bin")).returncode == 0   # stays inside
    for name, path, msg in (
            ("out", outside, f"{outside}: outside this daemon's dataset_roots ({root})"),
            ("dots", os.path.join(root, "sub", "..", "..", "out.bin"),
             f"leaves the dataset root {root}"),
            ("link", os.path.join(root, "escape.bin"), f"leaves the dataset root {root}"),
            ("magic", f"/proc/{os.getpid()}/root{inside}", "outside this daemon's dataset_roots"),
            ("fifo", os.path.join(root, "fifo"), "not a regular file (a FIFO)")):
        if name == "fifo":
            os.mkfifo(path)
        r = create(name, path)
        assert r.returncode != 0 and msg in r.stderr, (name, r.stderr)


def test_proc_magic_links_refused_without_roots(ld, workdir):
    tok = os.path.join(workdir, "t.bin")
    random_tokens(tok, SEQ * 16 + 1, "uint16", seed=5)
    fd = os.open(tok, os.O_RDONLY)
    try:
        r = ld.create(token_spec("m", f"/proc/{os.getpid()}/fd/{fd}", SEQ, "uint16"), check=False)
        assert r.returncode != 0 and "a symlink loop or a /proc magic link (refused)" in r.stderr, \
            r.stderr
    finally:
        os.close(fd)


def test_bad_security_config(workdir):
    from test_config import run_daemon_expect_failure
    cfg = os.path.join(workdir, "c.json")
    sock = os.path.join(workdir, "s.sock")
    for body, needle in (('{"dataset_roots": "/data"}', "dataset_roots: must be a non-empty array"),
                         ('{"dataset_roots": ["rel/dir"]}',
                          "dataset_roots[0]: must be an absolute directory path"),
                         ('{"dataset_roots": ["/no/such/dir-x"]}',
                          "dataset_roots[0]: /no/such/dir-x: No such file or directory"),
                         ('{"admin_group": "no-such-group-x"}', "admin_group: no group no-such-group-x"),
                         ('{"max_connections_per_uid": 0}',
                          "max_connections_per_uid: must be an integer in 1..512")):
        with open(cfg, "w") as f:
            f.write(body)
        err = run_daemon_expect_failure(["--config", cfg, "--socket", sock])
        assert cfg in err and needle in err, (body, err)


def test_socket_group_lets_members_in(daemon, workdir, users):
    alice, bob = users
    open_to_all(workdir)
    cfg = os.path.join(workdir, "sg.json")
    with open(cfg, "w") as f:
        json.dump({"socket_mode": "0660", "socket_group": "ldr-team"}, f)
    d = daemon("--config", cfg)
    st = os.stat(d.socket)
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == grp.getgrnam("ldr-team").gr_gid
    assert bob.ctl(d, "status").returncode == 0
    r = bob.run(d.ctl_cmd("status"), team=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr


def test_unprivileged_daemon_fails_closed(workdir, users):
    """A daemon without CAP_SETUID/CAP_SETGID (here: run as alice) serves its
    own user's pipelines and refuses to read files for anyone else."""
    alice, bob = users
    open_to_all(workdir)
    run = os.path.join(workdir, "run")
    os.mkdir(run)
    os.chown(run, alice.uid, alice.gid)
    tok = os.path.join(workdir, "t.bin")
    tokens = random_tokens(tok, SEQ * 16 + 1, "uint16", seed=8)
    os.chmod(tok, 0o644)                          # everyone may read it, bob too
    cfg = shared_config(workdir)
    sock = os.path.join(run, "ld.sock")
    log = open(os.path.join(workdir, "alice-daemon.log"), "w")
    p = subprocess.Popen([LOADERD, "--socket", sock, "--config", cfg, "--workers", "1"],
                         stdout=log, stderr=subprocess.STDOUT, **alice.popen_kwargs())
    try:
        class D:
            def ctl_cmd(self, *args, json_out=False):
                return ["%s/client/loaderctl" % BUILD, "--socket", sock] + \
                       (["--json"] if json_out else []) + [str(a) for a in args]
        d = D()
        import time
        deadline = time.monotonic() + 30
        while alice.ctl(d, "status").returncode != 0:
            assert p.poll() is None and time.monotonic() < deadline, \
                open(os.path.join(workdir, "alice-daemon.log")).read()
            time.sleep(0.05)
        shared = shared_dir(workdir)
        spec = spec_file(shared, token_spec("b", tok, SEQ, "uint16", batch_size=4), "b.json")
        # bob talks to a daemon of alice's only when he names her as
        # loaderd's service user (docs/security.md, "Whose pipeline, whose daemon")
        r = bob.ctl(d, "create", "--spec", spec,
                    env=dict(os.environ, LOADERD_DAEMON_USER="ldr-alice"))
        assert r.returncode != 0
        assert (f"{tok}: the daemon (uid {alice.uid}) cannot read files as ldr-bob (uid {bob.uid}):"
                " it needs CAP_SETUID and CAP_SETGID") in r.stderr, r.stderr
        spec = spec_file(shared, token_spec("a", tok, SEQ, "uint16", batch_size=4), "a.json")
        alice.ctl(d, "create", "--spec", spec, check=True)
        r, data = consume_as(alice, d, shared, "a")
        assert r.returncode == 0 and data == token_dump(tokens, SEQ, sequential_batches(16, 4))
    finally:
        p.terminate()
        assert p.wait(timeout=15) == 0
        log.close()


@pytest.mark.parametrize("extra, first_gid, target", [(100, 70000, 80000), (700, 3000000, 4000000)],
                         ids=["past-64-groups", "past-a-4096-byte-status-line"])
def test_group_access_past_many_supplementary_groups(setup, extra, first_gid, target):
    """bob's membership of a pipeline's group counts however many groups come
    before it in his process's list (the kernel sorts it: the group's gid is
    the largest): 100 (the daemon kept 64), or 700 of 7 digits, whose
    /proc/PID/status Groups line (about 5.6 KB) the daemon cut at 4096
    bytes. The gids need not exist: a process may hold any. root (an admin)
    creates the pipeline, for a group none of alice's."""
    d, alice, bob, tok, tokens, shared = setup
    spec = token_spec("many", tok, SEQ, "uint16", batch_size=8, access="group", group=target)
    d.ctl("create", "--spec", spec_file(shared, spec, "many.json"))
    kw = bob.popen_kwargs(team=False)
    for with_target in (False, True):
        kw["extra_groups"] = list(range(first_gid, first_gid + extra)) + [target] * with_target
        dump = os.path.join(shared, f"many-{extra}-{with_target}.bin")
        r = subprocess.run(d.ctl_cmd("consume", "many", "--dump", dump), capture_output=True,
                           text=True, timeout=120, **kw)
        if not with_target:
            assert r.returncode != 0
            assert "pipeline 'many' belongs to root (uid 0), access group" in r.stderr, r.stderr
            continue
        assert r.returncode == 0, r.stderr
        with open(dump, "rb") as f:
            assert f.read() == expected(tokens)
