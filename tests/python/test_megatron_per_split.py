# SPDX-License-Identifier: MIT
"""Megatron-LM's pretrain_gpt.py data arguments end to end (docs/spec.md,
"Megatron-LM's --data-path"), against megatron-core 0.16's own
BlendedMegatronDatasetBuilder as pretrain_gpt.py calls it:

- `--train-data-path 0.7 a 0.3 b --valid-data-path c --test-data-path d`
  (megatron-core's blend_per_split, no --split), with the sample counts
  Megatron-LM asks the builder for from --train-iters, --global-batch-size,
  --eval-iters and --eval-interval: one loaderd pipeline per subset as the
  docs write it, every sample equal to megatron's dataset for that subset
  (every sample of it, its data wrapping into a second epoch and more), and
  2 partition ranks' rows the positions docs/spec.md's Partition gives them;
- `--data-path 0.7 a 0.3 b --split 969,30,1` with the same counts: the test
  share one document of each corpus, one of them shorter than a sample.
The single-prefix --split 969,30,1 of one epoch is test_megatron.py's."""

import os

import numpy as np
import pytest

import loaderd

mcore = pytest.importorskip("megatron.core.datasets.gpt_dataset")
torch = pytest.importorskip("torch")
from megatron.core.datasets.blended_dataset import BlendedDataset  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import (  # noqa: E402
    BlendedMegatronDatasetBuilder)
from test_megatron_blend import (EOD, FIELDS, PAD, SUBSETS, Tok, corpus,  # noqa: E402
                                 mld)  # noqa: F401 (the fixture: a daemon with a cache dir)

SEQ_LEN, SEED = 16, 4321
# Megatron-LM's arguments of the run
TRAIN_ITERS, GLOBAL_BATCH_SIZE, EVAL_ITERS, EVAL_INTERVAL = 25, 8, 3, 10


def train_valid_test_num_samples():
    """Megatron-LM's megatron/training/training.py,
    get_train_valid_test_num_samples() (no --train-samples, no
    --full-validation): what pretrain_gpt.py's
    train_valid_test_datasets_provider hands BlendedMegatronDatasetBuilder."""
    train_samples = TRAIN_ITERS * GLOBAL_BATCH_SIZE
    eval_iters = (TRAIN_ITERS // EVAL_INTERVAL + 1) * EVAL_ITERS
    test_iters = EVAL_ITERS
    return [train_samples, eval_iters * GLOBAL_BATCH_SIZE, test_iters * GLOBAL_BATCH_SIZE]


@pytest.fixture
def one_rank(monkeypatch):
    """BlendedDataset with a path_to_cache asks torch.distributed.get_rank()
    whether to build its index: rank 0 of a run that has no process group."""
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a, **k: 0)


def build(workdir, sizes, **blends):
    """pretrain_gpt.py's core_gpt_dataset_config_from_args and
    BlendedMegatronDatasetBuilder(GPTDataset, sizes, ...).build(): the index
    caches in path_to_cache (--data-cache-path), not beside the corpus."""
    cfg = mcore.GPTDatasetConfig(random_seed=SEED, sequence_length=SEQ_LEN,
                                 path_to_cache=os.path.join(workdir, "mcore-cache"),
                                 tokenizer=Tok(), reset_position_ids=False,
                                 reset_attention_mask=False, eod_mask_loss=False,
                                 create_attention_mask=False, **blends)
    return BlendedMegatronDatasetBuilder(mcore.GPTDataset, sizes, lambda: True, cfg).build()


def read(ld, name, source, batch_size=8, **kw):
    spec = {"name": name, "source": source, "batch_size": batch_size}
    out = {}
    with loaderd.DataLoader(spec, socket=ld.socket, **kw) as dl:
        for b in dl:
            for k in FIELDS:
                out.setdefault(k, []).append(b[k].numpy().copy())
    return {k: np.concatenate(v) for k, v in out.items()}


def assert_rows(ds, got, positions):
    """Row j of what loaderd delivered is megatron's ds[positions[j]]."""
    assert got["tokens"].shape[0] == len(positions), (got["tokens"].shape, len(positions))
    for j, i in enumerate(positions):
        want = ds[i]
        for k in FIELDS:
            w = want[k].numpy()
            assert got[k][j].dtype == w.dtype, (k, got[k][j].dtype, w.dtype)
            assert got[k][j].tobytes() == w.tobytes(), (j, i, k, got[k][j], w)


