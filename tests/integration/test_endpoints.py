# SPDX-License-Identifier: MIT
"""Which endpoints the daemon's stores may reach (config store_endpoints,
docs/storage.md "Endpoints the daemon may reach").

Any local user can name a URL in a spec, and the daemon fetches it from
where it stands on the network. The config can name the stores it may
reach; with or without it, an address where a cloud serves instance
metadata (and the node's own keys) is never reached, whatever name leads
there, unless the config lists that endpoint itself.
"""

import http.server
import json
import os
import threading

import numpy as np
import pytest

import s3server
from ldrtest import npy_spec, write_npy
from s3server import aws_env

BUCKET = "alice-data"


@pytest.fixture(scope="module")
def s3():
    srv, d = s3server.make_server()
    yield srv
    s3server.stop_server(srv, d)


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    """A plain http server on loopback serving one .npy file."""
    root = tmp_path_factory.mktemp("web")
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    write_npy(os.path.join(root, "x.npy"), x)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a, **kw: Quiet(*a, directory=str(root), **kw))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.port = srv.server_address[1]
    srv.local = os.path.join(root, "x.npy")
    yield srv
    srv.shutdown()


def endpoints_daemon(daemon, workdir, endpoints, name="ep"):
    cfg = os.path.join(workdir, name + ".json")
    with open(cfg, "w") as f:
        json.dump({} if endpoints is None else {"store_endpoints": endpoints}, f)
    return daemon("--cache-dir", os.path.join(workdir, name + "-cache"), "--config", cfg)


def create(ld, spec, env, check=False):
    return ld.ctl("create", "--spec", ld.spec_file(spec), env=env, check=check)


def upload_npy(workdir, s3):
    p = os.path.join(workdir, "y.npy")
    write_npy(p, np.arange(40, dtype=np.int64).reshape(10, 4))
    with open(p, "rb") as f:
        s3.client("alice").put(BUCKET, "ep/y.npy", f.read())
    return p, f"s3://{BUCKET}/ep/y.npy"


def test_listed_store_reached_others_refused(daemon, workdir, s3, web):
    local, url = upload_npy(workdir, s3)
    ld = endpoints_daemon(daemon, workdir, [s3.endpoint, f"http://*.localhost:{web.port}"])
    env = aws_env(s3.endpoint)
    ld.create(npy_spec("local", [local], batch_size=3))
    want = ld.consume("local").dump
    create(ld, npy_spec("listed", [url], batch_size=3), env, check=True)
    assert ld.consume("listed").dump == want
    # a name under a "*." entry is reached; the entry's own host is not
    ld.create(npy_spec("web-local", [web.local], batch_size=3))
    create(ld, npy_spec("under", [f"http://data.localhost:{web.port}/x.npy"], batch_size=3), env, check=True)
    assert ld.consume("under").dump == ld.consume("web-local").dump
    allowed = f"its config's store_endpoints: {s3.endpoint}, http://*.localhost:{web.port}"
    for u in (f"http://localhost:{web.port}/x.npy", f"http://127.0.0.1:{web.port}/x.npy",
              f"https://data.localhost:{web.port}/x.npy"):
        r = create(ld, npy_spec("refused", [u], batch_size=3), env)
        assert r.returncode != 0
        assert f"URL '{u}' is not one this daemon may reach ({allowed})" in r.stderr, r.stderr
    # an s3:// source whose trainer names another endpoint
    other = "http://127.0.0.1:1"
    r = create(ld, npy_spec("elsewhere", [url], batch_size=3), aws_env(other))
    assert r.returncode != 0
    assert f"store: endpoint '{other}' is not one this daemon may reach ({allowed})" in r.stderr, r.stderr
    # the daemon goes on serving what it may
    assert ld.consume("listed").dump == want
    assert ld.status()["object_cache"]["store_endpoints"] == [s3.endpoint, f"http://*.localhost:{web.port}"]


def test_empty_list_turns_object_storage_off(daemon, workdir, s3):
    local, url = upload_npy(workdir, s3)
    ld = endpoints_daemon(daemon, workdir, [], name="off")
    r = create(ld, npy_spec("off", [url], batch_size=3), aws_env(s3.endpoint))
    assert r.returncode != 0
    assert (f"store: endpoint '{s3.endpoint}' is not one this daemon may reach (its config's "
            "store_endpoints is empty: object storage is off)") in r.stderr, r.stderr
    ld.create(npy_spec("local", [local], batch_size=3))
    assert len(ld.consume("local").dump) > 0
    assert ld.status()["object_cache"]["store_endpoints"] == []


@pytest.mark.parametrize("url, ip", [
    ("http://169.254.169.254/latest/meta-data/iam/security-credentials/x.npy", "169.254.169.254"),
    ("http://[fd00:ec2::254]/latest/meta-data/x.npy", "fd00:ec2::254"),
    ("http://[::ffff:169.254.170.2]/v2/credentials/x.npy", "::ffff:169.254.170.2"),
])
def test_metadata_address_never_reached(daemon, workdir, url, ip):
    """Without store_endpoints any endpoint may be reached, but not the
    instance metadata service: its answers are the node's keys."""
    ld = endpoints_daemon(daemon, workdir, None, name="md")
    assert ld.status()["object_cache"]["store_endpoints"] is None
    r = create(ld, npy_spec("md", [url], batch_size=3), aws_env("http://127.0.0.1:1"))
    assert r.returncode != 0
    assert (f"{url}: {ip} is a link-local address, where clouds serve instance metadata: not reached "
            "unless the config's store_endpoints lists this endpoint") in r.stderr, r.stderr


def test_bad_entries_named(daemon, workdir):
    import subprocess
    from ldrtest import LOADERD
    for bad, shown in ((["s3://bucket"], "'s3://bucket'"), (["https://host/path"], "'https://host/path'"),
                       (["https://a.*.b"], "'https://a.*.b'"), (["http://h:0"], "'http://h:0'"), ([7], "")):
        cfg = os.path.join(workdir, "bad.json")
        with open(cfg, "w") as f:
            json.dump({"store_endpoints": bad}, f)
        r = subprocess.run([LOADERD, "--config", cfg, "--check-config"], capture_output=True, text=True)
        assert r.returncode != 0
        want = f"{cfg}: store_endpoints[0]: must be http(s)://HOST[:PORT] (HOST may start with *.)"
        if shown:
            want += f", not {shown}"
        assert want in r.stderr, r.stderr
    with open(cfg, "w") as f:
        json.dump({"store_endpoints": "https://s3.amazonaws.com"}, f)
    r = subprocess.run([LOADERD, "--config", cfg, "--check-config"], capture_output=True, text=True)
    assert r.returncode != 0
    assert f'{cfg}: store_endpoints: must be an array of "http(s)://HOST[:PORT]" strings' in r.stderr, r.stderr
