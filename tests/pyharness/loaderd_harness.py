# SPDX-License-Identifier: MIT
"""The one pytest harness of loaderd: the real daemon on a private socket.

Both pytest suites use it, tests/integration (the daemon and loaderctl) and
tests/python (the loaderd package); their conftest.py put this folder on
sys.path and take their fixtures and helpers from here.

Binaries and libloader come from $LOADERD_BUILD (default <repo>/build):
daemon/loaderd, client/loaderctl, client/libloader.so. Every test gets a
private directory /tmp/ldr-XXXX (short, so that unix socket paths fit in
sun_path) and starts its daemon(s) there, through the `daemon` factory, the
`ld` fixture or `Daemon(workdir)`. A daemon stopped by the harness gets
SIGTERM and must exit 0 within 10 s, remove its socket and have printed no
sanitizer report; loaderctl, consumers and Python children must print none
either.

Sanitizer pass: the ASan-built libloader.so loaded into a Python process needs
the runtime preloaded, so tests/python runs with LD_PRELOAD=libasan:libubsan
and ASAN_OPTIONS with detect_leaks=0 for the interpreter (tests/python/
meson.build, docs/python.md). The daemon and loaderctl started from here get
child_env(): no LD_PRELOAD (they are linked with the runtime themselves) and
$LOADERD_CHILD_ASAN_OPTIONS, when set, as their ASAN_OPTIONS.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HARNESS_DIR))
BUILD_DIR = os.environ.get("LOADERD_BUILD") or os.path.join(REPO_ROOT, "build")
LOADERD = os.path.join(BUILD_DIR, "daemon", "loaderd")
LOADERCTL = os.path.join(BUILD_DIR, "client", "loaderctl")
LIBLOADER = os.path.join(BUILD_DIR, "client", "libloader.so")
PYDIR = os.path.join(REPO_ROOT, "client", "python")
EXAMPLES = os.path.join(REPO_ROOT, "examples")

READY_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0

SANITIZER_MARKERS = ("AddressSanitizer", "LeakSanitizer", "runtime error:",
                     "ThreadSanitizer", "UndefinedBehaviorSanitizer")


def sanitizer_report(text):
    """The first sanitizer marker found in @text, or None."""
    for marker in SANITIZER_MARKERS:
        if marker in text:
            return marker
    return None


def child_env(extra=None):
    """Environment of the daemon and loaderctl: no LD_PRELOAD, their own ASAN_OPTIONS."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if "LOADERD_CHILD_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["LOADERD_CHILD_ASAN_OPTIONS"]
    if extra:
        env.update(extra)
    return env


def require_built():
    """Fail the test (not error) when the build under test lacks a binary."""
    missing = [p for p in (LOADERD, LOADERCTL) if not os.access(p, os.X_OK)]
    missing += [p for p in (LIBLOADER,) if not os.path.exists(p)]
    if missing:
        pytest.fail("not built: " + ", ".join(missing) +
                    " (run scripts/build, or set LOADERD_BUILD)", pytrace=False)


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="ldr-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _ghost(c):
    """An earlier status poll, already exited, that the daemon still lists:
    once nng 1.5.2 has wedged its reaper (docs/protocol.md, "Robustness
    notes") it reports no closed connection, and the daemon's dead-pid sweep
    releases such clients a second or two later. Polling every 50 ms would
    otherwise never see an empty list. A ghost with attachments is not
    skipped: releasing those is what the tests check."""
    if c.get("attachments"):
        return False
    try:
        os.kill(c["pid"], 0)
        return False
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, TypeError):
        return False


