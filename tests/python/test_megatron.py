# SPDX-License-Identifier: MIT
"""The megatron source kind against megatron-core itself (docs/spec.md,
"source of kind megatron"): corpora written by megatron-core's
IndexedDatasetBuilder in several dtypes, GPTDataset built by its
BlendedMegatronDatasetBuilder on the same files, seed, split, seq_len and
num_samples, and every sample's tokens, labels, loss_mask and position_ids
equal to loaderd's, in megatron's order (shuffle false). Then bad .idx/.bin
pairs: the exact error at create."""

import glob
import os
import stat
import threading

import numpy as np
import pytest

import loaderd

mcore = pytest.importorskip("megatron.core.datasets.gpt_dataset")
torch = pytest.importorskip("torch")
from megatron.core.datasets.blended_megatron_dataset_builder import (  # noqa: E402
    BlendedMegatronDatasetBuilder)
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # noqa: E402
from loaderd_harness import daemon  # noqa: E402,F401  (the fixture)


@pytest.fixture
def mld(daemon, workdir):
    """A daemon whose cache_dir is the test's own."""
    return daemon("--cache-dir", os.path.join(workdir, "cache"))


class Tok:
    """What GPTDatasetConfig asks of a tokenizer."""

    def __init__(self, vocab, eod, pad):
        self.vocab_size, self.eod, self.pad = vocab, eod, pad
        self.unique_identifiers = {"class": "Tok", "vocab": vocab, "eod": eod, "pad": pad}


def corpus(prefix, dtype, ndocs, vocab, seed, seqs_per_doc=1, eod=None):
    """A .bin/.idx pair by megatron-core's builder: documents of 1..60 tokens
    (some of several sequences), ending in eod when given."""
    rng = np.random.default_rng(seed)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for _ in range(ndocs):
        lens = [int(x) for x in rng.integers(1, 60, size=int(rng.integers(1, seqs_per_doc + 1)))]
        t = rng.integers(0, vocab, size=sum(lens))
        if eod is not None:
            t[-1] = eod
        b.add_document(torch.from_numpy(t), lens)
    b.finalize(prefix + ".idx")
    return prefix


def megatron_splits(prefix, tmp, seq_len, seed, split, sizes, tok, **kw):
    cfg = mcore.GPTDatasetConfig(random_seed=seed, sequence_length=seq_len, blend=([prefix], None),
                                 split=split, path_to_cache=os.path.join(tmp, "mcore-cache"),
                                 tokenizer=tok, reset_position_ids=kw.get("reset_position_ids", False),
                                 reset_attention_mask=False,
                                 eod_mask_loss=kw.get("eod_mask_loss", False),
                                 create_attention_mask=False,
                                 add_extra_token_to_sequence=kw.get("add_extra_token", True))
    return BlendedMegatronDatasetBuilder(mcore.GPTDataset, sizes, lambda: True, cfg).build()


def loaderd_samples(ld, name, src, batch_size=5):
    spec = {"name": name, "source": dict(kind="megatron", **src), "batch_size": batch_size}
    out = {}
    with loaderd.DataLoader(spec, socket=ld.socket) as dl:
        for b in dl:
            for k in ("tokens", "labels", "loss_mask", "position_ids"):
                out.setdefault(k, []).append(b[k].numpy().copy())
    return {k: np.concatenate(v) for k, v in out.items()}


def assert_same(ds, got):
    n = len(ds)
    assert got["tokens"].shape[0] == n
    for i in range(n):
        want = ds[i]
        for k in ("tokens", "labels", "loss_mask", "position_ids"):
            w = want[k].numpy()
            assert got[k][i].dtype == w.dtype, (k, got[k][i].dtype, w.dtype)
            assert got[k][i].tobytes() == w.tobytes(), (i, k, got[k][i], w)


CASES = [  # dtype, documents, sequences per document, vocab, seed, seq_len, split, sizes
    (np.uint16, 300, 1, 50000, 1234, 32, "969,30,1", [None, None, None]),
    (np.int32, 200, 3, 200000, 7, 17, "80,15,5", [900, 40, 7]),
    (np.int64, 120, 1, 1 << 40, 99, 8, "1", [1000, None, None]),
    (np.uint8, 150, 2, 256, 5, 16, "60,40,0", [200, 300, None]),
    (np.int8, 100, 1, 100, 11, 9, "50,25,25", [None, 400, 50]),
    (np.int16, 100, 1, 30000, 3, 31, "100,0,0", [150, None, None]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0].__name__)
