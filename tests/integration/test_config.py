# SPDX-License-Identifier: MIT
"""The daemon's config file: pipelines at start, SIGHUP reload, bad files."""

import json
import os
import signal
import subprocess

from ldrtest import LOADERD, random_tokens, token_spec


def write_config(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def names(st):
    return sorted(p["name"] for p in st["pipelines"])


def test_config_pipelines_and_sighup_reload(daemon, workdir):
    tok = os.path.join(workdir, "t.bin")
    random_tokens(tok, 64 * 100 + 1, "uint16", seed=3)
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"workers": 2, "log_level": "info",
                       "pipelines": [token_spec("a", tok, 64, "uint16", batch_size=10)]})
    d = daemon("--config", cfg)
    assert names(d.status()) == ["a"]
    assert d.status()["workers"] == 2
    res = d.consume("a")
    assert res.json["batches"] == 10 and res.json["samples"] == 100

    # reload: a new pipeline appears, the running one is kept as it is
    write_config(cfg, {"workers": 2, "pipelines": [
        token_spec("a", tok, 64, "uint16", batch_size=10),
        token_spec("b", tok, 32, "uint16", batch_size=4, shuffle=True)]})
    os.kill(d.pid, signal.SIGHUP)
    st = d.wait_for(lambda s: names(s) == ["a", "b"], "pipeline b after SIGHUP")
    assert [p for p in st["pipelines"] if p["name"] == "a"][0]["batches_produced"] == 10

    # a broken file on reload: the daemon keeps running with what it has
    with open(cfg, "w") as f:
        f.write('{"pipelines": [')
    os.kill(d.pid, signal.SIGHUP)
    d.wait_for(lambda s: names(s) == ["a", "b"], "still serving after a bad reload")
    assert d.consume("b", "--batches", 3).json["batches"] == 3


def run_daemon_expect_failure(args):
    p = subprocess.run([LOADERD] + args, capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    return p.stderr


def test_bad_config_files(workdir):
    cfg = os.path.join(workdir, "c.json")
    sock = os.path.join(workdir, "s.sock")
    for body, needle in (('{"workers": 0}', "workers: must be an integer in 1..1024"),
                         ('{"wokers": 2}', 'unknown key "wokers"'),
                         ('{"memory_limit": "lots"}', "memory_limit"),
                         ('{"log_level": "loud"}', "log_level"),
                         ('{"pipelines": {}}', "pipelines: must be an array"),
                         ('[1, 2]', "must be a JSON object"),
                         ('{"socket": ', "line 1")):
        with open(cfg, "w") as f:
            f.write(body)
        err = run_daemon_expect_failure(["--config", cfg, "--socket", sock])
        assert cfg in err and needle in err, (body, err)
        assert not os.path.exists(sock)
    err = run_daemon_expect_failure(["--config", os.path.join(workdir, "missing.json"), "--socket", sock])
    assert "missing.json" in err


def test_bad_spec_in_config_is_reported_and_others_still_served(daemon, workdir):
    tok = os.path.join(workdir, "t.bin")
    random_tokens(tok, 32 * 50 + 1, "uint16", seed=4)
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"pipelines": [{"name": "bad", "source": {"kind": "tokens", "path": tok}},
                                      token_spec("good", tok, 32, "uint16", batch_size=5)]})
    d = daemon("--config", cfg)
    assert names(d.status()) == ["good"]
    log = d.log()
    assert "pipelines[0]" in log and "seq_len" in log, log


def test_conf_d_dropins(daemon, workdir):
    tok = os.path.join(workdir, "t.bin")
    random_tokens(tok, 32 * 40 + 1, "uint16", seed=5)
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"workers": 3, "memory_limit": "64M",
                       "pipelines": [token_spec("main", tok, 32, "uint16", batch_size=4)]})
    os.mkdir(os.path.join(workdir, "conf.d"))
    write_config(os.path.join(workdir, "conf.d", "20-more.json"),
                 {"memory_limit": "96M", "pipelines": [token_spec("late", tok, 16, "uint16")]})
    write_config(os.path.join(workdir, "conf.d", "10-first.json"),
                 {"memory_limit": "32M", "pipelines": [token_spec("early", tok, 8, "uint16")]})
    with open(os.path.join(workdir, "conf.d", "README"), "w") as f:
        f.write("not a drop-in")
    # --workers on the command line wins over the file; memory_limit comes
    # from the last drop-in in name order
    d = daemon("--config", cfg, workers=2)
    st = d.status()
    assert st["workers"] == 2
    assert st["memory_limit"] == 96 << 20
    assert names(st) == ["early", "late", "main"]

    # a broken drop-in is an error that names it
    write_config(os.path.join(workdir, "conf.d", "30-bad.json"), {"wrokers": 1})
    err = run_daemon_expect_failure(["--config", cfg, "--socket", os.path.join(workdir, "x.sock")])
    assert "30-bad.json" in err and 'unknown key "wrokers"' in err, err