class ConsumeResult:
    def __init__(self, cmd, rc, stdout, stderr, dump_path):
        self.cmd = cmd
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.dump_path = dump_path
        self._dump = None
        self.json = None
        if rc == 0:
            try:
                self.json = json.loads(stdout)
            except ValueError as e:
                raise AssertionError(f"consume --json printed no JSON object ({e}): {stdout!r}")

    @property
    def dump(self):
        if self._dump is None and self.dump_path:
            try:
                with open(self.dump_path, "rb") as f:
                    self._dump = f.read()
            except FileNotFoundError:
                if self.rc == 0:
                    raise AssertionError(f"consume exited 0 but wrote no dump {self.dump_path}")
                self._dump = b""
        return self._dump

    def describe(self):
        return (f"$ {' '.join(self.cmd)}\nexit {self.rc}\nstdout: {self.stdout[-2000:]}\n"
                f"stderr: {self.stderr[-2000:]}")

    def check(self):
        assert self.rc == 0, "consume failed:\n" + self.describe()
        return self


class Consumer:
    """A `loaderctl consume` running in the background."""

    def __init__(self, daemon, cmd, dump_path, stdout=subprocess.PIPE):
        self.cmd = cmd
        self.dump_path = dump_path
        self.proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True,
                                     env=child_env())
        self.pid = self.proc.pid
        daemon._children.append(self.proc)

    def signal(self, sig):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout=120, check=False):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"consumer did not finish within {timeout} s: {' '.join(self.cmd)}\n"
                                 f"stdout: {out[-2000:] if out else ''}\nstderr: {err[-2000:]}")
        marker = sanitizer_report(err or "")
        assert marker is None, f"loaderctl printed a {marker} report:\n{err}"
        res = ConsumeResult(self.cmd, self.proc.returncode, out or "", err or "", self.dump_path)
        if check:
            res.check()
        return res


