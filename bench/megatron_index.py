#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Index build time of a Megatron corpus: megatron-core 0.16's GPTDataset
(document, sample and shuffle indexes, its C++ helper included) against
loaderd's megatron source, on the same generated corpus and parameters
(issue 27: >= 5x faster, built once per node).

    ~/.cache/loaderd/venv-torch/bin/python bench/megatron_index.py \\
        [--build build] [--tokens 200000000] [--shards 1] [--seq-len 2048] \\
        [--epochs 2] [--runs 3]

The corpus (uint16, documents of 1..2000 tokens, written with megatron-core's
IndexedDatasetBuilder, one prefix per shard) is generated once in a
temporary directory. megatron: the wall time of GPTDataset's
_build_document_sample_shuffle_indices() (path_to_cache in a fresh directory
each run, so every run builds). loaderd: the pipeline status's
cache.build_seconds of a create on a daemon whose cache_dir is empty, the
wall time of that create (the .idx read and checked, the index written),
then the wall time of a second create of another name (the index reused). Prints
the median of the runs for each and the ratio.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "client", "python"))


class Tok:
    def __init__(self):
        self.vocab_size, self.eod, self.pad = 65535, 0, 65534
        self.unique_identifiers = {"class": "Tok"}


def make_corpus(d, tokens, shards):
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    rng = np.random.default_rng(0)
    prefixes = []
    for s in range(shards):
        prefix = os.path.join(d, f"shard{s:03d}")
        b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
        left = tokens // shards
        while left > 0:
            lens = rng.integers(1, 2000, size=4096)
            lens = lens[np.cumsum(lens) <= left] if lens.sum() > left else lens
            if len(lens) == 0:
                lens = np.array([left])
            t = rng.integers(0, 65000, size=int(lens.sum()), dtype=np.uint16)
            start = 0
            for n in lens:
                b.add_document(torch.from_numpy(t[start:start + n]), [int(n)])
                start += n
            left -= int(lens.sum())
        b.finalize(prefix + ".idx")
        prefixes.append(prefix)
    return prefixes


def megatron_seconds(prefix, seq_len, num_samples, tmp):
    from megatron.core.datasets import gpt_dataset as g
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    cfg = g.GPTDatasetConfig(random_seed=1234, sequence_length=seq_len, blend=([prefix], None),
                             split="1", path_to_cache=tempfile.mkdtemp(dir=tmp),
                             tokenizer=Tok(), reset_position_ids=False,
                             reset_attention_mask=False, eod_mask_loss=False,
                             create_attention_mask=False)
    t0 = time.perf_counter()
    BlendedMegatronDatasetBuilder(g.GPTDataset, [num_samples, None, None], lambda: True,
                                  cfg).build()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--tokens", type=int, default=200_000_000)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    os.environ["LOADERD_LIBRARY"] = os.path.join(a.build, "client", "libloader.so")
    import loaderd
    tmp = tempfile.mkdtemp(prefix="mg-bench-")
    prefixes = make_corpus(tmp, a.tokens, a.shards)
    num_samples = a.epochs * (a.tokens // a.shards) // a.seq_len - 1
    mc, ld, reuse, create = [], [], [], []
    sock = os.path.join(tmp, "ld.sock")
    for run in range(a.runs):
        cache = tempfile.mkdtemp(dir=tmp)
        d = subprocess.Popen([os.path.join(a.build, "daemon", "loaderd"), "--socket", sock,
                              "--cache-dir", cache], stderr=subprocess.DEVNULL)
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        c = loaderd.Client(socket=sock)
        for i, prefix in enumerate(prefixes):
            mc.append(megatron_seconds(prefix, a.seq_len, num_samples, tmp))
            src = {"kind": "megatron", "prefix": prefix, "seq_len": a.seq_len,
                   "num_samples": num_samples}
            t0 = time.perf_counter()
            c.create_pipeline({"name": f"b{i}", "source": src, "persist": True})
            create.append(time.perf_counter() - t0)
            ld.append(c.pipeline(f"b{i}")["cache"]["build_seconds"])
            t0 = time.perf_counter()
            c.create_pipeline({"name": f"r{i}", "source": src, "persist": True})
            reuse.append(time.perf_counter() - t0)
        c.close()
        d.send_signal(signal.SIGTERM)
        d.wait()
    m, l, r = statistics.median(mc), statistics.median(ld), statistics.median(reuse)
    w = statistics.median(create)
    print(f"corpus: {a.tokens} tokens in {a.shards} shard(s), seq_len {a.seq_len}, "
          f"{num_samples} samples per shard ({a.epochs} epochs)")
    print(f"megatron-core GPTDataset index build: {m:.3f} s (median of {len(mc)})")
    print(f"loaderd index build:                  {l:.3f} s  ({m / l:.1f}x faster)")
    print(f"loaderd whole create (parse, check, build, write the cache): {w:.3f} s "
          f"({m / w:.1f}x faster)")
    print(f"loaderd create reusing the cache:     {r:.3f} s")


if __name__ == "__main__":
    main()
