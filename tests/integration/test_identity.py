# SPDX-License-Identifier: MIT
"""Whose pipeline, whose daemon (docs/security.md): a trainer joins or
re-joins only a pipeline that it created or named on purpose, of the owner
it expects, and talks only to a daemon of root's, its own or loaderd's
service user's uid. Each test is an attack by bob (ldr-bob) on alice's
(ldr-alice) training, with two real Unix users (users.py):

- bob creates first the pipeline name alice's Python Dataset loader computes,
  same spec, "access": "all", fed by his own host;
- bob wins the race after a daemon restart and creates alice's pipeline's
  name over his own file (same dtype, seq_len, batch size);
- bob runs his own loaderd on alice's socket path while the real one is down.

Alice must get an error naming what happened, never one of bob's batches.
"""

import json
import os
import subprocess
import textwrap
import time

import numpy as np
import pytest

from ldrtest import LOADERD, python_client_env, sanitizer_report, token_spec
from users import open_to_all, shared_config, users  # noqa: F401,F811 (fixture)

SEQ, BS = 8, 4
NSAMPLES = 512               # 128 batches of 4 per epoch: more than one window
NTOK = SEQ * NSAMPLES + 1
BOB_BASE = 1_000_000         # bob's tokens: k + BOB_BASE, alice's: k

PRELUDE = textwrap.dedent("""
    import json, os, sys, time
    import loaderd
    SOCK, OUT = sys.argv[1], sys.argv[2]
    def out(**kw):
        print("RESULT " + json.dumps(kw), flush=True)
""")

# alice's trainer: the pipeline (a spec it creates, or a name), two batches,
# then it waits for OUT/go while the test restarts the daemon, then the rest
TRAINER = PRELUDE + textwrap.dedent("""
    pipe = json.loads(sys.argv[3])
    dl = loaderd.DataLoader(pipe, socket=SOCK, as_numpy=True, reconnect_timeout=120)
    it = iter(dl)
    before = []
    for _ in range(2):
        before += [int(x) for x in next(it)["input"][:, 0]]
    open(os.path.join(OUT, "paused"), "w").close()
    while not os.path.exists(os.path.join(OUT, "go")):
        time.sleep(0.01)
    after, err = [], None
    try:
        for b in it:
            after += [int(x) for x in b["input"][:, 0]]
    except loaderd.Error as e:
        err = str(e)
    out(before=before, after=after, err=err)
""")


def run_script(user, workdir, name, body, *args):
    path = os.path.join(workdir, f"{name}.py")
    with open(path, "w") as f:
        f.write(body)
    os.chmod(path, 0o644)
    outs = [open(os.path.join(workdir, f"{name}.{k}"), "w+") for k in ("out", "err")]
    p = subprocess.Popen(["/usr/bin/python3", path, *map(str, args)], stdout=outs[0],
                         stderr=outs[1], text=True, cwd=workdir,
                         **user.popen_kwargs(env=python_client_env()))
    p.outs = outs
    return p


