# SPDX-License-Identifier: MIT
"""Live tuning and reload (docs/config.md): `loaderctl set`, `loaderctl
reload` and SIGHUP change the running daemon without cutting off its
clients, refuse non-admins, and keep everything when the file is invalid."""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from ldrtest import fuse_mount, partition_share, random_tokens, sequential_batches, split_batches, token_dump, token_spec
from users import open_to_all, shared_config, users  # noqa: F401 (fixture)

SEQ = 16


def write_config(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def tokens(workdir, nsamples, seed, name="t.bin"):
    path = os.path.join(workdir, name)
    return path, random_tokens(path, SEQ * nsamples + 1, "uint16", seed=seed)


def expected(toks, batch, epochs=1, batches=None):
    n = (len(toks) - 1) // SEQ
    b = sequential_batches(n, batch, epochs=epochs)
    return token_dump(toks, SEQ, b if batches is None else b[:batches])


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def names(st):
    return sorted(p["name"] for p in st["pipelines"])


# ---------------------------------------------------------------- set

def test_set_workers_grows_and_shrinks_while_a_client_streams(daemon, workdir):
    tok, toks = tokens(workdir, 600, seed=21)
    d = daemon()                                   # --workers 2
    d.create(token_spec("w", tok, SEQ, "uint16", batch_size=4, epochs=2))
    assert d.status()["workers"] == 2
    base = threads(d.pid)
    c = d.popen_consume("w", "--delay", "2")
    prev = 2
    for n in (8, 1, 5, 2, 12, 3):
        r = d.ctl("set", "workers", n)
        note = "\n  (threads that leave finish their task first)" if n < prev else ""
        assert r.stdout == f"workers: {prev} -> {n}{note}\n"
        assert d.status()["workers"] == n
        # the pool really has n threads: the others of the daemon stay
        d.wait_for(lambda s: threads(d.pid) == base - 2 + n, f"{n} worker threads")
        prev = n
    res = c.wait(check=True)
    assert res.json["batches"] == 2 * 150
    assert res.dump == expected(toks, 4, epochs=2)
    log = d.log()
    assert re.search(r"notice: settings\.set key=workers old=2 new=8 client=\d+ pid=\d+ uid=0 "
                     r"user=\"root \(uid 0\)\"\n", log), log
    assert re.search(r"settings\.set key=workers old=5 new=2 client=\d+ pid=\d+ uid=0 user=\"root "
                     r"\(uid 0\)\" note=\"threads that leave finish their task first\"\n", log), log


def test_set_refuses_bad_values_and_says_why(daemon, workdir):
    tok, _ = tokens(workdir, 40, seed=22)
    d = daemon()
    d.create(token_spec("p", tok, SEQ, "uint16", batch_size=4, prefetch=4))
    for args, msg in ((("workers", "0"), "loaderctl: set: workers: '0' is not a thread count in 1..1024"),
                      (("workers", "1025"), "'1025' is not a thread count in 1..1024"),
                      (("workers", "two"), "'two' is not a thread count"),
                      (("log-level", "loud"), "log_level: 'loud' is none of error, warning, "
                                              "notice, info, debug"),
                      (("memory-limit", "lots"), "'lots' is not a size (bytes, or like 512M, 4G)"),
                      (("prefetch", "p", "0"), "prefetch: '0' is not a slot count (1 or more)"),
                      (("prefetch", "p", "5"), "prefetch: pipeline 'p' has a slab of 4 slots, so "
                                               "its prefetch is 1..4 live"),
                      (("prefetch", "p", "5"), "a larger one needs a new slab"),
                      (("prefetch", "nope", "2"), "set: no pipeline named 'nope'")):
        r = d.ctl("set", *args, check=False)
        assert r.returncode == 1 and msg in r.stderr, (args, r.stderr)
    for args in (("colour", "red"), ("workers",), ("workers", "1", "2"), ("prefetch", "4")):
        r = d.ctl("set", *args, check=False)
        assert r.returncode == 2 and "Try 'loaderctl --help'" in r.stderr, (args, r.stderr)
    st = d.status()
    assert st["workers"] == 2 and d.pipeline("p")["prefetch"] == 4


def test_set_memory_limit_applies_to_new_creates(daemon, workdir):
    tok, _ = tokens(workdir, 40, seed=23)
    d = daemon(memory_limit="64M")
    d.create(token_spec("m1", tok, SEQ, "uint16", batch_size=4))
    used = d.status()["memory_used"]
    r = d.ctl("--json", "set", "memory-limit", "4K")
    rep = json.loads(r.stdout)
    assert rep["key"] == "memory_limit" and rep["old"] == 64 << 20 and rep["new"] == 4096
    assert rep["note"] == (f"{used} bytes are in use, above the new limit: nothing is freed, "
                           "creates are refused until pipelines are dropped")
    assert d.pipeline("m1")["state"] == "running"
    r = d.create(token_spec("m2", tok, SEQ, "uint16", batch_size=4), check=False)
    assert r.returncode == 1 and "memory limit: pipeline 'm2' needs" in r.stderr
    assert "0 of 4096 bytes are free" in r.stderr, r.stderr
    d.ctl("set", "memory-limit", "64M")
    d.create(token_spec("m2", tok, SEQ, "uint16", batch_size=4))


def test_set_prefetch_caps_the_slots_live(daemon, workdir):
    tok, toks = tokens(workdir, 400, seed=24)
    d = daemon()
    d.create(token_spec("held", tok, SEQ, "uint16", batch_size=4, prefetch=8, epochs=0))
    # a trainer that holds each batch for long: the stream fills its slots
    c = d.popen_consume("held", "--delay", "100000")
    d.wait_for(lambda s: d.pipeline("held")["slots_in_use"] == 8, "8 slots filled")
    r = d.ctl("set", "prefetch", "held", "3")
    assert r.stdout == "prefetch of held: 8 -> 3\n"
    p = d.wait_for(lambda s: d.pipeline("held")["slots_in_use"] == 3, "3 slots in use")
    p = d.pipeline("held")
    assert p["prefetch"] == 3 and p["slots_total"] == 8
    r = d.ctl("set", "prefetch", "held", "8")
    d.wait_for(lambda s: d.pipeline("held")["slots_in_use"] == 8, "8 slots again")
    c.signal(signal.SIGTERM)
    c.wait()

    # while a client streams: every batch once, in order
    d.create(token_spec("live", tok, SEQ, "uint16", batch_size=4, prefetch=8, epochs=2))
    c = d.popen_consume("live", "--delay", "2")
    for n in (2, 6, 1, 8, 4):
        d.ctl("set", "prefetch", "live", n)
        assert d.pipeline("live")["prefetch"] == n
    res = c.wait(check=True)
    assert res.dump == expected(toks, 4, epochs=2)
    assert re.search(r"settings\.set key=prefetch pipeline=live old=1 new=8 client=\d+ pid=\d+ uid=0",
                     d.log())


def test_an_attach_refused_for_a_lowered_prefetch_says_how_to_raise_it(daemon, workdir):
    tok, _ = tokens(workdir, 400, seed=34)
    d = daemon()
    d.create(token_spec("p", tok, SEQ, "uint16", batch_size=4, prefetch=4, epochs=0))
    d.ctl("set", "prefetch", "p", "1")
    c = d.popen_consume("p", "--delay", "100000", dump=False)     # the broadcast stream
    d.wait_for(lambda s: any(a["delivered"] >= 1 for cl in s["clients"] for a in cl["attachments"]),
               "the broadcast client read")
    r = d.consume("p", "--mode", "dynamic", dump=False, check=False)
    assert r.rc == 1
    assert ("attach: pipeline 'p' has a live prefetch of 1 (its slab has 4 slots) and 1 streams "
            "read it already (one per partition rank, one for its broadcast and one for its "
            "dynamic clients): each stream needs a slot of its own; raise it with `loaderctl set "
            "prefetch p 2`") in r.stderr, r.stderr
    # at the slab's slots, only a new slab makes room
    d.create(token_spec("q", tok, SEQ, "uint16", batch_size=4, prefetch=2, epochs=0))
    c2 = d.popen_consume("q", "--delay", "100000", dump=False)
    c3 = d.popen_consume("q", "--mode", "partition", "--rank", 0, "--world-size", 1,
                         "--delay", "100000", dump=False)
    d.wait_for(lambda s: sum(1 for cl in s["clients"] for a in cl["attachments"]) == 3,
               "two streams of q read")
    r = d.consume("q", "--mode", "dynamic", dump=False, check=False)
    assert r.rc == 1
    assert "attach: pipeline 'q' has 2 slots and 2 streams read it already" in r.stderr, r.stderr
    assert "create the pipeline with a prefetch of at least 3" in r.stderr, r.stderr
    for x in (c, c2, c3):
        x.proc.kill()
        x.proc.wait()


def test_sizes_above_the_largest_are_refused(daemon, workdir):
    d = daemon()
    r = d.ctl("set", "memory-limit", "10000000T", check=False)
    assert r.returncode == 1
    assert r.stderr == ("loaderctl: set: memory_limit: '10000000T' is above the largest size, "
                        "9223372036854775807 bytes\n"), r.stderr
    assert d.status()["memory_limit"] > 0
    assert json.loads(d.ctl("--json", "set", "memory-limit", "8388607T").stdout)["new"] == \
        8388607 << 40
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {})
    d2 = daemon("--config", cfg)
    for key in ("memory_limit", "max_held_after_drop"):
        write_config(cfg, {key: "10000000T"})
        r = d2.ctl("reload", check=False)
        assert r.returncode == 1
        assert (f'{cfg}: {key}: "10000000T" is above the largest size, 9223372036854775807 bytes; '
                "the running config is kept") in r.stderr, r.stderr


