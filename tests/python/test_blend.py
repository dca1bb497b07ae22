# SPDX-License-Identifier: MIT
"""The blend source (docs/spec.md, "`source` of kind `blend`"): its order is
megatron-core's BlendedDataset's, computed here by megatron-core itself
(importorskip: the venv pass); per-part counts within one sample of the
weights and exact in status and /metrics; partition ranks' union is the
epoch; bad blends are refused at create with exact messages.

Every part's samples say who they are: npy parts hold, in "input"[0], the
value 100000 * (part + 1) + sample; the tokens part's file holds token
1000 + j at position j, so its sample k starts with 1000 + 4k."""

import json
import http.client
import os
import socket
import subprocess

import numpy as np
import pytest

import loaderd
from conftest import LOADERD, Daemon, child_env

L = 4  # seq_len of every part


def npy_part(d, p, n):
    """An npy part of n samples with fields input, target (int64 [L])."""
    os.makedirs(d, exist_ok=True)
    base = 100000 * (p + 1) + np.arange(n, dtype=np.int64)
    x = np.repeat(base[:, None], L, axis=1)
    np.save(os.path.join(d, "input.npy"), x)
    np.save(os.path.join(d, "target.npy"), -x)
    return {"kind": "npy", "paths": [os.path.join(d, "input.npy"), os.path.join(d, "target.npy")]}


def tokens_part(d, n):
    """A tokens part of n samples of seq_len L."""
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tok.bin")
    (1000 + np.arange(n * L + 1)).astype(np.uint16).tofile(path)
    return {"kind": "tokens", "path": path, "seq_len": L}


def who(v, tok_part):
    """(part, sample) of a sample's input[0]."""
    v = int(v)
    if v >= 100000:
        return v // 100000 - 1, v % 100000
    return tok_part, (v - 1000) // L


def parts3(workdir, sizes=(150, 90, 120)):
    """npy, npy, tokens parts; the tokens one is part 2."""
    return [npy_part(os.path.join(workdir, "a"), 0, sizes[0]),
            npy_part(os.path.join(workdir, "b"), 1, sizes[1]),
            tokens_part(os.path.join(workdir, "t"), sizes[2])], 2


def read_all(ld, spec, **kw):
    out = []
    with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True, **kw) as dl:
        for batch in dl:
            out.extend(np.asarray(batch["input"])[:, 0].tolist())
    return out


def blend_spec(name, sources, **src):
    s = {"kind": "blend", "sources": sources}
    s.update(src)
    return {"name": name, "source": s, "batch_size": 8}


# ------------------------------------------------- megatron-core's own order

class Part:
    """What BlendedDataset asks of a dataset: len(), index_split and
    unique_identifiers (its description)."""

    def __init__(self, n, i):
        from megatron.core.datasets.utils import Split
        self.n, self.index_split = n, Split.train
        self.unique_identifiers = {"part": i, "n": n}

    def __len__(self):
        return self.n


def megatron_order(lens, weights, size):
    """(dataset_index, dataset_sample_index % lens[index]) of megatron-core's
    BlendedDataset, path_to_cache None (no torch.distributed). Its parts are
    given as long enough for what it takes (it raises IndexError where the
    blend takes more than a part has; loaderd runs through the part again)."""
    pytest.importorskip("megatron.core.datasets.blended_dataset")
    from megatron.core.datasets.blended_dataset import BlendedDataset
    from megatron.core.datasets.blended_megatron_dataset_config import \
        BlendedMegatronDatasetConfig
    cfg = BlendedMegatronDatasetConfig(random_seed=0, sequence_length=L, split="1,0,0")
    bd = BlendedDataset([Part(1 << 40, i) for i in range(len(lens))], weights, size, cfg)
    return [(int(a), int(b) % lens[a]) for a, b in zip(bd.dataset_index, bd.dataset_sample_index)]