def test_socket_mode_and_group(daemon, workdir):
    """socket_mode and socket_group apply to both sockets, before their paths
    appear; the default stays 0660 and the daemon's group."""
    import grp
    import stat
    gid = grp.getgrnam("nogroup").gr_gid
    cfg = os.path.join(workdir, "loaderd.json")
    write_config(cfg, {"socket_mode": "0600", "socket_group": "nogroup"})
    d = daemon("--config", cfg)
    for path in (d.socket, d.fds_socket):
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600, (path, oct(st.st_mode))
        assert st.st_gid == gid, (path, st.st_gid)
    tok = os.path.join(workdir, "t.bin")
    random_tokens(tok, 32 * 20 + 1, "uint16", seed=6)
    d.create(token_spec("m", tok, 32, "uint16", batch_size=4))
    assert d.consume("m").json["batches"] == 5     # the fd channel works too
    d.stop()

    d2 = daemon(socket=os.path.join(workdir, "plain.sock"))
    for path in (d2.socket, d2.fds_socket):
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid(), (path, oct(st.st_mode))


def test_bad_socket_mode_and_group(workdir):
    cfg = os.path.join(workdir, "c.json")
    sock = os.path.join(workdir, "s.sock")
    for body, needle in (('{"socket_mode": "0999"}', 'socket_mode: must be an octal mode'),
                         ('{"socket_mode": 660}', 'socket_mode: must be an octal mode'),
                         ('{"socket_mode": "0066"}', "leaves the daemon's own user out"),
                         ('{"socket_group": "no-such-group-x"}', "socket_group: no group no-such-group-x"),
                         ('{"socket_group": []}', "socket_group: must be a group name or a gid")):
        with open(cfg, "w") as f:
            f.write(body)
        err = run_daemon_expect_failure(["--config", cfg, "--socket", sock])
        assert cfg in err and needle in err, (body, err)
        assert not os.path.exists(sock)


def test_check_config(workdir):
    """loaderd --check-config[=FILE]: every error of the file and of its
    pipelines' specs, or ok with the count; exit 0 or 1; nothing started."""
    def check(*args, env=None):
        if env is None:
            env = {k: v for k, v in os.environ.items() if k != "LOADERD_CONFIG"}
        return subprocess.run([LOADERD, *args], capture_output=True, text=True, timeout=30, env=env)

    good = os.path.join(workdir, "good.json")
    write_config(good, {"workers": 2, "pipelines": [
        token_spec("a", "/nonexistent/t.bin", 8, "uint16"),   # files are the create's business
        token_spec("b", "/nonexistent/t.bin", 8, "uint16", batch_size=4)]})
    r = check(f"--check-config={good}")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{good}: ok: 2 pipelines\n", "")
    bad = os.path.join(workdir, "bad.json")
    write_config(bad, {"pipelines": [
        token_spec("a", "/t.bin", 8, "uint16"),
        dict(token_spec("b", "/t.bin", 8, "uint16"), batch_size=0),
        dict(token_spec("c", "/t.bin", 8, "uint16"), ttl=5)]})
    r = check("--config", bad, "--check-config")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == (
        f"loaderd: {bad}: pipelines[1]: spec: batch_size: must be an integer in 1..1048576\n"
        f"loaderd: {bad}: pipelines[2]: ttl: pipelines of the config persist always (persist "
        "and ttl are for pipelines that clients create)\n"), r.stderr
    broken = os.path.join(workdir, "broken.json")
    write_config(broken, {"workers": "x"})
    r = check(f"--check-config={broken}")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"loaderd: {broken}: workers: must be an integer in 1..1024\n", r.stderr
    # $LOADERD_CONFIG is the default FILE, as for the daemon
    r = check("--check-config", env=dict(os.environ, LOADERD_CONFIG=good))
    assert (r.returncode, r.stdout) == (0, f"{good}: ok: 2 pipelines\n")