def test_set_log_level_changes_logging_at_once(daemon, workdir):
    d = daemon()
    d.ctl("status")
    assert "debug:" not in d.log()
    r = d.ctl("set", "log-level", "debug")
    assert r.stdout == "log_level: info -> debug\n"
    d.ctl("status")
    assert re.search(r"debug: client\.connect client=\d+ pid=\d+ uid=0", d.log()), d.log()
    d.ctl("set", "log_level", "warning")
    log = d.log()
    assert re.search(r'notice: settings\.set key=log_level old=debug new=warning client=\d+', log), log
    d.ctl("status")
    d.ctl("status")
    assert d.log() == log                          # nothing below warning any more
    d.ctl("set", "log-level", "info")
    assert "settings.set key=log_level old=warning new=info" in d.log()


def test_set_and_reload_are_for_admins(daemon, workdir, users):
    alice, bob = users
    open_to_all(workdir)
    d = daemon("--config", shared_config(workdir))
    for args in (("set", "workers", "7"), ("reload",)):
        r = bob.ctl(d, *args)
        verb = args[0]
        what = "change settings" if verb == "set" else "reload the config"
        assert r.returncode == 1, r
        assert r.stderr == (f"loaderctl: {verb}: only root, loaderd's own user and members of "
                            f"the config's admin_group may {what} (no admin_group is configured); "
                            f"ldr-bob (uid {bob.uid}) is none of them (docs/security.md)\n")
    assert d.status()["workers"] == 2
    assert "settings.set" not in d.log()

    # in the admin_group, bob may; the log names him
    d2 = daemon("--config", shared_config(workdir, admin_group="ldr-team"))
    r = bob.ctl(d2, "set", "workers", "3")
    assert r.returncode == 0 and r.stdout == "workers: 2 -> 3\n", r.stderr
    assert re.search(rf"settings\.set key=workers old=2 new=3 client=\d+ pid=\d+ uid={bob.uid} "
                     rf"user=\"ldr-bob \(uid {bob.uid}\)\"", d2.log()), d2.log()
    r = bob.run(d2.ctl_cmd("set", "workers", "4"), team=False)
    assert r.returncode == 1 and "(the admin_group is ldr-team); ldr-bob" in r.stderr, r.stderr
    assert d2.status()["workers"] == 3


