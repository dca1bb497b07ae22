# SPDX-License-Identifier: MIT
"""Megatron-LM's --data-path end to end (docs/spec.md, "Megatron-LM's
--data-path"): a blend of megatron parts, or a megatron source's
"prefixes", against megatron-core 0.16's own BlendedMegatronDatasetBuilder
(GPTDataset, [N, V, T]) on the same corpora, split, seed and seq_len:
every subset's samples (tokens, labels, loss_mask, position_ids) equal,
sample for sample, in megatron's order (shuffle false); the blend's
per-part counts in status equal to megatron's dataset_index counts; the
canonical form, and the exact errors of parts split unlike each other."""

import gc
import os
import subprocess

import numpy as np
import pytest

import loaderd
from conftest import LOADERCTL, Daemon
from loaderd_harness import create_at_once

mcore = pytest.importorskip("megatron.core.datasets.gpt_dataset")
torch = pytest.importorskip("torch")
from megatron.core.datasets.blended_dataset import BlendedDataset  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import (  # noqa: E402
    BlendedMegatronDatasetBuilder)
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # noqa: E402

FIELDS = ("tokens", "labels", "loss_mask", "position_ids")
SUBSETS = ("train", "valid", "test")
VOCAB, EOD, PAD = 250, 0, 251


@pytest.fixture
def mld(workdir):
    d = Daemon(workdir, args=("--cache-dir", os.path.join(workdir, "cache")))
    yield d
    gc.collect()
    d.stop()


class Tok:
    """What GPTDatasetConfig asks of a tokenizer."""

    def __init__(self):
        self.vocab_size, self.eod, self.pad = VOCAB, EOD, PAD
        self.unique_identifiers = {"class": "Tok", "vocab": VOCAB, "eod": EOD, "pad": PAD}


def corpus(prefix, dtype, ndocs, seed):
    """A .bin/.idx pair by megatron-core's builder: documents of 1..59 tokens."""
    rng = np.random.default_rng(seed)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for _ in range(ndocs):
        t = rng.integers(0, VOCAB, size=int(rng.integers(1, 60)))
        b.add_document(torch.from_numpy(t), [len(t)])
    b.finalize(prefix + ".idx")
    return prefix


def corpora(workdir):
    """3 prefixes in 3 dtypes, of unlike lengths (c is small: a weighted
    train size takes it through several epochs)."""
    d = os.path.join(workdir, "corpus")
    os.makedirs(d)
    return [corpus(os.path.join(d, "a"), np.uint16, 300, 1),
            corpus(os.path.join(d, "b"), np.int32, 180, 2),
            corpus(os.path.join(d, "c"), np.uint8, 60, 3)]


def builder(prefixes, weights, sizes, L, seed, split, surplus=None):
    """megatron-core's datasets [train, valid, test]; no index cache path:
    BlendedDataset then needs no torch.distributed (GPTDataset writes its
    cache beside the corpus, in the test's directory)."""
    kw = {} if surplus is None else {"mid_level_dataset_surplus": surplus}
    cfg = mcore.GPTDatasetConfig(random_seed=seed, sequence_length=L,
                                 blend=(prefixes, weights), split=split, path_to_cache=None,
                                 tokenizer=Tok(), reset_position_ids=False,
                                 reset_attention_mask=False, eod_mask_loss=False,
                                 create_attention_mask=False, **kw)
    return BlendedMegatronDatasetBuilder(mcore.GPTDataset, sizes, lambda: True, cfg).build()


def read(ld, name, source, batch_size=16):
    spec = {"name": name, "source": source, "batch_size": batch_size}
    out = {}
    with loaderd.DataLoader(spec, socket=ld.socket) as dl:
        for b in dl:
            for k in FIELDS:
                out.setdefault(k, []).append(b[k].numpy().copy())
    return {k: np.concatenate(v) for k, v in out.items()}


def assert_same(ds, got):
    n = len(ds)
    assert got["tokens"].shape[0] == n, (got["tokens"].shape, n)
    for i in range(n):
        want = ds[i]
        for k in FIELDS:
            w = want[k].numpy()
            assert got[k][i].dtype == w.dtype, (k, got[k][i].dtype, w.dtype)
            assert got[k][i].tobytes() == w.tobytes(), (i, k, got[k][i], w)


