#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Churn: SIGKILLed consumers and create/drop cycles must leak nothing (issue 13).

    tests/stress/churn.py [BUILD_DIR] [-n N] [--cycles C] [--concurrency K] [--seed S]
                                                     (build, 1000, N, 8, random)

Not part of scripts/test (N=1000 takes several minutes); a short version is
tests/integration/test_churn.py. Against one real daemon (the harness's
Daemon: `loaderd --workers 2` on a private socket):

1. warm-up: 16 consumers SIGKILLed and 16 create/drop cycles, the daemon
   left to settle, then the baseline: its fds (/proc/PID/fd), mappings
   (/proc/PID/maps lines) and VmRSS;
2. N `loaderctl consume churn --batches 1000000` (broadcast or dynamic, some
   with --delay so that they hold leases), K at a time, each SIGKILLed at a
   random moment of its first second (some in the handshake, most while they
   stream), then settle and measure;
3. C cycles of `loaderctl create --spec` (no --exist-ok) and `loaderctl drop`
   of a pipeline of its own name, K/2 at a time, then settle and measure.

"Settled": status lists no client but the poller (exited pollers that nng
1.5.2 never reported closed and the dead-pid sweep has not released yet are
waited out too), no slot leased, only the pipeline `churn`; then the fd count
is polled until it is back near the baseline (nng closes connections on its
own threads) or 60 s pass. Prints the numbers of each phase, the kinds of the
fds (socket, memfd, eventfd, ...), nng's threads and the daemon log's nng
lines; exits 1 when fds or maps exceed the baseline by more than --slack
(16) or RSS grew more than --rss-mib (64), or the daemon did not exit 0 at
SIGTERM. No timing is asserted: deadlines are generous.
"""

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "pyharness"))

SEQ_LEN = 16
NTOKENS = 4096 * SEQ_LEN + 1


# ------------------------------------------------------------ measurements

def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_kinds(pid):
    """fds of @pid by kind: socket, pipe, memfd, eventfd, ... and files."""
    kinds = collections.Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith("socket:"):
            k = "socket"
        elif t.startswith("pipe:"):
            k = "pipe"
        elif t.startswith("/memfd:"):
            k = "memfd:" + t[len("/memfd:"):].split(" ")[0]
        elif t.startswith("anon_inode:"):
            k = t
        elif t.startswith("/dev/"):
            k = t
        else:
            k = "file"
        kinds[k] += 1
    return dict(sorted(kinds.items()))


def maps_count(pid):
    with open(f"/proc/{pid}/maps") as f:
        return sum(1 for _ in f)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def threads(pid):
    """(name, state, wchan) of each thread of @pid; for nng's reaper also
    its syscall (an idle one waits on its condition: futex op 0x189)."""
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(base + "/stat") as f:
                stat = f.read()
            with open(base + "/wchan") as f:
                wchan = f.read().strip() or "-"
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        state = stat[stat.rindex(")") + 2]
        if name.startswith("nng:reap"):
            try:
                with open(base + "/syscall") as f:
                    wchan += " syscall " + " ".join(f.read().split()[:4])
            except OSError:
                pass
        out.append((name, state, wchan))
    return out


def swept(d):
    """(clients, watchdog probes) the daemon's dead-pid sweep released:
    non-zero once nng 1.5.2 stopped reporting closed connections."""
    st = raw_status(d)
    return st.get("clients_released_by_sweep", 0), st.get("probes_released_by_sweep", 0)


def measure(pid):
    return {"fds": fd_count(pid), "maps": maps_count(pid), "rss_kib": rss_kib(pid),
            "threads": len(os.listdir(f"/proc/{pid}/task")), "fd_kinds": fd_kinds(pid)}


def fmt(m):
    swept = f" swept {m['swept']}" if m.get("swept") else ""
    swept += f" probes swept {m['probes']}" if m.get("probes") else ""
    return (f"fds {m['fds']} maps {m['maps']} RSS {m['rss_kib'] / 1024:.1f} MiB "
            f"threads {m['threads']}{swept} {json.dumps(m['fd_kinds'])}")


# ----------------------------------------------------------------- settling

def raw_status(d):
    st = d.ctl_json("status")
    me = st.pop("_ctl_pid")
    st["clients"] = [c for c in st["clients"] if c.get("pid") != me]
    return st


def settle(d, base_fds=None, slack=16, names=("churn",), timeout=120.0, log=print):
    """Wait until no client is listed (exactly: ghosts of exited pollers
    included), no slot is leased, only @names are pipelines, and, with
    @base_fds, the fd count is within @slack of it (or 60 s passed).
    Returns the last status; raises AssertionError past @timeout."""
    deadline = time.monotonic() + timeout
    st = None
    while True:
        st = raw_status(d)
        leased = sum(p.get("slots_leased", 0) for p in st["pipelines"])
        leases = sum(c.get("leases", 0) for c in st["clients"])
        pls = sorted(p["name"] for p in st["pipelines"])
        if not st["clients"] and not leased and not leases and pls == sorted(names):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"not settled within {timeout} s: {len(st['clients'])} clients "
                                 f"({leases} leases), {leased} slots leased, pipelines {pls}:\n"
                                 f"{json.dumps(st['clients'][:10], indent=1)}")
        # not every 50 ms: a poller that nng never reports closed stays
        # listed until the dead-pid sweep (2 sweeps, 1 s apart) releases it
        time.sleep(0.5 if st["clients"] else 0.2)
    if base_fds is not None:
        fd_deadline = time.monotonic() + 60
        while fd_count(d.pid) > base_fds + slack and time.monotonic() < fd_deadline:
            time.sleep(0.5)
    return st


# ------------------------------------------------------------------- phases

def write_tokens(path):
    import numpy as np
    np.random.default_rng(7).integers(0, 50000, size=NTOKENS).astype(np.uint16).tofile(path)


def spec(name, tok):
    return {"name": name, "source": {"kind": "tokens", "path": tok, "dtype": "uint16",
                                     "seq_len": SEQ_LEN},
            "batch_size": 8, "epochs": 0, "prefetch": 4, "shuffle": True, "seed": 3,
            "persist": True}


def kill_consumers(d, n, concurrency, rng, name="churn", progress=None):
    """@n consumers of @name, @concurrency at a time, each SIGKILLed at a
    random moment of its first second."""
    from loaderd_harness import child_env
    env = child_env()
    live = []
    started = killed_exited = 0
    while started < n or live:
        now = time.monotonic()
        for p, at in list(live):
            if now >= at:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                else:
                    killed_exited += 1     # it failed on its own: a finding
                p.wait()
                live.remove((p, at))
        while started < n and len(live) < concurrency:
            args = ["consume", name, "--batches", "1000000"]
            if rng.random() < 0.5:
                args += ["--mode", "dynamic"]
            if rng.random() < 0.3:
                args += ["--delay", str(rng.choice((1, 5, 20)))]
            p = subprocess.Popen(d.ctl_cmd(*args), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=env)
            live.append((p, time.monotonic() + rng.uniform(0.02, 1.0)))
            started += 1
            if progress and started % 100 == 0:
                progress(f"  {started} consumers started")
        time.sleep(0.005)
    return killed_exited


def create_drop(d, n, concurrency, tok, progress=None):
    """@n create/drop cycles, @concurrency threads each with a pipeline name
    of its own; create without --exist-ok, so a name left behind fails."""
    errors = []
    done = [0]
    lock = threading.Lock()
    paths = []
    for k in range(concurrency):
        paths.append(d.spec_file(spec(f"cd{k}", tok)))

    def worker(k):
        while True:
            with lock:
                if done[0] >= n or errors:
                    return
                done[0] += 1
                i = done[0]
            for args in (("create", "--spec", paths[k]), ("drop", f"cd{k}")):
                r = d.ctl(*args, check=False)
                if r.returncode != 0:
                    with lock:
                        errors.append(f"cycle {i}: loaderctl {' '.join(args)}: exit "
                                      f"{r.returncode}: {r.stderr.strip()}")
                    return
            if progress and i % 100 == 0:
                progress(f"  {i} create/drop cycles")

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise AssertionError("; ".join(errors[:5]))


def nng_log_lines(log):
    keys = ("never reported closed", "released ", "stopped accepting", "replaced listener",
            "nng")
    return [line for line in log.splitlines() if any(k in line for k in keys)]


def run(d, n, cycles, concurrency, rng, slack=16, rss_mib=64, log=print):
    """The three phases on daemon @d; returns (ok, {phase: measurement})."""
    tok = os.path.join(d.dir, "churn-tokens.bin")
    write_tokens(tok)
    d.create(spec("churn", tok))
    res = {}
    t0 = time.monotonic()
    kill_consumers(d, 16, concurrency, rng)
    create_drop(d, 16, max(1, concurrency // 2), tok)
    settle(d, log=log)
    # nng closes the last connections on its own threads: a baseline once
    # the fd count held still for a second (or 10 s passed)
    last, deadline = -1, time.monotonic() + 10
    while fd_count(d.pid) != last and time.monotonic() < deadline:
        last = fd_count(d.pid)
        time.sleep(1.0)
    base = res["baseline"] = measure(d.pid)
    base["swept"], base["probes"] = swept(d)
    log(f"baseline (after warm-up, {time.monotonic() - t0:.0f} s): {fmt(base)}")

    t0 = time.monotonic()
    failed_early = kill_consumers(d, n, concurrency, rng, progress=log)
    t1 = time.monotonic()
    settle(d, base["fds"], slack, log=log)
    m = res["consumers"] = measure(d.pid)
    m["swept"], m["probes"] = swept(d)
    log(f"after {n} SIGKILLed consumers ({t1 - t0:.0f} s, settled in {time.monotonic() - t1:.0f} s"
        f"{f', {failed_early} exited before their kill' if failed_early else ''}): {fmt(m)}")

    t0 = time.monotonic()
    create_drop(d, cycles, max(1, concurrency // 2), tok, progress=log)
    t1 = time.monotonic()
    settle(d, base["fds"], slack, log=log)
    m = res["create_drop"] = measure(d.pid)
    m["swept"], m["probes"] = swept(d)
    log(f"after {cycles} create/drop cycles ({t1 - t0:.0f} s, settled in "
        f"{time.monotonic() - t1:.0f} s): {fmt(m)}")

    ok = True
    for phase in ("consumers", "create_drop"):
        m = res[phase]
        for key, limit in (("fds", base["fds"] + slack), ("maps", base["maps"] + slack),
                           ("rss_kib", base["rss_kib"] + rss_mib * 1024)):
            if m[key] > limit:
                log(f"LEAK after {phase}: {key} {m[key]} > {limit} (baseline {base[key]})")
                ok = False
    if not ok or base["swept"] or m["swept"]:
        log("threads (name state wchan): " + ", ".join(f"{a} {b} {c}" for a, b, c in threads(d.pid)))
    return ok, res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("-n", type=int, default=1000, help="SIGKILLed consumers (1000)")
    ap.add_argument("--cycles", type=int, default=None, help="create/drop cycles (N)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--slack", type=int, default=16)
    ap.add_argument("--rss-mib", type=int, default=64)
    ap.add_argument("--keep", action="store_true", help="keep the directory and its log")
    a = ap.parse_args()
    os.environ["LOADERD_BUILD"] = os.path.abspath(a.build)
    import loaderd_harness as h
    h.BUILD_DIR = os.path.abspath(a.build)
    h.LOADERD = os.path.join(h.BUILD_DIR, "daemon", "loaderd")
    h.LOADERCTL = os.path.join(h.BUILD_DIR, "client", "loaderctl")
    h.LIBLOADER = os.path.join(h.BUILD_DIR, "client", "libloader.so")
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    cycles = a.n if a.cycles is None else a.cycles
    print(f"churn: {a.n} consumers, {cycles} create/drop cycles, {a.concurrency} at a time, "
          f"seed {seed}, build {h.BUILD_DIR}", flush=True)
    wd = tempfile.mkdtemp(prefix="ldr-churn-", dir="/tmp")
    d = h.Daemon(wd)
    print(f"daemon pid {d.pid}, log {d.log_path}", flush=True)

    def log(s):
        print(s, flush=True)

    ok = False
    try:
        ok, _ = run(d, a.n, cycles, a.concurrency, random.Random(seed), a.slack, a.rss_mib, log)
    finally:
        lines = nng_log_lines(d.log())
        if lines:
            print(f"daemon log, nng lines ({len(lines)}):")
            for line in lines[:10] + (["..."] + lines[-5:] if len(lines) > 15 else lines[10:]):
                print("  " + line)
        try:
            d.stop()
            print("daemon exited 0 at SIGTERM")
        except AssertionError as e:
            print(f"STOP FAILED: {str(e)[:2000]}")
            ok = False
    print("OK: fds, maps and RSS flat" if ok else "FAILED")
    if ok and not a.keep:
        import shutil
        shutil.rmtree(wd, ignore_errors=True)
    else:
        print(f"kept {wd}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