# ------------------------------------------------------------- reload

def test_reload_applies_live_settings_and_names_restart_keys(daemon, workdir):
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"workers": 2, "log_level": "info", "linger": 5})
    d = daemon("--config", cfg, workers=None)
    write_config(cfg, {"workers": 3, "memory_limit": "64M", "log_level": "notice", "linger": 1.5,
                       "max_connections_per_uid": 20, "socket_mode": "0600",
                       "dataset_roots": [workdir]})
    rep = d.ctl_json("reload")
    changed = {c["key"]: (c["old"], c["new"]) for c in rep["changed"]}
    assert changed.pop("memory_limit")[1] == 64 << 20
    assert changed == {"workers": (2, 3), "log_level": ("info", "notice"), "linger": (5, 1.5),
                       "max_connections_per_uid": (64, 20)}
    real = os.path.realpath(workdir)
    # the command line's --socket wins over the file: not named
    assert rep["restart_needed"] == [
        {"key": "socket_mode", "running": "0660", "file": "0600"},
        {"key": "dataset_roots", "running": None, "file": [real]}]
    assert rep["file"] == cfg and rep["pipelines"]["created"] == []
    st = d.status()
    assert st["workers"] == 3 and st["memory_limit"] == 64 << 20
    log = d.log()
    assert re.search(r'notice: config\.change key=workers old=2 new=3 by="root \(uid 0\), pid \d+"\n',
                     log), log
    assert (f'warning: config.restart_needed key=dataset_roots running=null file="[\\"{real}\\"]" '
            f'config={cfg} why="it takes effect when loaderd restarts"') in log, log
    assert re.search(r'notice: config\.reload config=\S+ by="root \(uid 0\), pid \d+" changed=5 '
                     r'restart_needed=2 created=0 replaced=0 draining=0 failed=0\n', log), log
    r = d.ctl("reload")
    assert "no setting changed" in r.stdout and "socket_mode: 0660 (running), 0600 (file)" in r.stdout

    # SIGHUP does the same; a key the file drops goes back to its default
    write_config(cfg, {"workers": 4})
    os.kill(d.pid, signal.SIGHUP)
    d.wait_for(lambda s: s["workers"] == 4, "workers 4 after SIGHUP")
    assert "config.change key=log_level old=notice new=info by=SIGHUP\n" in d.log()

    # what the command line set wins over the file, also on a reload
    d2 = daemon("--config", cfg, workers=5)
    rep = d2.ctl_json("reload")
    assert [c["key"] for c in rep["changed"]] == [] and d2.status()["workers"] == 5