def result(p, who, timeout=180):
    p.wait(timeout=timeout)
    text = []
    for f in p.outs:
        f.seek(0)
        text.append(f.read())
        f.close()
    out, err = text
    m = sanitizer_report(err)
    assert m is None, f"{who} printed a {m} report:\n{err}"
    res = [line[7:] for line in out.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and res, f"{who} failed (exit {p.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
    return json.loads(res[-1]), err


def wait_for(cond, what, procs=(), timeout=60):
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            if p.poll() is not None:
                p.outs[1].seek(0)
                raise AssertionError(f"{what}: the trainer exited {p.returncode} first:\n"
                                     f"{p.outs[1].read()}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def tokens_of(user, path, base):
    """A uint32 token file of @user's alone: token k is k + @base."""
    (np.arange(NTOK, dtype=np.uint32) + base).tofile(path)
    os.chown(path, user.uid, user.gid)
    os.chmod(path, 0o600)
    return path


def daemon_in(daemon, workdir, sub, mode):
    """A daemon (root) all may use, its socket in the new directory @sub of
    @mode: (that directory, the socket, the config, the daemon)."""
    run = os.path.join(workdir, sub)
    os.mkdir(run)
    os.chmod(run, mode)
    sock = os.path.join(run, "loaderd.sock")
    cfg = shared_config(workdir)
    return run, sock, cfg, daemon("--config", cfg, socket=sock)


def start_trainer(alice, workdir, sock, pipe):
    """alice's TRAINER of @pipe, once it has taken its first two batches:
    (its process, its output folder, where the test writes "go")."""
    out = os.path.join(workdir, "out")
    os.mkdir(out)
    os.chmod(out, 0o777)
    p = run_script(alice, workdir, "trainer", TRAINER, sock, out, json.dumps(pipe))
    wait_for(lambda: os.path.exists(os.path.join(out, "paused")), "alice's first batches", [p])
    return p, out


def bobs_alice_train(workdir, files, bob):
    """bob's spec of a pipeline named alice-train over his own file, the
    layout of alice's (dtype, seq_len, batch size), open to all."""
    path = os.path.join(workdir, "bob-spec.json")
    with open(path, "w") as f:
        json.dump(dict(token_spec("alice-train", files[bob.name], SEQ, "uint32", batch_size=BS),
                       epochs=1, access="all", persist=True), f)
    os.chmod(path, 0o644)
    return path


def check_after(r):
    """After the restart the trainer took only what the old daemon had put
    in its batch ring already (alice's next samples, in order), then an
    error: never one of bob's tokens, never the end of the epoch."""
    assert r["before"] == list(range(0, 8 * SEQ, SEQ))
    assert [t for t in r["after"] if t >= BOB_BASE] == [], "alice's trainer got bob's batches"
    assert r["after"] == list(range(8 * SEQ, 8 * SEQ + len(r["after"]) * SEQ, SEQ))
    assert len(r["after"]) < NSAMPLES - 8
    assert r["err"] is not None


@pytest.fixture
def two(workdir, users):
    """alice and bob, a directory each may read for scripts, a token file
    each that only its owner may read."""
    alice, bob = users
    open_to_all(workdir)
    files = {}
    for u, base in ((alice, 0), (bob, BOB_BASE)):
        d = os.path.join(workdir, u.name)
        os.mkdir(d)
        os.chown(d, u.uid, u.gid)
        os.chmod(d, 0o755)
        files[u.name] = tokens_of(u, os.path.join(d, "tok.bin"), base)
    return alice, bob, files


# ------------------------------------------------------------------ item 1

SQUAT_DS = textwrap.dedent("""
    import os
    import torch

    class Who(torch.utils.data.Dataset):
        \"\"\"Sample i: i, and the uid of the process that built it.\"\"\"
        def __init__(self, n):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            return {"i": i, "uid": os.getuid()}
""")

SPEC_PY = {"source": {"kind": "python", "dataset": "whods:Who", "args": {"n": 16}}}


def test_python_dataset_name_cannot_be_squatted(daemon, workdir, two):
    """bob creates first, with the same spec, "access": "all" and persist,
    the pipeline name alice's loader computes for her Dataset, fed by his own
    host: alice's loader must not join it (her name is her own; exist_ok joins
    no other owner's pipeline), and says whose it is."""
    pytest.importorskip("torch")
    alice, bob, _ = two
    with open(os.path.join(workdir, "whods.py"), "w") as f:
        f.write(SQUAT_DS)
    os.chmod(os.path.join(workdir, "whods.py"), 0o644)
    d = daemon("--config", shared_config(workdir))

    # bob computes alice's name as her loader would (her uid where the
    # package asks for one), then creates it with his host behind it
    bob_p = run_script(bob, workdir, "bob", PRELUDE + textwrap.dedent(f"""
        from loaderd import pydataset
        real = os.geteuid
        os.geteuid = lambda: {alice.uid}
        spec, _ = pydataset.build_spec(dict({SPEC_PY!r}), overrides={{"batch_size": 4}})
        os.geteuid = real
        name = spec["name"]
        dl = loaderd.DataLoader(dict({SPEC_PY!r}, name=name, access="all", persist=True),
                                batch_size=4, socket=SOCK, as_numpy=True)
        uids = sorted({{int(u) for b in dl for u in b["uid"]}})
        out(name=name, uids=uids)
        dl.close()
    """), d.socket, workdir)
    r, _ = result(bob_p, "bob")
    assert r["uids"] == [bob.uid]
    name = r["name"]
    assert d.pipeline(name)["owner"]["uid"] == bob.uid

    alice_body = PRELUDE + textwrap.dedent(f"""
        try:
            dl = loaderd.DataLoader(dict({SPEC_PY!r}), batch_size=4, socket=SOCK, as_numpy=True)
        except loaderd.Error as e:
            out(err=str(e))
        else:
            out(name=dl.pipeline, created=dl.created,
                uids=sorted({{int(u) for b in dl for u in b["uid"]}}))
            dl.close()
    """)
    r, _ = result(run_script(alice, workdir, "alice", alice_body, d.socket, workdir), "alice")
    assert r.get("err") is not None, f"alice's loader joined bob's pipeline: {r}"
    assert (f"pipeline '{name}' exists already, owned by ldr-bob (uid {bob.uid}): exist_ok joins "
            "only your own pipelines") in r["err"], r["err"]
    # bob's pipeline is there still, as it was: one holder less than never
    assert d.pipeline(name)["owner"]["uid"] == bob.uid

    # once bob's is gone the same loader gets its own pipeline, her samples
    bob.ctl(d, "drop", name, "--force", check=True)
    r, _ = result(run_script(alice, workdir, "alice2", alice_body, d.socket, workdir), "alice")
    assert r == {"name": name, "created": True, "uids": [alice.uid]}, r


# ------------------------------------------------------------------ item 2

@pytest.mark.parametrize("how", ["created", "by_name"])
def test_restart_race_never_reattaches_to_another_users_pipeline(daemon, workdir, two, how):
    """alice's trainer reads alice-train (which it created, or which she
    created with loaderctl and it attached by name); the daemon is SIGKILLed
    and a new one starts on the same socket; bob creates alice-train over his
    own file (same dtype, seq_len, batch size, "access": "all") before alice's
    trainer reconnects. The trainer's next batch is an error naming why; it
    never gets one of bob's."""
    alice, bob, files = two
    run, sock, cfg, d1 = daemon_in(daemon, workdir, "run", 0o755)
    spec = token_spec("alice-train", files[alice.name], SEQ, "uint32", batch_size=BS)
    if how == "created":
        pipe = dict(spec, epochs=1)
    else:
        path = os.path.join(workdir, "alice-spec.json")
        with open(path, "w") as f:
            json.dump(dict(spec, epochs=1), f)
        os.chmod(path, 0o644)
        alice.ctl(d1, "create", "--spec", path, check=True)
        pipe = "alice-train"
    p, out = start_trainer(alice, workdir, sock, pipe)
    assert d1.pipeline("alice-train")["owner"]["uid"] == alice.uid

    # alice's trainer cannot reach the socket until bob has created his
    os.chown(run, 0, bob.gid)
    os.chmod(run, 0o750)
    d1.kill9()
    d2 = daemon("--config", cfg, socket=sock)
    bspec = bobs_alice_train(workdir, files, bob)
    bob.ctl(d2, "create", "--spec", bspec, check=True)
    assert d2.pipeline("alice-train")["owner"]["uid"] == bob.uid
    os.chmod(run, 0o755)
    open(os.path.join(out, "go"), "w").close()
    r, err = result(p, "alice's trainer")
    check_after(r)
    if how == "created":
        assert (f"the daemon at {sock} restarted, and pipeline 'alice-train' could not be created "
                "again: pipeline 'alice-train' exists already with another spec") in r["err"], r["err"]
    else:
        assert (f"pipeline 'alice-train' now belongs to ldr-bob (uid {bob.uid}), not to ldr-alice "
                f"(uid {alice.uid}) as at the attach") in r["err"], r["err"]
    assert "not attached again" in r["err"] or "could not be attached again" in r["err"], r["err"]
    # bob's pipeline served nobody of alice's
    assert d2.pipeline("alice-train")["clients"] == 0


# ------------------------------------------------------------------ item 3

def test_trainer_refuses_a_daemon_of_another_user(daemon, workdir, two):
    """The socket lies in a world-writable directory (sticky, as /tmp). The
    real daemon (root) stops; bob starts his own loaderd on the same path,
    with a pipeline of the name alice's trainer reads over his own file.
    alice's trainer must not follow it (its next batch is an error naming
    bob's uid and the path); a fresh client of alice's refuses it at connect,
    unless she names bob as loaderd's service user."""
    alice, bob, files = two
    tmp, sock, cfg, d1 = daemon_in(daemon, workdir, "tmp", 0o1777)
    spec = dict(token_spec("alice-train", files[alice.name], SEQ, "uint32", batch_size=BS), epochs=1)
    p, out = start_trainer(alice, workdir, sock, spec)

    # while bob sets up, only he (and root) may reach the directory, so that
    # alice's trainer finds his daemon with his pipeline (not one without)
    os.chown(tmp, 0, bob.gid)
    os.chmod(tmp, 0o1770)
    d1.stop(reap_first=False)         # down: its socket is gone
    bspec = bobs_alice_train(workdir, files, bob)
    blog = open(os.path.join(workdir, "bob-daemon.log"), "w")
    bd = subprocess.Popen([LOADERD, "--socket", sock, "--config", cfg, "--workers", "1"],
                          stdout=blog, stderr=subprocess.STDOUT, **bob.popen_kwargs())
    try:
        class D:
            socket = sock

            def ctl_cmd(self, *args, json_out=False):
                return d1.ctl_cmd(*args, json_out=json_out)
        bdd = D()
        wait_for(lambda: bob.ctl(bdd, "status").returncode == 0, "bob's daemon")
        bob.ctl(bdd, "create", "--spec", bspec, check=True)
        os.chmod(tmp, 0o1777)
        open(os.path.join(out, "go"), "w").close()
        r, err = result(p, "alice's trainer")
        check_after(r)
        want = (f"the daemon at {sock} now runs as ldr-bob (uid {bob.uid}), not as root (uid 0) as "
                "when this client connected: refusing to follow it")
        assert r["err"] is not None and want in r["err"], r["err"]

        # a fresh client of alice's: refused at connect, naming uid and path
        c = alice.ctl(bdd, "status")
        assert c.returncode != 0
        assert (f"the daemon at {sock} runs as ldr-bob (uid {bob.uid}), which is neither root, you "
                f"(ldr-alice (uid {alice.uid}))") in c.stderr, c.stderr
        # ...unless she says that bob's is loaderd's service user
        env = dict(os.environ, LOADERD_DAEMON_USER="ldr-bob")
        assert alice.ctl(bdd, "status", env=env).returncode == 0
        env["LOADERD_DAEMON_USER"] = "no-such-user-x"
        c = alice.ctl(bdd, "status", env=env)
        assert c.returncode != 0 and ("LOADERD_DAEMON_USER='no-such-user-x' is neither a user of "
                                      "this machine nor a uid") in c.stderr, c.stderr
    finally:
        bd.terminate()
        assert bd.wait(timeout=15) == 0
        blog.close()


# ------------------------------------------------------------ the exist_ok rule

def test_exist_ok_joins_only_own_the_daemons_or_the_named_owners(daemon, workdir, two):
    """An identical pipeline of that name: exist_ok joins the caller's own
    and the config's (the daemon's); another user's only when the create names
    that owner (loaderctl create --owner); a third user named is refused. The
    create's reply says whose pipeline it is (loaderctl --json)."""
    alice, bob, files = two
    tok = os.path.join(workdir, "open.bin")
    (np.arange(NTOK, dtype=np.uint32)).tofile(tok)
    os.chmod(tok, 0o644)
    cfg = os.path.join(workdir, "cfg.json")
    conf = json.load(open(shared_config(workdir)))
    conf["pipelines"] = [dict(token_spec("cfg", tok, SEQ, "uint32", batch_size=BS))]
    with open(cfg, "w") as f:
        json.dump(conf, f)
    os.chmod(cfg, 0o644)
    d = daemon("--config", cfg)

    def spec_file(name, **kw):
        path = os.path.join(workdir, f"{name}-{len(kw)}.json")
        with open(path, "w") as f:
            json.dump(dict(token_spec(name, tok, SEQ, "uint32", batch_size=BS), **kw), f)
        os.chmod(path, 0o644)
        return path

    def create(user, path, *args):
        r = user.ctl(d, "create", "--spec", path, *args, json_out=True)
        return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else r.stderr)

    shared = spec_file("shared", access="all")
    assert create(alice, shared) == (0, {"name": "shared", "created": True})
    # alice again: her own
    assert create(alice, shared, "--exist-ok") == (0, {"name": "shared", "created": False})
    # bob, exist_ok alone: refused, naming the owner
    rc, err = create(bob, shared, "--exist-ok")
    assert rc == 1 and (f"pipeline 'shared' exists already, owned by ldr-alice (uid {alice.uid}): "
                        "exist_ok joins only your own pipelines; attach it by name if you mean to "
                        "read it, or use another name") in err, err
    # bob naming another owner than alice: refused as well
    rc, err = create(bob, shared, "--owner", "root")
    assert rc == 1 and f"owned by ldr-alice (uid {alice.uid})" in err, err
    # bob naming alice: joined, on purpose (by name or by uid)
    assert create(bob, shared, "--owner", "ldr-alice") == (0, {"name": "shared", "created": False})
    assert create(bob, shared, "--owner", str(alice.uid)) == (0, {"name": "shared", "created": False})
    # the Python client's owner=, and its exist_ok alone
    r, _ = result(run_script(bob, workdir, "bob-py", PRELUDE + textwrap.dedent(f"""
        spec = json.load(open({shared!r}))
        c = loaderd.Client(SOCK)
        joined = c.create_pipeline(spec, owner="ldr-alice")
        try:
            c.create_pipeline(spec, exist_ok=True)
        except loaderd.Error as e:
            out(joined=joined, err=str(e))
    """), d.socket, workdir), "bob")
    assert r["joined"] == ["shared", False]
    assert f"exists already, owned by ldr-alice (uid {alice.uid})" in r["err"], r["err"]
    # the config's pipeline is the daemon's: anyone's exist_ok joins it
    cfgspec = os.path.join(workdir, "cfg-spec.json")
    with open(cfgspec, "w") as f:
        json.dump(dict(token_spec("cfg", tok, SEQ, "uint32", batch_size=BS), persist=True), f)
    os.chmod(cfgspec, 0o644)
    assert create(bob, cfgspec, "--exist-ok") == (0, {"name": "cfg", "created": False})
    # attaching by name stays what `access` allows
    r = bob.ctl(d, "consume", "shared", "--batches", "1", check=True)
    assert "batches 1" in r.stdout, r.stdout
    assert d.pipeline("shared")["owner"]["uid"] == alice.uid
