#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What the Python DataLoader costs per batch, against a C consumer, one run.

    /usr/bin/python3 bench/python_overhead.py [--build build] [--reps 5]
                     [--tokens 40000000] [--baseline REF] [--profile]

Starts a daemon on a private socket and, for every repetition, creates the
token pipeline of docs/benchmarks.md "Core" (uint16 tokens, seq_len 1024,
batch 32, int64 out, shuffled) with the default spec otherwise (no prefetch
or inflight tuning), 3 epochs, and reads it with one consumer:

  c        build/bench/bench-client throughput --skip-epochs 1
  numpy    loaderd.DataLoader(as_numpy=True), next_batch() in a loop
  torch    loaderd.DataLoader(), torch tensors

Every consumer touches one byte per 4 KiB page of every field, as
bench-client does (torch tensors through their zero-copy numpy view, so that
the touching costs the same for every kind: torch's own per-op dispatch is
the trainer's cost, not the loader's), and counts epochs 1 and 2 only (epoch 0 is the warm-up:
the first touch of the slots), timed from the last batch of epoch 0.
With --baseline REF the Python package of git REF (e.g. main before a change)
is measured too, as numpy@REF and torch@REF. The consumers run one after the
other, interleaved, --reps times: load from other work on the machine hits
every side alike. Prints one JSON line per run, then the medians: GB/s, as a
ratio to the C consumer's median, us per batch (seconds / batches), and the
consumer thread's own CPU time per batch (CLOCK_THREAD_CPUTIME_ID: not the
time it waits for batches, nor libloader's threads), whose difference to the
C consumer's is what Python costs per batch (the loader and the touching);
"next+release" is the part of it inside next_batch() and the release of the
batch (C: ldr_next() and ldr_release()): the loader's own cost per batch.
On a loaded machine CPU figures hold where wall-clock GB/s swing.