def test_weights_and_size_match_blended_dataset(ld, workdir):
    pytest.importorskip("megatron.core.datasets.blended_dataset")
    sources, tok = parts3(workdir)
    weights = [0.3, 0.5, 0.2]
    spec = blend_spec("w", sources, weights=weights, size=301)
    got = [who(v, tok) for v in read_all(ld, spec)]
    assert got == megatron_order([150, 90, 120], weights, 301)
    # within one sample of the weights
    counts = [sum(1 for p, _ in got if p == i) for i in range(3)]
    for i, w in enumerate(weights):
        assert abs(counts[i] - w * 301) <= 1
    # status: exact, for one epoch read by loaderctl consume
    ld.create(dict(spec, name="w1", epochs=1))
    assert ld.consume("w1").json["batches"] == 38
    st = ld.pipeline("w1")
    assert st["samples"] == 301
    parts = st["source"]["parts"]
    assert [p["samples_per_epoch"] for p in parts] == counts
    assert [p["samples_read"] for p in parts] == counts
    assert [p["name"] for p in parts] == ["input.npy", "input.npy", "tok.bin"]
    assert [p["kind"] for p in parts] == ["npy", "npy", "tokens"]
    assert [p["samples"] for p in parts] == [150, 90, 120]


def builder_order(lens, weights, target):
    """The blend BlendedMegatronDatasetBuilder builds for blend (parts,
    weights) and sizes [target, 0, 0], its parts stand-ins of the
    lengths it asks for; (dataset_index, dataset_sample_index % lens), and
    the num_samples it asked of each part."""
    pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_builder")
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.blended_megatron_dataset_config import \
        BlendedMegatronDatasetConfig
    from megatron.core.datasets.megatron_dataset import MegatronDataset

    asked = {}

    class StandIn(MegatronDataset):
        @staticmethod
        def numel_low_level_dataset(low_level_dataset):
            return low_level_dataset

        @staticmethod
        def build_low_level_dataset(dataset_path, config):
            return 1000

        def __len__(self):
            asked[self.dataset_path] = self.num_samples
            return self.num_samples

        def __getitem__(self, idx):
            raise NotImplementedError

    prefixes = [f"part{i}" for i in range(len(lens))]
    cfg = BlendedMegatronDatasetConfig(random_seed=0, sequence_length=L, split="1,0,0",
                                       blend=(prefixes, weights))
    bd = BlendedMegatronDatasetBuilder(StandIn, [target, 0, 0], lambda: True, cfg).build()[0]
    order = [(int(a), int(b) % lens[a]) for a, b in zip(bd.dataset_index, bd.dataset_sample_index)]
    return order, [asked[p] for p in prefixes]


def test_min_size_matches_the_builder(ld, workdir):
    """min_size: Megatron-LM's --train-samples through its builder."""
    pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_builder")
    sources, tok = parts3(workdir)
    weights = [0.3, 0.5, 0.2]
    spec = blend_spec("ms", sources, weights=weights, min_size=299)
    got = [who(v, tok) for v in read_all(ld, spec)]
    want, asked = builder_order([150, 90, 120], weights, 299)
    assert len(want) == 300 and got == want  # ceil(89.7) + ceil(149.5) + ceil(59.8)
    assert asked == [91, 151, 61]  # ceil(ceil(N w) * 1.005): what a megatron part will build
    st = ld.pipeline("ms")
    assert st["samples"] == 300 and st["spec"]["source"]["min_size"] == 299
    rng = np.random.default_rng(3)
    weights = [float(w) for w in rng.random(3) * 10]
    got = [who(v, tok) for v in read_all(ld, blend_spec("ms2", sources, weights=weights,
                                                        min_size=1000))]
    assert got == builder_order([150, 90, 120], weights, 1000)[0]