def counts(ds, nparts):
    return np.bincount(np.asarray(ds.dataset_index), minlength=nparts).tolist()


def mg_part(prefix, L, seed, split, subset):
    return {"kind": "megatron", "prefix": prefix, "seq_len": L, "seed": seed, "split": split,
            "subset": subset, "eod": EOD, "pad": PAD}


CASES = [  # weights, [N, V, T], seq_len, seed, split
    ([0.3, 0.5, 0.2], [900, 60, 20], 16, 1234, "80,15,5"),
    ([1, 2, 7], [1500, 90, 30], 9, 7, "90,6,4"),   # c: 1050 samples, several epochs
]


@pytest.mark.parametrize("case", CASES, ids=["w352", "w127"])
def test_weighted_blend_equals_the_builder(mld, workdir, case):
    """--data-path 0.3 a 0.5 b 0.2 c --split S --train-samples N (valid and
    test sized V, T): the blend with min_size, parts each a megatron prefix."""
    weights, sizes, L, seed, split = case
    prefixes = corpora(workdir)
    dss = builder(prefixes, weights, sizes, L, seed, split)
    for which, ds, size in zip(SUBSETS, dss, sizes):
        assert isinstance(ds, BlendedDataset)
        src = {"kind": "blend", "weights": weights, "min_size": size,
               "sources": [mg_part(p, L, seed, split, which) for p in prefixes]}
        got = read(mld, "b-" + which, src)
        assert_same(ds, got)
        st = mld.pipeline("b-" + which)
        assert [p["samples_per_epoch"] for p in st["source"]["parts"]] == counts(ds, 3)
        # each part was asked what the builder asked of its GPTDataset
        asked = [p["num_samples"] for p in st["spec"]["source"]["sources"]]
        assert asked == [d.num_samples for d in ds.datasets]
        assert [p["samples"] for p in st["source"]["parts"]] == [len(d) for d in ds.datasets]
    # the train size takes c through more than one epoch
    c = dss[0].datasets[2]
    assert len(c.document_index) >= 2 * len(c.indices)


def test_prefixes_with_weights_equal_the_builder(mld, workdir):
    """The same through a megatron source's prefixes, weights and
    num_samples; and a surplus of its own."""
    prefixes = corpora(workdir)
    weights, L, seed, split = [2, 5, 3], 12, 99, "70,20,10"
    dss = builder(prefixes, weights, [700, 80, 40], L, seed, split, surplus=0.05)
    for which, ds, n in zip(SUBSETS, dss, (700, 80, 40)):
        src = {"kind": "blend", "weights": weights, "min_size": n, "surplus": 0.05,
               "sources": [mg_part(p, L, seed, split, which) for p in prefixes]}
        assert_same(ds, read(mld, "s-" + which, src))
    dss = builder(prefixes, weights, [700, 80, 40], L, seed, split)
    for which, ds, n in zip(SUBSETS, dss, (700, 80, 40)):
        src = {"kind": "megatron", "prefixes": prefixes, "weights": weights, "num_samples": n,
               "seq_len": L, "seed": seed, "split": split, "subset": which, "eod": EOD,
               "pad": PAD}
        assert_same(ds, read(mld, "p-" + which, src))
        canon = mld.pipeline("p-" + which)["spec"]["source"]
        assert canon["kind"] == "blend" and canon["min_size"] == n
        assert canon["weights"] == weights and canon["surplus"] == 0.005
        assert [p["prefix"] for p in canon["sources"]] == prefixes
        assert [p["name"] for p in canon["sources"]] == ["a", "b", "c"]


@pytest.mark.parametrize("sizes", [[500, 50, 20], [None, None, None], [10 ** 6, 5, 3]],
                         ids=["capped", "exhaustive", "over"])
