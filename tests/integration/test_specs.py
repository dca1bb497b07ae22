# SPDX-License-Identifier: MIT
"""Pipeline specs: errors name the key and exit 1 with the daemon alive;
create --exist-ok; drop [--force]; the global memory budget."""

import copy
import os
import signal

import numpy as np
import pytest

from ldrtest import npy_spec, random_tokens, sequential_batches, token_dump, token_spec

L = 16


@pytest.fixture
def tokfile(workdir):
    path = os.path.join(workdir, "train.bin")
    random_tokens(path, 100 * L + 1, "uint16")
    return path


def good_spec(path):
    return token_spec("tok", path, L, "uint16", batch_size=8, shuffle=True, seed=7,
                      drop_last=False, epochs=1, prefetch=4, min_clients=1)


def set_key(spec, dotted, value):
    spec = copy.deepcopy(spec)
    keys = dotted.split(".")
    obj = spec
    for k in keys[:-1]:
        obj = obj[k]
    obj[keys[-1]] = value
    return spec


def del_key(spec, dotted):
    spec = copy.deepcopy(spec)
    keys = dotted.split(".")
    obj = spec
    for k in keys[:-1]:
        obj = obj[k]
    del obj[keys[-1]]
    return spec


BAD = [
    # (id, edit, substrings the message must contain)
    ("batch_size-zero", lambda s: set_key(s, "batch_size", 0), ["batch_size"]),
    ("batch_size-negative", lambda s: set_key(s, "batch_size", -4), ["batch_size"]),
    ("batch_size-string", lambda s: set_key(s, "batch_size", "32"), ["batch_size"]),
    ("batch_size-float", lambda s: set_key(s, "batch_size", 3.5), ["batch_size"]),
    ("batch_size-huge", lambda s: set_key(s, "batch_size", 1 << 40), ["batch_size"]),
    ("unknown-key", lambda s: set_key(s, "shufle", True), ['unknown key "shufle"']),
    ("unknown-source-key", lambda s: set_key(s, "source.seqlen", 4), ["seqlen"]),
    ("shuffle-string", lambda s: set_key(s, "shuffle", "yes"), ["shuffle"]),
    ("seed-negative", lambda s: set_key(s, "seed", -1), ["seed"]),
    ("seed-string", lambda s: set_key(s, "seed", "7"), ["seed"]),
    ("drop_last-int", lambda s: set_key(s, "drop_last", 1), ["drop_last"]),
    ("epochs-negative", lambda s: set_key(s, "epochs", -1), ["epochs"]),
    ("prefetch-zero", lambda s: set_key(s, "prefetch", 0), ["prefetch"]),
    ("prefetch-huge", lambda s: set_key(s, "prefetch", 1 << 30), ["prefetch"]),
    ("min_clients-zero", lambda s: set_key(s, "min_clients", 0), ["min_clients"]),
    ("min_clients-string", lambda s: set_key(s, "min_clients", "2"), ["min_clients"]),
    ("name-missing", lambda s: del_key(s, "name"), ["name"]),
    ("name-empty", lambda s: set_key(s, "name", ""), ["name"]),
    ("name-too-long", lambda s: set_key(s, "name", "n" * 64), ["name"]),
    ("name-number", lambda s: set_key(s, "name", 5), ["name"]),
    ("source-missing", lambda s: del_key(s, "source"), ["source"]),
    ("source-not-object", lambda s: set_key(s, "source", "tokens"), ["source"]),
    ("kind-unknown", lambda s: set_key(s, "source.kind", "parquet"), ["kind"]),
    ("kind-missing", lambda s: del_key(s, "source.kind"), ["kind"]),
    ("path-missing", lambda s: del_key(s, "source.path"), ["path"]),
    ("path-nonexistent", lambda s: set_key(s, "source.path", "/nonexistent/ldr/train.bin"),
     ["/nonexistent/ldr/train.bin"]),
    ("dtype-bad", lambda s: set_key(s, "source.dtype", "float8"), ["dtype"]),
    ("seq_len-zero", lambda s: set_key(s, "source.seq_len", 0), ["seq_len"]),
    ("seq_len-string", lambda s: set_key(s, "source.seq_len", "16"), ["seq_len"]),
    ("seq_len-missing", lambda s: del_key(s, "source.seq_len"), ["seq_len"]),
    ("output_dtype-bad", lambda s: set_key(s, "source.output_dtype", "float32"), ["output_dtype"]),
]