def test_exhaustive_and_choose_match_blended_dataset(ld, workdir):
    pytest.importorskip("megatron.core.datasets.blended_dataset")
    sources, tok = parts3(workdir, (37, 11, 25))
    # no weights, no size: every sample of every part once (megatron's builder
    # passes the parts' lengths as weights, size None)
    got = [who(v, tok) for v in read_all(ld, blend_spec("all", sources))]
    assert got == megatron_order([37, 11, 25], [37, 11, 25], None)
    # choose: megatron's integer weights with size None; beyond a part's
    # length the part runs again from its sample 0
    chosen = [dict(s, choose=c) for s, c in zip(sources, (20, 30, 5))]
    got = [who(v, tok) for v in read_all(ld, blend_spec("ch", chosen))]
    assert got == megatron_order([37, 11, 25], [20, 30, 5], None)
    # no weights with a size: the lengths as weights, size at most their sum
    got = [who(v, tok) for v in read_all(ld, blend_spec("sz", sources, size=50))]
    assert got == megatron_order([37, 11, 25], [37, 11, 25], 50)


def test_many_parts_weights_bit_for_bit(ld, workdir):
    """37 parts: numpy's pairwise sum in the normalisation, float weights."""
    pytest.importorskip("megatron.core.datasets.blended_dataset")
    rng = np.random.default_rng(7)
    n = 37
    weights = [float(w) for w in rng.random(n) * rng.choice([1e-3, 1.0, 1e3], n)]
    sources = [npy_part(os.path.join(workdir, f"p{i}"), i, 400) for i in range(n)]
    spec = blend_spec("many", sources, weights=weights, size=2000)
    spec["batch_size"] = 100
    got = [who(v, -1) for v in read_all(ld, spec)]
    assert got == megatron_order([400] * n, weights, 2000)


def test_ties_and_spent_parts_bit_for_bit(ld, workdir):
    """13 parts (not a multiple of the index builder's 4 lanes) of equal
    and unequal lengths: ties between parts at most steps (megatron's scan
    picks the first), parts spent and leaving the race at different times
    (exhaustive), equal weights tying at every step (weighted)."""
    pytest.importorskip("megatron.core.datasets.blended_dataset")
    lens = [6, 6, 6, 9, 9, 3, 6, 12, 6, 1, 9, 6, 2]
    sources = [npy_part(os.path.join(workdir, f"t{i}"), i, n) for i, n in enumerate(lens)]
    got = [who(v, -1) for v in read_all(ld, dict(blend_spec("ties", sources), batch_size=7))]
    assert got == megatron_order(lens, lens, None)
    got = [who(v, -1) for v in read_all(ld, dict(blend_spec("eq", sources, weights=[1] * 13,
                                                             size=200), batch_size=7))]
    assert got == megatron_order(lens, [1] * 13, 200)
    # 39 parts: the vector scans' full widths (16 and 4 at a time) and tail,
    # ties across them, parts leaving the race from every position
    lens3 = lens * 3
    sources = [npy_part(os.path.join(workdir, f"u{i}"), i, n) for i, n in enumerate(lens3)]
    got = [who(v, -1) for v in read_all(ld, dict(blend_spec("ties3", sources), batch_size=7))]
    assert got == megatron_order(lens3, lens3, None)


def test_large_blends_on_threads_bit_for_bit(ld, workdir):
    """Blends large enough that the daemon builds their index on several
    threads (a chunk each, joined where their counts agree: blend-index.c;
    more than 2 x 2^23 / 64 samples over 64 parts): still megatron-core's
    order, exhaustive and weighted."""
    pytest.importorskip("megatron.core.datasets.blended_dataset")
    rng = np.random.default_rng(11)
    lens = [int(n) for n in rng.integers(4000, 8000, 64)]
    sources = [npy_part(os.path.join(workdir, f"l{i}"), i, n) for i, n in enumerate(lens)]
    assert sum(lens) > 2 * (1 << 23) // 64
    got = [who(v, -1) for v in read_all(ld, dict(blend_spec("big", sources), batch_size=8192))]
    assert got == megatron_order(lens, lens, None)
    weights = [float(w) for w in rng.random(64)]
    got = [who(v, -1) for v in read_all(ld, dict(blend_spec("bigw", sources, weights=weights,
                                                             size=300000), batch_size=8192))]
    assert got == megatron_order(lens, weights, 300000)