def test_invalid_file_keeps_the_running_config(daemon, workdir):
    tok, toks = tokens(workdir, 40, seed=25)
    cfg = os.path.join(workdir, "loaderd.json")
    good = {"workers": 2, "pipelines": [token_spec("a", tok, SEQ, "uint16", batch_size=4)]}
    write_config(cfg, good)
    d = daemon("--config", cfg, workers=None)
    os.mkdir(os.path.join(workdir, "conf.d"))
    drop = os.path.join(workdir, "conf.d", "50-x.json")
    for body, where, msg in (
            ('{"workers": 3, "pipelines": [', cfg, "line 1"),
            ('{"workers": 0}', cfg, "workers: must be an integer in 1..1024"),
            ('{"workers": 3, "pipelines": [{"name": "z", "source": {"kind": "tokens", "path": "%s"}}]}'
             % tok, cfg, "pipelines[0]: "),
            (json.dumps({"workers": 3, "pipelines": [token_spec("y", tok, SEQ, "uint16"),
                                                     token_spec("y", tok, 8, "uint16")]}),
             cfg, "pipelines[1]: name 'y' is pipelines[0]'s already"),
            (None, drop, 'unknown key "wrokers"')):
        if body is None:
            write_config(cfg, {"workers": 3})
            write_config(drop, {"wrokers": 1})
        else:
            with open(cfg, "w") as f:
                f.write(body)
        r = d.ctl("reload", check=False)
        assert r.returncode == 1, r.stdout
        assert r.stderr.startswith(f"loaderctl: reload: {where}: ") and msg in r.stderr, r.stderr
        assert r.stderr.endswith("; the running config is kept\n"), r.stderr
        assert f'error: config.invalid by="root (uid 0), pid {r.pid}" error="{where}: ' in d.log()
    os.kill(d.pid, signal.SIGHUP)
    d.wait_for(lambda s: 'config.invalid by=SIGHUP error="' + drop in d.log(),
               "the SIGHUP's error in the log")
    st = d.status()
    assert st["workers"] == 2 and names(st) == ["a"]
    assert d.consume("a").dump == expected(toks, 4)


