# SPDX-License-Identifier: MIT
"""Pipelines scoped to the job (docs/spec.md, "Lifetime").

A pipeline a client creates is in use while an attachment reads it or while
the connection that created it (or found it with exist_ok) is open; once
unused it lingers (config key `linger`, a spec's `ttl`) and is dropped.
`"persist": true`, `loaderctl create` and the config's pipelines stay.

The trainer here is a small script on libloader's C API through ctypes
(TRAINER below): connect, create, attach, read N batches, print what it got,
exit -- the same script run as separate processes, as a user runs it twice.
"""

import json
import os
import pwd
import re
import signal
import subprocess
import sys

from ldrtest import BUILD_DIR, position_tokens, token_spec

LIBLOADER = os.path.join(BUILD_DIR, "client", "libloader.so")
L = 16

TRAINER = r'''
import ctypes, json, sys
a = json.loads(sys.argv[1])
lib = ctypes.CDLL(a["lib"])
P = ctypes.c_void_p
lib.ldr_connect.argtypes = [ctypes.POINTER(P), ctypes.c_char_p, ctypes.c_char_p]
lib.ldr_client_error.argtypes = [P]
lib.ldr_client_error.restype = ctypes.c_char_p
lib.ldr_client_id.argtypes = [P]
lib.ldr_client_id.restype = ctypes.c_uint64
lib.ldr_create_pipeline.argtypes = [P, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
lib.ldr_attach.argtypes = [P, ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(P)]
lib.ldr_next.argtypes = [P, ctypes.c_int, ctypes.POINTER(P)]
lib.ldr_batch_epoch.argtypes = [P]
lib.ldr_batch_epoch.restype = ctypes.c_uint64
lib.ldr_batch_index.argtypes = [P]
lib.ldr_batch_index.restype = ctypes.c_uint64
lib.ldr_release.argtypes = [P]
lib.ldr_detach.argtypes = [P]
lib.ldr_close.argtypes = [P]
c = P()
r = lib.ldr_connect(ctypes.byref(c), a["socket"].encode(), b"trainer")
if r != 0:
    sys.exit(f"connect: {r}")
out = {"client_id": lib.ldr_client_id(c), "batches": []}
if a.get("spec"):
    r = lib.ldr_create_pipeline(c, json.dumps(a["spec"]).encode(), 1 if a.get("exist_ok", True) else 0,
                                None, 0)
    if r < 0:
        print(json.dumps({"error": r, "message": lib.ldr_client_error(c).decode()}), flush=True)
        sys.exit(3)
    out["created"] = r == 1
if a.get("batches"):
    # struct ldr_attach_opts begins with size (a size_t; 0 = the first
    # layout), then mode, rank, world_size (uint32 each)
    opts = (ctypes.c_uint32 * 64)()
    opts[2], opts[3], opts[4] = a.get("mode", 0), a.get("rank", 0), a.get("world", 1)
    att = P()
    r = lib.ldr_attach(c, a["name"].encode(), ctypes.byref(opts), ctypes.byref(att))
    if r != 0:
        print(json.dumps({"error": r, "message": lib.ldr_client_error(c).decode()}), flush=True)
        sys.exit(4)
    for _ in range(a["batches"]):
        b = P()
        r = lib.ldr_next(att, 30000, ctypes.byref(b))
        if r != 0:
            sys.exit(f"next: {r}: {lib.ldr_client_error(c).decode()}")
        out["batches"].append([lib.ldr_batch_epoch(b), lib.ldr_batch_index(b)])
        lib.ldr_release(b)
    lib.ldr_detach(att)
print(json.dumps(out), flush=True)
if a.get("hold"):
    sys.stdin.readline()   # keep the connection open until told
lib.ldr_close(c)
'''

BROADCAST, PARTITION = 0, 1


