# SPDX-License-Identifier: MIT
"""The megatron source kind against megatron-core itself (docs/spec.md,
"source of kind megatron"): corpora written by megatron-core's
IndexedDatasetBuilder in several dtypes, GPTDataset built by its
BlendedMegatronDatasetBuilder on the same files, seed, split, seq_len and
num_samples, and every sample's tokens, labels, loss_mask and position_ids
equal to loaderd's, in megatron's order (shuffle false). Then bad .idx/.bin
pairs: the exact error at create."""

import glob
import json
import os
import stat
import struct
import subprocess

import numpy as np
import pytest

import loaderd

mcore = pytest.importorskip("megatron.core.datasets.gpt_dataset")
torch = pytest.importorskip("torch")
from megatron.core.datasets.blended_megatron_dataset_builder import (  # noqa: E402
    BlendedMegatronDatasetBuilder)
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # noqa: E402
from loaderd_harness import LOADERCTL, create_at_once, daemon  # noqa: E402,F401  (the fixture)


@pytest.fixture
def mld(daemon, workdir):
    """A daemon whose cache_dir is the test's own."""
    return daemon("--cache-dir", os.path.join(workdir, "cache"))


class Tok:
    """What GPTDatasetConfig asks of a tokenizer."""

    def __init__(self, vocab, eod, pad):
        self.vocab_size, self.eod, self.pad = vocab, eod, pad
        self.unique_identifiers = {"class": "Tok", "vocab": vocab, "eod": eod, "pad": pad}


def corpus(prefix, dtype, ndocs, vocab, seed, seqs_per_doc=1, eod=None, min_len=1):
    """A .bin/.idx pair by megatron-core's builder: documents of min_len..59
    tokens (some of several sequences), ending in eod when given."""
    rng = np.random.default_rng(seed)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for _ in range(ndocs):
        lens = [int(x) for x in rng.integers(min_len, 60,
                                             size=int(rng.integers(1, seqs_per_doc + 1)))]
        t = rng.integers(0, vocab, size=sum(lens))
        if eod is not None and len(t):
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
    (np.uint8, 150, 2, 256, 5, 16, "split 0.35 : 0.65", [200, 300, None]),
    (np.int8, 105, 1, 100, 11, 9, "0.1,0.2,0.7", [None, 400, 50]),
    (np.int16, 100, 1, 30000, 3, 31, "100,0,0", [150, None, None]),
    (np.uint16, 400, 2, 1000, 8, 6, "90,10,0", [1000, 100, None]),   # with empty sequences
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].__name__}-{c[1]}")
def test_megatron_equals_gptdataset(mld, workdir, case):
    dtype, ndocs, spd, vocab, seed, L, split, sizes = case
    prefix = corpus(os.path.join(workdir, "c"), dtype, ndocs, vocab, seed, spd,
                    min_len=0 if vocab == 1000 else 1)
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


