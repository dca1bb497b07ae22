# SPDX-License-Identifier: MIT
"""The bytes of the Python workers' socket, <socket>.workers: daemon/engine/pyw-wire.h
in struct formats (native byte order, standard sizes, no padding: "=").
Standard library only (the workers' host imports it)."""

import array
import os
import socket
import struct

MAGIC = 0x5750444C  # "LDPW"
VERSION = 1
MAX_PAYLOAD = 1 << 20
MSG_MAX = 16384

HELLO, WELCOME, ERROR, MAPPED, READY, WORKER_EXIT = 1, 2, 3, 4, 5, 6
TASK, DONE, FAIL = 10, 11, 12
ROLE_HOST, ROLE_WORKER = 1, 2

HDR = struct.Struct("=IHHI")               # magic, type, flags, len
HELLO_S = struct.Struct("=IIIIII64s")      # version, role, nworkers, worker_id, pid (the
#                                            daemon uses SO_PEERCRED's), reserved, pipeline
WELCOME_S = struct.Struct("=iIQQIIQQII")   # status, nfields, slab_size, slot_bytes, nslots,
#                                            batch_size, nsamples, seed, on_error, nworkers
FIELD_S = struct.Struct("=QQ")             # offset, sample_bytes
WORKER_EXIT_S = struct.Struct("=IIiI")     # worker_id, pid, wstatus, reserved
TASK_S = struct.Struct("=QQIIII")          # task_id, epoch, slot, row0, nrows, reserved
DONE_S = struct.Struct("=QQ")              # task_id, skipped
FAIL_S = struct.Struct("=QQiI")            # task_id, index, status, reserved

assert (HDR.size, HELLO_S.size, WELCOME_S.size, FIELD_S.size, WORKER_EXIT_S.size, TASK_S.size,
        DONE_S.size, FAIL_S.size) == (12, 88, 56, 16, 16, 32, 16, 24)


class ProtocolError(Exception):
    pass


class PeerError(Exception):
    """The daemon sent ERROR (status, text)."""

    def __init__(self, status, text):
        self.status = status
        self.text = text
        super().__init__(f"{text} ({os.strerror(-status) if status < 0 else status})")


def connect(path, daemon_uid=None):
    """Connect to the daemon's <socket>.workers, whose peer (SO_PEERCRED)
    must be @daemon_uid: the uid of the daemon the trainer's libloader
    checked (docs/security.md, "Whose pipeline, whose daemon")."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    if daemon_uid is not None:
        _, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                     struct.calcsize("3i")))
        if uid != daemon_uid:
            s.close()
            raise ProtocolError(f"{path} is served by uid {uid}, not by the daemon's uid "
                                f"{daemon_uid}: refusing it")
    return s


def send(sock, mtype, payload=b""):
    if len(payload) > MAX_PAYLOAD:
        raise ProtocolError(f"payload of {len(payload)} bytes")
    sock.sendall(HDR.pack(MAGIC, mtype, 0, len(payload)) + payload)


def hello(sock, role, pipeline, nworkers=0, worker_id=0):
    name = pipeline.encode()[:63]
    send(sock, HELLO, HELLO_S.pack(VERSION, role, nworkers, worker_id, os.getpid(), 0, name))


def _recv_exact(sock, n, fds):
    buf = bytearray()
    while len(buf) < n:
        if fds is None:
            chunk = sock.recv(n - len(buf))
        else:
            chunk, anc, flags, _ = sock.recvmsg(n - len(buf), socket.CMSG_SPACE(16 * 4))
            for level, ctype, data in anc:
                if level == socket.SOL_SOCKET and ctype == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(data[:len(data) - len(data) % a.itemsize])
                    fds.extend(a)
        if not chunk:
            return None if not buf else bytes(buf)
        buf += chunk
    return bytes(buf)


def recv(sock, fds=None):
    """(type, payload) of the next message, or None at EOF. @fds: a list
    that collects file descriptors passed with it (SCM_RIGHTS)."""
    h = _recv_exact(sock, HDR.size, fds)
    if h is None:
        return None
    if len(h) < HDR.size:
        raise ProtocolError("the connection closed inside a header")
    magic, mtype, _flags, n = HDR.unpack(h)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic 0x{magic:08x}")
    if n > MAX_PAYLOAD:
        raise ProtocolError(f"payload of {n} bytes announced")
    body = _recv_exact(sock, n, fds) if n else b""
    if body is None or len(body) < n:
        raise ProtocolError("the connection closed inside a message")
    return mtype, body


def check_error(msg):
    """Raise PeerError for an ERROR message."""
    if msg is not None and msg[0] == ERROR:
        body = msg[1]
        status = struct.unpack_from("=i", body)[0] if len(body) >= 4 else 0
        raise PeerError(status, body[4:].decode("utf-8", "replace"))


def expect(sock, mtype, name, fds=None):
    """The payload of the next message, which must be of @mtype (@name in
    errors); PeerError for an ERROR, ProtocolError for EOF or another type."""
    msg = recv(sock, fds)
    if msg is None:
        raise ProtocolError(f"the daemon closed the connection before {name}")
    check_error(msg)
    if msg[0] != mtype:
        raise ProtocolError(f"expected {name}, got message type {msg[0]}")
    return msg[1]


def parse_welcome(body):
    w = WELCOME_S.unpack_from(body)
    keys = ("status", "nfields", "slab_size", "slot_bytes", "nslots", "batch_size", "nsamples",
            "seed", "on_error", "nworkers")
    d = dict(zip(keys, w))
    fields = []
    off = WELCOME_S.size
    for _ in range(d["nfields"]):
        fields.append(FIELD_S.unpack_from(body, off))
        off += FIELD_S.size
    d["fields"] = fields
    return d


def cut_utf8(text, limit):
    """@text as UTF-8 of at most @limit bytes: its head and its tail."""
    b = text.encode("utf-8", "replace")
    if len(b) <= limit:
        return b
    mark = "\n[... cut ...]\n".encode()
    head = (limit - len(mark)) // 3
    tail = limit - len(mark) - head
    return (b[:head].decode("utf-8", "ignore").encode() + mark +
            b[len(b) - tail:].decode("utf-8", "ignore").encode())[:limit]