def test_reload_creates_drains_and_replaces_pipelines(daemon, workdir):
    tok, toks = tokens(workdir, 400, seed=26)           # 100 batches of 4 an epoch
    cfg = os.path.join(workdir, "loaderd.json")
    spec_a = token_spec("a", tok, SEQ, "uint16", batch_size=4, epochs=0)
    spec_b = token_spec("b", tok, SEQ, "uint16", batch_size=4, epochs=1)
    spec_c = token_spec("c", tok, SEQ, "uint16", batch_size=5)
    write_config(cfg, {"pipelines": [spec_a, spec_b, spec_c]})
    d = daemon("--config", cfg)
    ca = d.popen_consume("a", "--delay", "80")        # endless: only the drain ends it
    cb = d.popen_consume("b", "--delay", "80")        # 8 s for its epoch
    # a client is listed from its connect, before it attached
    d.wait_for(lambda s: len(s["clients"]) == 2 and
               all(c["attachments"] and c["attachments"][0]["delivered"] >= 2
                   for c in s["clients"]), "both reading")

    spec_b2 = dict(spec_b, batch_size=8)
    spec_d = token_spec("d", tok, SEQ, "uint16", batch_size=10)
    write_config(cfg, {"pipelines": [spec_b2, spec_c, spec_d]})
    rep = d.ctl_json("reload")
    assert rep["pipelines"] == {
        "created": ["d"], "unchanged": ["c"], "failed": [],
        "replaced": [{"name": "b", "changed": "batch_size 8 (it has 4)"}],
        "draining": [{"name": "a", "clients": 1}]}
    # no new attachments to a drained pipeline; the replaced name is the new spec's
    r = d.consume("a", check=False)
    assert r.rc == 1 and "pipeline 'a' was removed from the config by a reload: its clients " \
                         "finish their epoch, no new ones attach" in r.stderr, r.stderr
    states = {(p["name"], p["state"], p["batch_size"]) for p in d.status()["pipelines"]}
    assert ("b", "replaced", 4) in states and ("b", "running", 8) in states

    # the drained one's client ends with the epoch it was in, told why
    res = ca.wait()
    assert res.rc == 1
    assert "pipeline 'a' was removed from the config (reload by root (uid 0), pid" in res.stderr
    assert "it ended with the epoch its clients were in" in res.stderr
    epoch = expected(toks, 4)
    assert len(res.dump) >= len(epoch) and len(res.dump) % len(epoch) == 0, len(res.dump)
    assert res.dump == expected(toks, 4, epochs=len(res.dump) // len(epoch))
    # the replaced one's client reads its whole epoch of the old spec
    assert cb.wait(check=True).dump == epoch
    # new attachments get the new spec; the old one goes with its last client
    assert d.consume("b", "--batches", 3).dump == expected(toks, 8, batches=3)
    d.wait_for(lambda s: names(s) == ["b", "c", "d"], "the retired pipelines dropped")
    assert d.consume("d").dump == expected(toks, 10)
    log = d.log()
    assert re.search(r'notice: pipeline\.drain pipeline=a clients=1 why="reload by root \(uid 0\), '
                     r'pid \d+"\n', log), log
    assert re.search(r'notice: pipeline\.replace pipeline=b clients=1 why="reload by root', log), log
    assert 'pipeline.drop pipeline=a why="removed by a reload, and no client reads it any more"' in log
    assert 'pipeline.drop pipeline=b why="replaced by a reload, and no client reads it any more"' in log


def test_drained_partition_ranks_end_after_the_same_epoch(daemon, workdir):
    tok, toks = tokens(workdir, 400, seed=28)           # 50 batches of 4 a rank an epoch
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"pipelines": [token_spec("p", tok, SEQ, "uint16", batch_size=4, epochs=0)]})
    d = daemon("--config", cfg)
    ranks = [d.popen_consume("p", "--mode", "partition", "--rank", r, "--world-size", 2,
                             "--delay", delay) for r, delay in ((0, 5), (1, 60))]

    def position_of(st, c):
        (a,) = [cl["attachments"][0] for cl in st["clients"] if cl["pid"] == c.pid and cl["attachments"]] or [None]
        return (a["position"]["epoch"], a["position"]["batch"]) if a and a["delivered"] else None
    # reload while rank 0 has begun a later epoch than rank 1 is in (3 s an
    # epoch). At (1, 0) rank 0 has read all of epoch 0 and none of epoch 1:
    # the drain would rightly end both after epoch 0, so wait for a batch past it.
    d.wait_for(lambda s: (position_of(s, ranks[0]) or (0, 0)) > (1, 0) and
               (position_of(s, ranks[1]) or (1,))[0] == 0,
               "rank 0 into a later epoch than rank 1")
    write_config(cfg, {})
    assert d.ctl_json("reload")["pipelines"]["draining"] == [{"name": "p", "clients": 2}]
    dumps = []
    for r, c in enumerate(ranks):
        res = c.wait()
        assert res.rc == 1 and "pipeline 'p' was removed from the config" in res.stderr, res.stderr
        one = token_dump(toks, SEQ, split_batches(partition_share(list(range(400)), r, 2), 4))
        assert len(res.dump) % len(one) == 0, len(res.dump)
        assert res.dump == one * (len(res.dump) // len(one))
        dumps.append(len(res.dump) // len(one))
    # the slow rank reads on to the epoch the fast one was in: both as many
    assert dumps[0] == dumps[1] >= 2, dumps


def test_a_draining_pipeline_can_be_dropped_at_once(daemon, workdir):
    tok, _ = tokens(workdir, 400, seed=27)
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"pipelines": [token_spec("e", tok, SEQ, "uint16", batch_size=4, epochs=0)]})
    d = daemon("--config", cfg)
    c = d.popen_consume("e", "--delay", "200")     # 100 batches: 20 s an epoch
    d.wait_for(lambda s: any(a["delivered"] for cl in s["clients"] for a in cl["attachments"]),
               "the client reading")
    write_config(cfg, {})
    assert d.ctl_json("reload")["pipelines"]["draining"] == [{"name": "e", "clients": 1}]
    assert d.pipeline("e")["state"] == "draining"
    r = d.ctl("drop", "e", check=False)
    assert r.returncode == 1 and "pipeline 'e' has 1 clients attached (use force)" in r.stderr
    d.ctl("drop", "e", "--force")
    res = c.wait()
    assert res.rc == 1 and "pipeline 'e' was dropped" in res.stderr, res.stderr
    assert names(d.status()) == []