@pytest.mark.parametrize("edit,needles", [(e, n) for _, e, n in BAD], ids=[i for i, _, _ in BAD])
def test_bad_spec(ld, tokfile, edit, needles):
    spec = edit(good_spec(tokfile))
    r = ld.create(spec, check=False)
    assert r.returncode == 1, f"exit {r.returncode} for a bad spec, expected 1; stderr: {r.stderr!r}"
    for needle in needles:
        assert needle in r.stderr, f"error message does not name {needle!r}: {r.stderr!r}"
    st = ld.status()
    assert st["pipelines"] == [], "a bad spec created a pipeline"
    # the daemon still accepts the good spec afterwards
    ld.create(good_spec(tokfile))
    assert ld.pipeline("tok")["state"] in ("running", "done")


@pytest.mark.parametrize("text", ["{", "[]", "null", '"tok"', '{"name": "x", "source": {}} trailing',
                                  ""], ids=["unclosed", "array", "null", "string", "trailing", "empty"])
def test_spec_not_a_json_object(ld, text):
    r = ld.create(text, check=False)
    assert r.returncode == 1, f"exit {r.returncode}, stderr {r.stderr!r}"
    assert r.stderr.strip()
    assert ld.status()["pipelines"] == []


def test_spec_file_missing(ld, workdir):
    r = ld.ctl("create", "--spec", os.path.join(workdir, "nope.json"), check=False)
    assert r.returncode != 0
    assert "nope.json" in r.stderr


def test_token_file_too_small_for_one_sample(ld, workdir):
    path = os.path.join(workdir, "tiny.bin")
    random_tokens(path, L, "uint16")            # L tokens: (L - 1) // L = 0 samples
    r = ld.create(token_spec("tiny", path, L, "uint16"), check=False)
    assert r.returncode == 1, r.stderr
    assert "tiny.bin" in r.stderr or "seq_len" in r.stderr or "sample" in r.stderr, r.stderr


def npy_error(ld, workdir, arrays, needle):
    paths = []
    for name, arr in arrays.items():
        p = os.path.join(workdir, name + ".npy")
        if isinstance(arr, bytes):
            with open(p, "wb") as f:
                f.write(arr)
        else:
            np.save(p, arr, allow_pickle=True)
        paths.append(p)
    r = ld.create(npy_spec("bad", paths), check=False)
    assert r.returncode == 1, f"exit {r.returncode}: {r.stderr!r}"
    assert needle in r.stderr, f"message does not name {needle!r}: {r.stderr!r}"
    assert ld.status()["pipelines"] == []


def test_npy_fortran_order(ld, workdir):
    npy_error(ld, workdir, {"fort": np.asfortranarray(np.ones((10, 3), dtype=np.float32))}, "fort.npy")


def test_npy_big_endian(ld, workdir):
    npy_error(ld, workdir, {"bigend": np.arange(10, dtype=">i4")}, "bigend.npy")


def test_npy_object_array(ld, workdir):
    npy_error(ld, workdir, {"objs": np.array([{"a": 1}, None, 3], dtype=object)}, "objs.npy")


def test_npy_not_an_npy_file(ld, workdir):
    npy_error(ld, workdir, {"garbage": b"this is not a numpy file at all\n" * 4}, "garbage.npy")