@pytest.mark.parametrize("pad", [999, 7], ids=["pad", "pad-is-eod"])
def test_megatron_masks_no_extra_token_pad(mld, workdir, pad):
    """eod_mask_loss, reset_position_ids, add_extra_token false (labels end in
    pad, masked) and a num_samples of 1.5 epochs (the final epoch apart);
    a pad equal to eod is megatron's -1."""
    prefix = corpus(os.path.join(workdir, "m"), np.uint16, 80, 1000, 2, eod=7, min_len=0)
    tok = Tok(1000, 7, pad)
    kw = dict(eod_mask_loss=True, reset_position_ids=True, add_extra_token=False)
    ds = megatron_splits(prefix, workdir, 24, 42, "1", [0, None, None], tok, **kw)[0]
    n1 = len(ds)
    ds = megatron_splits(prefix, workdir, 24, 42, "1", [n1 + n1 // 2, None, None], tok, **kw)[0]
    src = {"prefix": prefix, "seq_len": 24, "seed": 42, "num_samples": n1 + n1 // 2,
           "eod": 7, "pad": pad, **kw}
    got = loaderd_samples(mld, "masks", src, batch_size=7)
    assert_same(ds, got)


def test_megatron_in_a_store_by_range_equals_gptdataset(daemon, workdir, monkeypatch):
    """A pair in s3:// of more than cache_bytes (its .bin read by range,
    docs/storage.md): GPTDataset's samples, with empty sequences (pieces
    of no token) and without the extra token, against the real S3 server of
    tests/integration."""
    # loaded from its file, sys.path untouched: a tests/integration first on
    # it would make later spawned children import its conftest, not ours
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "s3server", os.path.join(os.path.dirname(__file__), "..", "integration", "s3server.py"))
    s3server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s3server)
    srv, d = s3server.make_server()
    try:
        prefix = corpus(os.path.join(workdir, "c"), np.uint16, 400, 1000, 8, 2, eod=7, min_len=0)
        alice = srv.client("alice")
        for ext in (".bin", ".idx"):
            with open(prefix + ext, "rb") as f:
                alice.put("alice-data", "mg/c" + ext, f.read())
        cfg = os.path.join(workdir, "ranged.json")
        with open(cfg, "w") as f:
            json.dump({"cache_bytes": os.path.getsize(prefix + ".bin") - 1}, f)
        ld = daemon("--cache-dir", os.path.join(workdir, "cache"), "--config", cfg)
        for k in [k for k in os.environ if k.startswith("AWS_")]:
            monkeypatch.delenv(k)
        for k, v in s3server.aws_env(srv.endpoint).items():
            if k.startswith("AWS_"):
                monkeypatch.setenv(k, v)
        kw = dict(eod_mask_loss=True, reset_position_ids=True, add_extra_token=False)
        ds = megatron_splits(prefix, workdir, 6, 8, "90,10,0", [1000, None, None], Tok(1000, 7, 1001),
                             **kw)[0]
        src = {"prefix": "s3://alice-data/mg/c", "seq_len": 6, "seed": 8, "split": "90,10,0",
               "num_samples": 1000, "eod": 7, "pad": 1001, **kw}
        assert_same(ds, loaderd_samples(ld, "ranged", src))
        store = loaderd.Client(socket=ld.socket).pipeline("ranged")["store"]
        assert store["ranged"] and store["ranged_gets"] > len(ds), store
    finally:
        s3server.stop_server(srv, d)


def index_state(client, name):
    return client.pipeline(name)["cache"]


def test_megatron_subset_shorter_than_a_sample(mld, workdir):
    """A subset of fewer tokens than a sample (--split 969,30,1's test share
    of one short document): with num_samples, megatron reads it for as many
    epochs as the samples need, the samples spanning its repeats; without,
    one epoch holds no sample (the error at create, test_megatron_bad_keys)."""
    p = small_pair(workdir)
    tok = Tok(14, 0, 15)
    ds = megatron_splits(p, workdir, 100, 6, "1", [3, None, None], tok)[0]
    assert len(ds.document_index) > len(ds.indices)  # 95 tokens, read 4 times
    src = {"prefix": p, "seq_len": 100, "seed": 6, "num_samples": 3, "pad": 15, "eod": 0}
    assert_same(ds, loaderd_samples(mld, "short", src))