def test_proportion_and_repeat(ld, workdir):
    pytest.importorskip("megatron.core.datasets.blended_dataset")
    sources, tok = parts3(workdir, (40, 20, 30))
    # proportion: the weights, size default the parts' samples summed (Mosaic)
    prop = [dict(s, proportion=p) for s, p in zip(sources, (1, 2, 1))]
    got = [who(v, tok) for v in read_all(ld, blend_spec("pr", prop))]
    assert got == megatron_order([40, 20, 30], [1, 2, 1], 90)
    # repeat: int(repeat * samples) of each part, exhaustively
    rep = [dict(s, repeat=r) for s, r in zip(sources, (0.5, 2.5, 1))]
    got = [who(v, tok) for v in read_all(ld, blend_spec("rp", rep))]
    assert got == megatron_order([40, 20, 30], [20, 50, 30], None)
    assert ld.pipeline("rp")["source"]["parts"][1]["samples_per_epoch"] == 50


def test_partition_ranks_union_is_the_epoch(ld, workdir):
    sources, tok = parts3(workdir)
    spec = blend_spec("part", sources, weights=[2, 1, 1], size=240)
    spec["shuffle"] = True
    spec["seed"] = 5
    whole = read_all(ld, dict(spec, shuffle=False))
    ranks = [read_all(ld, spec, rank=r, world_size=3) for r in range(3)]
    assert all(len(r) == 80 for r in ranks)
    assert sorted(sum(ranks, [])) == sorted(whole)
    assert sum(ranks, []) != whole  # shuffled


def test_resume_mid_epoch(ld, workdir):
    """A state_dict() taken mid-epoch resumes with the rest of that epoch:
    the sampler's position is over the blend's indices, as for any source."""
    sources, _ = parts3(workdir)
    spec = blend_spec("res", sources, weights=[2, 1, 1], size=120)
    spec["shuffle"] = True
    whole = read_all(ld, spec, rank=1, world_size=2)
    with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True, rank=1, world_size=2) as dl:
        head = []
        for k, batch in enumerate(dl):
            head.extend(np.asarray(batch["input"])[:, 0].tolist())
            if k == 2:
                state = dl.state_dict()
                break
    with loaderd.DataLoader(spec, socket=ld.socket, as_numpy=True, rank=1, world_size=2) as dl:
        dl.load_state_dict(state)
        tail = []
        for batch in dl:
            tail.extend(np.asarray(batch["input"])[:, 0].tolist())
    assert len(head) == 24 and head + tail == whole


def test_canonical_form(ld, workdir):
    sources, _ = parts3(workdir)
    ld.create(blend_spec("canon", sources, weights=[3, 1.5, 1], size=10))
    src = ld.pipeline("canon")["spec"]["source"]
    assert src["kind"] == "blend" and src["weights"] == [3, 1.5, 1] and src["size"] == 10
    assert src["sources"][2] == dict(sources[2], dtype="uint16", output_dtype="int64",
                                     name="tok.bin", boundaries="file", sampling="aligned")
    # the same blend, spelled with the defaults, is the same pipeline
    ld.create(blend_spec("canon", [dict(s) for s in sources], weights=[3, 1.5, 1], size=10),
              exist_ok=True)
    # and so is its canonical form, given back
    canon = ld.pipeline("canon")["spec"]
    ld.create(canon, exist_ok=True)
    other = dict(canon, source=dict(canon["source"], size=11))
    r = ld.create(other, exist_ok=True, check=False)
    assert r.returncode != 0 and "source.size 11 (it has 10)" in r.stderr, r.stderr