def test_megatron_equals_gptdataset(mld, workdir, case):
    dtype, ndocs, spd, vocab, seed, L, split, sizes = case
    prefix = corpus(os.path.join(workdir, "c"), dtype, ndocs, vocab, seed, spd)
    tok = Tok(vocab, 0, vocab + 1)
    dss = megatron_splits(prefix, workdir, L, seed, split, sizes, tok)
    for which, ds, size in zip(("train", "valid", "test"), dss, sizes):
        if ds is None or len(ds) == 0:  # megatron's empty subset: loaderd's error at create
            continue
        src = {"prefix": prefix, "seq_len": L, "seed": seed, "split": split, "subset": which,
               "pad": vocab + 1, "eod": 0}
        if size is not None:
            src["num_samples"] = size
        got = loaderd_samples(mld, "m-" + which, src)
        assert_same(ds, got)


def test_megatron_masks_no_extra_token_pad(mld, workdir):
    """eod_mask_loss, reset_position_ids, add_extra_token false (labels end in
    pad, masked) and a num_samples of 1.5 epochs (the final epoch apart)."""
    prefix = corpus(os.path.join(workdir, "m"), np.uint16, 80, 1000, 2, eod=7)
    tok = Tok(1000, 7, 999)
    kw = dict(eod_mask_loss=True, reset_position_ids=True, add_extra_token=False)
    ds = megatron_splits(prefix, workdir, 24, 42, "1", [0, None, None], tok, **kw)[0]
    n1 = len(ds)
    ds = megatron_splits(prefix, workdir, 24, 42, "1", [n1 + n1 // 2, None, None], tok, **kw)[0]
    src = {"prefix": prefix, "seq_len": 24, "seed": 42, "num_samples": n1 + n1 // 2,
           "eod": 7, "pad": 999, **kw}
    got = loaderd_samples(mld, "masks", src, batch_size=7)
    assert_same(ds, got)


def index_state(client, name):
    return client.pipeline(name)["cache"]


def test_megatron_index_built_once(mld, workdir):
    """8 creates of one pipeline at once and 2 more pipelines of other names
    over the same corpus and parameters: one build, one cache file (0600),
    the others reuse it; a new daemon on the same cache_dir reuses it too;
    another seed is another index."""
    prefix = corpus(os.path.join(workdir, "c"), np.uint16, 3000, 50000, 1)
    src = {"kind": "megatron", "prefix": prefix, "seq_len": 64, "seed": 5, "num_samples": 5000}
    specs = [{"name": "same", "source": src, "persist": True}] * 8 + \
            [{"name": n, "source": src, "persist": True} for n in ("other1", "other2")]
    errors, barrier = [], threading.Barrier(len(specs))

    def create(spec):
        try:
            c = loaderd.Client(socket=mld.socket)
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
    assert errors == []
    c = loaderd.Client(socket=mld.socket)
    states = [index_state(c, n) for n in ("same", "other1", "other2")]
    assert sorted(s["index"] for s in states) == ["built", "reused", "reused"], states
    built = [s for s in states if s["index"] == "built"][0]
    assert built["build_seconds"] >= 0 and "note" not in built
    files = glob.glob(os.path.join(workdir, "cache", "megatron-*.index"))
    assert len(files) == 1
    st = os.stat(files[0])
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(os.path.join(workdir, "cache")).st_mode) == 0o700

    c.create_pipeline({"name": "seed6", "source": dict(src, seed=6)})
    assert index_state(c, "seed6")["index"] == "built"
    assert len(glob.glob(os.path.join(workdir, "cache", "megatron-*.index"))) == 2
    c.close()


def test_megatron_cache_survives_restart_and_changed_files(daemon, workdir):
    cache = os.path.join(workdir, "cache")
    prefix = corpus(os.path.join(workdir, "c"), np.int32, 200, 1000, 3)
    spec = {"name": "m", "source": {"kind": "megatron", "prefix": prefix, "seq_len": 16},
            "batch_size": 8}
    d1 = daemon("--cache-dir", cache)
    c = loaderd.Client(socket=d1.socket)
    c.create_pipeline(spec)
    assert index_state(c, "m")["index"] == "built"
    c.close()
    d1.stop()
    d2 = daemon("--cache-dir", cache)
    c = loaderd.Client(socket=d2.socket)
    c.create_pipeline(spec)
    assert index_state(c, "m")["index"] == "reused"
    c.drop_pipeline("m")
    # the corpus rewritten (new inode, size, mtime): built again, and still right
    corpus(prefix, np.int32, 210, 1000, 4)
    c.create_pipeline(spec)
    assert index_state(c, "m")["index"] == "built"
    c.close()
