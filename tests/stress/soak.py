#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Chaos soak: one real daemon, many clients doing everything at random.

    tests/stress/soak.py MINUTES [--seed N] [--build DIR] [--check-every S]

(scripts/soak builds and runs it; CI runs 2 minutes of it in scripts/test.)

A daemon on a private socket serves pipelines of every mode from small
datasets it writes to a private directory: tokens and npy sources, broadcast
with "slow_clients" "skip" and "wait" (slow_client_timeout 1 s), partition
(world 2..3, random start epoch and batch), dynamic, one pipeline that mixes
all three, pipelines that clients create themselves (ttl 1 s, 2 epochs, so
they end and linger) and pipelines that a SIGHUP reload adds. Meanwhile, all
drawn from one seeded RNG (printed; --seed replays the same schedule):

- clients (subprocesses of this script, libloader through the loaderd
  package's ctypes bindings) attach, read, hold and re-check batches, sleep
  between batches, detach, or are SIGSTOPped for 0.3..3 s, or SIGKILLed;
- the daemon gets SIGHUP (its drop-in changes linger, sometimes adds a
  pipeline);
- garbage connections: random bytes, bad frames, bare connects to the nng
  socket and to the fd channel <socket>.fds.

Every client checks every batch it receives against the bytes computed here
from the dataset (docs/spec.md, "Order and determinism": order, permutation,
partition share), and the order its mode promises (partition and broadcast
"wait": contiguous; broadcast "skip": increasing, gaps allowed; dynamic: no
batch taken twice across all clients). Every few seconds the driver checks
the invariants, one line each:

- the daemon lives and `loaderctl status` answers;
- no client whose process has been gone for 30 s still has attachments;
- per pipeline: slots_leased <= slots_in_use <= slots_total, no lease
  without an attached client, and (no broadcast attachment) the leases of its
  clients add up to slots_leased exactly;
- the daemon's fds, /proc maps lines and VmRSS stay under a ceiling over
  their value at start (fds +200, plus 2 per client nng never reported closed,
  docs/protocol.md "Robustness notes"; maps +600; RSS +256 MiB, +768 MiB
  under ASan, whose quarantine alone keeps 256 MiB of freed memory).

Every ~3 minutes, and at the end, it quiesces: every client is killed, and
within generous deadlines no client may stay listed, every pipeline has
slots_leased 0, the client-created pipelines are dropped after their ttl and
memory_used equals the slots of the pipelines left. Then the daemon gets
SIGTERM and must exit 0, remove its socket and print no sanitizer report.
Exit status 0 only when nothing was violated. No check depends on timing
except through deadlines far above what a loaded machine needs.
"""

import argparse
import collections
import ctypes
import errno
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYDIR = os.path.join(ROOT, "client", "python")
SANITIZER_MARKERS = ("AddressSanitizer", "LeakSanitizer", "runtime error:",
                     "ThreadSanitizer", "UndefinedBehaviorSanitizer")

EXIT_OK, EXIT_MISMATCH, EXIT_DETACHED, EXIT_REFUSED, EXIT_ERROR = 0, 3, 4, 5, 6
GRACE_S = 30.0          # a dead client's attachments must be gone by then
QUIESCE_S = 60.0        # deadline of every quiesce wait
CHECK_EVERY_S = 5.0
QUIESCE_EVERY_S = 180.0
MAX_CLIENTS = 8

# ------------------------------------------------------------ the contract
# docs/spec.md, "The permutation" (as tests/python/test_epochs.py has it)

M64 = (1 << 64) - 1


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def splitmix64(x):
    return mix64((x + 0x9e3779b97f4a7c15) & M64)


def permute(seed, epoch, n, pos):
    if n == 1:
        return 0
    bits = max(2, (n - 1).bit_length())
    bits += bits & 1
    h = bits // 2
    mask = (1 << h) - 1
    base = splitmix64(splitmix64(seed) ^ epoch)
    keys = [splitmix64((base + k) & M64) for k in range(8)]
    x = pos % n
    while True:
        lo, hi = x >> h, x & mask
        for k in range(8):
            lo, hi = hi, lo ^ (mix64(hi ^ keys[k]) & mask)
        x = (lo << h) | hi
        if x < n:
            return x


def share_len(p, mode, world):
    n = p["n"]
    if mode != "partition":
        return n
    return n // world if p["drop_last"] else -(-n // world)


def batches_per_epoch(p, mode, world):
    s, bs = share_len(p, mode, world), p["batch_size"]
    return s // bs if p["drop_last"] else -(-s // bs)


def batch_samples(p, mode, rank, world, epoch, index):
    """Sample ids of batch @index of @epoch (docs/spec.md, Order, Partition)."""
    n, bs = p["n"], p["batch_size"]
    s = share_len(p, mode, world)
    if mode != "partition":
        rank, world = 0, 1
    rows = range(index * bs, min((index + 1) * bs, s))
    pos = [(rank + world * j) % n for j in rows]
    if p["shuffle"]:
        return [permute(p["seed"], epoch, n, q) for q in pos]
    return pos


class Data:
    """A pipeline's dataset, loaded from the files the driver wrote."""

    def __init__(self, p):
        self.p = p
        if p["kind"] == "tokens":
            self.tok = np.fromfile(p["path"], dtype=p["dtype"])
        else:
            self.arrays = [np.load(path) for path in p["paths"]]

    def fields(self, samples):
        """The expected bytes of each field of a batch of @samples."""
        p = self.p
        if p["kind"] == "tokens":
            L = p["seq_len"]
            inp = np.stack([self.tok[i * L:i * L + L] for i in samples]).astype(np.int64)
            tgt = np.stack([self.tok[i * L + 1:i * L + L + 1] for i in samples]).astype(np.int64)
            return [inp.tobytes(), tgt.tobytes()]
        idx = np.asarray(samples, dtype=np.int64)
        return [np.ascontiguousarray(a[idx]).tobytes() for a in self.arrays]


# ------------------------------------------------------------------ client

class Suspect(Exception):
    pass


def client_main(cfg):
    """One client process: attach, read, verify, hold, release; a line per
    batch in the record file (so a SIGKILLed client's batches count too)."""
    sys.path.insert(0, PYDIR)
    from loaderd import _lib  # noqa: E402  (LOADERD_LIBRARY names this build's)
    L = _lib.lib()
    p, mode, rank, world = cfg["pipeline"], cfg["mode"], cfg["rank"], cfg["world"]
    rec = open(cfg["record"], "w", buffering=1)

    suspect = []

    def out(code, line):
        # a broadcast client detached for being stopped reads what it was
        # given before whole (docs/spec.md, "Slow broadcast clients"): a
        # mismatch is one, detach or not
        if suspect:
            line = ("DETACHED-AFTER " if code == EXIT_DETACHED else "") + suspect[0] + " | then: " + line
            if code not in (EXIT_DETACHED, EXIT_MISMATCH):
                code = EXIT_MISMATCH
        rec.write(line + "\n")
        rec.close()
        os._exit(code)

    data = Data(p)
    cl = ctypes.c_void_p()
    r = L.ldr_connect(ctypes.byref(cl), cfg["socket"].encode(), f"soak-{cfg['id']}".encode())
    if r < 0:
        out(EXIT_ERROR, f"ERR connect {r} {L.ldr_client_error(None)!r}")

    def msg():
        m = L.ldr_client_error(cl)
        return m.decode(errors="replace") if m else ""

    if cfg.get("create"):
        r = L.ldr_create_pipeline(cl, json.dumps(cfg["create"]).encode(), 1, None, 0)
        if r < 0:
            out(EXIT_ERROR, f"ERR create {r} {msg()}")
    opts = _lib.ldr_attach_opts()
    opts.mode = _lib.MODES[mode]
    opts.rank, opts.world_size = rank, world
    if cfg["start"] is not None:
        opts.has_start = 1
        opts.start_epoch, opts.start_batch = cfg["start"]
    opts.inflight = cfg["inflight"]
    # every soak client is of one job (docs/spec.md, "Jobs"): a client-created
    # pipeline's shared stream goes on where it stands for the next client,
    # so "each dynamic batch once" holds across clients that come and go
    opts.job = b"soak"
    att = ctypes.c_void_p()
    r = L.ldr_attach(cl, p["name"].encode(), ctypes.byref(opts), ctypes.byref(att))
    if r == -errno.ENOSPC:
        out(EXIT_REFUSED, f"REFUSED {msg()}")
    if r < 0:
        out(EXIT_ERROR, f"ERR attach {r} {msg()}")
    # which incarnation of the pipeline (a client's is dropped once unused
    # and created afresh): its creator's client id
    js = ctypes.c_void_p()
    if L.ldr_pipelines_json(cl, ctypes.byref(js)) == 0:
        pls = json.loads(ctypes.string_at(js.value).decode())["pipelines"]
        L.ldr_free(js)
        rec.write(f"P {[x.get('created_by') for x in pls if x['name'] == p['name']]}\n")
    bpe = batches_per_epoch(p, mode, world)
    got_bpe = L.ldr_attachment_batches_per_epoch(att)
    if got_bpe != bpe:
        out(EXIT_MISMATCH, f"MISMATCH batches_per_epoch {got_bpe}, expected {bpe}")
    nf = L.ldr_attachment_nfields(att)
    f = _lib.ldr_field()
    held = collections.deque()
    bp = ctypes.c_void_p()

    def read(b):
        return [ctypes.string_at(f.data, f.nbytes) if L.ldr_batch_field(b, i, ctypes.byref(f)) == 0
                and f.nbytes else b"" for i in range(nf)]

    def release_one():
        b, e, i, want = held.popleft()
        if read(b) != want:
            out(EXIT_MISMATCH, f"MISMATCH epoch {e} batch {i} changed while held")
        L.ldr_release(b)

    try:
        n = read_loop(L, _lib, cfg, att, bp, held, data, out, release_one, bpe, msg, rec, read)
        while held:
            release_one()
    except Suspect:
        for b, e, i, want in held:
            L.ldr_release(b)
        held.clear()
        for _ in range(200):
            r = L.ldr_next(att, -1, ctypes.byref(bp))
            if r == -errno.ETIMEDOUT:
                out(EXIT_DETACHED, f"ERR next {r} {msg()}")
            if r < 0:
                out(EXIT_MISMATCH, f"ERR next {r} {msg()}")
            L.ldr_release(bp.value)
        out(EXIT_MISMATCH, "200 batches and no detach")
    L.ldr_detach(att)
    L.ldr_close(cl)
    out(EXIT_OK, f"END {n}")


def read_loop(L, _lib, cfg, att, bp, held, data, out, release_one, bpe, msg, rec, read):
    p, mode, rank, world = cfg["pipeline"], cfg["mode"], cfg["rank"], cfg["world"]
    prev = None
    n = 0

    while cfg["batches"] is None or n < cfg["batches"]:
        r = L.ldr_next(att, -1, ctypes.byref(bp))
        if r == _lib.LDR_EOF:
            last = (p["epochs"] - 1, bpe - 1)
            if p["epochs"] == 0 or (mode != "dynamic" and prev is not None and prev != last):
                out(EXIT_MISMATCH, f"MISMATCH end of stream after {prev}, expected after {last}")
            rec.write("EOF\n")
            break
        if r < 0:
            out(EXIT_DETACHED if r == -errno.ETIMEDOUT else EXIT_ERROR, f"ERR next {r} {msg()}")
        b = bp.value
        e, i, rows = L.ldr_batch_epoch(b), L.ldr_batch_index(b), L.ldr_batch_rows(b)
        if i >= bpe or (p["epochs"] and e >= p["epochs"]):
            out(EXIT_MISMATCH, f"MISMATCH batch ({e}, {i}) out of range ({bpe} a epoch)")
        # the order its mode promises
        if mode == "partition" or (mode == "broadcast" and p["slow"] == "wait"):
            if prev is None:
                if cfg["start"] is not None and (e, i) != tuple(cfg["start"]):
                    out(EXIT_MISMATCH, f"MISMATCH first batch ({e}, {i}), asked for {cfg['start']}")
            else:
                succ = (prev[0], prev[1] + 1) if prev[1] + 1 < bpe else (prev[0] + 1, 0)
                if (e, i) != succ:
                    out(EXIT_MISMATCH, f"MISMATCH batch ({e}, {i}) after {prev}, expected {succ}")
        elif mode == "broadcast" and prev is not None and (e, i) <= prev:
            out(EXIT_MISMATCH, f"MISMATCH batch ({e}, {i}) after {prev}: not increasing")
        samples = batch_samples(p, mode, rank, world, e, i)
        want = data.fields(samples)
        if rows != len(samples):
            out(EXIT_MISMATCH, f"MISMATCH batch ({e}, {i}) has {rows} rows, expected {len(samples)}")
        if read(b) != want:
            out(EXIT_MISMATCH, f"MISMATCH batch ({e}, {i}) contents differ (mode {mode} rank {rank}/{world})")
        rec.write(f"B {e} {i}\n")
        prev = (e, i)
        n += 1
        held.append((b, e, i, want))
        while len(held) > cfg["hold"]:
            release_one()
        if cfg["delay_ms"]:
            time.sleep(cfg["delay_ms"] / 1000)
    return n


# ------------------------------------------------------------------ driver

def is_asan(binary):
    r = subprocess.run(["ldd", binary], capture_output=True, text=True)
    return "libasan" in r.stdout


def sanitizer_report(text):
    for m in SANITIZER_MARKERS:
        if m in text:
            return m
    return None


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.build = os.path.abspath(args.build)
        self.loaderd = os.path.join(self.build, "daemon", "loaderd")
        self.loaderctl = os.path.join(self.build, "client", "loaderctl")
        self.dir = tempfile.mkdtemp(prefix="ldr-soak-", dir="/tmp")
        self.sock = os.path.join(self.dir, "ld.sock")
        self.violations = []
        self.clients = {}          # pid -> client record
        self.dead = {}             # pid -> time it was reaped
        self.next_id = 0
        self.stats = collections.Counter()
        self.verified = collections.Counter()   # mode -> batches verified
        self.dyn_taken = collections.defaultdict(dict)  # pipeline -> {(e, b): client id}
        self.maxes = collections.Counter()
        self.t0 = time.monotonic()
        self.asan = is_asan(self.loaderd)
        # ASan keeps up to 256 MiB of freed memory in quarantine (its
        # quarantine_size_mb), and shadow memory beside what is used
        self.rss_allow = (256 << 20) + ((512 << 20) if self.asan else 0)
        self.daemon_env = dict(os.environ)
        self.daemon_env.pop("LD_PRELOAD", None)
        self.client_env = dict(self.daemon_env, LOADERD_LIBRARY=os.path.join(self.build, "client", "libloader.so"),
                               PYTHONPATH=PYDIR)
        for k in ("RANK", "WORLD_SIZE", "LOADERD_SOCKET"):
            self.client_env.pop(k, None)
        if self.asan:
            self.daemon_env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
            self.daemon_env.setdefault("LSAN_OPTIONS", f"suppressions={ROOT}/tests/lsan.supp:print_suppressions=0")
            pre = []
            for rt in ("libasan.so", "libubsan.so"):
                path = subprocess.run(["gcc", f"-print-file-name={rt}"], capture_output=True,
                                      text=True).stdout.strip()
                if path.startswith("/"):
                    pre.append(path)
            self.client_env["LD_PRELOAD"] = ":".join(pre)
            self.client_env["ASAN_OPTIONS"] = "detect_leaks=0"

    # -------------------------------------------------------------- output

    def t(self):
        return time.monotonic() - self.t0

    def say(self, line):
        print(f"[{self.t():7.1f}s] {line}", flush=True)

    def violate(self, what):
        self.violations.append(f"{self.t():.1f}s: {what}")
        self.say("VIOLATION: " + what)

    # ------------------------------------------------------------ datasets

    def make_data(self):
        g = np.random.default_rng(self.args.seed & 0xFFFFFFFF)
        d = self.dir
        t16 = os.path.join(d, "t16.bin")
        g.integers(0, 65535, size=203 * 8 + 1, endpoint=True).astype(np.uint16).tofile(t16)
        t32 = os.path.join(d, "t32.bin")
        g.integers(-2**31, 2**31 - 1, size=131 * 12 + 1, endpoint=True).astype(np.int32).tofile(t32)
        npy = []
        for name, arr in (("x", g.standard_normal((157, 3)).astype(np.float32)),
                          ("y", g.integers(0, 1000, size=157).astype(np.int64)),
                          ("m", g.integers(0, 255, size=(157, 2, 2)).astype(np.uint8))):
            path = os.path.join(d, name + ".npy")
            np.save(path, arr)
            npy.append(path)
        tok16 = dict(kind="tokens", path=t16, dtype="uint16", seq_len=8, n=203)
        tok32 = dict(kind="tokens", path=t32, dtype="int32", seq_len=12, n=131)
        npys = dict(kind="npy", paths=npy[:2], n=157)
        npy3 = dict(kind="npy", paths=npy, n=157)
        P = []

        def add(name, src, modes, bs, prefetch, shuffle=True, seed=0, drop_last=False, epochs=0,
                slow=None, worlds=(2, 3), origin="config", weight=1.0):
            p = dict(src, name=name, modes=list(modes), batch_size=bs, prefetch=prefetch,
                     shuffle=shuffle, seed=seed, drop_last=drop_last, epochs=epochs, slow=slow,
                     worlds=list(worlds), origin=origin, weight=weight)
            P.append(p)
            return p

        add("bc-skip", tok16, ["broadcast"], 4, 6, seed=11, slow="skip", weight=1.5)
        add("bc-wait", npys, ["broadcast"], 5, 6, seed=12, slow="wait", weight=1.5)
        add("part-tok", tok32, ["partition"], 3, 10, seed=13)
        add("part-npy", npy3, ["partition"], 4, 8, shuffle=False, drop_last=True)
        add("dyn", tok16, ["dynamic"], 6, 8, seed=14)
        add("mix", npys, ["broadcast", "partition", "dynamic"], 7, 12, seed=15, slow="skip",
            worlds=(2,), weight=1.5)
        for k in range(2):
            add(f"job-{k}", tok16, ["broadcast", "dynamic", "partition"], 5, 6, seed=20 + k,
                epochs=2, worlds=(1, 2), origin="client", slow="wait", weight=0.7)
        self.hup_defs = [dict(tok32 if k % 2 else npys, name=f"hup-{k}", modes=["dynamic", "partition"],
                              batch_size=3 + k, prefetch=6, shuffle=True, seed=30 + k, drop_last=False,
                              epochs=0, slow=None, worlds=[2, 3], origin="hup", weight=0.7)
                         for k in range(3)]
        self.pipelines = P

    @staticmethod
    def spec_of(p):
        if p["kind"] == "tokens":
            src = {"kind": "tokens", "path": p["path"], "dtype": p["dtype"], "seq_len": p["seq_len"]}
        else:
            src = {"kind": "npy", "paths": p["paths"]}
        s = {"name": p["name"], "source": src, "batch_size": p["batch_size"], "prefetch": p["prefetch"],
             "shuffle": p["shuffle"], "seed": p["seed"], "drop_last": p["drop_last"], "epochs": p["epochs"]}
        if p["slow"]:
            s["slow_clients"] = p["slow"]
            s["slow_client_timeout"] = 1.0
        if p["origin"] == "client":
            s["ttl"] = 1
        return s

    def write_config(self):
        self.cfg = os.path.join(self.dir, "loaderd.json")
        with open(self.cfg, "w") as fh:
            json.dump({"linger": 2, "slow_client_timeout": 5,
                       "pipelines": [self.spec_of(p) for p in self.pipelines if p["origin"] == "config"]},
                      fh, indent=1)
        os.mkdir(os.path.join(self.dir, "conf.d"))

    # -------------------------------------------------------------- daemon

    def start_daemon(self):
        self.log_path = os.path.join(self.dir, "loaderd.log")
        self.log = open(self.log_path, "w")
        self._log_off = self._wedges = 0
        self.daemon = subprocess.Popen([self.loaderd, "--socket", self.sock, "--workers", "2",
                                        "--config", self.cfg, "--memory-limit", "1G"],
                                       stdout=self.log, stderr=subprocess.STDOUT, env=self.daemon_env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.daemon.poll() is not None:
                raise SystemExit(f"soak: loaderd exited {self.daemon.returncode} at start:\n{self.read_log()}")
            if self.status(quiet=True) is not None:
                return
            time.sleep(0.1)
        raise SystemExit("soak: loaderd not ready within 60 s:\n" + self.read_log())

    def wedges(self):
        """Listener replacements the log has told of so far (daemon/server/nngfix.c:
        nng 1.5.2 stops accepting after a peer hangs up in the handshake,
        which the garbage connections do)."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_off)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1
        self._wedges += chunk[:end].count(b"stopped accepting")
        self._log_off += end
        return self._wedges

    def read_log(self):
        with open(self.log_path, errors="replace") as fh:
            return fh.read()

    def status(self, quiet=False):
        """`loaderctl --json status` without its own entry, or None."""
        proc = subprocess.Popen([self.loaderctl, "--socket", self.sock, "--json", "status"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.daemon_env)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            if not quiet:
                self.violate("loaderctl status did not answer within 60 s")
            return None
        r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if r.returncode != 0:
            if not quiet:
                self.violate(f"loaderctl status failed (exit {r.returncode}): {r.stderr.strip()}")
            return None
        m = sanitizer_report(r.stderr)
        if m:
            self.violate(f"loaderctl printed a {m} report: {r.stderr[-2000:]}")
        st = json.loads(r.stdout)
        # its own connection, and earlier pollers already gone (ghosts, see
        # tests/pyharness/loaderd_harness.py _ghost): no attachments, no pid
        st["clients"] = [c for c in st["clients"]
                         if c.get("pid") != proc.pid and (c.get("attachments") or self.pid_alive(c.get("pid")))]
        return st

    @staticmethod
    def pid_alive(pid):
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except (PermissionError, TypeError):
            return True

    def proc_figures(self):
        pid = self.daemon.pid
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/maps") as fh:
            maps = sum(1 for _ in fh)
        rss = 0
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
        return fds, maps, rss

    # ------------------------------------------------------------- clients

    def live_pipelines(self):
        return [p for p in self.pipelines if p.get("ready", p["origin"] != "hup")]

    def spawn(self):
        cands = self.live_pipelines()
        p = self.rng.choices(cands, weights=[c["weight"] for c in cands])[0]
        mode = self.rng.choice(p["modes"])
        rank, world, start = 0, 1, None
        if mode == "partition":
            world = self.rng.choice(p["worlds"])
            rank = self.rng.randrange(world)
            if self.rng.random() < 0.4:
                epochs = p["epochs"] or 4
                start = [self.rng.randrange(epochs), self.rng.randrange(batches_per_epoch(p, mode, world))]
            # at most prefetch - 3 partition streams: an attach over the slots is refused (ENOSPC)
            busy = sum(1 for c in self.clients.values() if c["p"] is p and c["mode"] == "partition")
            if busy >= p["prefetch"] - 3:
                return
        self.next_id += 1
        cid = self.next_id
        r = self.rng.random()
        batches = None if (p["epochs"] and r < 0.5) else self.rng.choice([5, 20, 60, 150, 400, 1500])
        cfg = dict(id=cid, socket=self.sock, pipeline={k: v for k, v in p.items() if k != "ready"},
                   mode=mode, rank=rank, world=world, start=start, batches=batches,
                   delay_ms=self.rng.choice([0, 0, 2, 10, 30]), hold=self.rng.choice([0, 1, 1, 2, 4]),
                   inflight=self.rng.choice([0, 0, 1, 2, 8]),
                   record=os.path.join(self.dir, f"c{cid}.rec"),
                   create=self.spec_of(p) if p["origin"] == "client" else None)
        errpath = os.path.join(self.dir, f"c{cid}.err")
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--client", json.dumps(cfg)],
                                stdout=subprocess.DEVNULL, stderr=open(errpath, "w"), env=self.client_env)
        self.dead.pop(proc.pid, None)      # a pid used again
        self.clients[proc.pid] = dict(id=cid, proc=proc, p=p, mode=mode, cfg=cfg, err=errpath,
                                      killed=False, stopped_until=None, was_stopped=False,
                                      wedges=self.wedges())
        self.stats["clients started"] += 1
        self.stats[f"started {mode}"] += 1

    def reap(self):
        for pid, c in list(self.clients.items()):
            rc = c["proc"].poll()
            if rc is None:
                continue
            del self.clients[pid]
            self.dead[pid] = time.monotonic()
            self.account(c, rc)

    def account(self, c, rc):
        cid, mode, p = c["id"], c["mode"], c["p"]
        lines = []
        try:
            with open(c["cfg"]["record"]) as fh:
                lines = fh.read().splitlines()
        except FileNotFoundError:
            pass
        nb = 0
        inc = p["name"]
        for ln in lines:
            if ln.startswith("P "):
                inc = p["name"] + " " + ln[2:]
            if ln.startswith("B "):
                nb += 1
                if mode == "dynamic":
                    key = tuple(int(x) for x in ln.split()[1:3])
                    other = self.dyn_taken[inc].get(key)
                    if other is not None and other != cid:
                        self.violate(f"dynamic {inc}: batch {key} taken by clients {other} and {cid}")
                    self.dyn_taken[inc][key] = cid
        self.verified[mode] += nb
        self.verified["all"] += nb
        tail = lines[-1] if lines else "(no record)"
        with open(c["err"], errors="replace") as fh:
            err = fh.read()
        if not c["killed"]:
            m = sanitizer_report(err)
            if m:
                self.violate(f"client {cid} printed a {m} report: {err[-3000:]}")
        if c["killed"] and rc == -signal.SIGKILL:
            self.stats["clients SIGKILLed"] += 1
            return
        if rc == EXIT_OK:
            self.stats["clients done"] += 1
        elif (rc == EXIT_ERROR and tail.split()[:3] in (["ERR", "connect", str(e)] for e in
                                                         (-4093, -errno.ECONNREFUSED, -errno.ETIMEDOUT))
              and self.wedges() > c["wedges"]):
            # every attempt of ldr_connect() (4) cut by a listener
            # replacement: possible only while garbage wedges nng again and
            # again; counted, and a violation without a replacement
            self.stats["connects lost to listener replacements"] += 1
            self.say(f"client {cid}: {tail} (listener replaced {self.wedges() - c['wedges']} "
                     f"times meanwhile)")
        elif rc == EXIT_REFUSED:
            self.stats["attaches refused (ENOSPC)"] += 1
        elif rc == EXIT_DETACHED and mode == "broadcast" and p["slow"]:
            self.stats["clients detached (slow)"] += 1
            if "DETACHED-AFTER" in tail:
                self.stats["detached clients that read a rebuilt slot first"] += 1
                self.say(f"client {cid} ({p['name']}): {tail}")
        else:
            self.violate(f"client {cid} ({p['name']} {mode} rank {c['cfg']['rank']}/{c['cfg']['world']} "
                         f"start {c['cfg']['start']}, stopped {c['was_stopped']}) exit {rc}: {tail} "
                         f"{err.strip()[-1500:]}")

    def kill(self, c):
        if c["proc"].poll() is None:
            c["killed"] = True
            os.kill(c["proc"].pid, signal.SIGKILL)

    def chaos_step(self):
        now = time.monotonic()
        for c in self.clients.values():
            if c["stopped_until"] is not None and now >= c["stopped_until"]:
                c["stopped_until"] = None
                if c["proc"].poll() is None:
                    os.kill(c["proc"].pid, signal.SIGCONT)
        live = [c for c in self.clients.values() if c["proc"].poll() is None and not c["killed"]]
        r = self.rng.random()
        if r < 0.06 and live:
            c = self.rng.choice(live)
            if c["stopped_until"] is None:
                os.kill(c["proc"].pid, signal.SIGSTOP)
                c["stopped_until"] = now + self.rng.uniform(0.3, 3.0)
                c["was_stopped"] = True
                self.stats["clients SIGSTOPped"] += 1
        elif r < 0.11 and live:
            self.kill(self.rng.choice(live))
        elif r < 0.17:
            self.garbage()
        elif r < 0.175:
            self.reload()

    # ------------------------------------------------------------- garbage

    def garbage(self):
        rng = self.rng
        target = rng.choice(["nng", "nng", "fds"])
        path = self.sock if target == "nng" else self.sock + ".fds"
        kind = rng.choice(["random", "bare", "frames", "short"])
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2.0)
        try:
            s.connect(path)
            if kind == "random":
                s.sendall(rng.randbytes(rng.randrange(1, 300)))
            elif kind == "short":
                s.sendall(rng.randbytes(rng.randrange(1, 8)))
            elif kind == "frames" and target == "nng":
                s.sendall(b"\x00SP\x00" + struct.pack(">HH", 0x30, 0))    # REQ
                for _ in range(rng.randrange(1, 4)):
                    body = struct.pack(">I", 0x80000000 | rng.getrandbits(31)) + rng.randbytes(rng.randrange(0, 64))
                    ln = len(body) if rng.random() < 0.7 else rng.getrandbits(40)
                    s.sendall(b"\x01" + struct.pack(">Q", ln) + body)
            elif kind == "frames":
                s.sendall(struct.pack("<II", 0x4644444c, rng.choice([2, 2, 1, 99])) + rng.randbytes(16))
            # bare: connect and close
            if rng.random() < 0.5:
                try:
                    s.recv(4096)
                except OSError:
                    pass
        except OSError:
            pass
        finally:
            s.close()
        self.stats[f"garbage connections ({target})"] += 1

    # -------------------------------------------------------------- reload

    def reload(self):
        self.stats["reloads (SIGHUP)"] += 1
        n = self.stats["reloads (SIGHUP)"]
        dropin = {"linger": self.rng.choice([1, 2, 3])}
        add = [h for h in self.hup_defs[:min(n, len(self.hup_defs))]]
        if add:
            dropin["pipelines"] = [self.spec_of(h) for h in add]
        tmp = os.path.join(self.dir, "conf.d", ".50-soak.tmp")
        with open(tmp, "w") as fh:
            json.dump(dropin, fh)
        os.rename(tmp, os.path.join(self.dir, "conf.d", "50-soak.json"))
        self.daemon.send_signal(signal.SIGHUP)
        for h in add:
            if h not in self.pipelines:
                h["ready"] = False
                self.pipelines.append(h)
        self.say(f"reload {n}: linger {dropin['linger']}, pipelines added by drop-in: {len(add)}")

    # -------------------------------------------------------------- checks

    def check(self, label="check"):
        self.stats["checks"] += 1
        if self.daemon.poll() is not None:
            self.violate(f"loaderd died (exit {self.daemon.returncode}); log tail:\n{self.read_log()[-3000:]}")
            return None
        st = self.status()
        if st is None:
            return None
        fds, maps, rss = self.proc_figures()
        swept = st.get("clients_released_by_sweep", 0)
        for k, v in (("fds", fds), ("maps", maps), ("rss", rss)):
            self.maxes[k] = max(self.maxes[k], v)
        if fds > self.base_fds + 200 + 2 * swept:
            self.violate(f"daemon fds {fds} > {self.base_fds} + 200 + 2 x {swept} swept")
        if maps > self.base_maps + 600:
            self.violate(f"daemon maps {maps} > {self.base_maps} + 600")
        if rss > self.base_rss + self.rss_allow:
            self.violate(f"daemon RSS {rss >> 20} MiB > {self.base_rss >> 20} + {self.rss_allow >> 20} MiB")
        now = time.monotonic()
        by_pipe = collections.defaultdict(list)
        for c in st["clients"]:
            for a in c.get("attachments") or []:
                by_pipe[a["pipeline"]].append(a)
            if c.get("attachments"):
                pid = c.get("pid")
                if pid in self.dead and pid not in self.clients and now - self.dead[pid] > GRACE_S:
                    self.violate(f"client {c['id']} (pid {pid}) gone {now - self.dead[pid]:.0f} s ago "
                                 f"still has attachments, {c['leases']} leases")
        pnames = {p["name"] for p in self.pipelines}
        leases = 0
        for pl in st["pipelines"]:
            name = pl["name"]
            att = by_pipe.get(name, [])
            sum_leases = sum(a["leases"] for a in att)
            leases += sum_leases
            if name in pnames and pl["state"] not in ("running", "done"):
                self.violate(f"pipeline {name} state {pl['state']}: {pl.get('error')}")
            if not pl["slots_leased"] <= pl["slots_in_use"] <= pl["slots_total"]:
                self.violate(f"pipeline {name}: slots leased {pl['slots_leased']} in use {pl['slots_in_use']} "
                             f"total {pl['slots_total']}")
            if not att and pl["slots_leased"]:
                self.violate(f"pipeline {name}: {pl['slots_leased']} slots leased, no client attached")
            broadcast = any(a["mode"] == "broadcast" for a in att)
            if att and not broadcast and sum_leases != pl["slots_leased"]:
                self.violate(f"pipeline {name}: clients hold {sum_leases} leases, slots_leased "
                             f"{pl['slots_leased']}")
            if att and broadcast and sum_leases < pl["slots_leased"]:
                self.violate(f"pipeline {name}: clients hold {sum_leases} leases < slots_leased "
                             f"{pl['slots_leased']}")
        for h in self.pipelines:
            if h.get("ready") is False and any(pl["name"] == h["name"] for pl in st["pipelines"]):
                h["ready"] = True
        self.say(f"{label}: fds {fds} (start {self.base_fds}) maps {maps} rss {rss / 2**20:.1f} MiB "
                 f"clients {len(st['clients'])} (ours live {len(self.clients)}) leases {leases} "
                 f"pipelines {len(st['pipelines'])} verified {self.verified['all']} "
                 f"swept {swept} violations {len(self.violations)}")
        return st

    def quiesce(self, label):
        """Kill every client; wait until the daemon lists none with
        attachments and leases are back; client pipelines dropped."""
        self.say(f"{label}: killing {len(self.clients)} clients")
        for c in self.clients.values():
            self.kill(c)
        for c in list(self.clients.values()):
            c["proc"].wait()
        self.reap()
        deadline = time.monotonic() + QUIESCE_S
        st = None
        while time.monotonic() < deadline:
            st = self.status()
            if st is None:
                return
            busy = [c for c in st["clients"] if c.get("attachments")]
            leased = [p for p in st["pipelines"] if p["slots_leased"]]
            jobs = [p for p in st["pipelines"] if p["name"].startswith("job-")]
            if not busy and not leased and not jobs:
                break
            time.sleep(0.5)
        else:
            self.violate(f"{label}: {QUIESCE_S:.0f} s after every client died: clients "
                         f"{[(c['id'], c['pid'], c['leases']) for c in st['clients'] if c.get('attachments')]}, "
                         f"leased {[(p['name'], p['slots_leased']) for p in st['pipelines'] if p['slots_leased']]}, "
                         f"client pipelines left {[p['name'] for p in st['pipelines'] if p['name'].startswith('job-')]}")
        used = sum(p["slots_total"] * p["slot_bytes"] for p in st["pipelines"])
        if st["memory_used"] != used:
            self.violate(f"{label}: memory_used {st['memory_used']} != the slots of the pipelines left {used}")
        self.stats["quiesces"] += 1
        self.check(label)

    # ----------------------------------------------------------------- run

    def run(self):
        a = self.args
        print(f"soak: seed {a.seed} (replay: --seed {a.seed}), {a.minutes} minutes, build {self.build}"
              f"{' (ASan)' if self.asan else ''}, dir {self.dir}", flush=True)
        self.make_data()
        self.write_config()
        self.start_daemon()
        st = self.status()
        used = sum(p["slots_total"] * p["slot_bytes"] for p in st["pipelines"])
        if st["memory_used"] != used:
            self.violate(f"start: memory_used {st['memory_used']} != slots {used}")
        self.base_fds, self.base_maps, self.base_rss = self.proc_figures()
        self.say(f"daemon pid {self.daemon.pid} up: {len(st['pipelines'])} pipelines, fds {self.base_fds}, "
                 f"maps {self.base_maps}, rss {self.base_rss / 2**20:.1f} MiB")
        end = self.t0 + a.minutes * 60
        next_check = time.monotonic() + a.check_every
        next_quiesce = time.monotonic() + QUIESCE_EVERY_S
        while time.monotonic() < end:
            self.reap()
            want = self.rng.randint(MAX_CLIENTS // 2, MAX_CLIENTS)
            if len(self.clients) < want:
                self.spawn()
            self.chaos_step()
            now = time.monotonic()
            if now >= next_check:
                self.check()
                next_check = time.monotonic() + a.check_every
            if now >= next_quiesce and end - now > 60:
                self.quiesce("quiesce")
                next_quiesce = time.monotonic() + QUIESCE_EVERY_S
            if self.daemon.poll() is not None:
                self.violate(f"loaderd died (exit {self.daemon.returncode}); log tail:\n"
                             f"{self.read_log()[-3000:]}")
                break
            time.sleep(0.1)
        if self.daemon.poll() is None:
            self.quiesce("final quiesce")
        self.stop_daemon()
        self.summary()
        return 1 if self.violations else 0

    def stop_daemon(self):
        if self.daemon.poll() is not None:
            self.log.close()
            return
        self.daemon.send_signal(signal.SIGTERM)
        try:
            rc = self.daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait()
            self.violate("loaderd did not exit within 60 s of SIGTERM")
            rc = None
        self.log.close()
        log = self.read_log()
        if rc is not None and rc != 0:
            self.violate(f"loaderd exited {rc} on SIGTERM; log tail:\n{log[-3000:]}")
        if os.path.exists(self.sock):
            self.violate("loaderd left its socket behind")
        m = sanitizer_report(log)
        if m:
            i = log.find(m)
            self.violate(f"loaderd printed a {m} report:\n{log[max(0, i - 200):i + 4000]}")
        self.stats["daemon SIGTERM exit"] = rc if rc is not None else -1

    def summary(self):
        print("\n==> soak summary", flush=True)
        print(f"seed {self.args.seed}, {self.args.minutes} minutes ({self.t():.0f} s), build {self.build}")
        for k in sorted(self.stats):
            print(f"  {k}: {self.stats[k]}")
        for m in ("broadcast", "partition", "dynamic", "all"):
            print(f"  batches verified ({m}): {self.verified[m]}")
        print(f"  max daemon fds {self.maxes['fds']} (start {self.base_fds}), maps {self.maxes['maps']} "
              f"(start {self.base_maps}), RSS {self.maxes['rss'] / 2**20:.1f} MiB "
              f"(start {self.base_rss / 2**20:.1f} MiB)")
        print(f"  daemon log: {self.log_path}")
        if self.violations:
            print(f"soak: FAILED, {len(self.violations)} violations:")
            for v in self.violations[:50]:
                print("  " + v.splitlines()[0])
        else:
            print("soak: ok, no violations")

    def cleanup(self):
        for c in self.clients.values():
            self.kill(c)
        if getattr(self, "daemon", None) is not None and self.daemon.poll() is None:
            self.daemon.kill()
        if not self.violations and not self.args.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        client_main(json.loads(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description="loaderd chaos soak (docs/reliability.md, Chaos soak)")
    ap.add_argument("minutes", type=float)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--build", default=os.environ.get("LOADERD_BUILD") or os.path.join(ROOT, "build"))
    ap.add_argument("--check-every", type=float, default=CHECK_EVERY_S)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    s = Soak(args)
    try:
        return s.run()
    finally:
        s.cleanup()


if __name__ == "__main__":
    sys.exit(main())
