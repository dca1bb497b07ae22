#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Language-model data: loaderd's megatron source against megatron-core and nanoGPT, one run.

    ~/.cache/loaderd/venv-torch/bin/python bench/llm_compare.py [--dir D] [--tokens 2e9]
        [--shards 64] [--seq-len 2048] [--batch 8] [--ranks 8] [--seconds 15]
        [--build build] [--json out.json] [--quick]

Runs in the current-torch venv (scripts/torch-venv: megatron-core 0.16 is
there). The corpus, generated once into --dir (default
/tmp/loaderd-llm-bench) and reused while its parameters stay the same, is
--shards Megatron indexed datasets (.bin/.idx pairs written in the MMIDIDX
format megatron-core reads, uint16 tokens, documents of lognormal lengths
around 1500 tokens) of --tokens tokens in all. Each "trainer" is a process
that takes batches of the train split and touches every row; it counts the
samples it receives inside a common window of --seconds, which starts
--warmup seconds after every trainer of the scenario has its first batch.

  index build  megatron-core: BlendedMegatronDatasetBuilder(GPTDataset) over
               the --shards prefixes (weights from their sizes, as
               --data-path without weights), empty path_to_cache, one epoch;
               loaderd: the create of a megatron pipeline over the same
               prefixes with an empty cache_dir (then a second create of
               another name: the cached index reused); cold only on
               megatron-core's side: bench/megatron_index.py compares
               both cold and both warm paths, median of several runs
  1 trainer    megatron-core's dataset in torch's DataLoader, num_workers=2,
               persistent workers, Megatron's sequential batch order (as
               pretrain_gpt.py builds it); nanoGPT's get_batch (np.memmap per
               batch, random offsets, torch.stack), in the trainer; loaderd:
               one partition rank 0 of 1 of the megatron pipeline
  8 ranks      --ranks trainers: each a megatron-core DataLoader (2 workers)
               over its data-parallel share (Megatron's pretraining sampler:
               rank r takes rows [r*B, (r+1)*B) of each global batch), against
               --ranks partition ranks of one loaderd pipeline

  samples/s    samples received by all trainers in the window / seconds
  trainer CPU  CPU seconds of the trainer processes alone (not their workers,
               not the daemon) per 1000 samples
  CPU s/1000   every process involved (trainers, torch's workers, the daemon)
               per 1000 samples

Prints a table and the ratios; --json writes every figure.
"""

import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from torch_compare import children_of, cpu_snapshot, proc_cpu  # noqa: E402
VOCAB = 50257


# ------------------------------------------------------------------ corpus

def write_shard(prefix, ntokens, rng, sparse=False):
    """One .bin/.idx pair of @ntokens uint16 tokens, as megatron-core's
    IndexedDatasetBuilder writes it (each sequence its own document); with
    @sparse the .bin a hole of its size (for what reads no token)."""
    import numpy as np
    lens = []
    left = ntokens
    while left > 0:
        n = rng.lognormal(7.0, 0.8, 4096).astype(np.int64) + 16
        lens.append(n)
        left -= int(n.sum())
    lens = np.concatenate(lens)
    cut = int(np.searchsorted(np.cumsum(lens), ntokens))
    lens = lens[:cut + 1].copy()
    lens[-1] -= int(lens.sum()) - ntokens
    lens = lens[lens > 0]
    with open(prefix + ".bin", "wb") as f:
        step = 1 << 26
        if sparse:
            f.truncate(ntokens * 2)
        for at in range(0, 0 if sparse else ntokens, step):
            rng.integers(0, VOCAB, min(step, ntokens - at), dtype=np.uint16).tofile(f)
    n = len(lens)
    ptr = np.zeros(n, np.int64)
    np.cumsum(lens[:-1] * 2, out=ptr[1:])
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))  # uint16
        f.write(struct.pack("<Q", n))
        f.write(struct.pack("<Q", n + 1))
        f.write(lens.astype(np.int32).tobytes())
        f.write(ptr.tobytes())
        f.write(np.arange(n + 1, dtype=np.int64).tobytes())


def make_corpus(a):
    """The prefixes of the corpus in a.dir, made once per parameters."""
    import numpy as np
    stamp = os.path.join(a.dir, "corpus.json")
    want = {"tokens": a.tokens, "shards": a.shards, "format": 1}
    prefixes = [os.path.join(a.dir, "data", f"shard_{i:03d}_text_document")
                for i in range(a.shards)]
    try:
        with open(stamp) as f:
            if json.load(f) == want:
                return prefixes
    except (OSError, ValueError):
        pass
    shutil.rmtree(os.path.join(a.dir, "data"), ignore_errors=True)
    os.makedirs(os.path.join(a.dir, "data"))
    rng = np.random.default_rng(0)
    per = a.tokens // a.shards
    t = time.time()
    for p in prefixes:
        write_shard(p, per, rng)
    print(f"corpus: {a.shards} shards, {per * a.shards / 1e9:.2f}e9 tokens in "
          f"{time.time() - t:.0f} s", file=sys.stderr)
    with open(stamp, "w") as f:
        json.dump(want, f)
    return prefixes


def warm(prefixes):
    for p in prefixes:
        for ext in (".bin", ".idx"):
            with open(p + ext, "rb") as fh:
                while fh.read(1 << 24):
                    pass


# ------------------------------------------------------------- megatron

class Tokenizer:
    """What GPTDatasetConfig wants of a tokenizer when nothing is tokenized."""
    eod = 0
    pad = VOCAB
    vocab_size = VOCAB
    unique_identifiers = {"class": "bench"}


def megatron_config(prefixes, seq_len, cache):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    return GPTDatasetConfig(random_seed=1234, sequence_length=seq_len,
                            blend=(prefixes, None), split="99,1,0", path_to_cache=cache,
                            tokenizer=Tokenizer(), reset_position_ids=False,
                            reset_attention_mask=False, eod_mask_loss=False,
                            create_attention_mask=False, mid_level_dataset_surplus=0.005)


def megatron_train(prefixes, seq_len, cache):
    """The train split, one epoch (megatron-core's sizes None)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        # BlendedDataset asks torch.distributed who builds its cache: a
        # process group of one, as a Megatron job of one process has
        fd, store = tempfile.mkstemp(prefix="pg-")
        os.close(fd)
        os.unlink(store)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset
    cfg = megatron_config(prefixes, seq_len, cache)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None],
                                                lambda: True, cfg).build()
    return train


