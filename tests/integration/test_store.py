# SPDX-License-Identifier: MIT
"""daemon/store (the S3 and https client) against a real S3 server.

SeaweedFS's `weed mini` verifies SigV4 (tests/integration/s3server.py);
objects are uploaded with the harness's own signer, read back with
store-tool (tests/integration-c/store-tool.c, the C client from the command
line) and compared byte for byte. Faults come from a proxy between the tool
and the server. Every error message is asserted whole.
"""

import base64
import concurrent.futures
import hashlib
import http.server
import os
import random
import struct
import subprocess
import threading
import zlib

import pytest

import s3server
from s3server import IDENTITIES, FaultProxy

BUILD = os.environ.get("LOADERD_BUILD") or os.path.join(s3server.REPO_ROOT, "build")
TOOL = os.path.join(BUILD, "tests", "integration-c", "store-tool")

# keys that a signer or a listing gets wrong first
ODD_KEYS = ["odd/with space.bin", "odd/plus+sign.bin", "odd/deep/er/path.bin",
            "odd/ünïcødé-日本.bin", "odd/percent%2Fslash.bin", "odd/amp&lt;.bin",
            "odd/tilde~star*(paren).bin", "odd/quote\"'.bin", "odd/equals=&q?.bin"]
MANY = 1105  # more than one ListObjectsV2 page (1000)


@pytest.fixture(scope="module")
def s3():
    srv, d = s3server.make_server()
    alice = srv.client("alice")
    rng = random.Random(28)
    objs = {}
    for i, k in enumerate(ODD_KEYS):
        body = bytes(rng.getrandbits(8) for _ in range(1000 + 37 * i))
        objs[k] = (body, alice.put("alice-data", k, body))
    big = bytes(rng.getrandbits(8) for _ in range(3 << 20))
    objs["big.bin"] = (big, alice.put("alice-data", "big.bin", big))

    def put(i):
        k = f"many/{i:05d}" + (" sp" if i % 7 == 0 else "") + ("+é" if i % 11 == 0 else "")
        body = b"%d" % i
        return k, (body, alice.put("alice-data", k, body))

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        objs.update(ex.map(put, range(MANY)))
    srv.client("bob").put("bob-data", "bobs.bin", b"bob's own")
    srv.objs = objs
    yield srv
    s3server.stop_server(srv, d)


env_for = s3server.aws_env


def tool(env, *args, retry=2, stall=1, stdin=None, timeout=120):
    return subprocess.run([TOOL, "-r", str(retry), "-s", str(stall), *args], env=env,
                          input=stdin, capture_output=True, timeout=timeout)


def ok(r):
    assert r.returncode == 0, r.stderr.decode()
    assert r.stderr == b""
    return r.stdout


def failed(r):
    assert r.returncode == 1 and r.stdout == b"", (r.returncode, r.stdout[:200])
    return r.stderr.decode().rstrip("\n")


def url(key, bucket="alice-data"):
    return f"s3://{bucket}/{key}"


