# SPDX-License-Identifier: MIT
"""Helpers of the integration tests: datasets, expected batches, dump parsing.

Everything here computes what loaderd must deliver independently of the
daemon, with numpy, straight from the documented contract (docs/spec.md,
issue "loaderd core"): sample i of a token file of sequence length L is the
window input = tok[i*L : i*L+L], target = tok[i*L+1 : i*L+L+1]; an npy field
is the rows of its file; a dump is every field of every batch, in order, as
raw C-order bytes (tokens: input then target; npy: the order of `paths`).
"""

import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import zlib

import numpy as np

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(TESTS_DIR), "pyharness"))

# the build under test and the sanitizer markers: the one harness's
from loaderd_harness import (BUILD_DIR, LOADERCTL, LOADERD, REPO_ROOT,  # noqa: E402,F401
                             SANITIZER_MARKERS, sanitizer_report)


@contextlib.contextmanager
def fuse_mount(workdir, script, mnt, ready, *args):
    """A real FUSE file system: the fusepy @script run over @mnt (made here)
    with *@args, until @ready exists under it. Skips the test where FUSE
    cannot mount; unmounts at the end."""
    import pytest
    try:
        import fusepy  # noqa: F401
    except ImportError:
        pytest.skip("python3-fusepy is not installed (scripts/bootstrap installs it)")
    um = shutil.which("fusermount3") or shutil.which("fusermount")
    if not os.path.exists("/dev/fuse") or not um:
        pytest.skip("no /dev/fuse or no fusermount here")
    os.mkdir(mnt)
    path = os.path.join(workdir, "fs.py")
    with open(path, "w") as f:
        f.write(script)
    fs = subprocess.Popen(["/usr/bin/python3", path, mnt, *args],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(mnt, ready)):
        if fs.poll() is not None or time.monotonic() > deadline:
            out = fs.communicate()[0] if fs.poll() is not None else ""
            fs.kill()
            pytest.skip(f"cannot mount a FUSE file system here: {out[-500:]}")
        time.sleep(0.1)
    try:
        yield
    finally:
        subprocess.run([um, "-u", mnt], capture_output=True)
        try:
            fs.wait(timeout=10)
        except subprocess.TimeoutExpired:
            fs.kill()
            fs.wait()


def wait_log(d, needle, what, count=1, timeout=20.0):
    """Poll daemon @d's log until @needle (a string, or a compiled regular
    expression) occurs at least @count times; the log. Shows that the path
    that writes the line ran, rather than sleeping for a guess of when."""
    deadline = time.monotonic() + timeout
    while True:
        log = d.log()
        n = len(needle.findall(log)) if hasattr(needle, "findall") else log.count(needle)
        if n >= count:
            return log
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} ({count} of "
                                 f"{getattr(needle, 'pattern', needle)!r} in the log, "
                                 f"{n} there):\n{log[-3000:]}")
        time.sleep(0.05)


def crc(data):
    return zlib.crc32(data) & 0xFFFFFFFF


# --------------------------------------------------------------- datasets

def write_tokens(path, tokens, dtype=None):
    """Write a flat token file; returns the array as written."""
    arr = np.asarray(tokens, dtype=dtype) if dtype else np.asarray(tokens)
    arr.tofile(path)
    return arr


def random_tokens(path, ntokens, dtype="uint16", seed=1):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    hi = min(int(info.max), 50000)
    lo = max(int(info.min), -50000)
    arr = rng.integers(lo, hi, size=ntokens, endpoint=True).astype(dtype)
    arr.tofile(path)
    return arr


def position_tokens(path, ntokens):
    """uint32 tokens with tok[k] = k: every window says where it came from."""
    arr = np.arange(ntokens, dtype=np.uint32)
    arr.tofile(path)
    return arr


def write_npy(path, arr):
    np.save(path, arr)
    return arr


def token_spec(name, path, seq_len, dtype, **kw):
    source = {"kind": "tokens", "path": str(path), "dtype": dtype, "seq_len": seq_len}
    if "output_dtype" in kw:
        source["output_dtype"] = kw.pop("output_dtype")
    spec = {"name": name, "source": source}
    spec.update(kw)
    return spec