class RankBatches:
    """Megatron's pretraining batch order for data-parallel rank @rank of
    @world: global batches of B*world consecutive samples, rank r takes rows
    [r*B, (r+1)*B) of each."""

    def __init__(self, n, batch, rank, world):
        self.n, self.b, self.r, self.w = n, batch, rank, world

    def __iter__(self):
        g = self.b * self.w
        for start in range(0, self.n - g + 1, g):
            lo = start + self.r * self.b
            yield list(range(lo, lo + self.b))

    def __len__(self):
        return self.n // (self.b * self.w)


# ------------------------------------------------------------------ trainer

def trainer(a):
    """One trainer process (run as: llm_compare.py --trainer ...)."""
    import numpy as np
    import torch
    torch.set_num_threads(1)
    prefixes = json.loads(a.prefixes)
    if a.system == "megatron":
        ds = megatron_train(prefixes, a.seq_len, a.cache)
        dl = torch.utils.data.DataLoader(ds, batch_sampler=RankBatches(len(ds), a.batch, a.rank,
                                                                       a.world),
                                         num_workers=2, pin_memory=False,
                                         persistent_workers=True)

        def batches():
            while True:
                for b in dl:
                    yield b["tokens"]
    elif a.system == "nanogpt":
        rng = np.random.default_rng(a.rank)

        def get_batch():
            # nanoGPT's train.py: a fresh memmap per batch (its memory-leak
            # workaround), random offsets, int64, torch.stack
            p = prefixes[rng.integers(len(prefixes))] + ".bin"
            data = np.memmap(p, dtype=np.uint16, mode="r")
            ix = torch.randint(len(data) - a.seq_len, (a.batch,))
            x = torch.stack([torch.from_numpy(data[i:i + a.seq_len].astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + a.seq_len].astype(np.int64))
                             for i in ix])
            return x, y

        def batches():
            while True:
                yield get_batch()[0]
    else:
        sys.path.insert(0, os.path.join(REPO, "client", "python"))
        import loaderd
        dl = loaderd.DataLoader(a.pipeline, socket=a.socket, mode="partition", rank=a.rank,
                                world_size=a.world)

        def batches():
            while True:
                b = dl.next_batch()
                if b is None:
                    return
                yield b["tokens"]
    n = acc = 0
    it = batches()
    acc += int(next(it)[:, 0].sum())
    # ready: the parent starts the window once every trainer has had a batch
    print("ready", flush=True)
    t0 = float(sys.stdin.readline())
    t1 = t0 + a.seconds
    for x in it:
        acc += int(x[:, 0].sum())  # touch every row
        now = time.time()
        if now >= t1:
            break
        if now >= t0:
            n += x.shape[0]
        del x
    print(json.dumps({"samples": n, "acc": acc}), flush=True)
    sys.stdin.read()