def test_unweighted_prefixes_equal_the_builder(mld, workdir, sizes):
    """--data-path a b c: the parts' lengths as weights, one epoch each; the
    size at most their sum, or every sample of every part once."""
    prefixes = corpora(workdir)
    L, seed, split = 10, 5, "85,10,5"
    dss = builder(prefixes, None, sizes, L, seed, split)
    for which, ds, n in zip(SUBSETS, dss, sizes):
        src = {"kind": "megatron", "prefixes": prefixes, "seq_len": L, "seed": seed,
               "split": split, "subset": which, "eod": EOD, "pad": PAD}
        if n is not None:
            src["num_samples"] = n
        got = read(mld, "u-" + which, src)
        assert_same(ds, got)
        st = mld.pipeline("u-" + which)
        assert [p["samples_per_epoch"] for p in st["source"]["parts"]] == counts(ds, 3)
        assert all(p["num_samples"] is None for p in st["spec"]["source"]["sources"])
        assert st["spec"]["source"]["min_size"] == n


def test_single_prefix_is_no_blend(mld, workdir):
    """--data-path a: megatron's builder builds a GPTDataset of num_samples
    N, no BlendedDataset; so does a blend of one unweighted part with
    min_size N; one prefix with a weight is a BlendedDataset of one."""
    a = corpora(workdir)[0]
    L, seed, split = 8, 3, "90,10,0"
    for which, ds in zip(("train", "valid"), builder([a], None, [1000, 40, None], L, seed, split)):
        assert not isinstance(ds, BlendedDataset)
        src = {"kind": "megatron", "prefixes": [a], "seq_len": L, "seed": seed, "split": split,
               "subset": which, "eod": EOD, "pad": PAD, "num_samples": ds.num_samples}
        assert_same(ds, read(mld, "one-" + which, src))
        canon = mld.pipeline("one-" + which)["spec"]["source"]
        assert canon["kind"] == "megatron" and canon["prefix"] == a
        assert_same(ds, read(mld, "oneb-" + which, {
            "kind": "blend", "min_size": ds.num_samples,
            "sources": [mg_part(a, L, seed, split, which)]}))
    ds = builder([a], [1.0], [1000, 40, 1], L, seed, split)[0]
    assert isinstance(ds, BlendedDataset)
    src = {"kind": "megatron", "prefixes": [a], "weights": [1.0], "num_samples": 1000,
           "seq_len": L, "seed": seed, "split": split, "eod": EOD, "pad": PAD}
    assert_same(ds, read(mld, "onew", src))


def test_user_num_samples_kept_and_canonical(mld, workdir):
    """A part's own num_samples is kept; the canonical form, given back, is
    the same pipeline."""
    a, b, _ = corpora(workdir)
    src = {"kind": "blend", "weights": [1, 1], "min_size": 100,
           "sources": [dict(mg_part(a, 8, 1, "1", "train"), num_samples=5000),
                       mg_part(b, 8, 1, "1", "train")]}
    mld.create({"name": "k", "source": src})
    canon = mld.pipeline("k")["spec"]
    assert [p["num_samples"] for p in canon["source"]["sources"]] == [5000, 51]
    mld.create(canon, exist_ok=True)
    mld.create({"name": "k", "source": src}, exist_ok=True)