def npy_spec(name, paths, **kw):
    spec = {"name": name, "source": {"kind": "npy", "paths": [str(p) for p in paths]}}
    spec.update(kw)
    return spec


# --------------------------------------------------------- sampler model

def nsamples_tokens(ntokens, seq_len):
    return (ntokens - 1) // seq_len


def batch_rows(nsamples, batch_size, drop_last=False):
    """Rows of each batch of one epoch of @nsamples samples."""
    full, rest = divmod(nsamples, batch_size)
    rows = [batch_size] * full
    if rest and not drop_last:
        rows.append(rest)
    return rows


def split_batches(indices, batch_size, drop_last=False):
    """Cut a list of sample indices into batches."""
    out = []
    pos = 0
    for r in batch_rows(len(indices), batch_size, drop_last):
        out.append(list(indices[pos:pos + r]))
        pos += r
    return out


def sequential_batches(nsamples, batch_size, drop_last=False, epochs=1):
    one = split_batches(list(range(nsamples)), batch_size, drop_last)
    return [b for _ in range(epochs) for b in one]


def partition_share(order, rank, world, drop_last=False):
    """torch DistributedSampler: rank r takes positions r, r+W, ... of the
    epoch order, padded by wrap-around to ceil(n/W) (drop_last: floor)."""
    n = len(order)
    if drop_last:
        per_rank = n // world
    else:
        per_rank = -(-n // world)
    total = per_rank * world
    padded = [order[p % n] for p in range(total)]
    return padded[rank:total:world]


# --------------------------------------------------------- expected bytes

def token_batch_bytes(tokens, seq_len, indices, out_dtype="int64"):
    L = seq_len
    inp = np.stack([tokens[i * L:i * L + L] for i in indices]).astype(out_dtype)
    tgt = np.stack([tokens[i * L + 1:i * L + L + 1] for i in indices]).astype(out_dtype)
    return np.ascontiguousarray(inp).tobytes() + np.ascontiguousarray(tgt).tobytes()


def token_dump(tokens, seq_len, batches, out_dtype="int64"):
    return b"".join(token_batch_bytes(tokens, seq_len, b, out_dtype) for b in batches)


def npy_dump(arrays, batches):
    parts = []
    for b in batches:
        idx = np.asarray(b, dtype=np.int64)
        for a in arrays:
            parts.append(np.ascontiguousarray(a[idx]).tobytes())
    return b"".join(parts)


# ------------------------------------------------------------ dump parsing

def parse_token_dump(dump, seq_len, rows_per_batch, out_dtype="int64"):
    """Split a tokens dump into [(input, target)] given each batch's rows."""
    itemsize = np.dtype(out_dtype).itemsize
    out = []
    pos = 0
    for rows in rows_per_batch:
        n = rows * seq_len * itemsize
        assert pos + 2 * n <= len(dump), (
            f"dump too short: {len(dump)} bytes, batch {len(out)} needs up to {pos + 2 * n}")
        inp = np.frombuffer(dump, dtype=out_dtype, count=rows * seq_len, offset=pos)
        tgt = np.frombuffer(dump, dtype=out_dtype, count=rows * seq_len, offset=pos + n)
        out.append((inp.reshape(rows, seq_len), tgt.reshape(rows, seq_len)))
        pos += 2 * n
    assert pos == len(dump), f"dump has {len(dump) - pos} bytes after the expected batches"
    return out


def position_indices(dump, seq_len, rows_per_batch):
    """For a dump of a position_tokens() file (uint32 tok[k] = k, int64 out):
    check every row is a well-formed window and return, per batch, the list of
    sample indices it holds."""
    batches = []
    L = seq_len
    ramp = np.arange(L, dtype=np.int64)
    for bi, (inp, tgt) in enumerate(parse_token_dump(dump, seq_len, rows_per_batch)):
        first = inp[:, 0]
        assert np.all(first % L == 0), f"batch {bi}: a row does not start at a multiple of L"
        idx = first // L
        assert np.array_equal(inp, (first[:, None] + ramp[None, :])), f"batch {bi}: input rows are not windows"
        assert np.array_equal(tgt, inp + 1), f"batch {bi}: target is not input shifted by one"
        batches.append([int(i) for i in idx])
    return batches


# ------------------------------------------- Python clients as subprocesses

def python_client_env(*pythonpath, base=None):
    """The environment of a /usr/bin/python3 client process of the build under
    test: this checkout's loaderd package (then @pythonpath), the build's
    libloader, no torchrun or socket variables from the test's own, and in a
    sanitizer build its runtime preloaded (the interpreter is not built with
    it)."""
    import subprocess
    lib = os.path.join(BUILD_DIR, "client", "libloader.so")
    env = dict(os.environ if base is None else base, LOADERD_LIBRARY=lib,
               PYTHONPATH=os.pathsep.join([os.path.join(REPO_ROOT, "client", "python"),
                                           *pythonpath]))
    for k in ("RANK", "WORLD_SIZE", "LOADERD_SOCKET"):
        env.pop(k, None)
    out = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    if "libasan" in out:
        pre = [subprocess.run(["gcc", f"-print-file-name={n}"], capture_output=True,
                              text=True).stdout.strip() for n in ("libasan.so", "libubsan.so")]
        env["LD_PRELOAD"] = ":".join(pre)
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    return env


# ------------------------------------------------------ raw nng IPC (REQ)

NNG_PROTO_REQ = 0x30
NNG_PROTO_REP = 0x31


def pb_varint(value):
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_field(num, payload):
    """A length-delimited protobuf field."""
    return pb_varint(num << 3 | 2) + pb_varint(len(payload)) + payload


def pb_read_varint(buf, pos):
    shift = 0
    val = 0
    while True:
        b = buf[pos]
        pos += 1
        val |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return val, pos


def pb_top_field(buf):
    """(field number, wire type, payload) of the first field of a message."""
    if not buf:
        return None, None, b""
    tag, pos = pb_read_varint(buf, 0)
    num, wt = tag >> 3, tag & 7
    if wt == 2:
        ln, pos = pb_read_varint(buf, pos)
        return num, wt, bytes(buf[pos:pos + ln])
    return num, wt, bytes(buf[pos:])


# Request oneof numbers (proto/loader.proto)
REQ_HELLO = 1
REQ_STATUS = 9
# Reply oneof numbers
REP_ERROR = 1
REP_HELLO = 2
REP_JSON = 5


class RawReq:
    """A bare nng REQ peer over the ipc transport, written by hand so that
    the tests can put arbitrary bytes on the daemon's socket."""

    def __init__(self, path, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.sock.sendall(b"\x00SP\x00" + struct.pack(">HH", NNG_PROTO_REQ, 0))
        hdr = self._recv_exact(8)
        assert hdr[:4] == b"\x00SP\x00", f"bad SP header {hdr!r}"
        self.peer_proto = struct.unpack(">H", hdr[4:6])[0]
        self.next_id = 0x80000001

    def _recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by peer")
            buf += chunk
        return bytes(buf)

    def send_frame(self, data, declared_len=None):
        ln = len(data) if declared_len is None else declared_len
        self.sock.sendall(b"\x01" + struct.pack(">Q", ln) + data)

    def send_request(self, body):
        rid = self.next_id
        self.next_id += 1
        self.send_frame(struct.pack(">I", rid) + body)
        return rid

    def recv_reply(self):
        """The reply body (request id header removed)."""
        hdr = self._recv_exact(9)
        assert hdr[0] == 1, f"unexpected frame type {hdr[0]}"
        ln = struct.unpack(">Q", hdr[1:])[0]
        assert ln < (1 << 24), f"absurd reply length {ln}"
        data = self._recv_exact(ln)
        assert len(data) >= 4
        return data[4:]

    def call(self, body):
        self.send_request(body)
        return self.recv_reply()

    def hello(self):
        body = pb_field(REQ_HELLO, b"\x08\x02" + pb_field(2, b"rawtest"))  # protocol 2
        num, _, _ = pb_top_field(self.call(body))
        return num

    def status(self):
        num, _, payload = pb_top_field(self.call(pb_field(REQ_STATUS, b"")))
        assert num == REP_JSON, f"status reply is field {num}, not JsonReply"
        _, _, text = pb_top_field(payload)
        return json.loads(text.decode())

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