class Daemon:
    """One loaderd on a private socket, started at construction.

    Daemon(workdir) starts `loaderd --socket <workdir>/ld.sock --workers 2`,
    logging to <workdir>/loaderd.log, and waits until `loaderctl status`
    answers (wait=False: the caller calls wait_ready()). workers=None adds no
    --workers; env=None runs it in child_env(); wrap, a command that execs
    its arguments (`nsenter --net=...`), runs it through that."""

    def __init__(self, workdir, workers=2, args=(), *, socket=None, env=None, log_path=None,
                 wait=True, factory=None, wrap=()):
        require_built()
        self.factory = factory
        self.dir = workdir
        self.socket = socket or os.path.join(workdir, "ld.sock")
        self.fds_socket = self.socket + ".fds"
        self.args = list(args)
        if workers is not None and "--workers" not in self.args:
            self.args += ["--workers", str(workers)]
        self.env = env
        self.log_path = log_path or os.path.join(workdir, "loaderd.log")
        self._children = []
        self._spec_no = 0
        self._dump_no = 0
        self.stopped = False
        self.expect_dead = False
        self.cmd = list(wrap) + [LOADERD, "--socket", self.socket] + self.args
        self._log = open(self.log_path, "w")
        if env is None:
            # the daemon's cache_dir (megatron indexes) inside the test's
            # directory, never the machine's /var/cache/loaderd or ~/.cache
            env = child_env({"CACHE_DIRECTORY": os.path.join(workdir, "cache")})
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env)
        self.pid = self.proc.pid
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                if self.proc.poll() is None:
                    self.kill9()
                else:
                    self.stopped = True
                    self._log.close()
                raise

    # ------------------------------------------------------------ lifecycle

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def wait_ready(self, timeout=READY_TIMEOUT):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"loaderd exited with {self.proc.returncode} while starting:\n"
                                     f"$ {' '.join(self.cmd)}\n{self.log()}")
            r = subprocess.run([LOADERCTL, "--socket", self.socket, "status"],
                               capture_output=True, text=True, timeout=30, env=child_env())
            if r.returncode == 0:
                return self
            last = r
            time.sleep(0.05)
        raise AssertionError(f"loaderd not ready within {timeout} s; last loaderctl status: "
                             f"exit {last.returncode if last else '?'}: "
                             f"{last.stderr if last else ''}\nlog:\n{self.log()}")

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT, reap_first=True):
        """Stop the daemon the documented way and check it exits 0, removes
        its socket and printed no sanitizer report. Returns the log.
        Consumers still running are killed first unless reap_first is False."""
        if reap_first:
            self._reap_children()
        if self.stopped:
            return self.log()
        self.stopped = True
        if self.proc.poll() is not None:
            rc = self.proc.returncode
            self._log.close()
            raise AssertionError(f"loaderd died during the test (exit {rc}):\n{self.log()}")
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self._log.close()
            raise AssertionError(f"loaderd did not exit within {timeout} s of {sig.name}:\n{self.log()}")
        self._log.close()
        log = self.log()
        assert rc == 0, f"loaderd exited {rc} on {sig.name}, expected 0:\n{log}"
        assert not os.path.exists(self.socket), f"loaderd left its socket {self.socket} behind"
        marker = sanitizer_report(log)
        assert marker is None, f"loaderd printed a {marker} report:\n{log}"
        return log

    def kill9(self):
        """SIGKILL the daemon (its socket stays behind, stale)."""
        self.stopped = True
        self.expect_dead = True
        self.proc.kill()
        self.proc.wait()
        self._log.close()

    def _reap_children(self):
        for p in self._children:
            if p.poll() is None:
                try:
                    p.kill()
                except OSError:
                    pass
            try:
                p.communicate(timeout=10)
            except Exception:
                pass
        self._children = []

    # -------------------------------------------------------------- loaderctl

    def ctl_cmd(self, *args, json_out=False):
        cmd = [LOADERCTL, "--socket", self.socket]
        if json_out:
            cmd.append("--json")
        return cmd + [str(a) for a in args]

    def ctl(self, *args, check=True, json_out=False, timeout=120, env=None):
        """Run loaderctl (in child_env() unless env is given); the
        CompletedProcess also carries its .pid."""
        cmd = self.ctl_cmd(*args, json_out=json_out)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env if env is not None else child_env())
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise AssertionError(f"$ {' '.join(cmd)}\ndid not finish within {timeout} s\n"
                                 f"stderr: {err}\ndaemon log:\n{self.log()[-3000:]}")
        r = subprocess.CompletedProcess(cmd, p.returncode, out, err)
        r.pid = p.pid
        marker = sanitizer_report(r.stderr)
        assert marker is None, f"loaderctl printed a {marker} report:\n$ {' '.join(cmd)}\n{r.stderr}"
        if check and r.returncode != 0:
            raise AssertionError(f"$ {' '.join(cmd)}\nexit {r.returncode}\nstdout: {r.stdout}\n"
                                 f"stderr: {r.stderr}\ndaemon log:\n{self.log()[-3000:]}")
        return r

    def ctl_json(self, *args, check=True, timeout=120):
        r = self.ctl(*args, check=check, json_out=True, timeout=timeout)
        if not check and r.returncode != 0:
            return None
        try:
            obj = json.loads(r.stdout)
        except ValueError as e:
            raise AssertionError(f"loaderctl --json {' '.join(map(str, args))} printed no JSON ({e}): "
                                 f"{r.stdout!r}")
        if isinstance(obj, dict):
            obj["_ctl_pid"] = r.pid
        return obj

    def status(self):
        """`status --json`, without the entry of the loaderctl that asked nor
        exited status-poller ghosts (_ghost)."""
        st = self.ctl_json("status")
        me = st.pop("_ctl_pid")
        st["clients"] = [c for c in st["clients"] if c.get("pid") != me and not _ghost(c)]
        return st

    def pipeline(self, name):
        for p in self.status()["pipelines"]:
            if p["name"] == name:
                return p
        raise AssertionError(f"pipeline {name!r} not in status")

    def leases(self):
        """Leases held by clients of this (test) process."""
        return sum(c["leases"] for c in self.status()["clients"] if c["pid"] == os.getpid())

    def spec_file(self, spec):
        self._spec_no += 1
        path = os.path.join(self.dir, f"spec{self._spec_no}.json")
        with open(path, "w") as f:
            if isinstance(spec, (dict, list)):
                json.dump(spec, f)
            else:
                f.write(spec)
        return path

    def create(self, spec, check=True, exist_ok=False):
        args = ["create", "--spec", self.spec_file(spec)]
        if exist_ok:
            args.append("--exist-ok")
        return self.ctl(*args, check=check)

    def _dump_path(self):
        self._dump_no += 1
        return os.path.join(self.dir, f"dump{self._dump_no}.bin")

    def consume_cmd(self, name, *args, dump=True):
        dump_path = self._dump_path() if dump else None
        extra = [str(a) for a in args]
        if dump_path:
            extra += ["--dump", dump_path]
        return self.ctl_cmd("consume", name, *extra, json_out=True), dump_path

    def consume(self, name, *args, dump=True, check=True, timeout=120):
        c = self.popen_consume(name, *args, dump=dump)
        res = c.wait(timeout=timeout)
        if check and res.rc != 0:
            raise AssertionError("consume failed:\n" + res.describe() +
                                 "\ndaemon log:\n" + self.log()[-3000:])
        return res

    def popen_consume(self, name, *args, dump=True, stdout=subprocess.PIPE):
        cmd, dump_path = self.consume_cmd(name, *args, dump=dump)
        return Consumer(self, cmd, dump_path, stdout=stdout)

    # ---------------------------------------------------------------- polling

    def wait_for(self, predicate, what, timeout=10.0):
        """Poll `status --json` until predicate(status) is true."""
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            st = self.status()
            if predicate(st):
                return st
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; last status:\n{json.dumps(st, indent=1)}")