ERRORS = [
    ({"weights": [1, -1, 1]}, "spec: source.weights[1]: must be a finite number > 0"),
    ({"weights": [1, 0, 1]}, "spec: source.weights[1]: must be a finite number > 0"),
    ({"weights": [1, 1]}, "spec: source.weights: has 2 weights for 3 sources"),
    ({"weights": "x"}, "spec: source.weights: must be an array of numbers, one per source"),
    ({"size": 0}, "spec: source.size: must be an integer in 1..68719476736"),
    ({"sizes": 1}, "spec: unknown key \"source.sizes\""),
    ({"min_size": 5, "size": 5, "weights": [1, 1, 1]},
     "spec: source.min_size: not with source.size (one of them gives the blend's size)"),
]


@pytest.mark.parametrize("extra,msg", ERRORS)
def test_bad_blends(ld, workdir, extra, msg):
    sources, _ = parts3(workdir)
    r = ld.create(blend_spec("bad", sources, **extra), check=False)
    assert r.returncode != 0 and msg in r.stderr, r.stderr


def test_bad_weights_nan_and_inf(ld, workdir):
    sources, _ = parts3(workdir)
    # JSON has no NaN nor Infinity (loaderctl refuses the file), and 1e999
    # overflows a double: all refused before anything is opened
    for w, msg in (("NaN", "invalid token near 'NaN'"), ("Infinity", "invalid token near 'Infinity'"),
                   ("1e999", "real number overflow")):
        text = json.dumps(blend_spec("bad", sources)).replace(
            '"kind": "blend"', '"kind": "blend", "weights": [1, %s, 1]' % w)
        r = ld.create(text, check=False)
        assert r.returncode != 0 and msg in r.stderr, r.stderr


def test_bad_parts(ld, workdir):
    sources, _ = parts3(workdir)
    empty = os.path.join(workdir, "e")
    os.makedirs(empty)
    np.save(os.path.join(empty, "input.npy"), np.zeros((0, L), np.int64))
    np.save(os.path.join(empty, "target.npy"), np.zeros((0, L), np.int64))
    other = npy_part(os.path.join(workdir, "o"), 3, 10)
    np.save(os.path.join(workdir, "o", "target.npy"), np.zeros((10, L + 1), np.int64))
    cases = [
        ([sources[0], {"kind": "npy", "paths": [os.path.join(empty, "input.npy")]}],
         f"source.sources[1]: {empty}/input.npy: no samples (shape[0] is 0)"),
        ([sources[0], sources[2], other],
         "source.sources[2]: field 1 is \"target\" int64 [5], but source.sources[0] gives "
         "\"target\" int64 [4] (a blend's parts give the same fields)"),
        ([sources[0], {"kind": "npy", "paths": [os.path.join(workdir, "a", "input.npy")]}],
         "source.sources[1]: gives 1 fields, but source.sources[0] gives 2 (a blend's parts "
         "give the same fields)"),
        ([sources[0], {"kind": "tokens", "seq_len": L}], "spec: source.sources[1].path: is required"),
        ([sources[0], dict(sources[2], bogus=1)], "spec: unknown key \"source.sources[1].bogus\""),
        ([sources[0], {"kind": "blend", "sources": [sources[0]]}],
         "spec: source.sources[1].kind: a blend cannot hold a blend (list its parts here, with "
         "their weights)"),
        ([sources[0], {"kind": "image_folder", "path": workdir}],
         "spec: source.sources[1].kind: image_folder sources cannot be blended (a blend's parts "
         "are tokens, npy or megatron sources)"),
        ([sources[0], {"kind": "python", "dataset": "x:y"}],
         "spec: source.sources[1].kind: python sources cannot be blended"),
        ([sources[0], "x"], "spec: source.sources[1]: must be a source object"),
        ([dict(sources[0], proportion=1), sources[1]],
         "spec: source.sources[1]: has no proportion, but source.sources[0] has (every part "
         "needs one, or none)"),
        ([dict(sources[0], repeat=1, choose=3)],
         "spec: source.sources[0]: at most one of proportion, repeat, choose"),
        ([dict(sources[0], repeat=-1)], "spec: source.sources[0].repeat: must be a number in (0, 1e9]"),
        ([dict(sources[0], repeat=0.001)], "source.sources[0].repeat: takes no sample of its 150"),
        ([dict(sources[0], choose=0)], "spec: source.sources[0].choose: must be an integer in "
         "1..68719476736"),
        ([], "spec: source.sources: must be an array of 1..32766 sources"),
    ]
    for srcs, msg in cases:
        r = ld.create(blend_spec("bad", srcs), check=False)
        assert r.returncode != 0 and msg in r.stderr, (msg, r.stderr)
    r = ld.create(blend_spec("bad", [dict(sources[0], choose=3), sources[1]], size=4), check=False)
    assert "spec: source.size: not with source.sources[0].choose (they give the samples per epoch)" \
        in r.stderr, r.stderr
    r = ld.create(blend_spec("bad", [dict(sources[0], choose=3), sources[1]], weights=[1, 1]),
                  check=False)
    assert "spec: source.weights: not with source.sources[0].choose" in r.stderr, r.stderr
    assert ld.status()["pipelines"] == []
    # 10^5 parts: more than a client's spec may hold, so from a config file
    cfg = os.path.join(workdir, "many.json")
    with open(cfg, "w") as f:
        json.dump({"pipelines": [blend_spec("many", [sources[2]] * 100000)]}, f)
    r = subprocess.run([LOADERD, "--check-config", "--config", cfg], env=child_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"loaderd: {cfg}: pipelines[0]: spec: source.sources: must be an "
                                "array of 1..32766 sources"), r.stderr
