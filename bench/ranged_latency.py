#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Two epochs of a tokens corpus read by range from a slow store, two builds (issue 28).

    /usr/bin/python3 bench/ranged_latency.py [--shards 8] [--shard-kib 1024]
                                             [--seq-len 2048] [--batch-size 64]
                                             [--workers 2] [--delay 0.02] [--runs 3]
                                             [--builds main=/work/main/build,new=build]
                                             [--json out.json] [--quick]

A `tokens` corpus whose objects are more than the node's cache_bytes is read
by range (docs/storage.md, "Read by range"): a ranged GET per window. This
times a reader's 2 shuffled epochs (`loaderctl consume`, from its start to
its end; the create, HEADs only, before it) for each build named in --builds
(NAME=BUILD_DIR), the same objects in the same bucket, each run with a fresh
daemon (--workers workers) and a fresh cache_dir.

The store: the suite's real S3 server on loopback (SeaweedFS's `weed mini`,
tests/integration/s3server.py, $LOADERD_WEED or scripts/s3-server-venv),
through the suite's fault proxy with --delay seconds added to every GET (a
store's latency to first byte). The corpus: --shards uint16 token files of
--shard-kib KiB (random tokens), uploaded as alice to
s3://alice-data/rl/shard-NNN.bin. cache_bytes one byte under the corpus
(so it is read by range). Printed per build: each run's seconds, the median,
samples/s (a GET a window), the GETs the proxy saw per run and the most at once.

--quick: 2 shards of 128 KiB, seq_len 256, 1 run: a smoke test of the paths.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from store_compare import start_daemon  # noqa: E402


def one_run(build, d, spec, env, cache_bytes, workers):
    """Seconds of 2 epochs read by one consumer, after the create."""
    proc, sock = start_daemon(build, d, cache_bytes, workers=workers)
    ctl = [os.path.join(build, "client", "loaderctl"), "--socket", sock]
    try:
        r = subprocess.run(ctl + ["create", "--spec", spec], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise SystemExit(f"create failed ({build}): {r.stderr.strip()}")
        t = time.perf_counter()
        r = subprocess.run(ctl + ["consume", "rl"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        took = time.perf_counter() - t
        if r.returncode != 0:
            raise SystemExit(f"consume failed ({build}): {r.stderr.strip()}")
        return took
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(os.path.join(d, "cache"), ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-kib", type=int, default=1024)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--delay", type=float, default=0.02, help="seconds added to every GET")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--builds", default=f"main=/work/main/build,new={os.path.join(REPO, 'build')}")
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.shards, a.shard_kib, a.seq_len, a.runs = 2, 128, 256, 1
    builds = [b.split("=", 1) for b in a.builds.split(",")]
    sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
    import s3server

    d = tempfile.mkdtemp(prefix="ldr-bench-rl-", dir="/tmp")
    srv = proxy = None
    results = {}
    try:
        srv = s3server.S3Server(d).start()
        alice = srv.client("alice")
        total = 0
        with open("/dev/urandom", "rb") as rnd:
            for s in range(a.shards):
                body = rnd.read(a.shard_kib * 1024)
                alice.put("alice-data", f"rl/shard-{s:03d}.bin", body)
                total += len(body)
        proxy = s3server.FaultProxy(("127.0.0.1", int(srv.endpoint.rsplit(":", 1)[1])))
        proxy.delay = a.delay
        spec = os.path.join(d, "spec.json")
        with open(spec, "w") as f:
            json.dump({"name": "rl", "batch_size": a.batch_size, "shuffle": True, "seed": 1, "epochs": 2,
                       "source": {"kind": "tokens", "dtype": "uint16", "seq_len": a.seq_len,
                                  "paths": [f"s3://alice-data/rl/shard-{{000..{a.shards - 1:03d}}}.bin"]}},
                      f)
        env = s3server.aws_env(proxy.endpoint)
        print(f"{a.shards} token files, {total / 2**20:.1f} MiB, seq_len {a.seq_len}, batch_size "
              f"{a.batch_size}, {a.workers} workers, {a.delay * 1000:.0f} ms a GET")
        for name, build in builds:
            times, gets, most = [], [], []
            for _ in range(a.runs):
                before = sum(1 for h in proxy.heads if h.startswith(b"GET "))
                proxy.gets_most = 0
                times.append(one_run(build, d, spec, env, total - 1, a.workers))
                gets.append(sum(1 for h in proxy.heads if h.startswith(b"GET ")) - before)
                most.append(proxy.gets_most)
            med = statistics.median(times)
            samples = statistics.median(gets)  # boundaries "file": a GET a window
            results[name] = {"build": build, "seconds": times, "median": med, "gets": gets, "most": most}
            print(f"{name:8} 2 epochs {med:7.3f} s median of {', '.join(f'{t:.3f}' for t in times)} "
                  f"({samples / med:.0f} samples/s); GETs a run {gets}, most at once {most}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"shards": a.shards, "bytes": total, "delay": a.delay, "seq_len": a.seq_len,
                           "batch_size": a.batch_size, "workers": a.workers, "builds": results}, f, indent=1)
    finally:
        if proxy:
            proxy.stop()
        if srv:
            srv.stop()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