def write_config(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def start(daemon, workdir, linger=None, extra=None, **kw):
    cfg = {}
    if linger is not None:
        cfg["linger"] = linger
    cfg.update(extra or {})
    path = os.path.join(workdir, "loaderd.json")
    write_config(path, cfg)
    d = daemon("--config", path, **kw)
    with open(os.path.join(workdir, "trainer.py"), "w") as f:
        f.write(TRAINER)
    return d


def tokens(workdir, n=400):
    path = os.path.join(workdir, "t.bin")
    if not os.path.exists(path):
        position_tokens(path, n * L + 1)
    return path


def spec(workdir, name="job", **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("epochs", 0)
    kw.setdefault("prefetch", 4)
    return token_spec(name, tokens(workdir), L, "uint32", **kw)


def trainer_args(d, workdir, spec=None, name=None, batches=3, **kw):
    args = {"lib": LIBLOADER, "socket": d.socket, "spec": spec,
            "name": name or (spec["name"] if spec else None), "batches": batches}
    args.update(kw)
    return [sys.executable, os.path.join(workdir, "trainer.py"), json.dumps(args)]


def trainer_env():
    """The trainer's environment. A sanitizer build's libloader needs the
    ASan/UBSan runtimes loaded first in a plain interpreter, without leak
    checking (the interpreter's own allocations)."""
    env = dict(os.environ)
    with open(LIBLOADER, "rb") as f:
        instrumented = b"libasan.so" in f.read()
    if instrumented:
        libs = [subprocess.run(["gcc", f"-print-file-name={n}"], capture_output=True, text=True,
                               check=True).stdout.strip() for n in ("libasan.so", "libubsan.so")]
        env["LD_PRELOAD"] = ":".join(libs)
        env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "detect_leaks=0"]))
    return env


def run_trainer(d, workdir, spec=None, check=True, run_id=None, **kw):
    """Run the trainer to its end (in torchrun's run @run_id, if given); its
    JSON line."""
    env = trainer_env()
    if run_id is not None:
        env["TORCHELASTIC_RUN_ID"] = run_id
    p = subprocess.run(trainer_args(d, workdir, spec, **kw), capture_output=True, text=True,
                       timeout=120, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"trainer exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}\n"
                             f"daemon log:\n{d.log()[-3000:]}")
    return json.loads(p.stdout.splitlines()[-1]) if p.stdout.strip() else {"rc": p.returncode}


class Holder:
    """A trainer that keeps its connection open until release()."""

    def __init__(self, d, workdir, spec=None, **kw):
        self.p = subprocess.Popen(trainer_args(d, workdir, spec, hold=True, **kw),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=trainer_env())
        d._children.append(self.p)
        line = self.p.stdout.readline()
        assert line, "the holding trainer printed nothing"
        self.out = json.loads(line)

    def release(self):
        self.p.stdin.close()
        assert self.p.wait(timeout=30) == 0


def names(st):
    return sorted(p["name"] for p in st["pipelines"])


def find(st, name):
    for p in st["pipelines"]:
        if p["name"] == name:
            return p
    return None


def wait_gone(d, name, timeout=15):
    return d.wait_for(lambda s: find(s, name) is None, f"pipeline {name} dropped", timeout=timeout)


def wait_unused(d, name, timeout=15):
    """The pipeline once the daemon saw its last user go: a trainer's exit
    closes its connection, which the daemon learns of a moment later (nng's
    pipe event), not by the time the process is reaped."""
    st = d.wait_for(lambda s: find(s, name) is not None and not find(s, name)["in_use"],
                    f"pipeline {name} unused", timeout=timeout)
    return find(st, name)


def outlive_the_linger(d, workdir, name="witness"):
    """Wait until every pipeline that went unused before now and that the
    linger drops is dropped: a pipeline of the same linger goes unused now
    (its trainer creates it and exits) and is waited for until it is gone.
    One timer drops every pipeline that is due (registry.c, on_linger), so a
    pipeline still there then was kept by something other than the clock."""
    run_trainer(d, workdir, spec(workdir, name=name), batches=0)
    wait_gone(d, name)
    assert f'pipeline.drop pipeline={name} why="unused for ' in d.log()


# ---------------------------------------------------------------- the job

def test_script_run_twice_starts_afresh(daemon, workdir):
    d = start(daemon, workdir, linger=0.5)
    s = spec(workdir)
    first = run_trainer(d, workdir, s)
    assert first["created"] is True
    assert first["batches"] == [[0, 0], [0, 1], [0, 2]]
    wait_gone(d, "job")
    assert 'pipeline.drop pipeline=job why="unused for 0.5 s"' in d.log()
    assert d.status()["memory_used"] == 0

    second = run_trainer(d, workdir, s)
    assert second["created"] is True, "the second run found the first run's pipeline"
    assert second["batches"] == [[0, 0], [0, 1], [0, 2]]
    wait_gone(d, "job")
    assert d.log().count('pipeline.drop pipeline=job why="unused for 0.5 s"') == 2