def _have_megatron():
    try:
        import megatron.core.datasets.blended_dataset  # noqa: F401
        return True
    except Exception:
        return False


def _metrics(path):
    class Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(10)
            self.sock.connect(path)
    c = Conn("localhost")
    try:
        c.request("GET", "/metrics")
        return c.getresponse().read().decode()
    finally:
        c.close()


def test_counts_in_metrics_and_top(workdir):
    sources, tok = parts3(workdir)
    mpath = os.path.join(workdir, "metrics.sock")
    cfg = os.path.join(workdir, "loaderd.json")
    with open(cfg, "w") as f:
        json.dump({"metrics_address": mpath}, f)
    d = Daemon(workdir, args=["--config", cfg])
    try:
        sources[0]["name"] = "web"
        spec = blend_spec("m", sources, weights=[0.5, 0.3, 0.2], size=100)
        spec["epochs"] = 1
        d.create(spec)
        assert d.consume("m").json["batches"] == 13
        counts = [sum(1 for p, _ in megatron_order([150, 90, 120], [0.5, 0.3, 0.2], 100)
                      if p == i) for i in range(3)] if _have_megatron() else [50, 30, 20]
        text = _metrics(mpath)
        names = ["web", "input.npy", "tok.bin"]
        for i in range(3):
            line = ('loaderd_pipeline_blend_samples_total{pipeline="m",generation="0",'
                    f'part="{i}",part_name="{names[i]}"}} {counts[i]}')
            assert line in text, text[-3000:]
        top = d.ctl("top").stdout
        want = "m: blend, samples read/per epoch: " + ", ".join(
            f"{n} {c}/{c}" for n, c in zip(names, counts))
        assert want in top.splitlines(), top
        for i, n in enumerate(names):
            line = ('loaderd_pipeline_blend_samples_per_epoch{pipeline="m",generation="0",'
                    f'part="{i}",part_name="{n}"}} {counts[i]}')
            assert line in text
    finally:
        d.stop()