def assert_same_and_ranks(ld, name, src, ds):
    """The subset's pipeline is megatron's dataset, sample for sample; rank r
    of 2 reads positions r, r+2, ... wrapping to pad (docs/spec.md, Partition)."""
    n = len(ds)
    assert_rows(ds, read(ld, name, src), range(n))
    for r in range(2):
        got = read(ld, name, src, rank=r, world_size=2)
        assert_rows(ds, got, [(r + 2 * j) % n for j in range(-(-n // 2))])


def wraps(gpt):
    """megatron's GPTDataset reads its documents in two epochs or more."""
    return len(gpt.document_index) >= 2 * len(gpt.indices)


def test_blend_per_split_equals_pretrain_gpt(mld, workdir, one_rank):
    """--train-data-path 0.7 a 0.3 b --valid-data-path c --test-data-path d:
    train the prefixes and weights with num_samples, valid and test a prefix
    each with theirs, the default split "1" (the whole of each prefix)."""
    d = os.path.join(workdir, "corpus")
    os.makedirs(d)
    a = corpus(os.path.join(d, "a"), np.uint16, 300, 1)
    b = corpus(os.path.join(d, "b"), np.int32, 25, 2)
    c = corpus(os.path.join(d, "c"), np.uint8, 20, 3)
    t = corpus(os.path.join(d, "d"), np.int16, 10, 4)
    sizes = train_valid_test_num_samples()
    assert sizes == [200, 72, 24]
    dss = build(workdir, sizes, blend_per_split=[([a, b], [0.7, 0.3]), ([c], None), ([t], None)])
    assert isinstance(dss[0], BlendedDataset)
    assert not isinstance(dss[1], BlendedDataset) and not isinstance(dss[2], BlendedDataset)
    # each subset's data runs past one epoch: b in train, c and d whole
    assert wraps(dss[0].datasets[1]) and wraps(dss[1]) and wraps(dss[2])
    common = {"kind": "megatron", "seq_len": SEQ_LEN, "seed": SEED, "eod": EOD, "pad": PAD}
    sources = [dict(common, prefixes=[a, b], weights=[0.7, 0.3], num_samples=sizes[0]),
               dict(common, prefix=c, num_samples=sizes[1]),
               dict(common, prefix=t, num_samples=sizes[2])]
    for which, ds, src in zip(SUBSETS, dss, sources):
        assert_same_and_ranks(mld, "ps-" + which, src, ds)
    assert len(dss[0]) == sum(-(-sizes[0] * w // 10) for w in (7, 3))
    assert mld.pipeline("ps-train")["spec"]["source"]["sources"][0]["split"] == "1,0,0"


def test_split_969_30_1_equals_pretrain_gpt(mld, workdir, one_rank):
    """--data-path 0.7 a 0.3 b --split 969,30,1 (Megatron-LM's legacy
    default split) with the same counts: one pipeline per subset; the test
    subset is one document of each corpus, read for many epochs."""
    d = os.path.join(workdir, "corpus")
    os.makedirs(d)
    a = corpus(os.path.join(d, "a"), np.uint16, 600, 5)
    b = corpus(os.path.join(d, "b"), np.uint8, 600, 6)
    sizes = train_valid_test_num_samples()
    dss = build(workdir, sizes, blend=([a, b], [0.7, 0.3]), split="969,30,1")
    # 600 documents: [581, 599) valid, [599, 600) test
    assert [len(x.indices) for x in dss[1].datasets + dss[2].datasets] == [18, 18, 1, 1]
    assert wraps(dss[1].datasets[0]) and all(wraps(x) for x in dss[2].datasets)
    # a's test document is shorter than one sample: read over many epochs
    assert int(dss[2].datasets[0].dataset.sequence_lengths[599]) < SEQ_LEN + 1
    for which, ds, n in zip(SUBSETS, dss, sizes):
        assert isinstance(ds, BlendedDataset)
        src = {"kind": "megatron", "prefixes": [a, b], "weights": [0.7, 0.3], "num_samples": n,
               "split": "969,30,1", "subset": which, "seq_len": SEQ_LEN, "seed": SEED,
               "eod": EOD, "pad": PAD}
        assert_same_and_ranks(mld, "sp-" + which, src, ds)