def test_linger_lets_a_later_rank_attach(daemon, workdir):
    d = start(daemon, workdir, linger=4)
    s = spec(workdir, name="ddp")
    r0 = run_trainer(d, workdir, s, mode=PARTITION, rank=0, world=2)
    assert r0["batches"] == [[0, 0], [0, 1], [0, 2]]
    p = wait_unused(d, "ddp")
    assert p["in_use"] is False and p["expires_in_s"] is not None and p["linger_s"] == 4
    # a while unused, in the daemon's view: the linger, not rank 0, keeps it
    p = find(d.wait_for(lambda s: (find(s, "ddp") or {}).get("idle_s", 0) >= 1, "ddp idle 1 s"),
             "ddp")
    assert p["in_use"] is False and p["expires_in_s"] is not None
    # rank 1 attaches by name (no create): the linger kept the pipeline for it
    r1 = run_trainer(d, workdir, None, name="ddp", mode=PARTITION, rank=1, world=2)
    assert r1["batches"] == [[0, 0], [0, 1], [0, 2]]
    assert "pipeline.drop" not in d.log()
    # and rank 1's attach started the linger over: gone only after it
    wait_gone(d, "ddp")
    assert 'pipeline.drop pipeline=ddp why="unused for 4 s"' in d.log()


def test_exist_ok_create_during_the_linger_keeps_it(daemon, workdir):
    d = start(daemon, workdir, linger=3)
    s = spec(workdir)
    first = run_trainer(d, workdir, s, batches=0)
    assert first["created"] is True
    h = Holder(d, workdir, s, batches=0)
    assert h.out["created"] is False, "exist_ok did not find the lingering pipeline"
    # past the end of the linger the first run started: kept by the holder
    outlive_the_linger(d, workdir)
    p = d.pipeline("job")
    assert p["in_use"] is True and p["idle_s"] == 0 and p["expires_in_s"] is None
    assert p["created_by"] == first["client_id"]
    h.release()
    wait_gone(d, "job")


def test_creator_connection_holds_the_pipeline(daemon, workdir):
    d = start(daemon, workdir, linger=0.2)
    h = Holder(d, workdir, spec(workdir), batches=2)
    assert h.out["batches"] == [[0, 0], [0, 1]]
    # detached (the daemon saw it), but the creating connection is open
    d.wait_for(lambda s: (find(s, "job") or {}).get("clients") == 0, "the holder detached")
    outlive_the_linger(d, workdir)
    p = d.pipeline("job")
    assert p["in_use"] is True and p["clients"] == 0 and p["created_by"] == h.out["client_id"]
    h.release()
    wait_gone(d, "job")


def test_relaunch_with_another_spec_replaces_a_lingering_pipeline(daemon, workdir):
    d = start(daemon, workdir, linger=30)
    run_trainer(d, workdir, spec(workdir, name="mnist", batch_size=4))
    assert wait_unused(d, "mnist")["in_use"] is False
    out = run_trainer(d, workdir, spec(workdir, name="mnist", batch_size=8))
    assert out["created"] is True and out["batches"] == [[0, 0], [0, 1], [0, 2]]
    assert d.pipeline("mnist")["batch_size"] == 8
    assert ('pipeline.drop pipeline=mnist why="unused, and client %d creates it with another '
            'spec: batch_size 8 (it has 4)"' % out["client_id"]) in d.log()


# ---------------------------------------------------------- persist, ttl

def test_persist_survives(daemon, workdir):
    d = start(daemon, workdir, linger=0.2)
    s = spec(workdir, persist=True)
    assert run_trainer(d, workdir, s, run_id="run-1")["created"] is True
    # unused for a second (counted from when the daemon saw the trainer go)
    st = d.wait_for(lambda s: (find(s, "job") or {}).get("idle_s", 0) >= 1, "job idle 1 s")
    p = find(st, "job")
    assert p["persist"] is True and p["expires_in_s"] is None and p["linger_s"] is None
    assert p["in_use"] is False and p["idle_s"] >= 1
    # a later trainer of the same job (torchrun's run id) joins it: persist is
    # not part of the spec's identity
    again = run_trainer(d, workdir, spec(workdir), run_id="run-1")
    assert again["created"] is False
    # the stream goes on where the first left it (what it had in flight is consumed)
    first = again["batches"][0][1]
    assert first >= 3 and again["batches"] == [[0, first], [0, first + 1], [0, first + 2]]
    # another job's trainer starts the stream again (docs/spec.md, "Jobs")
    other = run_trainer(d, workdir, spec(workdir), run_id="run-2")
    assert other["created"] is False and other["batches"] == [[0, 0], [0, 1], [0, 2]]
    assert "spec" in p and "persist" not in p["spec"]
    d.ctl("drop", "job")
    assert names(d.status()) == []


