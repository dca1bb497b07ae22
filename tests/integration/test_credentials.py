# SPDX-License-Identifier: MIT
"""Fresh object-store credentials for a running pipeline (docs/storage.md,
"Fresh credentials"), against the real S3 server of s3server.py.

alice's key is rotated for real in the server (the old pair stops working)
while a trainer of hers reads pipelines over her bucket, two of them read as
a stream (more than the node's cache_bytes: objects are fetched while they
are read, and the store refuses those fetches for the old keys); she hands the
new pair to each in one of the three ways (loaderctl credentials, which is
the C call ldr_set_store(); loaderd.Client.set_store(); the DataLoader's own
refresh on the refusal it meets), and every stream goes on with exactly the
batches of the same spec over local files, none lost, skipped or repeated. Her keys' expiry (AWS_CREDENTIAL_EXPIRATION) is shown in
status and named in a refusal past it. bob (a real Unix user) may neither
replace her keys nor read them. Readers in dynamic mode, which share the
stream's next batch, are each told a refusal once too, and read on.
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse

import pytest

import s3server
from ldrtest import python_client_env
from s3server import IDENTITIES, aws_env
from test_objects import BUCKET, create, shards, stream_daemon, wds
from users import open_to_all, shared_config
from users import users  # noqa: F401 (a fixture)

HERE = os.path.dirname(os.path.abspath(__file__))
NEW_AK, NEW_SK = "LDRALICEKEY000000099", "alice-secret-rotated-42"
PAST, FUTURE = "2021-01-01T00:00:00Z", "2099-01-01T00:00:00Z"


@pytest.fixture(scope="module")
def s3():
    srv, d = s3server.make_server()
    yield srv
    s3server.stop_server(srv, d)


def store_of(pipeline):
    """A pipeline's store in status, without a stream's figures."""
    st = dict(pipeline["store"])
    st.pop("stream", None)
    return st


def wait_file(path, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.01)


def test_fresh_credentials_for_running_pipelines(daemon, workdir, s3, users):
    alice_u, bob_u = users
    open_to_all(workdir)
    local, url, _ = shards(workdir, s3, "cred/a", per_class=4)
    local3, url3, _ = shards(workdir, s3, "cred/b", nshards=9, per_class=12, seed=7)
    size_a = sum(os.path.getsize(local.replace("{000..002}", f"{s:03d}")) for s in range(3))
    sizes = [os.path.getsize(local3.replace("{000..008}", f"{s:03d}")) for s in range(9)]
    # p1, p2 (cred/a) fit the node's cache: fetched whole at create; p3 and
    # p6 (cred/b) do not: read as a stream, with room for the fetch-ahead
    # and one shard per worker (2)
    limit = size_a + 3 * max(sizes)
    assert sum(sizes) > limit, (sizes, limit)
    ld = daemon("--cache-dir", os.path.join(workdir, "cache"), "--config",
                shared_config(workdir, cache_bytes=limit, fetch_ahead=max(sizes)))
    ld.create(wds("local", local, access="all"))
    # (in order: a shuffled stream would read its samples by range)
    ld.create(wds("local3", local3, access="all", epochs=2, shuffle=False))

    def spec_file(spec):
        p = ld.spec_file(spec)
        os.chmod(p, 0o644)
        return p

    def ctl_as(user, *args, env=None):
        return user.run(ld.ctl_cmd(*args), env=env)

    # alice's trainer environment: her keys, which she was told expire at PAST
    old_env = aws_env(s3.endpoint, "alice", AWS_CREDENTIAL_EXPIRATION=PAST)
    # p3, p6: two epochs, few batches built ahead: the second must fetch
    # again what the cache could not keep, after the rotation
    for p, spec in (("p1", wds("p1", url)), ("p2", wds("p2", url)),
                    ("p3", wds("p3", url3, epochs=2, prefetch=2, shuffle=False)),
                    ("p6", wds("p6", url3, epochs=2, prefetch=2, shuffle=False))):
        r = ctl_as(alice_u, "create", "--spec", spec_file(spec), env=old_env)
        assert r.returncode == 0, r.stderr
    assert ["stream" in ld.pipeline(p)["store"] for p in ("p1", "p2", "p3", "p6")] == [False, False, True, True]
    ak, sk, _ = IDENTITIES["alice"]
    store = {"endpoint": s3.endpoint, "region": "us-east-1", "access_key_id": ak[-4:],
             "session_token": False, "expires": PAST, "expired": True, "credentials_updates": 0}
    assert store_of(ld.pipeline("p1")) == store

    out = os.path.join(workdir, "trainer")
    os.mkdir(out)
    os.chown(out, alice_u.uid, alice_u.gid)
    env = python_client_env(HERE, base=old_env)
    trainer = subprocess.Popen([sys.executable, os.path.join(HERE, "creds_trainer.py"), ld.socket, out,
                                "local", "p1", "p2", "local3", "p3", "p6"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, **alice_u.popen_kwargs(env=env))
    try:
        wait_file(os.path.join(out, "paused"), trainer)
        # the store rotates alice's key: the old pair is refused from now on
        s3.rekey("alice", NEW_AK, NEW_SK)
        # a request with it says what the store said, and that her keys
        # expired when she was told they would
        r = ctl_as(alice_u, "create", "--spec", spec_file(wds("p4", url)), env=old_env)
        refused = (f"s3://{BUCKET}/cred/a-000.tar: InvalidAccessKeyId: The access key ID you provided "
                   "does not exist in our records. (HTTP 403)")
        assert r.returncode != 0
        assert r.stderr == (
            f"loaderctl: create: {refused}: the credentials of pipeline 'p4' expired at {PAST} (renew "
            "them: a create sends the process's current ones; a running pipeline takes fresh ones "
            "from `loaderctl credentials p4`, ldr_set_store() or loaderd.Client.set_store(); "
            "docs/storage.md)\n"), r.stderr
        # without an expiry known: the store's words alone
        r = ctl_as(alice_u, "create", "--spec", spec_file(wds("p4", url)),
                   env=aws_env(s3.endpoint, "alice"))
        assert r.returncode != 0 and r.stderr == f"loaderctl: create: {refused}\n", r.stderr

        new_env = aws_env(s3.endpoint, "alice", AWS_ACCESS_KEY_ID=NEW_AK, AWS_SECRET_ACCESS_KEY=NEW_SK,
                          AWS_CREDENTIAL_EXPIRATION=FUTURE)
        # bob may not hand alice's pipeline his keys (nor any), and never
        # sees hers: status has their last 4 characters only
        r = ctl_as(bob_u, "credentials", "p1", env=aws_env(s3.endpoint, "bob"))
        assert r.returncode != 0
        assert r.stderr == ("loaderctl: credentials: pipeline 'p1' belongs to ldr-alice (uid 1001), "
                            "access owner: only its owner (or root) may hand it credentials\n"), r.stderr
        r = ctl_as(bob_u, "credentials", "p1", env=new_env)
        assert r.returncode != 0 and "only its owner (or root)" in r.stderr, r.stderr
        st = json.loads(bob_u.run(ld.ctl_cmd("status", json_out=True)).stdout)
        # (her pipeline is "access": "owner": bob is not shown its store at all)
        assert [p.get("store") for p in st["pipelines"] if p["name"] == "p1"] == [None]
        assert store_of(ld.pipeline("p1")) == store
        text = json.dumps(st)
        for secret in (sk, NEW_SK, ak[:-4], NEW_AK[:-4]):
            assert secret not in text and secret not in ld.log()
        # fresh keys are for the pipeline's own store
        r = ctl_as(alice_u, "credentials", "p1", env=dict(new_env, AWS_ENDPOINT_URL="http://127.0.0.1:1"))
        assert r.returncode != 0
        assert r.stderr == (f"loaderctl: credentials: pipeline 'p1' reads the store at {s3.endpoint}, not "
                            "http://127.0.0.1:1: fresh credentials are for the same endpoint\n"), r.stderr
        r = ctl_as(alice_u, "credentials", "local", env=new_env)
        assert r.returncode != 0 and "belongs to root" in r.stderr, r.stderr
        r = ld.ctl("credentials", "local", env=new_env, check=False)
        assert r.returncode != 0
        assert r.stderr == ("loaderctl: credentials: pipeline 'local' reads no object store (no s3:// or "
                            "http(s):// path): it has no credentials to replace\n"), r.stderr
        # the first way: loaderctl (ldr_set_store())
        r = ctl_as(alice_u, "credentials", "p1", env=new_env)
        assert (r.returncode, r.stdout) == (0, "handed fresh credentials to pipeline p1\n"), r.stderr
        fresh = dict(store, access_key_id=NEW_AK[-4:], expires=FUTURE, expired=False, credentials_updates=1)
        assert store_of(ld.pipeline("p1")) == fresh
        assert store_of(ld.pipeline("p2")) == store
        # the other two: the trainer's Client and DataLoader
        with open(os.path.join(out, "go.tmp"), "w") as f:
            json.dump({"access_key_id": NEW_AK, "secret_access_key": NEW_SK, "expires": FUTURE}, f)
        os.rename(os.path.join(out, "go.tmp"), os.path.join(out, "go"))
        so, se = trainer.communicate(timeout=60)
        assert trainer.returncode == 0, se
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.communicate()
    with open(os.path.join(out, "result")) as f:
        res = json.load(f)
    # every stream went on, nothing lost or repeated
    assert res["want"] == [3, 18]
    assert res["batches"] == {"p1": 3, "p2": 3, "p3": 18, "p6": 18}
    assert res["equal"] == {"p1": True, "p2": True, "p3": True, "p6": True}
    # p3's DataLoader met the store's refusal once, as the daemon words it
    # (the URL, the store's words, the expiry, how to renew), handed the
    # environment's new keys, and read that batch again
    assert res["handed"] == {"client": [True, False], "client4": True, "dataloader": [[True], False]}

    def refused_words(p):
        return re.escape(f"s3://{BUCKET}/cred/b-") + r"00[0-8]" + re.escape(
            ".tar: InvalidAccessKeyId: The access key ID you provided does not exist in our records. "
            f"(HTTP 403): the credentials of pipeline '{p}' expired at {PAST} (renew them: a create "
            f"sends the process's current ones; a running pipeline takes fresh ones from `loaderctl "
            f"credentials {p}`, ldr_set_store() or loaderd.Client.set_store(); docs/storage.md)")
    [[code, msg]] = res["refusals"]
    assert code == -13 and re.fullmatch(refused_words("p3"), msg), msg
    # p6's reader, whose environment had no new keys yet, got that error
    # (the same words), and after set_store() the batch that waited
    [[code, msg]] = res["raised"]
    assert code == -13 and re.fullmatch(refused_words("p6"), msg), msg
    # a refusal is neither the data's error nor a bad sample
    for p in ("p1", "p2", "p3", "p6"):
        pst = ld.pipeline(p)
        assert (pst["state"] != "failed", pst["error"], pst["skipped"], pst["batches_failed"]) == \
            (True, None, 0, 0), pst
    # (p6: its DataLoader, which had sent no keys for it (loaderctl made
    # it), first handed its environment's, still the old ones, and read
    # again: refused again, that error raised; then the Client's)
    assert {p: store_of({"store": st}) for p, st in res["store"].items()} == \
        {"p1": fresh, "p2": fresh, "p3": fresh, "p6": dict(fresh, credentials_updates=2)}
    # the new pair is alice's in the store now: a create with it works
    r = ctl_as(alice_u, "create", "--spec", spec_file(wds("p5", url)), env=new_env)
    assert r.returncode == 0, r.stderr
    assert store_of(ld.pipeline("p5")) == dict(fresh, credentials_updates=0)


def test_refused_dynamic_readers_told_once(daemon, workdir, s3):
    """Two dynamic readers (one job) of a stream whose keys the store stops
    taking: each is told the store's words once (EACCES), as a partition or
    broadcast client is, and once fresh keys come both read on; every batch
    comes exactly once across the two, byte for byte that of the same spec
    over local files (docs/storage.md, "A refusal while streaming")."""
    local, url, n = shards(workdir, s3, "dyn/b", nshards=9, per_class=12, seed=8)
    sizes = [os.path.getsize(local.replace("{000..008}", f"{s:03d}")) for s in range(9)]
    ld, _ = stream_daemon(daemon, workdir, 3 * max(sizes), max(sizes), "dyn")
    # in order: a shuffled stream would read its samples by range
    ld.create(wds("local", local, epochs=2, shuffle=False))
    # the dump: each batch's fields in order (image, label), 9 full batches
    # an epoch
    dump, per = ld.consume("local").dump, 4 * (20 * 20 * 3 + 8)
    assert len(dump) == 2 * n * per // 4 and n == 36
    want = {(k // 9, k % 9): dump[k * per:(k + 1) * per] for k in range(18)}
    old_ak, old_sk, _ = s3.identities["alice"]
    old_env = aws_env(s3.endpoint, "alice", AWS_ACCESS_KEY_ID=old_ak, AWS_SECRET_ACCESS_KEY=old_sk)
    # few batches built ahead, two epochs over a cache of a third of the
    # shards: later batches must fetch again, which the store refuses
    create(ld, wds("dyn", url, epochs=2, prefetch=2, shuffle=False), old_env)
    assert "stream" in ld.pipeline("dyn")["store"]
    s3.rekey("alice", "LDRALICEKEY000000077", "alice-secret-dynamic-77")
    try:
        outs = [os.path.join(workdir, f"dyn-{r}.json") for r in "ab"]
        env = python_client_env(HERE)
        readers = [subprocess.Popen([sys.executable, os.path.join(HERE, "dyn_reader.py"), ld.socket, "dyn",
                                     "dyn-refused", o], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for o in outs]
        try:
            for o, r in zip(outs, readers):
                wait_file(o + ".told", r)
            parked = ld.pipeline("dyn")["store"]["stream"]["parked"]
            assert parked and {p["why"] for p in parked} == {"keys"}, parked
            r = ld.ctl("credentials", "dyn", env=aws_env(s3.endpoint, "alice",
                       AWS_ACCESS_KEY_ID="LDRALICEKEY000000077", AWS_SECRET_ACCESS_KEY="alice-secret-dynamic-77"))
            assert r.stdout == "handed fresh credentials to pipeline dyn\n", r.stderr
            for r in readers:
                _, se = r.communicate(timeout=60)
                assert r.returncode == 0, se
        finally:
            for r in readers:
                if r.poll() is None:
                    r.kill()
                    r.communicate()
    finally:
        s3.rekey("alice", old_ak, old_sk)
    res = []
    for o in outs:
        with open(o) as f:
            res.append(json.load(f))
    # each reader told once, the same words: the refused shard's URL and
    # what the store said; its DataLoader handed no keys of its own
    words = re.escape(f"s3://{BUCKET}/dyn/b-") + r"00[0-8]" + re.escape(
        ".tar: InvalidAccessKeyId: The access key ID you provided does not exist in our records. (HTTP 403)")
    for r in res:
        [[code, msg]] = r["errors"]
        assert code == -13 and re.fullmatch(words, msg), msg
        assert r["refreshes"] == 1
    assert res[0]["errors"] == res[1]["errors"]
    # nothing lost or repeated across the two, each batch the local one's
    got = [(e, i) for r in res for e, i, _ in r["batches"]]
    assert sorted(got) == sorted(want), got
    assert all(bytes.fromhex(b) == want[(e, i)] for r in res for e, i, b in r["batches"])
    pst = ld.pipeline("dyn")
    assert (pst["state"] != "failed", pst["error"], pst["skipped"], pst["batches_failed"]) == \
        (True, None, 0, 0), pst
    assert pst["store"]["stream"]["parked"] == []


def test_keys_from_aws_services(daemon, workdir, s3):
    """Keys a trainer's AWS tools get from a service, in botocore's order
    (docs/storage.md, "Credentials"): a web identity token exchanged at STS
    (EKS's IRSA), a container's endpoint (ECS, EKS Pod Identity), an EC2
    instance's role (IMDSv2). The services are awsmeta.py's stand-ins
    (they run only inside AWS); the keys they hand out are alice's real
    keys of the S3 server, so each pipeline reads her bucket for real."""
    from awsmeta import (AwsMeta, CONTAINER_AUTH, EXPIRES, IMDS_ROLE, ROLE_ARN, WEB_TOKEN, sts_error)
    local, url, _ = shards(workdir, s3, "cred/svc")
    ld = daemon("--cache-dir", os.path.join(workdir, "cache"))
    ld.create(wds("local", local))
    want = ld.consume("local").dump
    ak, sk, _ = s3.identities["alice"]  # her keys now (another test may have rotated them)
    meta = AwsMeta((ak, sk))
    home = os.path.join(workdir, "svc-home")
    os.makedirs(home)
    tokf = os.path.join(workdir, "web-token")
    with open(tokf, "w") as f:
        f.write(WEB_TOKEN + "\n")
    authf = os.path.join(workdir, "pod-token")
    with open(authf, "w") as f:
        f.write(CONTAINER_AUTH)

    def env(**kw):
        e = aws_env(s3.endpoint, HOME=home, **kw)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            del e[k]
        return {k: v for k, v in e.items() if v is not None}

    def made(name, e):
        r = create(ld, wds(name, url), e, check=False)
        assert r.returncode == 0, r.stderr
        st = store_of(ld.pipeline(name))
        assert (st["access_key_id"], st["session_token"], st["expires"]) == (ak[-4:], False, EXPIRES), st
        assert ld.consume(name).dump == want
        ld.ctl("drop", name)

    def refused(name, e):
        r = create(ld, wds(name, url), e, check=False)
        assert r.returncode != 0
        return r.stderr

    try:
        web = dict(AWS_ROLE_ARN=ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE=tokf, AWS_ENDPOINT_URL_STS=meta.url)
        made("web", env(**web))
        method, path, hdrs, body = meta.requests[-1]
        form = dict(p.split("=", 1) for p in body.decode().split("&"))
        assert (method, path, form["Action"], form["Version"]) == ("POST", "/", "AssumeRoleWithWebIdentity",
                                                                   "2011-06-15")
        assert form["RoleArn"] == "arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fldr-trainer"
        assert form["WebIdentityToken"] == WEB_TOKEN and re.fullmatch(r"loaderd-session-\d+",
                                                                      form["RoleSessionName"]), form
        assert "Authorization" not in hdrs  # AssumeRoleWithWebIdentity is not signed
        # the same from a profile of ~/.aws/config, with its session name
        with open(os.path.join(home, "config"), "w") as f:
            f.write(f"[profile irsa]\nrole_arn = {ROLE_ARN}\nweb_identity_token_file = {tokf}\n"
                    "role_session_name = job-7\n[profile sso]\nsso_session = corp\nsso_account_id = 1\n")
        made("webprof", env(AWS_CONFIG_FILE=os.path.join(home, "config"), AWS_PROFILE="irsa",
                            AWS_ENDPOINT_URL_STS=meta.url))
        assert "RoleSessionName=job-7" in meta.requests[-1][3].decode()
        # refused by STS: its code and message, the role and the token file named
        meta.fail["sts"] = (403, sts_error("AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity"))
        assert refused("webno", env(**web)) == (
            f"loaderctl: create: object-store credentials: web identity (role {ROLE_ARN}, token {tokf}): STS "
            f"{meta.url}: AccessDenied: Not authorized to perform sts:AssumeRoleWithWebIdentity (HTTP 403)\n")
        del meta.fail["sts"]
        assert refused("webnf", env(**dict(web, AWS_WEB_IDENTITY_TOKEN_FILE=tokf + ".gone"))) == (
            f"loaderctl: create: object-store credentials: web identity (role {ROLE_ARN}, token {tokf}.gone): "
            f"{tokf}.gone: No such file or directory\n")
        # a session token (what STS always gives): sent and signed with the
        # keys, which the suite's server refuses (it knows only its own)
        from s3server import FaultProxy
        proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
        meta.token = "FwoGZXIvYXdzEldrSessionToken/+="
        try:
            assert refused("webtok", env(AWS_ENDPOINT_URL=proxy.endpoint, **web)) == (
                f"loaderctl: create: s3://{BUCKET}/cred/svc-000.tar: InvalidAccessKeyId: The access key ID you "
                "provided does not exist in our records. (HTTP 403)\n")
            head = proxy.heads[0].decode()
            assert f"x-amz-security-token: {meta.token}" in head.split("\r\n"), head
            assert "x-amz-security-token" in re.search(r"SignedHeaders=([^,]+)", head).group(1).split(";")
        finally:
            proxy.stop()
            meta.token = None
        # the environment's keys come first: STS is not asked
        n = len(meta.requests)
        e = aws_env(s3.endpoint, HOME=home, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk, **web)
        assert create(ld, wds("envkeys", url), e).returncode == 0
        assert len(meta.requests) == n and store_of(ld.pipeline("envkeys"))["session_token"] is False
        ld.ctl("drop", "envkeys")

        # a container's endpoint, with its authorization token file
        cont = dict(AWS_CONTAINER_CREDENTIALS_FULL_URI=meta.url + "/creds",
                    AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=authf)
        made("pod", env(**cont))
        assert meta.requests[-1][2]["Authorization"] == CONTAINER_AUTH
        assert refused("podno", env(AWS_CONTAINER_CREDENTIALS_FULL_URI=meta.url + "/creds",
                                    AWS_CONTAINER_AUTHORIZATION_TOKEN="wrong")) == (
            f"loaderctl: create: object-store credentials: container credentials ({meta.url}/creds): HTTP 401: "
            '{"Message": "bad Authorization"}\n')
        assert refused("podhost", env(AWS_CONTAINER_CREDENTIALS_FULL_URI="http://192.0.2.7/creds")) == (
            "loaderctl: create: object-store credentials: AWS_CONTAINER_CREDENTIALS_FULL_URI: "
            "http://192.0.2.7/creds: not https, nor http to loopback, 169.254.170.2, 169.254.170.23 or "
            "fd00:ec2::23\n")

        # the instance's role: IMDSv2's token on every request
        imds = dict(AWS_EC2_METADATA_DISABLED=None, AWS_EC2_METADATA_SERVICE_ENDPOINT=meta.url + "/")
        n = len(meta.requests)
        made("ec2", env(**imds))
        seen = [(m, p, h.get("X-aws-ec2-metadata-token")) for m, p, h, _ in meta.requests[n:]]
        assert seen == [("PUT", "/latest/api/token", None),
                        ("GET", "/latest/meta-data/iam/security-credentials/", "imds-token-0"),
                        ("GET", f"/latest/meta-data/iam/security-credentials/{IMDS_ROLE}", "imds-token-0")], seen
        # a token refused (403): IMDSv1, as botocore
        meta.fail["imds-token"] = (403, "")
        n = len(meta.requests)
        made("ec2v1", env(**imds))
        assert [h.get("X-aws-ec2-metadata-token") for _, _, h, _ in meta.requests[n + 1:]] == [None, None]
        del meta.fail["imds-token"]
        # no role there, or no metadata service at all: no keys, as for a
        # public bucket: the store's refusal names the object
        meta.fail["imds"] = (404, "")
        nokeys = refused("ec2no", env(**imds))
        assert nokeys == f"loaderctl: create: s3://{BUCKET}/cred/svc-000.tar: AccessDenied: Access Denied. (HTTP 403)\n"
        del meta.fail["imds"]
        assert refused("ec2off", env()) == nokeys
        # a spec of http(s):// URLs alone is never signed: no service asked
        n = len(meta.requests)
        plain = f"{s3.endpoint}/{BUCKET}/cred/svc-{{000..002}}.tar"
        r = create(ld, wds("ec2http", plain), env(**imds), check=False)
        assert r.returncode != 0 and "(HTTP 403)" in r.stderr, r.stderr
        assert len(meta.requests) == n, meta.requests[n:]

        # a role assumed with another profile's keys (source_profile): the
        # AssumeRole is signed with them (the stand-in verifies SigV4)
        with open(os.path.join(home, "credentials"), "w") as f:
            f.write(f"[base]\naws_access_key_id = {ak}\naws_secret_access_key = {sk}\n"
                    f"[wrong]\naws_access_key_id = {ak}\naws_secret_access_key = not-{sk}\n")
        with open(os.path.join(home, "config"), "a") as f:
            f.write(f"[profile admin]\nrole_arn = {ROLE_ARN}\nsource_profile = base\nexternal_id = ext-1\n"
                    f"role_session_name = job-9\n[profile wrongkeys]\nrole_arn = {ROLE_ARN}\n"
                    f"source_profile = wrong\n[profile pod]\nrole_arn = {ROLE_ARN}\n"
                    "credential_source = EcsContainer\n")
        files = dict(AWS_CONFIG_FILE=os.path.join(home, "config"),
                     AWS_SHARED_CREDENTIALS_FILE=os.path.join(home, "credentials"), AWS_ENDPOINT_URL_STS=meta.url)
        made("role", env(AWS_PROFILE="admin", **files))
        form = dict(urllib.parse.parse_qsl(meta.requests[-1][3].decode()))
        assert (form["Action"], form["RoleArn"], form["ExternalId"], form["RoleSessionName"]) == (
            "AssumeRole", ROLE_ARN, "ext-1", "job-9"), form
        assert meta.signed[-1][:2] == (ak, "us-east-1"), meta.signed
        assert refused("rolebad", env(AWS_PROFILE="wrongkeys", **files)) == (
            f"loaderctl: create: object-store credentials: role {ROLE_ARN} (assumed with the keys of [wrong] in "
            f"{home}/credentials): STS {meta.url}: SignatureDoesNotMatch: The request signature we calculated does "
            "not match the signature you provided. (HTTP 403)\n")
        # credential_source: the container's keys sign the AssumeRole
        n = len(meta.requests)
        made("rolepod", env(AWS_PROFILE="pod", **files, **cont))
        assert [(m, p) for m, p, _, _ in meta.requests[n:]] == [("GET", "/creds"), ("POST", "/")]

        # an SSO profile: named as not read, with what to do instead
        assert refused("sso", env(AWS_CONFIG_FILE=os.path.join(home, "config"), AWS_PROFILE="sso")) == (
            f"loaderctl: create: object-store credentials: {home}/config: [profile sso] has sso_session, which "
            "libloader does not read (SSO, a role behind an MFA code): give the profile `credential_process = "
            "aws configure export-credentials --profile sso --format process` (AWS CLI v2), or export its keys\n")
    finally:
        meta.stop()