def test_python_client_set_and_reload(daemon, workdir):
    import subprocess
    from ldrtest import python_client_env
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"workers": 2})
    d = daemon("--config", cfg, workers=None)
    write_config(cfg, {"workers": 3})
    code = ("import json, sys, loaderd\n"
            "c = loaderd.Client(sys.argv[1])\n"
            "print(json.dumps([c.set('log_level', 'debug'), c.reload()]))\n"
            "try:\n"
            "    c.set('workers', '0')\n"
            "except loaderd.Error as e:\n"
            "    print(e)\n")
    p = subprocess.run(["/usr/bin/python3", "-c", code, d.socket], capture_output=True, text=True,
                       env=python_client_env(), timeout=60)
    assert p.returncode == 0, p.stderr
    first, err = p.stdout.splitlines()
    s, rep = json.loads(first)
    assert s == {"key": "log_level", "old": "info", "new": "debug"}
    assert [(c["key"], c["old"], c["new"]) for c in rep["changed"]] == [
        ("workers", 2, 3), ("log_level", "debug", "info")]
    assert "workers: '0' is not a thread count in 1..1024" in err, err


def test_reload_without_a_config_file_says_so(daemon, workdir):
    d = daemon()
    r = d.ctl("reload", check=False)
    assert r.returncode == 1
    assert r.stderr == ("loaderctl: reload: loaderd runs without a config file (--config, "
                        "$LOADERD_CONFIG, /etc/loaderd/loaderd.json): nothing to reload\n")
    os.kill(d.pid, signal.SIGHUP)
    d.wait_for(lambda s: 'config.reload by=SIGHUP error="no config file to reload"' in d.log(),
               "the SIGHUP's note")
    assert d.status()["workers"] == 2


def test_reload_makes_a_failed_config_pipeline_anew(daemon, workdir):
    tok, toks = tokens(workdir, 400, seed=29)
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"pipelines": [token_spec("f", tok, SEQ, "uint16", batch_size=4, prefetch=2)]})
    d = daemon("--config", cfg)
    os.truncate(tok, SEQ * 2 * 40)                      # cut before anyone read it
    res = d.consume("f", "--timeout", 20000, check=False)
    assert res.rc == 1 and "truncated" in res.stderr, res.stderr
    d.wait_for(lambda s: d.pipeline("f")["state"] == "failed", "f failed")
    toks.tofile(tok)                                    # the file fixed
    rep = d.ctl_json("reload")
    (rp,) = rep["pipelines"]["replaced"]
    assert rp["name"] == "f" and rp["changed"].startswith("it had failed: ") and \
        "truncated" in rp["changed"], rp
    assert d.consume("f").dump == expected(toks, 4)
    d.wait_for(lambda s: [(x["name"], x["state"]) for x in s["pipelines"]] == [("f", "done")],
               "only the new f")


def test_reload_returns_a_live_prefetch_to_the_specs(daemon, workdir):
    tok, toks = tokens(workdir, 400, seed=33)
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"pipelines": [token_spec("p", tok, SEQ, "uint16", batch_size=4, prefetch=8)]})
    d = daemon("--config", cfg)
    d.ctl("set", "prefetch", "p", "3")
    assert d.pipeline("p")["prefetch"] == 3
    rep = d.ctl_json("reload")
    assert rep["changed"] == [{"key": "prefetch", "pipeline": "p", "old": 3, "new": 8}]
    assert rep["pipelines"]["unchanged"] == ["p"]
    assert d.pipeline("p")["prefetch"] == 8
    assert re.search(r'notice: config\.change key=prefetch pipeline=p old=3 new=8 by="root \(uid 0\), '
                     r'pid \d+"\n', d.log()), d.log()
    d.ctl("set", "prefetch", "p", "2")
    r = d.ctl("reload")
    assert "  prefetch of p: 2 -> 8\n" in r.stdout, r.stdout
    # at the spec's already: nothing to say
    assert d.ctl_json("reload")["changed"] == []
    assert d.consume("p").dump == expected(toks, 4)


