# SPDX-License-Identifier: MIT
"""The host of a python pipeline's workers: `python -m loaderd._pyhost` (loader.host_command).

The trainer that created the pipeline spawns it (a fresh interpreter, the
trainer's user) with a pickled payload of builtin types on stdin
(loaderd.pydataset.build_spec). The host is a zygote: it imports no torch,
unpickles no user object and stays single-threaded. It connects to the
daemon's <socket>.workers, says HELLO (role HOST), maps the slab read-write
from the memfd passed with WELCOME, says MAPPED, waits for READY (the daemon
sealed the slab: nobody can map it writable any more), then forks its
workers, which inherit the writable mapping (loaderd._pyworker). It restarts
a worker that dies (reporting WORKER_EXIT), and when the daemon closes the
connection (the pipeline was dropped or failed) or on SIGTERM it stops its
workers (SIGTERM, SIGKILL after 2 s) and exits.
"""

import ctypes
import mmap
import os
import pickle
import select
import signal
import sys
import time
import traceback

# The host's and the workers' own code, all imported here, before setup()
# puts the trainer's sys.path in place (for the Dataset's module): it comes
# from loaderd's directory and the interpreter's, never from a directory of
# the trainer's (docs/security.md; loader.host_command). The worker code is
# stdlib only at import, loaded once before the forks.
from . import _pyworker
from . import _pywire as W

PR_SET_PDEATHSIG = 1
RESTART_FAST = 5         # deaths in a row of one worker before restarts wait
RESTART_DELAY = 1.0      # seconds
LIVED_LONG = 10.0        # a worker that lived this long resets its count
STOP_GRACE = 2.0


def _log(msg):
    sys.stderr.write(f"loaderd workers host (pid {os.getpid()}): {msg}\n")
    sys.stderr.flush()


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def map_shared(fd, size):
    """(address, buffer) of @fd mapped MAP_SHARED read-write. ctypes, not
    the mmap module: mmap.mmap keeps a dup of the fd, this keeps none."""
    libc = _libc()
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        e = ctypes.get_errno()
        raise OSError(e, f"mmap of the slab ({size} bytes): {os.strerror(e)}")
    return addr, (ctypes.c_uint8 * size).from_address(addr)