def test_persist_request_upgrades_a_scoped_pipeline(daemon, workdir):
    d = start(daemon, workdir, linger=0.2)
    h = Holder(d, workdir, spec(workdir), batches=0)
    assert d.pipeline("job")["persist"] is False
    # loaderctl create adds "persist": true; with --exist-ok it joins and upgrades
    r = d.create(spec(workdir), exist_ok=True)
    assert "pipeline job exists" in r.stdout
    assert d.pipeline("job")["persist"] is True
    h.release()
    assert wait_unused(d, "job")["persist"] is True
    outlive_the_linger(d, workdir)
    assert d.pipeline("job")["persist"] is True


def test_ttl_is_the_pipelines_own_linger(daemon, workdir):
    d = start(daemon, workdir, linger=0.2)
    run_trainer(d, workdir, spec(workdir, name="long", ttl=30))
    run_trainer(d, workdir, spec(workdir, name="short"))
    # "short" went unused after "long": the linger that dropped it is over for both
    wait_gone(d, "short")
    p = d.pipeline("long")
    assert p["persist"] is False and p["linger_s"] == 30
    assert 0 < p["expires_in_s"] <= 30

    d2 = start(daemon, workdir, linger=60)
    run_trainer(d2, workdir, spec(workdir, name="quick", ttl=0.3))
    run_trainer(d2, workdir, spec(workdir, name="slow"))
    wait_gone(d2, "quick")
    assert 'pipeline.drop pipeline=quick why="unused for 0.3 s"' in d2.log()
    p = d2.pipeline("slow")
    assert p["linger_s"] == 60 and p["expires_in_s"] > 30


def test_linger_follows_a_reload(daemon, workdir):
    d = start(daemon, workdir, linger=600)
    run_trainer(d, workdir, spec(workdir))
    assert wait_unused(d, "job")["expires_in_s"] > 500
    write_config(os.path.join(workdir, "loaderd.json"), {"linger": 0.2})
    os.kill(d.pid, signal.SIGHUP)
    wait_gone(d, "job")


def test_config_pipelines_persist(daemon, workdir):
    d = start(daemon, workdir, linger=0.1, extra={"pipelines": [spec(workdir, name="cfg", epochs=1)]})
    res = d.consume("cfg", "--batches", "3")
    assert res.json["batches"] == 3
    wait_unused(d, "cfg")
    outlive_the_linger(d, workdir)
    p = d.pipeline("cfg")
    assert p["created_by"] == "config" and p["persist"] is True and p["expires_in_s"] is None


def test_config_pipeline_with_lifetime_keys_is_refused(daemon, workdir):
    d = start(daemon, workdir, extra={"pipelines": [spec(workdir, name="t", ttl=5),
                                                    spec(workdir, name="f", persist=False),
                                                    spec(workdir, name="ok", persist=True)]})
    assert names(d.status()) == ["ok"]
    log = d.log()
    assert "pipelines[0]: ttl: pipelines of the config persist always" in log
    assert "pipelines[1]: persist: false: pipelines of the config persist always" in log


# ----------------------------------------------------------- loaderctl

def test_loaderctl_create_persists_unless_scoped(daemon, workdir):
    d = start(daemon, workdir, linger=0.2)
    d.create(spec(workdir, name="admin"))
    r = d.ctl("create", "--scoped", "--spec", d.spec_file(spec(workdir, name="scoped")))
    assert "created pipeline scoped" in r.stdout
    # "scoped" went unused after "admin": the linger that dropped it is over for both
    wait_gone(d, "scoped")
    p = d.pipeline("admin")
    assert p["persist"] is True and isinstance(p["created_by"], int)
    # a ttl of the spec's own is kept as it is: no persist added
    d.create(spec(workdir, name="ttl", ttl=0.2))
    wait_gone(d, "ttl")
    help_text = d.ctl("--help").stdout
    assert "--scoped" in help_text
    # a later process still finds what `loaderctl create` made
    assert d.consume("admin", "--batches", "2").json["batches"] == 2


# ------------------------------------------------------------- memory

