# SPDX-License-Identifier: MIT
"""Starting the workers' host of a python pipeline, from the trainer.

loaderd.DataLoader starts the host before the pipeline exists (docs/python.md,
"Who runs what, and for how long"): the host's worker 0 learns what the
trainer never computes itself (dataset[0]'s fields; a run of __getitem__
that raises, hangs or crashes happens in that worker), the trainer creates
the pipeline from it and says "go", or closes the channel when the pipeline
existed already (another trainer's host serves it).

- **fork** (multiprocessing_context None or "fork", on Linux): the host is
  forked from the trainer, as torch's fork workers are, and sees the
  trainer's Dataset, collate_fn and worker_init_fn as they are. It is made
  fit to outlive the trainer first: its own session (a double fork: it is
  never the trainer's child, no zombie there), no signal handler of the
  trainer's, and nothing that would keep the trainer's resources alive or
  touch libloader's state: the trainer's sockets (its connections to the
  daemon, a DDP rendezvous port), pipes (multiprocessing's sentinel of a
  process that torch.multiprocessing.spawn waits for) and GPU device files
  are replaced by /dev/null (the numbers stay taken; its stdin too, while
  stdout and stderr stay the trainer's), the trainer's mappings of slabs are
  unmapped, and it leaves only by os._exit (no finalizer, no atexit).
- **exec** ("spawn", "forkserver"): `python -P -m loaderd._pyhost`
  (loader.host_command), the payload pickled as torch pickles for those
  contexts.
"""

import ctypes
import errno
import multiprocessing
import os
import select
import signal
import socket
import stat
import sys
import time
import warnings

from . import _pyhost
from .errors import DatasetError, Error, WorkerDied, dataset_error, from_code
from .pydataset import SampleError

_GPU_FILES = ("/dev/nvidia", "/dev/dri/", "/dev/kfd")
_SLAB_MAPS = "/memfd:loaderd:"   # the daemon's slabs (daemon/engine/slab.c)


def start_method(ctx, num_workers):
    """"fork" or "exec" for torch's multiprocessing_context @ctx (None, a
    start method's name or a multiprocessing context), checked as torch
    checks it."""
    if ctx is None:
        name = "fork"
    else:
        if not num_workers:
            raise ValueError("multiprocessing_context can only be used with multi-process "
                             f"loading (num_workers > 0), but got num_workers={num_workers or 0}")
        if isinstance(ctx, str):
            valid = multiprocessing.get_all_start_methods()
            if ctx not in valid:
                raise ValueError("multiprocessing_context option should specify a valid start "
                                 f"method in {valid!r}, but got multiprocessing_context={ctx!r}")
            name = ctx
        elif isinstance(ctx, multiprocessing.context.BaseContext):
            name = ctx.get_start_method()
        else:
            raise TypeError("multiprocessing_context option should be a valid context object "
                            "or a string specifying the start method, but got "
                            f"multiprocessing_context={ctx}")
    if name == "fork" and hasattr(os, "fork") and sys.platform.startswith("linux"):
        if ctx is None and sanitizer_runtime():
            return "exec"  # the default only: an explicit "fork" is the user's choice
        return "fork"
    return "exec"


_SANITIZER = None


def sanitizer_runtime():
    """The AddressSanitizer or ThreadSanitizer runtime this process runs
    with (a libloader built with one, the runtime preloaded), or None. Its
    allocator is not safe across fork() in a process with threads
    (libloader's are running): a host forked from such a trainer deadlocks
    in its first malloc now and then, so the default context starts the
    host by exec there (docs/python.md, "Who runs what, and for how long")."""
    global _SANITIZER
    if _SANITIZER is None:
        _SANITIZER = ""
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    for lib in ("libasan", "libtsan"):
                        if lib in line:
                            _SANITIZER = lib
                            break
                    if _SANITIZER:
                        break
        except OSError:
            pass
    return _SANITIZER or None


def start(payload, method):
    """A started host (HostHandle) for @payload (pydataset.plan_spec's)."""
    if method == "exec":
        from .loader import _HostProcess, host_command
        parent, child = socket.socketpair()
        try:
            argv, cwd, env = host_command()
            proc = _HostProcess(argv, stdin=child.fileno(), start_new_session=True, cwd=cwd,
                                env=env)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        h = HostHandle(parent, proc)
        try:
            _pyhost.chan_send(parent, payload, pickled=True)
        except OSError:
            pass  # it exited already: learn() and failure() say so
        return h
    parent, child = socket.socketpair()
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():
        # Python 3.12 warns of a fork with threads running (libloader's are):
        # the host never touches what they hold (module doc)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        def middle():
            parent.close()
            _leave_trainer(child.fileno())
            os.setsid()
            return _pyhost.serve(child, payload) if os.fork() == 0 else 0
        _pyhost.child_exit(middle)
    child.close()
    try:
        os.waitpid(pid, 0)  # the middle process exits at once
    except ChildProcessError:
        pass  # someone else's SIGCHLD handler reaped it
    return HostHandle(parent)


