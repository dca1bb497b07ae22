# SPDX-License-Identifier: MIT
"""Exact contents: what loaderd delivers equals what numpy computes from the
same files (sequential order), byte for byte, with the documented counts."""

import os

import numpy as np
import pytest

from ldrtest import (crc, nsamples_tokens, npy_dump, npy_spec, random_tokens, sequential_batches,
                     token_dump, token_spec, write_npy)


def check_summary(res, expected_dump, batches, samples, pipeline=None, eof=True, first=(0, 0)):
    j = res.json
    assert res.dump == expected_dump, (
        f"dump differs from numpy: {len(res.dump)} bytes vs {len(expected_dump)} expected; "
        f"first difference at byte {first_diff(res.dump, expected_dump)}")
    assert j["batches"] == batches
    assert j["samples"] == samples
    assert j["bytes"] == len(expected_dump)
    assert isinstance(j["checksum"], str) and len(j["checksum"]) == 8, j["checksum"]
    assert int(j["checksum"], 16) == crc(expected_dump), "checksum is not zlib.crc32 of the dump"
    assert j["eof"] is eof
    if pipeline is not None:
        assert j["pipeline"] == pipeline
    if batches:
        assert (j["first_epoch"], j["first_batch"]) == first
    assert isinstance(j["seconds"], (int, float)) and j["seconds"] >= 0


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "int32"])
def test_tokens_sequential_int64(ld, workdir, dtype):
    path = os.path.join(workdir, f"train_{dtype}.bin")
    L, bs = 64, 32
    ntokens = 200_003              # 3125 samples: 97 full batches + one of 21
    tok = random_tokens(path, ntokens, dtype)
    n = nsamples_tokens(ntokens, L)
    assert n == 3125
    ld.create(token_spec("tok", path, L, dtype, batch_size=bs))
    batches = sequential_batches(n, bs)
    res = ld.consume("tok")
    check_summary(res, token_dump(tok, L, batches), len(batches), n, pipeline="tok")
    assert len(batches) == 98 and len(batches[-1]) == 21


def test_tokens_keep_source_dtype(ld, workdir):
    path = os.path.join(workdir, "t16.bin")
    L, bs = 128, 16
    ntokens = 128 * 500 + 1        # exactly 500 samples
    tok = random_tokens(path, ntokens, "uint16", seed=5)
    ld.create(token_spec("t16", path, L, "uint16", output_dtype="uint16", batch_size=bs))
    batches = sequential_batches(500, bs)
    res = ld.consume("t16")
    check_summary(res, token_dump(tok, L, batches, out_dtype="uint16"), len(batches), 500)


def test_tokens_defaults_and_status(ld, workdir):
    """Defaults: batch_size 32, shuffle false, drop_last false, epochs 1."""
    path = os.path.join(workdir, "d.bin")
    L = 32
    ntokens = 32 * 1000 + 5       # 1000 samples (the 4 extra tokens make no sample)
    tok = random_tokens(path, ntokens, "uint16", seed=9)
    ld.create(token_spec("dflt", path, L, "uint16"))
    p = ld.pipeline("dflt")
    assert p["samples"] == 1000
    assert p["batch_size"] == 32
    assert p["batches_per_epoch"] == 32          # 31 full + one of 8
    assert p["epochs"] == 1
    assert p["state"] in ("running", "done")
    assert p["error"] is None
    spec = p["spec"]
    assert spec["batch_size"] == 32 and spec["shuffle"] is False and spec["drop_last"] is False
    assert spec["epochs"] == 1 and spec["prefetch"] == "auto" and spec["seed"] == 0
    # 2 KiB a field in a 4 KiB slot: the most slots, sized by the daemon
    assert (p["slots_total"], p["prefetch"], p["prefetch_auto"]) == (64, 64, True)
    assert spec["min_clients"] == 1
    assert spec["source"]["output_dtype"] == "int64"
    batches = sequential_batches(1000, 32)
    res = ld.consume("dflt")
    check_summary(res, token_dump(tok, L, batches), 32, 1000)
    assert len(batches[-1]) == 8


def test_tokens_drop_last(ld, workdir):
    path = os.path.join(workdir, "dl.bin")
    L, bs = 16, 10
    tok = random_tokens(path, 16 * 95 + 1, "uint16", seed=3)  # 95 samples
    ld.create(token_spec("dl", path, L, "uint16", batch_size=bs, drop_last=True))
    assert ld.pipeline("dl")["batches_per_epoch"] == 9
    batches = sequential_batches(95, bs, drop_last=True)
    res = ld.consume("dl")
    check_summary(res, token_dump(tok, L, batches), 9, 90)