def test_a_replace_that_does_not_fit_keeps_the_old_pipeline_as_it_was(daemon, workdir):
    tok, toks = tokens(workdir, 400, seed=36)
    cfg = os.path.join(workdir, "loaderd.json")
    spec = token_spec("p", tok, SEQ, "uint16", batch_size=4, prefetch=4)
    write_config(cfg, {"memory_limit": "24K", "pipelines": [spec]})
    d = daemon("--config", cfg, memory_limit=None)
    assert d.status()["memory_used"] == 4 * 4096
    d.wait_for(lambda s: d.pipeline("p")["idle_s"] >= 2, "p unused for 2 s", timeout=20)
    # the new spec's slab does not fit beside the old one
    write_config(cfg, {"memory_limit": "24K", "pipelines": [dict(spec, batch_size=5)]})
    r = d.ctl("reload", json_out=True, check=False)
    assert r.returncode == 1
    (f,) = json.loads(r.stdout)["pipelines"]["failed"]
    assert f["name"] == "p" and "memory limit: pipeline 'p' needs" in f["error"], f
    p = d.pipeline("p")
    # as it was: the config's, persistent, unused since before the reload
    assert (p["state"], p["batch_size"], p["persist"], p["in_use"]) == ("running", 4, True, False)
    assert p["idle_s"] >= 2, p
    assert 'pipeline.keep pipeline=p why="its new spec could not be created"' in d.log()
    assert d.consume("p").dump == expected(toks, 4)


# ------------------------------------------------- a reload that takes long

SLOW_FS = """
import errno, os, stat, sys, time
from fusepy import FUSE, Operations, FuseOSError
MNT, BACKING, HANG, OPENING = sys.argv[1:5]

class SlowOpen(Operations):
    # t.bin is BACKING's bytes; an open waits while HANG exists (a dataset
    # on a network file system that takes long to answer)
    def getattr(self, path, fh=None):
        now = time.time()
        if path == "/":
            return dict(st_mode=stat.S_IFDIR | 0o755, st_nlink=2, st_ctime=now, st_mtime=now,
                        st_atime=now)
        if path == "/t.bin":
            return dict(st_mode=stat.S_IFREG | 0o644, st_nlink=1,
                        st_size=os.path.getsize(BACKING), st_ctime=now, st_mtime=now,
                        st_atime=now)
        raise FuseOSError(errno.ENOENT)
    def readdir(self, path, fh):
        return [".", "..", "t.bin"]
    def open(self, path, flags):
        open(OPENING, "w").close()
        while os.path.exists(HANG):
            time.sleep(0.05)
        return 0
    def read(self, path, size, offset, fh):
        with open(BACKING, "rb") as f:
            f.seek(offset)
            return f.read(size)

FUSE(SlowOpen(), MNT, foreground=True, direct_io=True)
"""


@pytest.fixture
def slow_open_fs(workdir):
    """A real FUSE file system whose t.bin opens only when the test lets it."""
    mnt, hang, opening = (os.path.join(workdir, n) for n in ("mnt", "hang", "opening"))
    backing, toks = tokens(workdir, 300, seed=31, name="backing.bin")
    with fuse_mount(workdir, SLOW_FS, mnt, "t.bin", backing, hang, opening):
        yield os.path.join(mnt, "t.bin"), toks, hang, opening
        if os.path.exists(hang):
            os.unlink(hang)


