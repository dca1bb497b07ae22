# SPDX-License-Identifier: MIT
"""A "node" of the many-node tests: a network namespace of its own whose
loopback reaches one host-side service through a Unix socket.

Node(port, unix_path) starts this file as a script under `unshare --net`:
a new network namespace with nothing but a loopback device, which the
script brings up (SIOCSIFFLAGS, no iproute2 needed), then it listens on
127.0.0.1:port there and relays every connection, byte for byte, to the
Unix socket @unix_path (a file system path, which crosses network
namespaces). The namespace lives as long as that process; Node.wrap is
the `nsenter` prefix that runs a command (the daemon) in it.

Nothing here leaves the machine: the namespace has no other device, and
the host-side end is a Unix socket.
"""

import ctypes
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def available():
    """None when network namespaces can be made here, else why not."""
    for tool in ("unshare", "nsenter"):
        if not shutil.which(tool):
            return f"no {tool} (util-linux) on PATH"
    r = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot make a network namespace here: {r.stderr.strip()}"
    return None


def _die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


class Node:
    """A network namespace held by a forwarder process (see the top)."""

    def __init__(self, port, unix_path):
        self.proc = subprocess.Popen(
            ["unshare", "--net", "--", sys.executable, os.path.abspath(__file__), str(port),
             unix_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"nsforward.py did not start: {line}{self.proc.stderr.read()}")
        self.netns = f"/proc/{self.proc.pid}/ns/net"
        self.wrap = ["nsenter", f"--net={self.netns}", "--"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _loopback_up():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sh22x", b"lo", 0))
        flags = struct.unpack("16sh22x", ifr)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def _pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _relay(c, path):
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        u.connect(path)
    except OSError:
        c.close()
        u.close()
        return
    t = threading.Thread(target=_pump, args=(u, c), daemon=True)
    t.start()
    _pump(c, u)
    t.join()
    c.close()
    u.close()


def main(port, path):
    _loopback_up()
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(64)
    print("ready", flush=True)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=_relay, args=(c, path), daemon=True).start()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
