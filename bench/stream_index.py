#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The create of a streamed webdataset over a slow store, two builds (issue 28).

    /usr/bin/python3 bench/stream_index.py [--shards 200] [--shard-kib 256]
                                           [--delay 0.05] [--runs 3]
                                           [--builds main=/work/main/build,new=build]
                                           [--json out.json] [--quick]

A webdataset whose shards are more than the node's cache_bytes is read as a
stream (docs/storage.md): its create HEADs every shard, then fetches each
whole to index it. This times that create, `loaderctl create` from its
start to its answer, for each build named in --builds (NAME=BUILD_DIR), the
same shards in the same bucket, each run with a fresh daemon and a fresh
cache_dir.

The store: the suite's real S3 server on loopback (SeaweedFS's `weed mini`,
tests/integration/s3server.py, $LOADERD_WEED or scripts/s3-server-venv),
through the suite's fault proxy with --delay seconds added to every GET (a
store's latency). The shards: --shards tars of about --shard-kib KiB each,
samples of KEY.jpg (random bytes: a create reads no pixels) and KEY.cls,
uploaded as alice to s3://alice-data/ix/train-NNNNNN.tar. The daemon:
cache_bytes one byte under the shards' bytes (so they stream), fetch_ahead
half of it (its most). Printed per build: each run's seconds, the median, and
the GETs the proxy saw per run (each shard once is the shard count).

--quick: 16 shards of 64 KiB, 2 runs: a smoke test of the paths.
"""

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from store_compare import start_daemon  # noqa: E402


def make_shards(d, nshards, shard_kib):
    """The shards' files (their paths) of ~shard_kib KiB, 8 KiB a sample."""
    rnd = open("/dev/urandom", "rb")
    paths = []
    per = max(1, shard_kib // 8)
    for s in range(nshards):
        p = os.path.join(d, f"train-{s:06d}.tar")
        with tarfile.open(p, "w", format=tarfile.USTAR_FORMAT) as t:
            for i in range(per):
                for ext, data in (("jpg", rnd.read(8192 - 600)), ("cls", b"%d" % (i % 10))):
                    info = tarfile.TarInfo(f"s{s:06d}_{i:05d}.{ext}")
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
        paths.append(p)
    rnd.close()
    return paths


def one_run(build, d, spec, env, cache_bytes, fetch_ahead):
    """Seconds of one create from a cold cache."""
    proc, sock = start_daemon(build, d, cache_bytes, fetch_ahead=fetch_ahead)
    try:
        t = time.perf_counter()
        r = subprocess.run([os.path.join(build, "client", "loaderctl"), "--socket", sock, "create",
                            "--spec", spec], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        took = time.perf_counter() - t
        if r.returncode != 0:
            raise SystemExit(f"create failed ({build}): {r.stderr.strip()}")
        return took
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(os.path.join(d, "cache"), ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=200)
    ap.add_argument("--shard-kib", type=int, default=256)
    ap.add_argument("--delay", type=float, default=0.05, help="seconds added to every GET")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--builds", default=f"main=/work/main/build,new={os.path.join(REPO, 'build')}")
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.shards, a.shard_kib, a.runs = 16, 64, 2
    builds = [b.split("=", 1) for b in a.builds.split(",")]
    sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
    import s3server

    d = tempfile.mkdtemp(prefix="ldr-bench-ix-", dir="/tmp")
    srv = proxy = None
    results = {}
    try:
        paths = make_shards(d, a.shards, a.shard_kib)
        total = sum(os.path.getsize(p) for p in paths)
        srv = s3server.S3Server(d).start()
        alice = srv.client("alice")
        for p in paths:
            with open(p, "rb") as f:
                alice.put("alice-data", "ix/" + os.path.basename(p), f.read())
        proxy = s3server.FaultProxy(("127.0.0.1", int(srv.endpoint.rsplit(":", 1)[1])))
        proxy.delay = a.delay
        spec = os.path.join(d, "spec.json")
        with open(spec, "w") as f:
            json.dump({"name": "ix", "source": {"kind": "webdataset",
                       "urls": [f"s3://alice-data/ix/train-{{000000..{a.shards - 1:06d}}}.tar"]},
                       "transforms": [{"op": "resize", "size": 16}, {"op": "center_crop", "size": 16}],
                       "output": {"dtype": "uint8", "layout": "NCHW"}, "batch_size": 8}, f)
        env = s3server.aws_env(proxy.endpoint)
        print(f"{a.shards} shards, {total / 2**20:.1f} MiB, {a.delay * 1000:.0f} ms a GET; "
              f"cache_bytes {total - 1}, fetch_ahead {(total - 1) // 2}")
        for name, build in builds:
            times, gets = [], []
            for _ in range(a.runs):
                before = sum(1 for h in proxy.heads if h.startswith(b"GET "))
                times.append(one_run(build, d, spec, env, total - 1, (total - 1) // 2))
                gets.append(sum(1 for h in proxy.heads if h.startswith(b"GET ")) - before)
            results[name] = {"build": build, "seconds": times, "median": statistics.median(times),
                             "gets": gets}
            print(f"{name:8} create {statistics.median(times):7.3f} s median of "
                  f"{', '.join(f'{t:.3f}' for t in times)}; GETs a run {gets}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"shards": a.shards, "bytes": total, "delay": a.delay, "builds": results}, f,
                          indent=1)
    finally:
        if proxy:
            proxy.stop()
        if srv:
            srv.stop()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
