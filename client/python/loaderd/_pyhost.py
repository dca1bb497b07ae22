# SPDX-License-Identifier: MIT
"""The host of a python pipeline's workers (loaderd._pystart starts it).

The trainer starts it before the pipeline exists, in one of two ways
(multiprocessing_context): **forked** from the trainer (the default on
Linux, as torch's fork workers: the Dataset, collate_fn and worker_init_fn
are the trainer's objects as they are, nothing pickled or re-imported), or
**exec'd** as a fresh interpreter, `python -P -m loaderd._pyhost` (spawn,
forkserver), that gets a payload of builtin types and pickles and then is a
zygote: it imports no torch and unpickles no user object. Either way it
talks to its trainer over a socketpair (its stdin when exec'd; messages
chan_send() frames) and:

1. forks worker 0 to learn what the trainer does not compute itself
   (len() of a Dataset named by import path, the fields of dataset[0]:
   loaderd._pyworker.learn) and sends it back, or how that failed
   (the exception's text, or the signal that killed the worker);
2. waits for the trainer's "go" (the pipeline it created, the socket, the
   daemon's uid) or EOF (the pipeline existed: another host serves it; or
   the trainer failed or went away), then exits or goes on;
3. connects to the daemon's <socket>.workers, says HELLO (role HOST), maps
   the slab read-write from the memfd passed with WELCOME, says MAPPED,
   waits for READY (the daemon sealed the slab: nobody can map it writable
   any more), says "ready" to the trainer, then forks its workers, which
   inherit the writable mapping (loaderd._pyworker). It restarts a worker
   that dies (reporting WORKER_EXIT), and when the daemon closes the
   connection (the pipeline was dropped or failed) or on SIGTERM it stops
   its workers (SIGTERM, SIGKILL after 2 s), says "exit" and its status to
   the trainer if it still listens, and exits.
"""

import ctypes
import json
import mmap
import os
import pickle
import select
import signal
import socket
import struct
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
CHAN_HDR = struct.Struct("=cI")   # kind (b"J" JSON, b"P" pickle: the exec'd host's payload), length
CHAN_MAX = 1 << 30


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


# ------------------------------------------------------- the trainer's channel

def chan_send(sock, obj, pickled=False):
    """One message to the other end of the trainer's channel: JSON, or (the
    trainer's payload to an exec'd host only) a pickle of builtin types."""
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if pickled else \
        json.dumps(obj).encode()
    sock.sendall(CHAN_HDR.pack(b"P" if pickled else b"J", len(body)) + body)


def _read_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            if buf:
                raise W.ProtocolError("the channel closed in the middle of a message")
            return None
        buf += chunk
    return bytes(buf)


def chan_recv(sock, allow_pickle=False):
    """The next message of the channel, or None at EOF. A pickle only where
    @allow_pickle (the exec'd host's first message, from its own trainer)."""
    hdr = _read_exact(sock, CHAN_HDR.size)
    if hdr is None:
        return None
    kind, n = CHAN_HDR.unpack(hdr)
    if n > CHAN_MAX or kind not in (b"J", b"P") or (kind == b"P" and not allow_pickle):
        raise W.ProtocolError(f"the channel sent a message of kind {kind!r}, {n} bytes")
    body = _read_exact(sock, n)
    if body is None:
        raise W.ProtocolError("the channel closed in the middle of a message")
    return pickle.loads(body) if kind == b"P" else json.loads(body)