def test_megatron_index_built_once(mld, workdir):
    """8 creates of one pipeline at once and 2 more pipelines of other names
    over the same corpus and parameters: one build, one cache file (0600),
    the others reuse it; a new daemon on the same cache_dir reuses it too;
    another seed is another index."""
    prefix = corpus(os.path.join(workdir, "c"), np.uint16, 3000, 50000, 1)
    src = {"kind": "megatron", "prefix": prefix, "seq_len": 64, "seed": 5, "num_samples": 5000}
    specs = [{"name": "same", "source": src, "persist": True}] * 8 + \
            [{"name": n, "source": src, "persist": True} for n in ("other1", "other2")]
    assert create_at_once(mld.socket, specs) == []
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

    out = subprocess.run([LOADERCTL, "--socket", mld.socket, "status"], capture_output=True,
                         text=True).stdout
    assert out.count("megatron index: built in ") == 1, out
    assert out.count(f"megatron index: reused, {built['epochs']} epochs, "
                     f"{built['samples']} samples\n") == 2, out
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
    # a file torn by a crash (zeros in the middle, or cut short) is built
    # again, right; a crash of the kernel is another boot: the file written
    # in this one carries its boot id, one of another boot is checked whole
    path, = glob.glob(os.path.join(cache, "megatron-*.index"))
    good = open(path, "rb").read()
    boot = open("/proc/sys/kernel/random/boot_id", "rb").read(36)
    assert good.count(boot) == 1
    other = good.replace(boot, b"0" * 36)
    # (whole, from another boot: checked, reused, made this boot's)
    for data, how in ((other[:len(good) // 2] + bytes(64) + other[len(good) // 2 + 64:],
                       "built"), (other[:-20], "built"), (good[:-20], "built"),
                      (other, "reused")):
        with open(path, "wb") as f:
            f.write(data)
        c.create_pipeline(spec)
        assert index_state(c, "m")["index"] == how
        assert open(path, "rb").read() == good
        c.drop_pipeline("m")
    # of this boot, damaged behind the daemon's back (used as it is): the
    # read says so, never reads outside the index
    klen = int.from_bytes(good[8:16], "little")
    hdr = 16 + (klen + 7) // 8 * 8
    ndoc, ns = struct.unpack_from("<QQ", good, hdr)
    shuffle0 = hdr + 32 + 40 + (ndoc * 4 + 7) // 8 * 8 + (ns + 1) * 8  # int32 pairs
    patch(path, shuffle0, struct.pack("<I", ns))  # uint32
    with pytest.raises(loaderd.Error) as e:
        with loaderd.DataLoader(spec, socket=d2.socket) as dl:
            for _ in dl:
                pass
    assert f"{prefix}.bin: sample 0: shuffle index {ns} out of range (the cached index is " \
        "damaged)" in e.value.message, e.value.message
    with open(path, "wb") as f:
        f.write(good)
    # the corpus rewritten (new inode, size, mtime): built again, and still right
    corpus(prefix, np.int32, 210, 1000, 4)
    c.create_pipeline(spec)
    assert index_state(c, "m")["index"] == "built"
    c.close()


# ---- bad input: the exact error at create, naming the file and the offset

def small_pair(d, name="b", dtype=np.uint16):
    """10 documents of 5..14 tokens (ids 0..13): N = 10 sequences, D = 11
    document indices; lengths at 34, pointers at 74, document indices at
    154, 242 bytes of .idx."""
    b = IndexedDatasetBuilder(os.path.join(d, name + ".bin"), dtype=dtype)
    for i in range(10):
        b.add_document(torch.arange(5 + i), [5 + i])
    b.finalize(os.path.join(d, name + ".idx"))
    return os.path.join(d, name)


def patch(path, off, data):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


def create_error(ld, prefix, **kw):
    c = loaderd.Client(socket=ld.socket)
    try:
        with pytest.raises(loaderd.InvalidSpec) as e:
            c.create_pipeline({"name": "bad", "source": dict(dict(kind="megatron", prefix=prefix,
                                                                  seq_len=4), **kw)})
        return e.value.message
    finally:
        c.close()


def test_megatron_bad_files(mld, workdir):
    p = small_pair(workdir)
    idx, bin_ = p + ".idx", p + ".bin"
    good = open(idx, "rb").read()
    ptr = lambda i: 2 * sum(5 + k for k in range(i))  # noqa: E731
    cases = [
        (lambda: patch(idx, 0, b"MMIDIDY"),
         f"{idx}: offset 0: not a Megatron indexed dataset index (magic is not "
         "\"MMIDIDX\\x00\\x00\")"),
        (lambda: patch(idx, 9, struct.pack("<Q", 2)), f"{idx}: offset 9: version 2 (only 1 is known)"),
        (lambda: patch(idx, 17, b"\x09"), f"{idx}: offset 17: dtype code 9 is not one of 1..8"),
        (lambda: patch(idx, 17, b"\x00"), f"{idx}: offset 17: dtype code 0 is not one of 1..8"),
        (lambda: patch(idx, 17, b"\x07"),  # float32: 4-byte elements, sequence 0 overlaps 1
         f"{idx}: offset 82: sequence 1 pointer 10 is before the end of sequence 0 (20): "
         "pointers must ascend"),
        (lambda: patch(idx, 26, struct.pack("<Q", 12)),
         f"{idx}: offset 18: 10 sequences and 12 document indices need 250 bytes (or 260 with "
         "sequence modes), the file has 242"),
        (lambda: patch(idx, 18, struct.pack("<Q", 1 << 62)),
         f"{idx}: offset 18: {1 << 62} sequences and 11 document indices need 0 bytes (or 0 "
         "with sequence modes), the file has 242"),
        (lambda: patch(idx, 34 + 4 * 3, struct.pack("<i", 9)),  # length 8 -> 9 overlaps the next
         f"{idx}: offset {74 + 8 * 4}: sequence 4 pointer {ptr(4)} is before the end of "
         f"sequence 3 ({ptr(4) + 2}): pointers must ascend"),
        (lambda: patch(idx, 34 + 4 * 9, struct.pack("<i", 15)),
         f"{idx}: offset {74 + 8 * 9}: sequence 9 pointer {ptr(9)} + 15 uint16 elements is past "
         f"the end of {bin_} (190 bytes)"),
        (lambda: patch(idx, 34 + 4 * 2, struct.pack("<i", -1)),
         f"{idx}: offset 42: sequence 2 has length -1"),
        (lambda: patch(idx, 74 + 8 * 6, struct.pack("<q", 1000)),
         f"{idx}: offset {74 + 8 * 6}: sequence 6 pointer 1000 + 11 uint16 elements is past the "
         f"end of {bin_} (190 bytes)"),
        (lambda: patch(idx, 154, struct.pack("<q", 1)),
         f"{idx}: offset 154: document index 0 is 1, must be 0"),
        (lambda: patch(idx, 154 + 8 * 5, struct.pack("<q", 2)),
         f"{idx}: offset {154 + 40}: document index 5 is 2, not in 4..10"),
        (lambda: patch(idx, 154 + 8 * 10, struct.pack("<q", 9)),
         f"{idx}: offset {154 + 80}: the last document index is 9, must be the sequence count 10"),
        (lambda: os.truncate(bin_, 180),
         f"{idx}: offset {74 + 8 * 9}: sequence 9 pointer {ptr(9)} + 14 uint16 elements is past "
         f"the end of {bin_} (180 bytes)"),
        (lambda: open(bin_, "ab").write(b"\0\0"),
         f"{bin_}: 192 bytes, but the sequences of {idx} end at byte 190"),
        (lambda: os.truncate(idx, 20), f"{idx}: 20 bytes, shorter than the 34-byte header"),
    ]
    for mutate, want in cases:
        small_pair(workdir)
        assert open(idx, "rb").read() == good
        mutate()
        assert create_error(mld, p) == want
        r = subprocess.run([LOADERCTL, "inspect", p], capture_output=True, text=True)
        assert (r.returncode, r.stderr) == (1, f"loaderctl: inspect: {want}\n")
    # the daemon still serves
    small_pair(workdir)
    c = loaderd.Client(socket=mld.socket)
    c.create_pipeline({"name": "ok", "source": {"kind": "megatron", "prefix": p, "seq_len": 4}})
    c.close()


def test_megatron_bad_keys_and_vocab(mld, workdir):
    p = small_pair(workdir)
    assert create_error(mld, p, vocab_size=13) == \
        f"{p}.bin: offset {2 * sum(range(5, 14)) + 2 * 13}: token id 13 is not in 0..12 " \
        "(source.vocab_size 13)"
    c = loaderd.Client(socket=mld.socket)
    c.create_pipeline({"name": "v", "source": {"kind": "megatron", "prefix": p, "seq_len": 4,
                                               "vocab_size": 14}})
    c.close()
    assert create_error(mld, p, split="1,2,3,4") == (
        "spec: source.split: must be up to 3 non-negative weights with a positive sum, "
        "e.g. \"969,30,1\"")
    assert create_error(mld, p, split="1,0,0", subset="valid") == \
        "spec: source.split: gives the valid subset nothing"
    assert create_error(mld, p, subset="dev") == "spec: source.subset: must be train, valid or test"
    assert create_error(mld, p, eod_mask_loss=True) == "spec: source.eod_mask_loss: needs source.eod"
    assert create_error(mld, p, seed=1 << 32) == \
        "spec: source.seed: must be an integer in 0..4294967295"
    assert create_error(mld, p, paths=[p]) == "spec: unknown key \"source.paths\""
    c = loaderd.Client(socket=mld.socket)
    with pytest.raises(loaderd.NotFound) as e:
        c.create_pipeline({"name": "gone", "source": {"kind": "megatron", "prefix": p + "-missing",
                                                      "seq_len": 4}})
    c.close()
    assert e.value.message == f"{p}-missing.bin: No such file or directory"
    assert create_error(mld, p, seq_len=1000) == \
        f"{p}.bin: the subset's 95 tokens are too few for one sample of 1001"
    f = small_pair(workdir, "f", dtype=np.float32)
    assert create_error(mld, f) == \
        f"{f}.idx: offset 17: dtype float32 (code 7) does not hold token ids"


def test_megatron_inspect(workdir):
    import json
    p = small_pair(workdir, dtype=np.int32)
    r = subprocess.run([LOADERCTL, "--json", "inspect", p + ".idx", "--seq-len", "8"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"prefix": p, "valid": True, "dtype": "int32", "documents": 10,
                                    "sequences": 10, "tokens": 95, "bin_bytes": 380,
                                    "multimodal": False, "seq_len": 8, "samples": 11}
    ds = megatron_splits(p, workdir, 8, 1, "1", [None, None, None], Tok(100, 0, 99))[0]
    assert len(ds) == 11
    r = subprocess.run([LOADERCTL, "inspect", p + ".bin"], capture_output=True, text=True)
    assert r.returncode == 0 and "documents   10\n" in r.stdout and "int32 (code 4)" in r.stdout