def test_tokens_multi_epoch_sequential(ld, workdir):
    path = os.path.join(workdir, "me.bin")
    L, bs = 16, 8
    tok = random_tokens(path, 16 * 50 + 1, "uint32", seed=4)  # 50 samples, 7 batches/epoch
    ld.create(token_spec("me", path, L, "uint32", batch_size=bs, epochs=3))
    batches = sequential_batches(50, bs, epochs=3)
    res = ld.consume("me")
    check_summary(res, token_dump(tok, L, batches), 21, 150)


def test_consume_batches_limit(ld, workdir):
    path = os.path.join(workdir, "lim.bin")
    L, bs = 16, 8
    tok = random_tokens(path, 16 * 400 + 1, "uint16", seed=6)
    ld.create(token_spec("lim", path, L, "uint16", batch_size=bs))
    batches = sequential_batches(400, bs)[:7]
    res = ld.consume("lim", "--batches", 7)
    check_summary(res, token_dump(tok, L, batches), 7, 56, eof=False)


def test_consume_epochs_of_endless_pipeline(ld, workdir):
    path = os.path.join(workdir, "endless.bin")
    L, bs = 16, 8
    tok = random_tokens(path, 16 * 60 + 1, "uint16", seed=8)   # 60 samples: 8 batches/epoch
    ld.create(token_spec("endless", path, L, "uint16", batch_size=bs, epochs=0))
    p = ld.pipeline("endless")
    assert p["epochs"] == 0 and p["batches_per_epoch"] == 8
    batches = sequential_batches(60, bs, epochs=2)
    res = ld.consume("endless", "--epochs", 2)
    check_summary(res, token_dump(tok, L, batches), 16, 120, eof=False)


def test_npy_two_fields(ld, workdir):
    rng = np.random.default_rng(11)
    n = 1000
    x = write_npy(os.path.join(workdir, "x.npy"), rng.standard_normal((n, 3, 5)).astype(np.float32))
    y = write_npy(os.path.join(workdir, "y.npy"), rng.integers(0, 10, size=n).astype(np.int64))
    bs = 64
    ld.create(npy_spec("arr", [os.path.join(workdir, "x.npy"), os.path.join(workdir, "y.npy")],
                       batch_size=bs))
    p = ld.pipeline("arr")
    assert p["samples"] == n and p["batches_per_epoch"] == 16
    batches = sequential_batches(n, bs)
    res = ld.consume("arr")
    check_summary(res, npy_dump([x, y], batches), 16, n, pipeline="arr")


def test_npy_field_order_follows_paths(ld, workdir):
    """Fields come in the order of `paths`, not alphabetically."""
    n = 300
    b = write_npy(os.path.join(workdir, "b.npy"), np.arange(n * 2, dtype=np.uint8).reshape(n, 2))
    a = write_npy(os.path.join(workdir, "a.npy"), np.arange(n, dtype=np.float64) * 0.5)
    ld.create(npy_spec("order", [os.path.join(workdir, "b.npy"), os.path.join(workdir, "a.npy")],
                       batch_size=50))
    batches = sequential_batches(n, 50)
    res = ld.consume("order")
    check_summary(res, npy_dump([b, a], batches), 6, n)


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "uint64", "float16", "float64"])
def test_npy_dtypes(ld, workdir, dtype):
    rng = np.random.default_rng(12)
    n = 257
    if dtype == "bool":
        arr = rng.integers(0, 2, size=(n, 7)).astype(bool)
    elif dtype.startswith("float"):
        arr = rng.standard_normal((n, 7)).astype(dtype)
    else:
        arr = rng.integers(0, 100, size=(n, 7)).astype(dtype)
    path = os.path.join(workdir, f"v_{dtype}.npy")
    write_npy(path, arr)
    ld.create(npy_spec("dt", [path], batch_size=32))
    batches = sequential_batches(n, 32)
    res = ld.consume("dt")
    check_summary(res, npy_dump([arr], batches), 9, n)


def test_pipelines_command_lists_pipeline(ld, workdir):
    path = os.path.join(workdir, "p.bin")
    random_tokens(path, 16 * 10 + 1, "uint16")
    ld.create(token_spec("listed", path, 16, "uint16", batch_size=4))
    r = ld.ctl("pipelines")
    assert "listed" in r.stdout
    names = [p["name"] for p in ld.status()["pipelines"]]
    assert names == ["listed"]