# ------------------------------------------------------------- measurement

class Daemon:
    def __init__(self, build, d, cache):
        self.socket = os.path.join(d, "bench.sock")
        self.log = open(os.path.join(d, "loaderd.log"), "w")
        self.proc = subprocess.Popen([os.path.join(build, "daemon", "loaderd"), "--socket",
                                      self.socket, "--workers", str(os.cpu_count()),
                                      "--cache-dir", cache, "--log-level", "warning"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while not (os.path.exists(self.socket) and os.path.exists(self.socket + ".fds")):
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit("loaderd did not start")
            time.sleep(0.02)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self.log.close()


def loaderd_spec(name, prefixes, a):
    return {"name": name, "batch_size": a.batch, "seed": 1234, "epochs": 0, "persist": True,
            "source": {"kind": "megatron", "prefixes": prefixes, "seq_len": a.seq_len,
                       "split": "99,1,0", "seed": 1234}}


def run_trainers(a, system, k, prefixes, daemon=None, pipeline=None, cache=None):
    extra = []
    if daemon:
        extra = ["--socket", daemon.socket, "--pipeline", pipeline]
    if cache:
        extra += ["--cache", cache]
    procs = []
    for r in range(k):
        cmd = [sys.executable, __file__, "--trainer", "--system", system,
               "--prefixes", json.dumps(prefixes), "--seconds",
               repr(a.seconds), "--rank", str(r), "--world", str(k), "--batch", str(a.batch),
               "--seq-len", str(a.seq_len)] + extra
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, env=dict(os.environ, OMP_NUM_THREADS="1")))
    for p in procs:  # every trainer has its first batch (workers started, index loaded)
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit(f"trainer failed ({system} k={k}): {line!r}")
    t0 = time.time() + a.warmup
    for p in procs:
        p.stdin.write(f"{t0!r}\n")
        p.stdin.flush()
    base = [p.pid for p in procs] + ([daemon.proc.pid] if daemon else [])
    while time.time() < t0:
        time.sleep(0.01)
    before = cpu_snapshot(children_of(base))
    tcpu0 = {p.pid: proc_cpu(p.pid) for p in procs}
    time.sleep(a.seconds)
    after = cpu_snapshot(children_of(base))
    tcpu1 = {p.pid: proc_cpu(p.pid) for p in procs}
    cpu = sum(c - before.get(p, 0.0) for p, c in after.items())
    tcpu = sum((tcpu1[p] or 0) - (tcpu0[p] or 0) for p in tcpu0)
    samples = 0
    for p in procs:
        line = p.stdout.readline()
        try:
            samples += json.loads(line)["samples"]
        except ValueError:
            raise SystemExit(f"trainer failed ({system} k={k}): {line!r}")
    for p in procs:
        p.stdin.close()
        p.wait(60)
    return {"system": system, "k": k, "samples": samples, "samples_per_s": samples / a.seconds,
            "cpu_s_per_1000": cpu / samples * 1000 if samples else float("inf"),
            "trainer_cpu_s_per_1000": tcpu / samples * 1000 if samples else float("inf")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--prefixes", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--pipeline", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--dir", default="/tmp/loaderd-llm-bench")
    ap.add_argument("--tokens", type=float, default=2e9)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--warmup", type=float, default=3,
                    help="seconds between every trainer's first batch and the window")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true",
                    help="a small corpus (2e7 tokens, 8 shards), 4 s windows: a smoke run")
    a = ap.parse_args()
    if a.trainer:
        return trainer(a)
    if a.quick:
        a.tokens, a.shards, a.seconds, a.warmup = 2e7, 8, 4, 1
        a.dir = a.dir.rstrip("/") + "-quick"
    a.tokens = int(a.tokens)
    os.makedirs(a.dir, exist_ok=True)
    prefixes = make_corpus(a)
    warm(prefixes)
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    import loaderd
    out = {"tokens": a.tokens, "shards": a.shards, "seq_len": a.seq_len, "batch": a.batch,
           "ranks": a.ranks, "seconds": a.seconds, "results": []}
    res = out["results"]

    # index build: megatron-core, empty cache (its modules imported first)
    import megatron.core.datasets.blended_megatron_dataset_builder  # noqa: F401
    import megatron.core.datasets.gpt_dataset  # noqa: F401
    mcache = tempfile.mkdtemp(prefix="mcore-cache-", dir=a.dir)
    t = time.time()
    ds = megatron_train(prefixes, a.seq_len, mcache)
    mbuild = time.time() - t
    nsamples = len(ds)
    del ds
    # loaderd: empty cache_dir, then a second pipeline over the same index
    lcache = tempfile.mkdtemp(prefix="loaderd-cache-", dir=a.dir)
    daemon = Daemon(a.build, a.dir, lcache)
    try:
        with loaderd.Client(daemon.socket) as c:
            t = time.time()
            c.create_pipeline(loaderd_spec("llm", prefixes, a))
            lbuild = time.time() - t
            t = time.time()
            c.create_pipeline(loaderd_spec("llm-again", prefixes, a))
            lreuse = time.time() - t
            c.drop_pipeline("llm-again")
        out.update(train_samples=nsamples, megatron_build_s=mbuild, loaderd_build_s=lbuild,
                   loaderd_reuse_s=lreuse)
        print(f"index build: megatron-core {mbuild:.2f} s, loaderd {lbuild:.2f} s "
              f"({mbuild / lbuild:.1f}x), reused by a second pipeline {lreuse:.3f} s; "
              f"{nsamples} train samples", flush=True)
        res.append(run_trainers(a, "loaderd", 1, prefixes, daemon, "llm"))
        res.append(run_trainers(a, "loaderd", a.ranks, prefixes, daemon, "llm"))
    finally:
        daemon.stop()
    res.append(run_trainers(a, "megatron", 1, prefixes, cache=mcache))
    res.append(run_trainers(a, "nanogpt", 1, prefixes))
    res.append(run_trainers(a, "megatron", a.ranks, prefixes, cache=mcache))
    shutil.rmtree(mcache, ignore_errors=True)
    shutil.rmtree(lcache, ignore_errors=True)

    print(f"{'system':10} {'ranks':>5} {'samples/s':>10} {'trainer CPU s/1000':>19} "
          f"{'CPU s/1000':>11}")
    for r in res:
        print(f"{r['system']:10} {r['k']:5d} {r['samples_per_s']:10.0f} "
              f"{r['trainer_cpu_s_per_1000']:19.3f} {r['cpu_s_per_1000']:11.3f}")

    def rate(system, k):
        return next(r["samples_per_s"] for r in res if r["system"] == system and r["k"] == k)
    ratios = {
        "1 trainer, loaderd / megatron-core": rate("loaderd", 1) / rate("megatron", 1),
        "1 trainer, loaderd / nanoGPT get_batch": rate("loaderd", 1) / rate("nanogpt", 1),
        f"{a.ranks} ranks, loaderd / megatron-core": rate("loaderd", a.ranks) /
        rate("megatron", a.ranks),
        "index build, megatron-core / loaderd": mbuild / lbuild,
    }
    out["ratios"] = ratios
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