def _leave_trainer(keep):
    """In the forked host: what of the trainer it must not hold (module
    doc); @keep is its channel's fd."""
    _pyhost.reset_signals()
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, 0)
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd < 3 or fd in (keep, null):
                continue
            try:
                st = os.fstat(fd)
                gpu = stat.S_ISCHR(st.st_mode) and \
                    os.readlink(f"/proc/self/fd/{fd}").startswith(_GPU_FILES)
            except OSError:
                continue  # the listing's own fd, closed by now
            if stat.S_ISSOCK(st.st_mode) or stat.S_ISFIFO(st.st_mode) or gpu:
                os.dup2(null, fd)
    finally:
        os.close(null)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    with open("/proc/self/maps") as f:
        maps = [line.split() for line in f if _SLAB_MAPS in line]
    for m in maps:
        lo, hi = (int(x, 16) for x in m[0].split("-"))
        libc.munmap(lo, hi - lo)


class HostHandle:
    """The trainer's end of a started host: its channel (and, exec'd, its
    Popen). pid, learn(), go(), failure(), wait(), close()."""

    def __init__(self, chan, proc=None):
        self.chan = chan
        self.proc = proc
        self._pid = proc.pid if proc is not None else None
        self.result = None       # {"learnt": ...} or {"error": ...}
        self.ready = False       # its workers are being forked
        self.error = None        # {"kind": "host", "text"} of a host that could not start
        self.exit_code = None
        self.eof = False

    def pump(self, timeout):
        """Read the host's next message, waiting up to @timeout seconds
        (None: forever): False when none came."""
        if self.eof:
            return False
        r, _, _ = select.select([self.chan], [], [], timeout)
        if not r:
            return False
        try:
            msg = _pyhost.chan_recv(self.chan)
        except (OSError, ValueError) as e:  # ProtocolError, JSON: a host gone wrong
            msg = None
            self.error = self.error or {"kind": "host", "text": f"its channel failed: {e}"}
        if msg is None:
            self.eof = True
        elif "pid" in msg:
            self._pid = msg["pid"]
        elif "ready" in msg:
            self.ready = True
        elif "exit" in msg:
            self.exit_code = msg["exit"]
        elif "learnt" in msg or ("error" in msg and msg["error"].get("kind") != "host"):
            self.result = msg    # worker 0's answer
        elif "error" in msg:
            self.error = msg["error"]  # the host could not start serving
        return True

    @property
    def pid(self):
        deadline = time.monotonic() + 60
        while self._pid is None and not self.eof and time.monotonic() < deadline:
            self.pump(0.2)
        return self._pid

    def learn(self, timeout=None):
        """What worker 0 learnt (pydataset.finish_spec's @learnt), or its
        error raised here: the Dataset's own exception type (errors.
        dataset_error), SampleError, WorkerDied, Timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.result is None and not self.eof:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise from_code(-errno.ETIMEDOUT, f"DataLoader timed out after {timeout} seconds: "
                                "dataset[0] did not return in worker 0 (loaderd learns the "
                                "pipeline's fields from it)", "")
            self.pump(0.2 if left is None else min(0.2, left))
        res = self.result
        if res is None:
            raise Error(-errno.ECHILD, "the Python workers' host exited before it learnt the "
                        "fields of dataset[0] (its messages are on this process's stderr)", "")
        if "learnt" in res:
            return res["learnt"]
        raise _learn_error(res["error"])

    def go(self, payload, socket_path, daemon_uid):
        """Have the host serve the pipeline of @payload (finished:
        pydataset.finish_spec), created by this trainer."""
        go = {k: payload[k] for k in ("pipeline", "fields", "structure", "learnt")}
        go.update(socket=socket_path, daemon_uid=daemon_uid)
        _pyhost.chan_send(self.chan, {"go": go})

    def failure(self):
        """None while the host is starting or serves; else why it does not
        (it exited, or could not connect) before its workers started."""
        while self.pump(0):
            pass
        if self.ready:
            return None
        if self.error is not None:
            return self.error.get("text") or "could not start"
        if self.eof:
            return "exited (its messages are on this process's stderr)"
        if self.proc is not None and self.proc.poll() is not None:
            return (f"exited with status {self.proc.returncode} (its messages are on this "
                    "process's stderr)")
        return None

    def wait(self, timeout=None):
        """The host's exit status once it ends (None: it ended without
        saying, or @timeout passed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.exit_code is None and not self.eof:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self.pump(left)
        if self.proc is not None:
            self.proc.wait(timeout)
        return self.exit_code

    def close(self):
        """Stop listening: before "go", the host then exits."""
        try:
            self.chan.close()
        except OSError:
            pass


def _learn_error(err):
    kind, text = err.get("kind"), err.get("text") or ""
    if kind == "raised":
        return dataset_error(DatasetError(-errno.EINVAL, text, ""))
    if kind == "sample":
        return SampleError(text)
    if kind == "empty":
        return ValueError(text)
    if kind == "died":
        pid, status = err.get("pid"), int(err.get("status") or 0)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            what = f"is killed by signal: {signal.strsignal(sig) or sig}"
        else:
            what = f"exited unexpectedly with exit code {os.waitstatus_to_exitcode(status)}"
        return WorkerDied(-errno.ECHILD, f"DataLoader worker (pid {pid}) {what}. loaderd's worker "
                          "0 died computing dataset[0] (to learn the pipeline's fields): a crash "
                          "in the Dataset or in an extension it calls; this process is unharmed, "
                          "and no pipeline was created", "")
    if kind == "start":
        return DatasetError(-errno.EINVAL, text, "")
    return Error(-errno.ECHILD, f"the Python workers' host: {text}", "")