def test_head_get_range_odd_keys(s3):
    env = env_for(s3.endpoint)
    for key in ODD_KEYS + ["big.bin"]:
        body, etag = s3.objs[key]
        assert ok(tool(env, "head", url(key))) == f"size={len(body)} etag={etag}\n".encode()
        assert ok(tool(env, "get", url(key))) == body
        assert ok(tool(env, "get", url(key), etag)) == body
        for off, n in ((0, 1), (1, 100), (len(body) - 7, 7), (len(body) // 3, len(body) // 2)):
            assert ok(tool(env, "range", url(key), str(off), str(n))) == body[off:off + n]


def test_range_past_the_end(s3):
    env = env_for(s3.endpoint)
    body, _ = s3.objs["odd/with space.bin"]
    u = url("odd/with space.bin")
    assert failed(tool(env, "range", u, str(len(body) - 2), "4")) == (
        f"{u}: asked for 4 bytes at {len(body) - 2}, got 2 (HTTP 206)")
    assert failed(tool(env, "range", u, str(len(body)), "4")) == (
        f"{u}: InvalidRange: The requested range is not satisfiable (HTTP 416)")


def test_list_pages_and_odd_keys(s3):
    env = env_for(s3.endpoint)
    want = sorted((k for k in s3.objs if k.startswith("many/")), key=lambda k: k.encode())
    out = ok(tool(env, "list", url("many/"))).decode().splitlines()
    assert len(out) == MANY
    assert out == [f"{k}\t{len(s3.objs[k][0])}\t{s3.objs[k][1]}" for k in want]
    # a prefix with a space, '+', unicode and '/' in it (the query string
    # must be canonical for the signature to match)
    for prefix in ("many/00007 sp", "many/00077 sp+é", "odd/ünïcødé", "odd/deep/er/", "odd/amp&",
                   "odd/percent%2F"):
        want = sorted((k for k in s3.objs if k.startswith(prefix)), key=lambda k: k.encode())
        assert want, prefix
        out = ok(tool(env, "list", url(prefix))).decode().splitlines()
        assert [line.split("\t")[0] for line in out] == want
    assert ok(tool(env, "list", url("nothing/here/"))) == b""


def test_wrong_secret_and_unknown_key_id(s3):
    u = url("odd/with space.bin")
    env = env_for(s3.endpoint, AWS_SECRET_ACCESS_KEY="not-alices-secret")
    msg = (f"{u}: SignatureDoesNotMatch: The request signature we calculated does not match the "
           "signature you provided. Check your key and signing method. (HTTP 403)")
    assert failed(tool(env, "get", u)) == msg
    assert failed(tool(env, "head", u)) == msg
    env = env_for(s3.endpoint, AWS_ACCESS_KEY_ID="LDRNOSUCHKEY00000000")
    assert failed(tool(env, "get", u)) == (
        f"{u}: InvalidAccessKeyId: The access key ID you provided does not exist in our records. "
        "(HTTP 403)")


def test_bob_cannot_read_alices_bucket(s3):
    env = env_for(s3.endpoint, "bob")
    u = url("odd/with space.bin")
    assert failed(tool(env, "get", u)) == f"{u}: AccessDenied: Access Denied. (HTTP 403)"
    assert failed(tool(env, "head", u)) == f"{u}: AccessDenied: Access Denied. (HTTP 403)"
    assert failed(tool(env, "list", url("odd/"))) == f"{url('odd/')}: AccessDenied: Access Denied. (HTTP 403)"
    # and alice not bob's
    u = url("bobs.bin", "bob-data")
    assert failed(tool(env_for(s3.endpoint), "get", u)) == f"{u}: AccessDenied: Access Denied. (HTTP 403)"
    assert ok(tool(env, "get", u)) == b"bob's own"


def test_missing_key_and_bucket(s3):
    env = env_for(s3.endpoint)
    u = url("odd/no such key")
    for cmd in ("get", "head"):
        assert failed(tool(env, cmd, u)) == f"{u}: NoSuchKey: The specified key does not exist. (HTTP 404)"
    env = env_for(s3.endpoint, "admin")
    u = url("k", "no-such-bucket")
    for cmd in ("get", "head", "list"):
        assert failed(tool(env, cmd, u)) == (
            f"{u}: NoSuchBucket: The specified bucket does not exist (HTTP 404)")


def test_bad_urls_and_endpoint(s3):
    env = env_for(s3.endpoint)
    assert failed(tool(env, "get", "s3://alice-data/")) == "s3://alice-data/: no object key after the bucket"
    assert failed(tool(env, "get", "s3:///k")) == "s3:///k: no valid bucket name after s3://"
    assert failed(tool(env, "get", "ftp://x/y")) == "ftp://x/y: not an s3:// or https:// URL"
    assert failed(tool(env, "list", "https://x/y")) == "https://x/y: only s3:// URLs can be listed"
    env = env_for("ftp://127.0.0.1:1")
    assert failed(tool(env, "get", url("x"))) == (
        "AWS_ENDPOINT_URL: 'ftp://127.0.0.1:1' is not http(s)://HOST[:PORT]")
    # nothing listens there: retried, then said
    env = env_for("http://127.0.0.1:1")
    assert failed(tool(env, "get", url("x"), retry=0.3)) == (
        "s3://alice-data/x: cannot connect to http://127.0.0.1:1 (Couldn't connect to server); "
        "retried for 0.3 s")
    assert failed(tool(env, "head", "http://127.0.0.1:1/x", retry=0.3)) == (
        "http://127.0.0.1:1/x: cannot connect to the server (Couldn't connect to server); "
        "retried for 0.3 s")
    # AWS_ENDPOINT_URL_S3 wins over AWS_ENDPOINT_URL (a dead port here)
    env = env_for("http://127.0.0.1:1", AWS_ENDPOINT_URL_S3=s3.endpoint)
    assert ok(tool(env, "get", url("odd/plus+sign.bin"))) == s3.objs["odd/plus+sign.bin"][0]


def test_session_token_and_payload_hash_are_signed(s3):
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    try:
        env = env_for(proxy.endpoint, AWS_SESSION_TOKEN="tok/en+with=odd")
        # SeaweedFS's static identities take no session token: it refuses
        # it, which shows that it was sent
        r = tool(env, "get", url("odd/plus+sign.bin"))
        head = proxy.heads[-1].decode("latin-1").lower()
        assert "\r\nx-amz-security-token: tok/en+with=odd" in head
        assert "\r\nx-amz-content-sha256: unsigned-payload" in head
        assert "\r\nx-amz-checksum-mode: enabled" in head  # a whole GET asks for the object's sums
        signed = head.split("signedheaders=")[1].split(",")[0]
        assert signed.split(";") == ["host", "x-amz-checksum-mode", "x-amz-content-sha256", "x-amz-date",
                                     "x-amz-security-token"]
        assert "tok/en+with=odd" not in r.stderr.decode()
        assert IDENTITIES["alice"][1] not in r.stderr.decode()
    finally:
        proxy.stop()


@pytest.fixture
def proxy(s3):
    p = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    yield p
    p.stop()


@pytest.mark.parametrize("fault", ["503", "429", "cut", "reset"])
def test_fault_once_then_success(s3, proxy, fault):
    """One fault, then the same request again: the right bytes."""
    body, _ = s3.objs["big.bin"]
    proxy.add(fault)
    out = ok(tool(env_for(proxy.endpoint), "get", url("big.bin"), retry=20))
    assert hashlib.sha256(out).hexdigest() == hashlib.sha256(body).hexdigest()
    assert proxy.requests == 2
    proxy.add(fault)
    out = ok(tool(env_for(proxy.endpoint), "range", url("big.bin"), "1000", "700000", retry=20))
    assert out == body[1000:701000]


def test_stall_then_success(s3, proxy):
    body, _ = s3.objs["big.bin"]
    proxy.add("stall")
    out = ok(tool(env_for(proxy.endpoint), "get", url("big.bin"), retry=30, stall=1))
    assert out == body
    assert proxy.requests == 2


@pytest.mark.parametrize("fault,msg", [
    ("503", "SlowDown: Please reduce your request rate. (HTTP 503); retried for 1 s"),
    ("429", "TooManyRequests: Please reduce your request rate. (HTTP 429); retried for 1 s"),
    ("cut", "the body ended after 1572864 of 3145728 bytes; retried for 1 s"),
    ("reset", "connection lost: Recv failure: Connection reset by peer; retried for 1 s"),
    ("stall", "stalled: no byte for 1 s (after 1572864 of 3145728 bytes); retried for 1 s"),
])
def test_fault_every_time(s3, proxy, fault, msg):
    """The fault on every try: retried for retry_seconds, then the error
    names the URL and the last fault."""
    proxy.add(*[fault] * 200)
    u = url("big.bin")
    assert failed(tool(env_for(proxy.endpoint), "get", u, retry=1, stall=1)) == f"{u}: {msg}"
    assert proxy.requests >= 2 if fault != "stall" else proxy.requests >= 1


def test_corrupted_body(s3, proxy):
    """A body with one byte flipped (its length kept) is not the MD5 of its
    ETag: tried again, the good copy returned; flipped every time, the error
    names both digests. A range is not checked against the whole's ETag."""
    body, etag = s3.objs["big.bin"]
    assert etag == f'"{hashlib.md5(body).hexdigest()}"'  # SeaweedFS: the ETag is the MD5
    u = url("big.bin")
    proxy.flip = 1
    assert ok(tool(env_for(proxy.endpoint), "get", u, retry=20)) == body
    assert (proxy.requests, proxy.flipped) == (2, 1)
    proxy.flip = -1
    bad = hashlib.md5(FaultProxy.flip_body(body)).hexdigest()
    assert failed(tool(env_for(proxy.endpoint), "get", u, retry=1)) == (
        f"{u}: the body's MD5 {bad} does not match its ETag {etag} ({len(body)} bytes); retried for 1 s")
    assert proxy.requests >= 4 and proxy.flipped == proxy.requests - 1
    # a range: its bytes as they came (the flipped one is at the middle of the range)
    out = ok(tool(env_for(proxy.endpoint), "range", u, "1000", "700000"))
    assert out == FaultProxy.flip_body(body[1000:701000])


@pytest.mark.parametrize("header,checked", [
    (b"x-amz-server-side-encryption: aws:kms", False),
    (b"x-amz-server-side-encryption: aws:kms:dsse", False),
    (b"x-amz-server-side-encryption-customer-algorithm: AES256", False),
    (b"x-amz-server-side-encryption: AES256", True),
])
def test_encrypted_etag_is_no_md5(s3, proxy, header, checked):
    """SSE-KMS's and SSE-C's ETags are no MD5 of the bytes: not checked
    (the flipped body comes back as it came); SSE-S3's is, and is checked."""
    body, etag = s3.objs["big.bin"]
    u = url("big.bin")
    proxy.add_headers = [header]
    proxy.flip = -1
    r = tool(env_for(proxy.endpoint), "get", u, retry=0.3)
    if checked:
        assert failed(r).startswith(f"{u}: the body's MD5 ")
    else:
        assert ok(r) == FaultProxy.flip_body(body) and proxy.requests == 1


def crc_reflected(data, poly, bits):
    """A reflected CRC of @bits with all ones in and out, byte by byte."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    ones = (1 << bits) - 1
    c = ones
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ ones


def crc32c(data):
    return crc_reflected(data, 0x82F63B78, 32)


def crc64nvme(data):
    """NVM Express's CRC-64 (AWS's CRC64NVME); "123456789" gives
    0xAE8B14860A799888."""
    return crc_reflected(data, 0x9A6C9329AC4BC9B5, 64)


SUMS = {  # x-amz-checksum-KIND: (the name in a message, the sum of bytes)
    "crc32": ("CRC32", lambda b: struct.pack(">I", zlib.crc32(b))),
    "crc32c": ("CRC32C", lambda b: struct.pack(">I", crc32c(b))),
    "crc64nvme": ("CRC64NVME", lambda b: struct.pack(">Q", crc64nvme(b))),
    "sha256": ("SHA-256", lambda b: hashlib.sha256(b).digest()),
}


@pytest.mark.parametrize("kind", sorted(SUMS))
def test_checksum_header_is_checked(s3, proxy, kind):
    """An object uploaded with x-amz-checksum-KIND: the store gives the sum
    back (asked with x-amz-checksum-mode), the daemon's sum of the body is
    the same, and a flipped body is caught by it where the ETag is no MD5
    (SSE-KMS here, as the proxy says)."""
    label, fn = SUMS[kind]
    body = random.Random(kind).randbytes(20000)
    want = base64.b64encode(fn(body)).decode()
    key = f"sums/{kind}.bin"
    status, h, _ = s3.client("alice").request("PUT", "alice-data", key, body,
                                              headers={f"x-amz-checksum-{kind}": want})
    assert status == 200 and h[f"x-amz-checksum-{kind}"] == want
    u = url(key)
    proxy.add_headers = [b"x-amz-server-side-encryption: aws:kms"]
    assert ok(tool(env_for(proxy.endpoint), "get", u)) == body
    proxy.flip = 1
    assert ok(tool(env_for(proxy.endpoint), "get", u, retry=20)) == body
    assert (proxy.requests, proxy.flipped) == (3, 1)
    proxy.flip = -1
    got = base64.b64encode(fn(FaultProxy.flip_body(body))).decode()
    assert failed(tool(env_for(proxy.endpoint), "get", u, retry=0.3)) == (
        f"{u}: the body's {label} {got} does not match its x-amz-checksum-{kind} {want} (20000 bytes); "
        f"retried for 0.3 s")
    # a multipart upload's composite sum is no sum of the bytes: not checked
    proxy.add_headers.append(b"x-amz-checksum-type: COMPOSITE")
    requests = proxy.requests
    assert ok(tool(env_for(proxy.endpoint), "get", u)) == FaultProxy.flip_body(body)
    assert proxy.requests == requests + 1


@pytest.mark.parametrize("kind,checked", [("crc32c", "crc32c"), ("crc32", "crc32"), ("crc64nvme", "crc64nvme"),
                                          ("sha256", "md5")])
def test_only_the_cheapest_sum_is_computed(s3, proxy, kind, checked):
    """One verified sum of the whole body is the guarantee: of an ETag's MD5
    and an x-amz-checksum-KIND, only the cheaper is computed. The proxy
    replaces the ETag with a wrong MD5: behind a CRC the fetch still
    succeeds (the MD5 was not computed) and a flipped byte is still caught
    by the CRC; behind SHA-256 (slower than MD5) and without a sum, the MD5
    is what is checked, and the wrong ETag fails the fetch."""
    label, fn = SUMS[kind]
    body = random.Random("cheap" + kind).randbytes(20000)
    want = base64.b64encode(fn(body)).decode()
    alice = s3.client("alice")
    status, h, _ = alice.request("PUT", "alice-data", f"cheap/{kind}.bin", body,
                                 headers={f"x-amz-checksum-{kind}": want})
    assert status == 200 and h[f"x-amz-checksum-{kind}"] == want
    etag = h["etag"]
    assert etag == f'"{hashlib.md5(body).hexdigest()}"'
    u, plain = url(f"cheap/{kind}.bin"), url("cheap/plain.bin")
    alice.put("alice-data", "cheap/plain.bin", body)
    wrong = '"' + hashlib.md5(b"not these bytes").hexdigest() + '"'
    proxy.etag = wrong
    md5_msg = (f"the body's MD5 {hashlib.md5(body).hexdigest()} does not match its ETag {wrong} "
               f"(20000 bytes); retried for 0.3 s")
    # no sum beside the ETag: the MD5 is checked, and the wrong ETag caught
    assert failed(tool(env_for(proxy.endpoint), "get", plain, retry=0.3)) == f"{plain}: {md5_msg}"
    requests = proxy.requests
    r = tool(env_for(proxy.endpoint), "get", u, retry=0.3)
    if checked == "md5":
        assert failed(r) == f"{u}: {md5_msg}"
        return
    assert ok(r) == body and proxy.requests == requests + 1
    # the CRC is computed: a flipped byte is caught by it, named in the message
    proxy.flip = -1
    got = base64.b64encode(fn(FaultProxy.flip_body(body))).decode()
    assert failed(tool(env_for(proxy.endpoint), "get", u, retry=0.3)) == (
        f"{u}: the body's {label} {got} does not match its x-amz-checksum-{kind} {want} (20000 bytes); "
        f"retried for 0.3 s")
    assert proxy.flipped == proxy.requests - requests - 1 >= 2


def test_object_changed_between_head_and_get(s3):
    alice = s3.client("alice")
    first = b"first version" * 100
    alice.put("alice-data", "changing.bin", first)
    env = env_for(s3.endpoint)
    p = subprocess.Popen([TOOL, "headget", url("changing.bin")], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    etag_line = p.stdout.readline().decode().strip()
    assert etag_line == f"etag=\"{hashlib.md5(first).hexdigest()}\""
    alice.put("alice-data", "changing.bin", b"second version")
    out, err = p.communicate(b"go\n", timeout=60)
    assert p.returncode == 1 and out == b""
    assert err.decode().rstrip("\n") == (
        f"{url('changing.bin')}: PreconditionFailed: At least one of the pre-conditions you specified "
        f"did not hold (HTTP 412): the object changed since its ETag {etag_line[5:]} was seen")


def test_threads_share_connections(s3, proxy):
    """8 threads GET the same objects at once through one store: the bytes
    agree, and the connections are reused (far fewer than requests)."""
    keys = ODD_KEYS[:5]
    out = ok(tool(env_for(proxy.endpoint), "threads", "8", *[url(k) for k in keys]))
    assert out.decode().splitlines() == [f"{url(k)} {len(s3.objs[k][0])}" for k in keys]
    assert proxy.requests == 5 + 8 * 3 * 5
    assert proxy.connections <= 9, (proxy.connections, proxy.requests)


def test_plain_http_url(workdir):
    """An http(s):// URL is fetched as it is, unsigned."""
    with open(os.path.join(workdir, "pub.bin"), "wb") as f:
        f.write(b"public bytes" * 1000)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        extra = []  # header (name, value) pairs sent with every answer

        def log_message(self, *a):
            pass

        def end_headers(self):
            for k, v in self.extra:
                self.send_header(k, v)
            super().end_headers()

    srv = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **kw: Quiet(*a, directory=workdir, **kw))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        env = env_for("http://127.0.0.1:1")
        assert ok(tool(env, "get", base + "/pub.bin")) == b"public bytes" * 1000
        assert ok(tool(env, "range", base + "/pub.bin", "12", "12")) == b"public bytes"
        assert ok(tool(env, "head", base + "/pub.bin")).startswith(b"size=12000 etag=")
        assert failed(tool(env, "get", base + "/nope")) == f"{base}/nope: HTTP 404"
        # a web server's ETag of 32 hex digits is no MD5 of the bytes: not
        # checked, but where the answer is an S3 store's (x-amz-request-id), it is
        Quiet.extra = [("ETag", '"' + "0" * 32 + '"')]
        assert ok(tool(env, "get", base + "/pub.bin")) == b"public bytes" * 1000
        Quiet.extra.append(("x-amz-request-id", "18EEB7ED5559A9C0"))
        md5 = hashlib.md5(b"public bytes" * 1000).hexdigest()
        assert failed(tool(env, "get", base + "/pub.bin", retry=0.2)) == (
            f"{base}/pub.bin: the body's MD5 {md5} does not match its ETag \"{'0' * 32}\" (12000 bytes); "
            f"retried for 0.2 s")
    finally:
        srv.shutdown()