def test_sweep_of_five_trials_under_a_memory_limit_for_two(daemon, workdir):
    s0 = spec(workdir, name="probe")
    d = start(daemon, workdir, linger=0)
    d.create(s0)
    one = d.status()["memory_used"]
    d.ctl("drop", "probe")
    assert one > 0

    d2 = start(daemon, workdir, linger=0, memory_limit=one * 2 + one // 2)
    for trial in range(5):
        out = run_trainer(d2, workdir, spec(workdir, name=f"trial{trial}", seed=trial))
        assert out["created"] is True and out["batches"] == [[0, 0], [0, 1], [0, 2]], trial
    d2.wait_for(lambda s: s["pipelines"] == [] and s["memory_used"] == 0, "every trial's pipeline dropped")

    # the control: persistent trials fill the limit at the third
    for trial in range(2):
        run_trainer(d2, workdir, spec(workdir, name=f"kept{trial}", seed=trial, persist=True))
    out = run_trainer(d2, workdir, spec(workdir, name="kept2", seed=2, persist=True), check=False)
    assert out.get("error") == -28 and "memory limit" in out["message"], out


# ------------------------------------------------------ another spec

def test_another_spec_error_names_the_keys(daemon, workdir):
    d = start(daemon, workdir, linger=30)
    d.create(spec(workdir, name="mnist", batch_size=32))
    r = d.create(spec(workdir, name="mnist", batch_size=64, shuffle=True), check=False)
    assert r.returncode == 1
    assert ("pipeline 'mnist' exists already with another spec: batch_size 64 (it has 32), "
            "shuffle true (it has false); use another name, or drop it first "
            "(loaderctl drop mnist)") in r.stderr, r.stderr
    other = spec(workdir, name="mnist", batch_size=32)
    other["source"]["seq_len"] = 8
    r = d.create(other, check=False, exist_ok=True)
    assert "source.seq_len 8 (it has 16)" in r.stderr, r.stderr
    # lifetime keys are not part of the spec: same pipeline
    r = d.create(spec(workdir, name="mnist", batch_size=32, persist=False), exist_ok=True)
    assert "pipeline mnist exists" in r.stdout
    # a scoped pipeline in use refuses another spec the same way
    h = Holder(d, workdir, spec(workdir, name="busy"), batches=0)
    out = run_trainer(d, workdir, spec(workdir, name="busy", drop_last=True), batches=0, check=False)
    assert out.get("error") == -17 and "drop_last true (it has false)" in out["message"], out
    h.release()


# -------------------------------------------------------------- status

def test_status_shows_owner_age_and_idle_time(daemon, workdir):
    d = start(daemon, workdir, linger=30, extra={"pipelines": [spec(workdir, name="cfg")]})
    h = Holder(d, workdir, spec(workdir, name="held"), batches=1)
    run_trainer(d, workdir, spec(workdir, name="idle"), batches=1)
    # a second old and idle: idle_s counts from when the daemon saw the
    # trainer's connection go, a moment after the process was reaped
    st = d.wait_for(lambda s: all(p["age_s"] >= 1 for p in s["pipelines"]) and
                    all(find(s, n)["idle_s"] >= 1 for n in ("idle", "cfg")),
                    "a second of age and idleness")
    me = pwd.getpwuid(os.getuid()).pw_name
    for p in st["pipelines"]:
        assert p["owner"] == {"uid": os.getuid(), "user": me}, p["owner"]
        assert isinstance(p["age_s"], int) and p["age_s"] >= 1
        for key in ("created_by", "idle_s", "persist", "linger_s", "expires_in_s", "in_use"):
            assert key in p, key
    held, idle, cfg = find(st, "held"), find(st, "idle"), find(st, "cfg")
    assert held["created_by"] == h.out["client_id"] and held["in_use"] is True
    assert held["idle_s"] == 0 and held["expires_in_s"] is None and held["persist"] is False
    assert held["linger_s"] == 30
    assert idle["in_use"] is False and idle["idle_s"] >= 1 and 0 < idle["expires_in_s"] <= 30
    assert cfg["created_by"] == "config" and cfg["persist"] is True and cfg["expires_in_s"] is None
    assert cfg["linger_s"] is None and cfg["idle_s"] >= 1

    # the text table: the lifetime columns, aligned
    text = d.ctl("pipelines").stdout.splitlines()
    head = text[0]
    assert re.split(r"\s{2,}", head.strip()) == ["PIPELINE", "STATE", "SLOTS", "PREFETCH", "CLIENTS",
                                                 "PRODUCED", "OWNER", "BY", "AGE", "IDLE", "EXPIRES"]
    rows = {line.split()[0]: line for line in text[1:4]}
    col = head.index("OWNER")
    for line in rows.values():
        assert line[col:].split()[0] == me and line[col - 2:col] == "  ", line
    assert rows["cfg"].split()[7] == "config" and rows["cfg"].split()[-1] == "never"
    assert rows["held"].split()[-2:] == ["-", "-"]
    assert rows["idle"].split()[-1].endswith("s") and rows["idle"].split()[-2] != "-"
    h.release()