def test_a_reload_opens_new_files_while_everyone_is_served(daemon, workdir, slow_open_fs):
    slow, slow_toks, hang, opening = slow_open_fs
    tok, toks = tokens(workdir, 400, seed=30)            # 100 batches of 4
    cfg = os.path.join(workdir, "loaderd.json")
    spec_a = token_spec("a", tok, SEQ, "uint16", batch_size=4, prefetch=2)
    write_config(cfg, {"pipelines": [spec_a]})
    d = daemon("--config", cfg)
    ca = d.popen_consume("a", "--delay", "20")
    d.wait_for(lambda s: any(a["delivered"] >= 2 for c in s["clients"] for a in c["attachments"]),
               "a read")

    # the reload adds a pipeline whose file opens only when the test says so
    with open(hang, "w"):
        pass
    write_config(cfg, {"pipelines": [spec_a, token_spec("s", slow, SEQ, "uint16", batch_size=5)]})
    rl = subprocess.Popen(d.ctl_cmd("reload", json_out=True), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(opening) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(opening), "the reload never opened the new pipeline's file"

    # while its file is being opened, the daemon serves: the client's stream
    # goes on to its end, status answers
    assert ca.wait(timeout=60, check=True).dump == expected(toks, 4)
    assert names(d.status()) == ["a"]
    assert rl.poll() is None, "the reload answered before its files were open"

    os.unlink(hang)
    out, err = rl.communicate(timeout=60)
    assert rl.returncode == 0, err
    rep = json.loads(out)
    assert rep["pipelines"] == {"created": ["s"], "unchanged": ["a"], "failed": [],
                                "replaced": [], "draining": []}
    assert d.consume("s").dump == token_dump(slow_toks, SEQ, sequential_batches(300, 5))


def test_reloads_asked_for_meanwhile_follow_the_running_one(daemon, workdir, slow_open_fs):
    slow, _, hang, opening = slow_open_fs
    tok, _ = tokens(workdir, 40, seed=32)
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"pipelines": [token_spec("a", tok, SEQ, "uint16", batch_size=4)]})
    d = daemon("--config", cfg)
    with open(hang, "w"):
        pass
    write_config(cfg, {"pipelines": [token_spec("s", slow, SEQ, "uint16", batch_size=5)]})
    first = subprocess.Popen(d.ctl_cmd("reload", json_out=True), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(opening) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(opening), "the reload never opened the new pipeline's file"
    os.kill(d.pid, signal.SIGHUP)
    d.wait_for(lambda s: 'config.reload by=SIGHUP queued="a reload is in progress: this one '
                         'follows it"' in d.log(), "the SIGHUP queued")
    os.unlink(hang)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert json.loads(out)["pipelines"]["created"] == ["s"]
    # the queued one read the file again: nothing left to change
    d.wait_for(lambda s: re.search(r"config\.reload config=\S+ by=SIGHUP changed=0 restart_needed=0 "
                                   r"created=0 replaced=0 draining=0 failed=0\n", d.log()),
               "the SIGHUP's reload")
    d.wait_for(lambda s: names(s) == ["s"], "the drained 'a' dropped")


def test_a_reload_whose_files_open_while_the_daemon_stops_changes_nothing(daemon, workdir,
                                                                         slow_open_fs):
    slow, _, hang, opening = slow_open_fs
    tok, _ = tokens(workdir, 40, seed=35)
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"workers": 2})
    d = daemon("--config", cfg)
    with open(hang, "w"):
        pass
    write_config(cfg, {"workers": 3, "pipelines": [token_spec("s", slow, SEQ, "uint16",
                                                               batch_size=5)]})
    rl = subprocess.Popen(d.ctl_cmd("reload"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(opening) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(opening), "the reload never opened the new pipeline's file"
    d.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while "Terminated received" not in d.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "Terminated received" in d.log(), d.log()[-3000:]
    os.unlink(hang)                                 # the open ends while the daemon stops
    # the stop closed the connections: loaderctl has no answer; the log says why
    rl.communicate(timeout=60)
    assert rl.returncode == 1
    log = d.stop(reap_first=False)
    assert 'config.reload by="root (uid 0), pid' in log and \
        'error="the daemon is stopping: the reload was not applied"' in log, log
    assert "pipeline.create" not in log and "config.change" not in log, log


def test_cache_dir_from_the_file_and_a_reload_that_changes_it(daemon, workdir):
    """cache_dir (docs/config.md): the file's value is used at start (made,
    mode 0700, when a megatron pipeline first needs it); a reload that
    changes it names it as needing a restart; --cache-dir wins over the
    file and is then not named."""
    import glob
    import stat
    import struct
    cfg = os.path.join(workdir, "loaderd.json")
    a, b = os.path.join(workdir, "cache-a"), os.path.join(workdir, "cache-b")
    prefix = os.path.join(workdir, "corpus")
    with open(prefix + ".bin", "wb") as f:   # one document of 40 uint16 tokens
        f.write(struct.pack("<40H", *range(40)))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 1, 2) + struct.pack("<i", 40) +
                struct.pack("<q", 0) + struct.pack("<2q", 0, 1))
    write_config(cfg, {"cache_dir": a})
    d = daemon("--config", cfg)
    spec = os.path.join(workdir, "m.json")
    with open(spec, "w") as f:
        json.dump({"name": "m", "source": {"kind": "megatron", "prefix": prefix, "seq_len": 8}}, f)
    d.ctl("create", "--spec", spec)
    assert len(glob.glob(os.path.join(a, "megatron-*.index"))) == 1
    assert stat.S_IMODE(os.stat(a).st_mode) == 0o700
    write_config(cfg, {"cache_dir": b})
    rep = d.ctl_json("reload")
    assert rep["restart_needed"] == [{"key": "cache_dir", "running": a, "file": b}]
    write_config(cfg, {"cache_dir": "relative"})
    r = d.ctl("reload", check=False)
    assert r.returncode == 1 and f"{cfg}: cache_dir: must be an absolute directory path" in \
        r.stdout + r.stderr
    write_config(cfg, {"cache_dir": b})
    d2 = daemon("--config", cfg, "--cache-dir", a)
    assert d2.ctl_json("reload")["restart_needed"] == []