class DaemonFactory:
    """The `daemon` fixture: daemon(*args, workers=2, memory_limit=None,
    socket=None, wait=True, env=None, wrap=()) starts one more daemon in the
    test's directory (ld.sock, then ld1.sock, ...; logs loaderd0.log, ...)."""

    def __init__(self, d):
        self.dir = d
        self.daemons = []

    def __call__(self, *args, workers=2, memory_limit=None, socket=None, wait=True, env=None,
                 wrap=()):
        n = len(self.daemons)
        sock = socket or os.path.join(self.dir, "ld.sock" if n == 0 else f"ld{n}.sock")
        full = list(args)
        if memory_limit is not None:
            full += ["--memory-limit", str(memory_limit)]
        d = Daemon(self.dir, workers=workers, args=full, socket=sock, env=env,
                   log_path=os.path.join(self.dir, f"loaderd{n}.log"), wait=False, factory=self,
                   wrap=wrap)
        self.daemons.append(d)
        if wait:
            d.wait_ready()
        return d

    def teardown(self):
        errors = []
        for d in self.daemons:
            if d.stopped:
                d._reap_children()
                continue
            try:
                d.stop()
            except AssertionError as e:
                errors.append(str(e))
        if errors:
            pytest.fail("\n\n".join(errors), pytrace=False)


@pytest.fixture
def daemon(workdir):
    require_built()
    f = DaemonFactory(workdir)
    yield f
    f.teardown()


def create_at_once(socket, specs):
    """Create every spec at once, a client and a thread each, released
    together (exist_ok: creates of one name race); the exceptions raised."""
    import threading
    import loaderd
    errors, barrier = [], threading.Barrier(len(specs))

    def create(spec):
        try:
            c = loaderd.Client(socket=socket)
            barrier.wait()
            c.create_pipeline(spec, exist_ok=True)
            c.close()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=create, args=(s,)) for s in specs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


def run_python(code_or_args, env=None, timeout=120, cwd=None):
    """Run this interpreter (code, or a list of arguments) in this process's
    environment plus @env; fails on a sanitizer report in its stderr."""
    args = [sys.executable] + (["-c", code_or_args] if isinstance(code_or_args, str) else
                               list(code_or_args))
    e = dict(os.environ)
    if env:
        e.update(env)
    r = subprocess.run(args, capture_output=True, text=True, env=e, timeout=timeout, cwd=cwd)
    m = sanitizer_report(r.stderr)
    assert m is None, f"python printed a {m} report:\n{r.stderr}"
    return r