def test_npy_first_dims_differ(ld, workdir):
    path_x = os.path.join(workdir, "x.npy")
    path_y = os.path.join(workdir, "y.npy")
    np.save(path_x, np.zeros((10, 2), dtype=np.float32))
    np.save(path_y, np.zeros(11, dtype=np.int64))
    r = ld.create(npy_spec("bad", [path_x, path_y]), check=False)
    assert r.returncode == 1
    assert "y.npy" in r.stderr or "x.npy" in r.stderr, r.stderr
    assert ld.status()["pipelines"] == []


def test_npy_truncated_file(ld, workdir):
    path = os.path.join(workdir, "short.npy")
    np.save(path, np.zeros((1000, 4), dtype=np.float64))
    os.truncate(path, os.path.getsize(path) - 100)
    r = ld.create(npy_spec("bad", [path]), check=False)
    assert r.returncode == 1 and "short.npy" in r.stderr, r.stderr


def test_npy_paths_empty_and_duplicate_stems(ld, workdir):
    r = ld.create(npy_spec("bad", []), check=False)
    assert r.returncode == 1 and "paths" in r.stderr, r.stderr
    os.makedirs(os.path.join(workdir, "a"))
    os.makedirs(os.path.join(workdir, "b"))
    for d in ("a", "b"):
        np.save(os.path.join(workdir, d, "x.npy"), np.zeros(10))
    r = ld.create(npy_spec("dup", [os.path.join(workdir, "a", "x.npy"),
                                   os.path.join(workdir, "b", "x.npy")]), check=False)
    assert r.returncode == 1, "two fields named x were accepted"
    assert ld.status()["pipelines"] == []


def test_create_twice_and_exist_ok(ld, tokfile):
    spec = good_spec(tokfile)
    ld.create(spec)
    r = ld.create(spec, check=False)
    assert r.returncode == 1, "creating an existing pipeline again succeeded"
    assert "tok" in r.stderr and "exist" in r.stderr.lower(), r.stderr
    ld.create(spec, exist_ok=True)
    other = set_key(spec, "seed", 8)
    r = ld.create(other, check=False, exist_ok=True)
    assert r.returncode == 1, "--exist-ok accepted a different spec under the same name"
    assert "tok" in r.stderr
    assert [p["name"] for p in ld.status()["pipelines"]] == ["tok"]
    assert ld.pipeline("tok")["spec"]["seed"] == 7


def test_drop(ld, tokfile):
    ld.create(good_spec(tokfile))
    ld.ctl("drop", "tok")
    assert ld.status()["pipelines"] == []
    r = ld.ctl("drop", "tok", check=False)
    assert r.returncode != 0 and "tok" in r.stderr, r.stderr
    # the name is free again
    ld.create(good_spec(tokfile))
    assert [p["name"] for p in ld.status()["pipelines"]] == ["tok"]


def test_drop_with_clients_needs_force(ld, workdir):
    path = os.path.join(workdir, "f.bin")
    random_tokens(path, 400 * L + 1, "uint16")
    ld.create(token_spec("busy", path, L, "uint16", batch_size=4, epochs=0, prefetch=2))
    c = ld.popen_consume("busy", dump=False)
    ld.wait_for(lambda s: any(x["pid"] == c.pid and x["delivered"] > 0 for x in s["clients"]),
                "consumer streaming")
    r = ld.ctl("drop", "busy", check=False)
    assert r.returncode != 0, "drop of a pipeline with clients attached succeeded without --force"
    assert "busy" in r.stderr
    assert [p["name"] for p in ld.status()["pipelines"]] == ["busy"]
    ld.ctl("drop", "busy", "--force")
    res = c.wait(timeout=30)
    assert res.rc != 0, "the consumer of a force-dropped endless pipeline exited 0"
    ld.wait_for(lambda s: s["pipelines"] == [] and s["clients"] == [],
                "dropped pipeline and its client gone")
    # its slab goes back to the budget once no job builds into it any more
    # (registry.c, pipeline_maybe_free): one may still run at the drop
    ld.wait_for(lambda s: s["memory_used"] == 0, "the dropped pipeline's memory given back")