class Host:
    def __init__(self, payload):
        self.p = payload
        self.sock = None
        self.welcome = None
        self.slab = None
        self.workers = {}        # pid -> worker id
        self.by_id = {}          # worker id -> pid
        self.started = {}        # worker id -> monotonic start
        self.deaths = {}         # worker id -> deaths in a row
        self.due = {}            # worker id -> monotonic time of its (re)start
        self.stopping = False
        self.wake_r, self.wake_w = os.pipe()

    # ----------------------------------------------------------- setup

    def setup(self):
        p = self.p
        try:
            os.chdir(p["cwd"])
        except OSError as e:
            _log(f"cannot chdir to {p['cwd']}: {e}")
        sys.path[:] = p["sys_path"]
        self.sock = W.connect(p["socket"] + ".workers", p.get("daemon_uid"))
        W.hello(self.sock, W.ROLE_HOST, p["pipeline"], nworkers=p["nworkers"])
        fds = []
        try:
            self.welcome = W.parse_welcome(W.expect(self.sock, W.WELCOME, "WELCOME", fds))
            if not fds:
                raise W.ProtocolError("WELCOME came without the slab's file descriptor")
            self.addr, self.slab = map_shared(fds[0], self.welcome["slab_size"])
        finally:
            for fd in fds:
                os.close(fd)
        W.send(self.sock, W.MAPPED)
        W.expect(self.sock, W.READY, "READY")

    # ---------------------------------------------------------- workers

    def fork_worker(self, wid):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                for s in (signal.SIGTERM, signal.SIGCHLD, signal.SIGINT):
                    signal.signal(s, signal.SIG_DFL)
                try:
                    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                except Exception:
                    pass
                if os.getppid() != self.host_pid:
                    os._exit(1)  # the host died before prctl
                self.sock.close()
                os.close(self.wake_r)
                os.close(self.wake_w)
                code = _pyworker.main(self.p, self.welcome, wid, self.addr, self.slab)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        self.workers[pid] = wid
        self.by_id[wid] = pid
        self.started[wid] = time.monotonic()

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            wid = self.workers.pop(pid, None)
            if wid is None:
                continue
            self.by_id.pop(wid, None)
            if self.stopping:
                continue
            try:
                W.send(self.sock, W.WORKER_EXIT, W.WORKER_EXIT_S.pack(wid, pid, status, 0))
            except OSError:
                pass
            lived = time.monotonic() - self.started.get(wid, 0)
            n = 1 if lived >= LIVED_LONG else self.deaths.get(wid, 0) + 1
            self.deaths[wid] = n
            what = (f"exit {os.WEXITSTATUS(status)}" if os.WIFEXITED(status) else
                    f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"status {status}")
            delay = RESTART_DELAY if n >= RESTART_FAST else 0.0
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                # the daemon closed the worker's connection: the pipeline is
                # going away, and the host's EOF follows; restart quietly
                # only if it does not
                self.due[wid] = time.monotonic() + max(delay, 0.5)
                continue
            _log(f"worker {wid} (pid {pid}) ended ({what}); restarting it"
                 + (f" in {delay:.0f} s ({n} deaths in a row)" if delay else ""))
            self.due[wid] = time.monotonic() + delay

    def start_due(self):
        now = time.monotonic()
        for wid, t in list(self.due.items()):
            if t <= now:
                del self.due[wid]
                self.fork_worker(wid)

    def _signal(self, signum, frame):
        if signum == signal.SIGTERM:
            self.stopping = True

    def run(self):
        self.host_pid = os.getpid()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for wid in range(self.p["nworkers"]):
            self.fork_worker(wid)
        reason = "SIGTERM"
        while not self.stopping:
            self.reap()
            if self.stopping:
                break
            self.start_due()
            timeout = 1.0
            if self.due:
                timeout = max(0.0, min(self.due.values()) - time.monotonic())
            try:
                r, _, _ = select.select([self.sock, self.wake_r], [], [], timeout)
            except InterruptedError:
                continue
            if self.wake_r in r:
                try:
                    os.read(self.wake_r, 512)
                except BlockingIOError:
                    pass
            if self.sock in r:
                try:
                    msg = W.recv(self.sock)
                except (OSError, W.ProtocolError) as e:
                    msg = None
                    reason = f"the connection failed ({e})"
                if msg is None:
                    reason = reason if reason != "SIGTERM" else "the daemon closed the connection"
                    break
                if msg[0] == W.ERROR:
                    try:
                        W.check_error(msg)
                    except W.PeerError as e:
                        _log(f"the daemon says: {e}")
                    reason = "the daemon sent ERROR"
                    break
                # nothing else is expected on the host's connection
        self.stop()
        return 0

    def stop(self):
        self.stopping = True
        for pid in list(self.workers):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE
        while self.workers and time.monotonic() < deadline:
            self._reap_quiet()
            time.sleep(0.02)
        for pid in list(self.workers):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while self.workers:
            try:
                pid, _ = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            self.workers.pop(pid, None)
        try:
            self.sock.close()
        except OSError:
            pass

    def _reap_quiet(self):
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.workers.clear()
                return
            if pid == 0:
                return
            self.workers.pop(pid, None)


def main():
    try:
        payload = pickle.load(sys.stdin.buffer)
    except Exception as e:
        _log(f"cannot read the payload on stdin: {e}")
        return 2
    try:
        sys.stdin.close()
        os.close(0)
        fd = os.open(os.devnull, os.O_RDONLY)
        if fd != 0:
            os.dup2(fd, 0)
            os.close(fd)
    except OSError:
        pass
    host = Host(payload)
    try:
        host.setup()
    except W.PeerError as e:
        _log(f"pipeline {payload.get('pipeline')!r}: the daemon refused: {e}")
        return 3
    except (OSError, W.ProtocolError) as e:
        _log(f"pipeline {payload.get('pipeline')!r}: {e}")
        return 4
    return host.run()


if __name__ == "__main__":
    sys.exit(main())