def test_threads_through_faults(s3, proxy):
    """8 threads while 503s, resets and cut bodies come and go: every GET
    retried to the same bytes as a clean one (store-tool compares)."""
    keys = ODD_KEYS[:6]
    proxy.add(*(["503", None, "reset", None, "cut"] * 10))
    out = ok(tool(env_for(proxy.endpoint), "threads", "8", *[url(k) for k in keys], retry=30))
    assert out.decode().splitlines() == [f"{url(k)} {len(s3.objs[k][0])}" for k in keys]
    assert proxy.faults.empty()


def test_no_answer_and_unprintable_error(s3, proxy):
    """A server that takes the request and says nothing is not a stalled
    body; an error's Code and Message reach the message printable only."""
    u = url("big.bin")
    proxy.add(*["silent"] * 20)
    assert failed(tool(env_for(proxy.endpoint), "get", u, retry=1, stall=1)) == (
        f"{u}: no answer from {proxy.endpoint} (Operation too slow. Less than 1 bytes/sec transferred "
        "the last 1 seconds); retried for 1 s")
    while not proxy.faults.empty():
        proxy.faults.get()
    proxy.add(("answer", 403, b"<Error><Code>Access\x1b[31mDenied</Code>"
                              b"<Message>no\x07pe &#27;[2J</Message></Error>"))
    assert failed(tool(env_for(proxy.endpoint), "get", u)) == (
        f"{u}: Access?[31mDenied: no?pe ?[2J (HTTP 403)")