ERRORS = [
    (lambda a, b: {"kind": "blend", "weights": [1, 1], "min_size": 10,
                   "sources": [mg_part(a, 8, 1, "98,2,0", "train"),
                               mg_part(b, 8, 1, "1", "train")]},
     "spec: source.sources[1].split: \"1\" is not the first megatron part's \"98,2,0\" "
     "(with min_size, megatron's builder gives every part one split, subset, seed and "
     "seq_len)"),
    (lambda a, b: {"kind": "blend", "min_size": 10,
                   "sources": [mg_part(a, 8, 1, "98,2,0", "train"),
                               mg_part(b, 8, 1, "98,2,0", "valid")]},
     "spec: source.sources[1].subset: \"valid\" is not the first megatron part's \"train\" "
     "(with min_size, megatron's builder gives every part one split, subset, seed and "
     "seq_len)"),
    (lambda a, b: {"kind": "blend", "weights": [1, 1], "min_size": 10,
                   "sources": [mg_part(a, 8, 1, "1", "train"), mg_part(b, 9, 1, "1", "train")]},
     "spec: source.sources[1].seq_len: 9 is not the first megatron part's 8 (with min_size, "
     "megatron's builder gives every part one split, subset, seed and seq_len)"),
    (lambda a, b: {"kind": "blend", "weights": [1, 1], "min_size": 10,
                   "sources": [mg_part(a, 8, 1, "1", "train"), mg_part(b, 8, 2, "1", "train")]},
     "spec: source.sources[1].seed: 2 is not the first megatron part's 1 (with min_size, "
     "megatron's builder gives every part one split, subset, seed and seq_len)"),
    (lambda a, b: {"kind": "blend", "weights": [1, 1],
                   "sources": [mg_part(a, 8, 1, "1", "train"), mg_part(b, 9, 1, "1", "train")]},
     "source.sources[1]: field 0 is \"tokens\" int64 [9], but source.sources[0] gives "
     "\"tokens\" int64 [8] (a blend's parts give the same fields)"),
    (lambda a, b: {"kind": "megatron", "prefixes": [a, b], "weights": [1, 2], "seq_len": 8},
     "spec: source.weights: need source.num_samples (megatron's builder: weights need a "
     "size, as --train-samples)"),
    (lambda a, b: {"kind": "megatron", "prefixes": [a, b], "weights": [1], "seq_len": 8,
                   "num_samples": 5},
     "spec: source.weights: must be an array of 2 numbers, one per prefix"),
    (lambda a, b: {"kind": "megatron", "prefixes": [a, b], "weights": [1, 0], "seq_len": 8,
                   "num_samples": 5},
     "spec: source.weights[1]: must be a finite number > 0"),
    (lambda a, b: {"kind": "megatron", "prefixes": [a, 3], "seq_len": 8},
     "spec: source.prefixes[1]: must be a path string"),
    (lambda a, b: {"kind": "megatron", "prefixes": [], "seq_len": 8},
     "spec: source.prefixes: must be an array of 1..32766 prefixes"),
    (lambda a, b: {"kind": "megatron", "prefixes": [a], "prefix": a, "seq_len": 8},
     "spec: source.prefixes: not with source.prefix"),
    (lambda a, b: {"kind": "megatron", "prefixes": [a, b], "seq_len": 8, "split": "x"},
     "spec: source.split: must be up to 3 non-negative weights"),
    (lambda a, b: {"kind": "megatron", "prefixes": [a, b], "seq_len": 8, "seeds": 1},
     "spec: unknown key \"source.seeds\""),
    (lambda a, b: {"kind": "blend", "sources": [{"kind": "megatron", "prefixes": [a, b],
                                                 "seq_len": 8}]},
     "spec: source.sources[0].prefixes: a blend's megatron part has one prefix (list each "
     "as a part)"),
    (lambda a, b: {"kind": "blend", "weights": [1, 1], "min_size": 10, "surplus": -1,
                   "sources": [mg_part(a, 8, 1, "1", "train"), mg_part(b, 8, 1, "1", "train")]},
     "spec: source.surplus: must be a number in 0..10"),
    (lambda a, b: {"kind": "blend", "min_size": 10,
                   "sources": [dict(mg_part(a, 8, 1, "1", "train"), choose=3),
                               mg_part(b, 8, 1, "1", "train")]},
     "spec: source.min_size: not with source.sources[0].choose (they give the samples per "
     "epoch)"),
]


@pytest.mark.parametrize("make,msg", ERRORS)
def test_bad_megatron_blends(mld, workdir, make, msg):
    a, b, _ = corpora(workdir)
    r = mld.create({"name": "bad", "source": make(a, b)}, check=False)
    assert r.returncode != 0 and msg in r.stderr, r.stderr


def blend_files(mld):
    d = os.path.join(mld.dir, "cache")
    return sorted(os.path.join(d, f) for f in os.listdir(d)
                  if f.startswith("blend-") and f.endswith(".index"))