def test_memory_limit_refuses_pipeline(daemon, workdir):
    path = os.path.join(workdir, "m.bin")
    tok = random_tokens(path, 1024 * 64 + 1, "uint16")
    limit = 1 << 20
    d = daemon(memory_limit=limit)
    assert d.status()["memory_limit"] == limit
    # 8 slots x 32 rows x 2 fields x 1024 x int64 = 4 MiB > 1 MiB
    r = d.create(token_spec("big", path, 1024, "uint16", batch_size=32, prefetch=8), check=False)
    assert r.returncode == 1, f"a pipeline over the memory limit was created: {r.stderr!r}"
    assert "memory" in r.stderr.lower(), r.stderr
    st = d.status()
    assert st["pipelines"] == [] and st["memory_used"] == 0
    # a small one fits, and is accounted for
    d.create(token_spec("small", path, L, "uint16", batch_size=4, prefetch=2))
    st = d.status()
    assert 0 < st["memory_used"] <= limit
    used = st["memory_used"]
    # a second small one fits too; the sum stays within the limit
    d.create(token_spec("small2", path, L, "uint16", batch_size=4, prefetch=2))
    assert used < d.status()["memory_used"] <= limit
    res = d.consume("small", "--batches", 3)
    assert res.dump == token_dump(tok, L, sequential_batches(4096, 4)[:3])
    d.ctl("drop", "small")
    d.ctl("drop", "small2")
    # a dropped pipeline's slab goes back to the budget once no job still
    # builds into it (registry.c, pipeline_maybe_free): the prefetch job the
    # consumer's last release started may still run for a moment
    d.wait_for(lambda st: st["memory_used"] == 0, "the dropped pipelines' memory given back")
    # with the room freed, a pipeline that fits the whole budget is accepted again
    d.create(token_spec("mid", path, 1024, "uint16", batch_size=4, prefetch=4))   # 4 x 64 KiB


def test_consumer_of_killed_during_drop_force(ld, workdir):
    """drop --force while a consumer is stopped: the consumer later ends with
    an error and the daemon keeps no trace of it."""
    path = os.path.join(workdir, "g.bin")
    random_tokens(path, 400 * L + 1, "uint16")
    ld.create(token_spec("g", path, L, "uint16", batch_size=4, epochs=0, prefetch=2))
    c = ld.popen_consume("g", dump=False, )
    ld.wait_for(lambda s: any(x["pid"] == c.pid and x["delivered"] > 0 for x in s["clients"]),
                "consumer streaming")
    c.signal(signal.SIGSTOP)
    ld.ctl("drop", "g", "--force")
    c.signal(signal.SIGCONT)
    res = c.wait(timeout=30)
    assert res.rc != 0
    ld.wait_for(lambda s: s["pipelines"] == [] and s["clients"] == [], "nothing left")


def _nested(n):
    v = 0
    for _ in range(n):
        v = [v]
    return v


def python_spec(**src):
    spec = {"name": "py", "batch_size": 4, "source": {
        "kind": "python", "dataset": "mymod:Data", "samples": 8,
        "fields": [{"name": "x", "dtype": "int64", "shape": []}]}}
    spec["source"].update(src)
    return spec


@pytest.mark.parametrize("key", ["structure", "args"])
def test_python_spec_nesting_is_bounded(ld, key):
    """Every client that lists a python pipeline parses its structure and
    args (Python's json stops near 1000 levels): the daemon takes 128."""
    deep = {"structure": _nested(129), "args": {"a": _nested(128)}}[key]
    r = ld.create(python_spec(**{key: deep}), check=False)
    assert r.returncode == 1 and f"source.{key}: nested more than 128 levels deep" in r.stderr, \
        r.stderr
    assert ld.status()["pipelines"] == []
    ok = {"structure": _nested(128), "args": {"a": _nested(127)}}[key]
    ld.create(python_spec(**{key: ok}))
    assert ld.pipeline("py")["spec"]["source"][key] == ok