--profile: also runs the torch consumer(s) under cProfile (timer: the
thread's CPU time) for 1000 batches and prints where the time per batch goes.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CONSUMER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import loaderd
kind, sock, pipe, prof = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
if kind == "torch":
    import torch
    torch.set_num_threads(1)
dl = loaderd.DataLoader(pipe, socket=sock, as_numpy=(kind == "numpy"))
n = nbytes = seen = 0
lib_cpu = 0.0  # thread CPU inside next_batch() and the release (del b)
t0 = t_prev = cpu0 = cpu_prev = None
sink = 0
def run(limit):
    global n, nbytes, t0, t_prev, sink, seen, cpu0, cpu_prev, lib_cpu
    while True:
        c0 = time.thread_time()
        b = dl.next_batch()
        c1 = time.thread_time()
        if b is None:
            return
        counting = b.epoch >= 1
        if counting and t0 is None:
            t0, cpu0 = t_prev, cpu_prev
        for x in b.values():  # one byte per 4 KiB page, as bench-client
            # a tensor is touched through its numpy view (zero-copy): the
            # touching stands in for the trainer's work and costs the same
            # for both kinds; torch's per-op dispatch (~5 us an op in 1.13)
            # is not the loader's
            a = x if kind == "numpy" else x.numpy()
            sink += int(a.reshape(-1)[::4096 // a.itemsize].sum())
            if counting:
                nbytes += a.nbytes
        seen += 1
        if counting:
            n += 1
        c2 = time.thread_time()
        del b, x, a
        t_prev = time.perf_counter()
        cpu_prev = time.thread_time()
        if counting:
            lib_cpu += (c1 - c0) + (cpu_prev - c2)
        if limit and seen >= limit:
            return
if prof:
    import cProfile, pstats
    pr = cProfile.Profile(time.thread_time)  # CPU time: waiting for batches is not counted
    pr.enable()
    run(int(sys.argv[6]))
    pr.disable()
    st = pstats.Stats(pr)
    st.sort_stats("tottime")
    tot = sum(v[2] for v in st.stats.values())
    print(json.dumps({"batches": seen, "total_us_per_batch": tot / seen * 1e6,
                      "top": [[f"{os.path.basename(k[0])}:{k[1]}({k[2]})", v[1],
                               round(v[2] / seen * 1e6, 2)]
                              for k, v in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:18]]}))
else:
    run(0)
    dt = t_prev - t0
    print(json.dumps({"batches": n, "bytes": nbytes, "seconds": round(dt, 4),
                      "gb_per_s": round(nbytes / dt / 1e9, 3),
                      "thread_cpu_s": round(cpu_prev - cpu0, 4), "lib_cpu_s": round(lib_cpu, 4)}))
dl.close()
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=40_000_000)
    ap.add_argument("--baseline", help="git ref whose client/python is measured too")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    env = dict(os.environ, LOADERD_LIBRARY=os.path.join(build, "client", "libloader.so"))
    tmp = tempfile.mkdtemp(prefix="ldr-pyov-")
    sock = os.path.join(tmp, "loaderd.sock")
    tok = os.path.join(tmp, "tokens.bin")
    import numpy as np
    np.random.default_rng(0).integers(0, 50257, size=args.tokens, dtype=np.uint16).tofile(tok)
    pkgs = {"": os.path.join(REPO, "client", "python")}
    if args.baseline:
        base = os.path.join(tmp, "base")
        os.makedirs(base)
        arch = subprocess.run(["git", "-C", REPO, "archive", args.baseline, "client/python"],
                              check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=arch, check=True)
        pkgs["@" + args.baseline] = os.path.join(base, "client", "python")
    daemon = subprocess.Popen([os.path.join(build, "daemon", "loaderd"), "--socket", sock,
                               "--log-level", "warning"])
    ctl = os.path.join(build, "client", "loaderctl")
    seq = [0]

    def create():
        seq[0] += 1
        name = f"tok{seq[0]}"
        spec = {"name": name, "source": {"kind": "tokens", "path": tok, "dtype": "uint16",
                                         "seq_len": 1024},
                "batch_size": 32, "shuffle": True, "seed": 7, "epochs": 3}
        path = os.path.join(tmp, "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        subprocess.run([ctl, "--socket", sock, "create", "--spec", path], check=True,
                       stdout=subprocess.DEVNULL)
        return name

    def drop(name):
        subprocess.run([ctl, "--socket", sock, "drop", name], check=True,
                       stdout=subprocess.DEVNULL)

    def consume(kind, pkg, profile=0):
        name = create()
        try:
            if kind == "c":
                cmd = [os.path.join(build, "bench", "bench-client"), "--socket", sock,
                       "--pipeline", name, "throughput", "--skip-epochs", "1"]
            else:
                cmd = [sys.executable, "-c", CONSUMER, pkg, kind, sock, name,
                       "1" if profile else "0", str(profile)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
            return json.loads(out.stdout.strip().splitlines()[-1])
        finally:
            drop(name)

    try:
        for _ in range(100):
            if subprocess.run([ctl, "--socket", sock, "status"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        subprocess.run(["cat", tok], stdout=subprocess.DEVNULL)  # in the page cache
        sides = [("c", "c", None)]
        for tag, pkg in pkgs.items():
            sides += [("numpy" + tag, "numpy", pkg), ("torch" + tag, "torch", pkg)]
        results = {s[0]: [] for s in sides}
        consume("c", None)  # warm-up run, not counted
        for rep in range(args.reps):
            for label, kind, pkg in sides:
                r = consume(kind, pkg)
                r["us_per_batch"] = round(r["seconds"] / r["batches"] * 1e6, 1)
                r["cpu_us_per_batch"] = round(r["thread_cpu_s"] / r["batches"] * 1e6, 1)
                r["next_us_per_batch"] = round(r["lib_cpu_s"] / r["batches"] * 1e6, 1)
                results[label].append(r)
                print(json.dumps({"rep": rep, "side": label, **r}), flush=True)
        cmed = statistics.median(r["gb_per_s"] for r in results["c"])
        print()
        ccpu = statistics.median(r["cpu_us_per_batch"] for r in results["c"])
        cnext = statistics.median(r["next_us_per_batch"] for r in results["c"])
        print(f"{'consumer':16} {'GB/s (median)':>14} {'of C':>7} {'us/batch':>9} "
              f"{'CPU us/batch':>13} {'over C':>7} {'next+release':>13} {'over C':>7}  runs GB/s")
        for label, rs in results.items():
            g = statistics.median(r["gb_per_s"] for r in rs)
            us = statistics.median(r["us_per_batch"] for r in rs)
            cpu = statistics.median(r["cpu_us_per_batch"] for r in rs)
            nx = statistics.median(r["next_us_per_batch"] for r in rs)
            print(f"{label:16} {g:14.2f} {g / cmed:7.0%} {us:9.1f} {cpu:13.1f} {cpu - ccpu:7.1f} "
                  f"{nx:13.1f} {nx - cnext:7.1f}  " + " ".join(f"{r['gb_per_s']:.2f}" for r in rs))
        if args.profile:
            for tag, pkg in pkgs.items():
                p = consume("torch", pkg, profile=1000)
                print(f"\ncProfile, torch consumer{tag}: {p['total_us_per_batch']:.1f} us "
                      f"of CPU per batch over {p['batches']} batches (profiler included; "
                      "foreign calls count in their Python caller); tottime per batch:")
                for fn, calls, us in p["top"]:
                    print(f"  {us:8.2f} us  {calls:7d} calls  {fn}")
    finally:
        daemon.terminate()
        daemon.wait()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
