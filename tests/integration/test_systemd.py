# SPDX-License-Identifier: MIT
"""systemd integration: sd_notify messages and the watchdog, the unit file."""

import json
import os
import signal
import socket
import subprocess
import threading
import time

from ldrtest import LOADERD


class Notifications:
    """The datagrams sent to a notify socket, read by a thread as they come:
    the kernel queues only a few (net.unix.max_dgram_qlen, 10 here) and the
    daemon's sends do not wait, so with watchdog pings every 100 ms a test
    that stalled a second would have READY, RELOADING or STOPPING dropped."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.1)
        self.got, self.seen = [], 0
        self.cond = threading.Condition()
        self.closing = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while not self.closing:
            try:
                msg = self.sock.recv(4096).decode()
            except socket.timeout:
                continue
            with self.cond:
                self.got.append(msg)
                self.cond.notify_all()

    def until(self, wanted, timeout=10.0):
        """The datagrams not yet returned, up to the first that contains
        @wanted."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i in range(self.seen, len(self.got)):
                    if wanted in self.got[i]:
                        out, self.seen = self.got[self.seen:i + 1], i + 1
                        return out
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {wanted!r} among {self.got[self.seen:]!r}")
                self.cond.wait(left)

    def close(self):
        self.closing = True
        self.thread.join()
        self.sock.close()


def test_notify_ready_reload_watchdog_stopping(daemon, workdir):
    path = os.path.join(workdir, "notify.sock")
    n = Notifications(path)
    cfg = os.path.join(workdir, "c.json")
    with open(cfg, "w") as f:
        json.dump({"workers": 1}, f)
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="200000")
    d = daemon("--config", cfg, env=env)
    msgs = n.until("READY=1")
    ready = [m for m in msgs if "READY=1" in m][0]
    assert f"MAINPID={d.pid}" in ready and "STATUS=serving on" in ready
    # watchdog pings at half the interval: several within a second
    pings = [m for m in n.until("WATCHDOG=1") + n.until("WATCHDOG=1") if m == "WATCHDOG=1"]
    assert len(pings) >= 2
    os.kill(d.pid, signal.SIGHUP)
    msgs = n.until("READY=1")
    reload_msg = [m for m in msgs if "RELOADING=1" in m]
    assert reload_msg and "MONOTONIC_USEC=" in reload_msg[0]
    d.stop(signal.SIGTERM)
    assert any("STOPPING=1" in m for m in n.until("STOPPING=1"))
    n.close()


def test_no_notify_socket_is_fine(daemon):
    d = daemon(env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"})
    assert d.status()["pid"] == d.pid


def test_unit_file(workdir):
    build = os.path.dirname(os.path.dirname(LOADERD))
    unit = os.path.join(build, "systemd", "loaderd.service")
    if not os.path.exists(unit):
        import pytest
        pytest.skip("systemd's pkg-config file was not found at configure time: no unit built")
    text = open(unit).read()
    for line in ("Type=notify", "WatchdogSec=", "RuntimeDirectory=loaderd", "LimitMEMLOCK=",
                 "LimitNOFILE=", "ExecReload=/bin/kill -HUP $MAINPID", "NoNewPrivileges=yes",
                 "Restart=on-failure",
                 # object stores are reached over TCP (docs/storage.md, docs/deploy.md)
                 "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\n"):
        assert line in text, line
    assert "@BINDIR@" not in text
    exe = [l for l in text.splitlines() if l.startswith("ExecStart=")][0].split("=", 1)[1]
    assert exe.endswith("/loaderd")
    r = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True)
    # the binary is not installed here; anything else is a unit error
    problems = [l for l in (r.stdout + r.stderr).splitlines()
                if l.strip() and "is not executable" not in l and "No such file" not in l]
    assert not problems, problems