def reset_signals():
    """A forked child's signals as a fresh process has them: no handler or
    wakeup fd of the process it was forked from runs in it."""
    signal.set_wakeup_fd(-1)
    for s in signal.valid_signals():
        try:
            if callable(signal.getsignal(s)) or s in (signal.SIGTERM, signal.SIGCHLD,
                                                      signal.SIGINT):
                signal.signal(s, signal.SIG_DFL)
        except (OSError, ValueError, TypeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def child_exit(fn):
    """In a forked child: run @fn, print what it raises, and leave by
    os._exit with its status: no finalizer, atexit handler or code of the
    parent's runs after it."""
    code = 1
    try:
        code = fn()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _die_with_parent(parent):
    try:
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass
    if os.getppid() != parent:
        os._exit(1)  # the parent died before prctl


def learn_in_child(chan, payload):
    """Fork worker 0 to learn what payload["learn"] asks (_pyworker.learn);
    its answer, a dict, or None when the trainer went away meanwhile (the
    child is killed). A child that dies without an answer (a segfault in
    __getitem__) is {"error": {"kind": "died", "pid", "status"}}."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        def child():
            os.close(r)
            chan.close()
            reset_signals()
            _die_with_parent(parent)
            view = memoryview(json.dumps(_pyworker.learn(payload)).encode())
            while view:
                view = view[os.write(w, view):]
            return 0
        child_exit(child)
    os.close(w)
    buf = bytearray()
    try:
        while True:
            ready, _, _ = select.select([r, chan], [], [])
            if chan in ready and not chan.recv(1, socket.MSG_PEEK):
                os.kill(pid, signal.SIGKILL)  # the trainer is gone (or gave up)
                os.waitpid(pid, 0)
                return None
            if r in ready:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                buf += chunk
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    if buf:
        try:
            return json.loads(bytes(buf))
        except ValueError:
            pass
    return {"error": {"kind": "died", "pid": pid, "status": status}}


def serve(chan, payload):
    """The host's life once started (exec'd: main(); forked: loaderd._pystart),
    @chan its trainer's channel: learn, wait for "go", serve. Its exit status."""
    try:
        chan_send(chan, {"pid": os.getpid()})
    except OSError:
        return 0  # the trainer is gone already
    # the trainer's directory and sys.path (for the Dataset's modules), only
    # now that the host's own code is imported (a no-op when forked)
    try:
        os.chdir(payload["cwd"])
    except OSError as e:
        _log(f"cannot chdir to {payload['cwd']}: {e}")
    sys.path[:] = payload["sys_path"]
    ask = payload.get("learn") or {}
    if ask.get("samples") or ask.get("fields"):
        res = learn_in_child(chan, payload)
        if res is None:
            return 0
        try:
            chan_send(chan, res)
        except OSError:
            return 0  # the trainer went away meanwhile
        if "error" in res:
            return 0
    msg = chan_recv(chan)
    if not isinstance(msg, dict) or not isinstance(msg.get("go"), dict):
        return 0  # the pipeline existed (another host serves it), or the trainer failed
    payload.update(msg["go"])
    host = Host(payload, chan)
    try:
        host.setup()
    except W.PeerError as e:
        text = f"pipeline {payload.get('pipeline')!r}: the daemon refused: {e}"
        code = 3
    except (OSError, W.ProtocolError) as e:
        text = f"pipeline {payload.get('pipeline')!r}: {e}"
        code = 4
    else:
        chan_send(chan, {"ready": True})
        code = host.run()
        try:
            chan_send(chan, {"exit": code})
        except OSError:
            pass  # the trainer no longer listens
        return code
    _log(text)
    try:
        chan_send(chan, {"error": {"kind": "host", "text": text}})
    except OSError:
        pass
    return code


class Host:
    def __init__(self, payload, chan=None):
        self.p = payload
        self.chan = chan         # the trainer's channel (its workers close it)
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
            def worker():
                reset_signals()
                _die_with_parent(self.host_pid)
                self.sock.close()
                if self.chan is not None:
                    self.chan.close()
                os.close(self.wake_r)
                os.close(self.wake_w)
                return _pyworker.main(self.p, self.welcome, wid, self.addr, self.slab)
            child_exit(worker)
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
    """The exec'd host: its channel is its stdin, the payload the first
    message (host_command, loaderd._pystart)."""
    try:
        chan = socket.socket(fileno=os.dup(0))
        fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
        payload = chan_recv(chan, allow_pickle=True)
    except (OSError, W.ProtocolError, pickle.UnpicklingError, EOFError) as e:
        _log(f"cannot read the payload from the trainer: {e}")
        return 2
    if not isinstance(payload, dict):
        return 2  # the trainer went away
    return serve(chan, payload)


if __name__ == "__main__":
    sys.exit(main())
