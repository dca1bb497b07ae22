#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Index build time of a Megatron corpus of many prefixes: megatron-core
0.16's BlendedMegatronDatasetBuilder(GPTDataset) (Megatron-LM's --data-path
a b c ...: a GPTDataset per prefix and the BlendedDataset over them, its
C++ helpers included) against a loaderd megatron pipeline over the same
prefixes (issue 27: >= 5x faster, built once per node), cold and warm.

    ~/.cache/loaderd/venv-torch/bin/python bench/megatron_index.py \\
        [--build build] [--dir /tmp/loaderd-llm-bench] [--tokens 2e9] \\
        [--shards 64] [--seq-len 2048] [--runs 5] [--sparse]

The corpus is bench/llm_compare.py's (the same --dir, reused while its
parameters stay the same: uint16 documents of lognormal length around 1500
tokens, 64 prefixes, the train split of "99,1,0", seed 1234, one epoch).
--sparse writes only the .idx files and a sparse .bin of the right size
(no index reads a token: 10^10 tokens and more fit on any disk), into
DIR-sparse-TOKENS. Per run (the median of --runs is printed):

  megatron-core cold  the builder's build() into an empty path_to_cache
                      (every .npy index built and written)
  megatron-core warm  the same again, the same path_to_cache (its .npy
                      files read: megatron-core's own cache reused)
  loaderd cold        a create on a daemon whose cache_dir is empty (every
                      .idx read and checked, every index built and written)
  loaderd warm        a second create (another name) on that daemon: the
                      indexes read from cache_dir
  loaderd restart     a create on a new daemon over the same cache_dir

Also loaderd's own build seconds (status cache.build_seconds of the
blend's index; the parts' are in the cold create), and the CPU seconds of
each cold build (megatron-core's process, loaderd's daemon: on a shared
machine less noisy than the wall times). megatron-core runs in
this process (a process group of one, as a Megatron job of one process
has: BlendedDataset asks torch.distributed who writes its cache).
"""

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "client", "python"))
import llm_compare  # noqa: E402


def sparse_corpus(d, tokens, shards):
    """llm_compare's documents, the .bin files sparse (nothing reads them)."""
    import numpy as np
    prefixes = [os.path.join(d, f"shard_{i:03d}_text_document") for i in range(shards)]
    if all(os.path.exists(p + ".idx") for p in prefixes):
        return prefixes
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    for p in prefixes:
        llm_compare.write_shard(p, tokens // shards, rng, sparse=True)
    return prefixes


def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Daemon:
    def __init__(self, build, d, cache):
        import loaderd
        self.socket = os.path.join(d, "bench.sock")
        self.proc = subprocess.Popen([os.path.join(build, "daemon", "loaderd"), "--socket",
                                      self.socket, "--cache-dir", cache, "--log-level",
                                      "warning"], stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while True:
            try:
                self.client = loaderd.Client(self.socket)
                break
            except Exception:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise SystemExit("loaderd did not start")
                time.sleep(0.02)

    def cpu(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def create(self, name, prefixes, seq_len):
        spec = {"name": name, "batch_size": 8, "seed": 1234, "persist": True,
                "source": {"kind": "megatron", "prefixes": prefixes, "seq_len": seq_len,
                           "split": "99,1,0", "seed": 1234}}
        c0, t = self.cpu(), time.perf_counter()
        self.client.create_pipeline(spec)
        t = time.perf_counter() - t
        self.cpu_s = self.cpu() - c0
        return t, self.client.pipeline(name)["cache"]

    def stop(self):
        self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--dir", default="/tmp/loaderd-llm-bench")
    ap.add_argument("--tokens", type=float, default=2e9)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sparse", action="store_true")
    a = ap.parse_args()
    a.tokens = int(a.tokens)
    os.environ["LOADERD_LIBRARY"] = os.path.join(a.build, "client", "libloader.so")
    if a.sparse:
        prefixes = sparse_corpus(f"{a.dir.rstrip('/')}-sparse-{a.tokens:.0e}-{a.shards}",
                                 a.tokens, a.shards)
    else:
        os.makedirs(a.dir, exist_ok=True)
        prefixes = llm_compare.make_corpus(a)
    for p in prefixes:  # the .idx files in the page cache, for both
        with open(p + ".idx", "rb") as f:
            f.read()
    import megatron.core.datasets.blended_megatron_dataset_builder  # noqa: F401
    import megatron.core.datasets.gpt_dataset  # noqa: F401
    tmp = tempfile.mkdtemp(prefix="mg-index-", dir="/tmp")
    rows = {k: [] for k in ("mc_cold", "mc_warm", "ld_cold", "ld_warm", "ld_restart",
                            "ld_blend_build", "mc_cold_cpu", "ld_cold_cpu")}
    nsamples = 0
    try:
        for _ in range(a.runs):
            mcache = tempfile.mkdtemp(dir=tmp)
            for key in ("mc_cold", "mc_warm"):
                c0, t = cpu_self(), time.perf_counter()
                ds = llm_compare.megatron_train(prefixes, a.seq_len, mcache)
                rows[key].append(time.perf_counter() - t)
                if key == "mc_cold":
                    rows["mc_cold_cpu"].append(cpu_self() - c0)
                nsamples = len(ds)
                del ds
            lcache = tempfile.mkdtemp(dir=tmp)
            d = Daemon(a.build, tmp, lcache)
            try:
                s, c = d.create("cold", prefixes, a.seq_len)
                assert c["index"] == "built", c
                rows["ld_cold"].append(s)
                rows["ld_cold_cpu"].append(d.cpu_s)
                rows["ld_blend_build"].append(c.get("build_seconds", 0.0))
                s, c = d.create("warm", prefixes, a.seq_len)
                assert c["index"] == "reused" and c["parts_built"] == 0, c
                rows["ld_warm"].append(s)
            finally:
                d.stop()
            d = Daemon(a.build, tmp, lcache)
            try:
                s, c = d.create("restart", prefixes, a.seq_len)
                assert c["index"] == "reused" and c["parts_built"] == 0, c
                rows["ld_restart"].append(s)
            finally:
                d.stop()
            shutil.rmtree(mcache)
            shutil.rmtree(lcache)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    m = {k: statistics.median(v) for k, v in rows.items()}
    load = os.getloadavg()[0]
    print(f"corpus: {a.tokens:.2e} tokens in {len(prefixes)} prefixes"
          f"{' (sparse .bin)' if a.sparse else ''}, seq_len {a.seq_len}, "
          f"{nsamples} train samples; median of {a.runs}; load average now {load:.1f}")
    print(f"cold  megatron-core {m['mc_cold']:.3f} s   loaderd {m['ld_cold']:.3f} s   "
          f"{m['mc_cold'] / m['ld_cold']:.1f}x   (loaderd's blend index "
          f"{m['ld_blend_build']:.3f} s of it)")
    print(f"cold CPU seconds (user + system, all threads): megatron-core "
          f"{m['mc_cold_cpu']:.3f} s, loaderd's daemon {m['ld_cold_cpu']:.3f} s "
          f"({m['mc_cold_cpu'] / max(m['ld_cold_cpu'], 1e-9):.1f}x)")
    print(f"warm  megatron-core {m['mc_warm']:.3f} s   loaderd {m['ld_warm']:.3f} s   "
          f"{m['mc_warm'] / m['ld_warm']:.1f}x   (a new daemon over the same cache_dir: "
          f"{m['ld_restart']:.3f} s, {m['mc_warm'] / m['ld_restart']:.1f}x)")


if __name__ == "__main__":
    main()