@pytest.mark.parametrize("weights", [[0.3, 0.5, 0.2], None], ids=["weighted", "exhaustive"])
def test_blend_index_cached_and_reused(mld, workdir, weights):
    """The blend's index is built once into cache_dir and reused by the next
    create (status cache says which, and of its parts' indexes); the reused
    index gives megatron's samples as the built one does; a damaged file is
    built again, never read."""
    prefixes = corpora(workdir)
    L, seed, split = 9, 11, "90,6,4"
    n = 700 if weights else None
    ds = builder(prefixes, weights, [n, 40, 20] if weights else [None] * 3, L, seed, split)[0]
    src = {"kind": "megatron", "prefixes": prefixes, "seq_len": L, "seed": seed,
           "split": split, "eod": EOD, "pad": PAD}
    if weights:
        src.update(weights=weights, num_samples=n)
    assert_same(ds, read(mld, "c1", src))
    c = mld.pipeline("c1")["cache"]
    assert c.pop("build_seconds") >= 0
    assert c == {"index": "built", "samples": len(ds), "parts": 3, "parts_built": 3,
                 "parts_reused": 0}
    files = blend_files(mld)
    assert len(files) == 1
    assert_same(ds, read(mld, "c2", src))
    assert mld.pipeline("c2")["cache"] == {"index": "reused", "samples": len(ds), "parts": 3,
                                           "parts_built": 0, "parts_reused": 3}
    # a file of this boot is used as it is (megatron-cache.c); one of another
    # boot (a kernel crash in between may have torn it) is checked whole: a
    # byte flipped fails the checksum and it is built again
    boot = open("/proc/sys/kernel/random/boot_id", "rb").read(36)
    good = open(files[0], "rb").read()
    assert good.count(boot) == 1
    other = good.replace(boot, b"0" * 36)
    flipped = bytearray(other)
    flipped[len(other) // 3] ^= 1
    # an older format's file (version 2: another checksum) of this boot is
    # built again, not read
    assert good[:8] == b"LDRBLIX3"
    older = b"LDRBLIX2" + good[8:]
    for name, data, how in (("c3", flipped, "built"), ("c4", other, "reused"),
                            ("c4v", older, "built")):
        with open(files[0], "wb") as f:
            f.write(data)
        assert_same(ds, read(mld, name, src))
        assert mld.pipeline(name)["cache"]["index"] == how
        assert blend_files(mld) == files
        assert open(files[0], "rb").read() == good  # rebuilt, or made this boot's
    # of this boot, a part number damaged behind the daemon's back: the read
    # says so, never reads outside the parts
    klen = int.from_bytes(good[8:16], "little")
    part0 = 16 + (klen + 7) // 8 * 8 + 16 + 40
    with open(files[0], "r+b") as f:
        f.seek(part0)
        f.write(b"\xff\xff")
    with pytest.raises(loaderd.Error) as e:
        read(mld, "c5", src)
    assert "blend: sample 0: part 65535 out of range (the cached index is damaged)" in \
        e.value.message, e.value.message
    with open(files[0], "wb") as f:
        f.write(good)


def test_blend_index_built_once(mld, workdir):
    """6 creates of one pipeline at once and 2 of other names over the same
    prefixes: the blend's index built once, each part's once (in whichever
    create got there first), one blend file; loaderctl status says which."""
    prefixes = corpora(workdir)
    src = {"kind": "megatron", "prefixes": prefixes, "seq_len": 9, "seed": 3,
           "split": "90,6,4", "eod": EOD, "pad": PAD}
    specs = [{"name": "same", "source": src, "persist": True}] * 6 + \
            [{"name": n, "source": src, "persist": True} for n in ("o1", "o2")]
    assert create_at_once(mld.socket, specs) == []
    states = [mld.pipeline(n)["cache"] for n in ("same", "o1", "o2")]
    assert sorted(s["index"] for s in states) == ["built", "reused", "reused"], states
    assert sum(s["parts_built"] for s in states) == 3, states
    assert sum(s["parts_reused"] for s in states) == 6, states
    assert len(blend_files(mld)) == 1
    n = states[0]["samples"]
    out = subprocess.run([LOADERCTL, "--socket", mld.socket, "status"], capture_output=True,
                         text=True).stdout
    assert out.count("blend index: built in ") == 1, out
    assert out.count(f"blend index: reused, {n} samples; its parts' indexes: ") == 2, out
