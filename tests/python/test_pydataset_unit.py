# SPDX-License-Identifier: MIT
"""Your own Dataset, without the daemon: loaderd.pydataset (flatten, rebuild
as torch's default_collate, field learning and its refusals, the seeding
function) and the workers' host and workers (loaderd._pyhost, _pyworker)
against a fake daemon that speaks daemon/engine/pyw-wire.h on <socket>.workers."""

import collections
import functools
import json
import os
import pickle
import random
import signal
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import pydatasets as D
from loaderd import _pywire as W
from loaderd import pydataset as P
from loaderd import _pystart

torch = pytest.importorskip("torch")
from torch.utils.data import default_collate  # noqa: E402


# ------------------------------------------------------------ helpers

def batch_of(samples, batched=False):
    """The fields of @samples as loaderd would fill them: name -> stacked
    tensor (what the trainer's Batch holds)."""
    flat = [dict(P.flatten(s)[1]) for s in samples]
    out = {}
    for name in flat[0]:
        arrs = [P.leaf_array(f[name], P.leaf_info(name, f[name])[0]) for f in flat]
        out[name] = torch.from_numpy(np.stack([np.asarray(a) for a in arrs]))
    return out


def same(a, b):
    """Structure, types and values equal (tensors: dtype, shape, values)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), (a, b)
        assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
        assert torch.equal(a, b), (a, b)
        return
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, (int, float)):
        assert a == b
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    else:
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)


# --------------------------------------------------- flatten and rebuild

@pytest.mark.parametrize("cls", [D.DictSamples, D.TupleSamples, D.NamedSamples])
def test_rebuild_as_default_collate(cls):
    ds = cls()
    samples = [ds[i] for i in range(5)]
    fields, structure = P.learn_fields(samples[0])
    got = P.rebuild(structure, batch_of(samples), types=P.own_types(structure))
    same(got, default_collate(samples))


def test_rebuild_keeps_no_cycle():
    """Dropping the rebuilt batch frees the fields at once (their slot goes
    back), without waiting for the cyclic GC."""
    import gc
    import weakref

    class Fields(dict):
        pass
    _, structure = P.learn_fields({"a": (np.zeros(2), 1), "b": [np.zeros(1)]})
    b = Fields({"a.0": torch.zeros(3, 2), "a.1": torch.zeros(3), "b.0": torch.zeros(3, 1)})
    ref = weakref.ref(b)
    gc.disable()
    try:
        out = P.rebuild(structure, b)
        del b
        assert ref() is None
        assert set(out) == {"a", "b"}
    finally:
        gc.enable()


def test_rebuild_bare_tensor_and_names():
    samples = [torch.full((2,), float(i)) for i in range(3)]
    fields, structure = P.learn_fields(samples[0])
    assert [f["name"] for f in fields] == ["sample"]
    same(P.rebuild(structure, batch_of(samples)), default_collate(samples))
    st, leaves = P.flatten((1, [2, {"a": 3}], {"b": {"c": 4.0}}))
    assert [n for n, _ in leaves] == ["0", "1.0", "1.1.a", "2.b.c"]


def test_leaf_dtypes():
    f, _ = P.learn_fields({"i": 1, "f": 1.0, "b": True, "n": np.uint16(3),
                           "t": torch.zeros(2, dtype=torch.bfloat16)})
    assert [(x["name"], x["dtype"], x["shape"]) for x in f] == [
        ("i", "int64", []), ("f", "float64", []), ("b", "bool", []), ("n", "uint16", []),
        ("t", "bfloat16", [2])]


def test_object_leaves_and_their_part():
    """What cannot be a field (a str, None, bytes, an empty or a string
    array) is an object leaf {"o": name}; the rows then have an object part
    of max(64 KiB, 4x sample 0's) bytes, hidden from the structure."""
    f, st = P.learn_fields({"x": np.zeros(2), "name": "s0", "none": None,
                            "e": np.zeros((2, 0)), "u": np.array(["a", "b"])})
    assert [(x["name"], x["dtype"], x["shape"], x["pad"]) for x in f] == [
        ("x", "float64", [2], False), ("__obj__", "uint8", [65536], True),
        ("__obj___len", "int64", [], False)]
    assert st == {"dict": [["x", {"f": "x"}], ["name", {"o": "name"}], ["none", {"o": "none"}],
                           ["e", {"o": "e"}], ["u", {"o": "u"}]]}
    assert P.check_structure(st, f) is st and P.object_bytes_of(f) == 65536
    big = P.learn_fields(("s" * 40000, 1))[0]
    assert P.object_bytes_of(big) == 160384   # 4x its blob (40 089 bytes), 64-aligned
    # collated: a leaf without the batch as its first dimension is an object
    f, st = P.learn_fields((torch.zeros(3, 5), torch.zeros(1, 2)), batched=True)
    assert st == {"collated": {"tuple": [{"o": "0"}, {"f": "1"}]}}
    assert P.object_bytes_of(P.learn_fields(1, object_bytes=4096)[0]) == 4096
    assert P.object_bytes_of(P.learn_fields(1)[0]) is None   # all numbers: none
    with pytest.raises(P.SampleError, match="no '__obj__'"):
        P.check_structure({"o": "x"}, [{"name": "x", "dtype": "int8", "shape": []}])


def test_object_part_round_trip_zero_copy_and_restricted():
    from loaderd import _objpart as O
    region = np.zeros(1 << 16, dtype=np.uint8)
    obj = {"t": torch.arange(6, dtype=torch.float32).reshape(2, 3), "s": "text",
           "a": np.arange(4, dtype=np.int16), "n": None, "bf": torch.ones(2, dtype=torch.bfloat16),
           "sc": np.float32(1.5), "empty": torch.zeros(0, 3)}
    plain = {"c": 1 + 2j, "set": {1, 2}, "fs": frozenset([3]), "od": collections.OrderedDict(a=1),
             "size": torch.Size([2, 3]), "dev": torch.device("cpu"), "dt": torch.float16,
             "ba": bytearray(b"xy"), "b": b"raw", "l": [1, (2.5, True)]}
    n = O.pack(dict(obj, **plain), region)
    back = O.unpack(region[:n], trusted=False)
    assert {k: back[k] for k in plain} == plain
    assert back["s"] == "text" and back["n"] is None and back["sc"] == np.float32(1.5)
    assert back["t"].tolist() == [[0, 1, 2], [3, 4, 5]] and back["a"].tolist() == [0, 1, 2, 3]
    assert back["bf"].dtype == torch.bfloat16 and back["empty"].shape == (0, 3)
    lo, hi = region.ctypes.data, region.ctypes.data + n
    assert lo <= back["t"].data_ptr() < hi and lo <= back["a"].ctypes.data < hi   # views
    # a class (here one whose pickle runs a function) only with the full unpickler
    n = O.pack({"d": D.Plain()}, region)
    assert type(O.unpack(region[:n], trusted=True)["d"]) is D.Plain
    with pytest.raises(O.Refused, match="pydatasets.Plain"):
        O.unpack(region[:n], trusted=False)
    evil = pickle.dumps(functools.partial(print, "ran"), protocol=5)
    with pytest.raises(O.Refused, match="functools.partial"):
        O.RestrictedUnpickler(__import__("io").BytesIO(evil)).load()
    with pytest.raises(O.TooBig) as e:
        O.pack(torch.zeros(20000), region)
    assert e.value.needed > 80000 and e.value.capacity == 1 << 16
    with pytest.raises(pickle.UnpicklingError, match="malformed"):
        O.unpack(np.frombuffer(b"LDO1" + b"\xff" * 60, dtype=np.uint8), trusted=False)


@pytest.mark.parametrize("sample,words", [
    ({"x": np.zeros(2), "name": "s0"}, ["'name'", "str", "encode"]),
    ((np.zeros(2), None), ["'1'", "NoneType"]),
    ({1: np.zeros(2)}, ["dict key 1", "str"]),
    ({"a b": 1}, ["'a b'", "not valid"]),
    ({"a.b": 1}, ["'a.b'", "nested"]),
    ({"x": np.array(["a", "b"])}, ["'x'", "dtype <U1"]),
    ({"x": np.zeros(2, dtype=complex)}, ["'x'", "complex128"]),
    ({"x": ()}, ["empty tuple"]),
    ({"x": b"raw"}, ["'x'", "bytes"]),
])
def test_refusals(sample, words):
    with pytest.raises(P.SampleError) as ei:
        P.learn_fields(sample, object_bytes=0)   # no object part: refused
    for w in words:
        assert w in str(ei.value), str(ei.value)


def test_too_many_fields_and_pad_len():
    with pytest.raises(P.SampleError, match="1..16"):
        P.learn_fields({f"k{i}": i for i in range(17)})
    f = P.check_fields([{"name": "tok", "dtype": "int64", "shape": [8], "pad": True}])
    assert f[1] == {"name": "tok_len", "dtype": "int64", "shape": [], "pad": False}
    with pytest.raises(P.SampleError, match="dtype must be one of"):
        P.check_fields([{"name": "x", "dtype": "int128", "shape": []}])
    with pytest.raises(P.SampleError, match="maximum length"):
        P.check_fields([{"name": "x", "dtype": "int8", "shape": [], "pad": True}])


def test_structure_from_declared_names():
    f = P.check_fields([{"name": "0", "dtype": "float32", "shape": [3]},
                        {"name": "1", "dtype": "int64", "shape": []}])
    assert P.structure_from_names(f) == {"list": [{"f": "0"}, {"f": "1"}]}
    f = P.check_fields({"tok": {"dtype": "int64", "shape": [5], "pad": True},
                        "meta.y": {"dtype": "int64", "shape": []}})
    st = P.structure_from_names(f)
    assert st == {"dict": [["tok", {"f": "tok"}], ["meta", {"dict": [["y", {"f": "meta.y"}]]}]]}
    b = {"tok": torch.zeros(2, 5), "tok_len": torch.tensor([1, 2]), "meta.y": torch.tensor([3, 4])}
    got = P.rebuild(st, b, {"tok"})
    assert list(got) == ["tok", "tok_len", "meta"] and got["tok_len"] is b["tok_len"]


# ------------------------- a structure read from another user's spec

PLANTED = """
import os
with open(os.environ["LDR_MARKER"], "a") as f:
    f.write("ran as uid %d\\n" % os.getuid())
class Evil(tuple):
    def __new__(cls, *a):
        return tuple.__new__(cls, a)
"""


@pytest.mark.parametrize("path,tname", [("pickle:loads", "loads"), ("os:system", "system"),
                                        ("ldr_planted_mod:Evil", "Evil"),
                                        ("ldr_planted_mod:Evil.__new__", "__new__"),
                                        ("ldr_planted_mod:class", "namedtuple")])
def test_structure_imports_and_calls_nothing_it_names(workdir, monkeypatch, path, tname):
    """A reader rebuilds a tuple that a spec says is of "type" X without
    importing or calling X: a namedtuple of the spec's names that loaderd
    makes, or (no names, an older client's spec) a list, as a tuple."""
    with open(os.path.join(workdir, "ldr_planted_mod.py"), "w") as f:
        f.write(PLANTED)
    marker = os.path.join(workdir, "marker")
    monkeypatch.setenv("LDR_MARKER", marker)
    monkeypatch.syspath_prepend(workdir)
    fields = [{"name": "a", "dtype": "uint8", "shape": [4], "pad": False},
              {"name": "b", "dtype": "int64", "shape": [], "pad": False}]
    b = {"a": torch.tensor([list(pickle.dumps(0)[:4])] * 2, dtype=torch.uint8),
         "b": torch.tensor([7, 8])}
    named = {"tuple": [{"f": "a"}, {"f": "b"}], "type": path, "names": ["data", "label"]}
    src = {"fields": fields, "structure": named}
    st, pads, types = P.reader_structure(json.loads(json.dumps(src)))
    assert types == {} and pads == set()
    got = P.rebuild(st, b, pads, types)
    assert type(got).__name__ == tname and \
        type(got)._fields == ("data", "label") and type(got).__module__ == "loaderd.pydataset"
    assert got.data is b["a"] and got.label is b["b"]
    old = {"tuple": [{"f": "a"}, {"f": "b"}], "type": path}   # no names: a list
    assert P.rebuild(P.reader_structure({"fields": fields, "structure": old})[0], b) == \
        [b["a"], b["b"]]
    assert P.rebuild({"collated": old}, b) == (b["a"], b["b"])
    assert "ldr_planted_mod" not in sys.modules and not os.path.exists(marker)


def test_namedtuple_is_its_class_only_where_learnt():
    """The process that learnt a structure from its own sample rebuilds its
    namedtuple as the class itself (torch's default_collate does), found by
    identity, never by import; a structure it did not learn, even naming
    that class, gets loaderd's namedtuple of the same name and fields."""
    samples = [D.NamedSamples()[i] for i in range(3)]
    _, st = P.learn_fields(samples[0])
    assert st == {"tuple": [{"f": "0"}, {"f": "1"}], "type": "pydatasets:Pair",
                  "names": ["image", "label"]}
    from_daemon = json.loads(json.dumps(st))
    got = P.rebuild(from_daemon, batch_of(samples), types=P.own_types(from_daemon))
    same(got, default_collate(samples))
    assert type(got) is D.Pair
    other = dict(from_daemon, names=["label", "image"])   # not what this process learnt
    assert P.own_types(other) == {}
    got = P.rebuild(other, batch_of(samples), types=P.own_types(other))
    assert type(got) is not D.Pair and type(got).__name__ == "Pair" and \
        type(got)._fields == ("label", "image")


F2 = [{"name": "a", "dtype": "int64", "shape": [], "pad": False},
      {"name": "b", "dtype": "int64", "shape": [], "pad": False}]


def _deep(n):
    s = {"f": "a"}
    for _ in range(n - 1):
        s = {"list": [s]}
    return s


@pytest.mark.parametrize("structure,msg", [
    ([{"f": "a"}], "the top node must be an object, not list"),
    ({"f": "zz"}, "the structure names field 'zz', which is not declared"),
    ({"list": [{"f": "a"}], "type": "os:system"}, "the top node has the unknown key 'type'"),
    ({"list": [{"f": "a"}, {"f": "b", "x": 1}]}, "node '1' has the unknown key 'x'"),
    ({"list": [{"collated": {"f": "a"}}]}, "(\"collated\" is only the top node)"),
    ({"collated": {"f": "a"}, "f": "b"}, "has \"collated\" and other keys"),
    ({"tuple": []}, "\"tuple\" must be a non-empty array"),
    ({"f": "a", "list": [{"f": "b"}]}, "must have one of the keys"),
    ({"dict": [["a", {"f": "a"}, 3]]}, "\"dict\" entry 0 must be [key, node]"),
    ({"dict": [[1, {"f": "a"}]]}, "\"dict\" entry 0 must be [key, node]"),
    ({"tuple": [{"f": "a"}, {"f": "b"}], "type": 5}, "\"type\" must be a string of 1..255"),
    ({"tuple": [{"f": "a"}, {"f": "b"}], "type": "m:T", "names": ["x"]},
     "\"names\" must be a list of 2 field names, one per item"),
    ({"tuple": [{"f": "a"}, {"f": "b"}], "type": "m:T", "names": ["x", "import os"]},
     "'import os' cannot be a namedtuple field"),
    ({"tuple": [{"f": "a"}, {"f": "b"}], "type": "m:T", "names": ["x", "_fields"]},
     "'_fields' cannot be a namedtuple field"),
    ({"tuple": [{"f": "a"}, {"f": "b"}], "type": "m:T", "names": ["x", "x"]},
     "a field name is there twice"),
    (_deep(41), "is nested too deep: a structure has at most 40 levels"),
    ({"list": [{"f": "a"}] * 1024}, "is one node too many: a structure has at most 1024"),
])
def test_check_structure_refuses(structure, msg):
    with pytest.raises(P.SampleError) as e:
        P.check_structure(structure, F2)
    assert msg in str(e.value), str(e.value)
    with pytest.raises(P.SampleError) as e:
        P.reader_structure({"fields": F2, "structure": structure})
    assert str(e.value).startswith("its spec's source.structure"), str(e.value)


@pytest.mark.parametrize("src,msg", [
    ({}, "its spec's source.fields is not a list of fields"),
    ({"fields": 5, "structure": {"f": "a"}}, "its spec's source.fields is not a list of fields"),
    ({"fields": [{"name": 1}]}, "fields[0]: name is required"),
    ({"fields": [3], "structure": {"f": "a"}}, "the spec's fields are not a list of"),
])
def test_reader_structure_fields_untrusted(src, msg):
    with pytest.raises(P.SampleError) as e:
        P.reader_structure(src)
    assert msg in str(e.value), str(e.value)


def test_check_structure_takes_what_loaderd_writes():
    P.check_structure(_deep(40), F2)
    P.check_structure({"list": [{"f": "a"}] * 1023}, F2)
    name = ".".join("0" * 32)   # 63 characters: 32 levels and the leaf
    fields, st = P.learn_fields(functools.reduce(lambda x, _: (x,), range(32), np.int64(1)))
    assert [f["name"] for f in fields] == [name]
    P.check_structure(st, fields)
    for ds in (D.DictSamples(), D.TupleSamples(), D.NamedSamples()):
        fields, st = P.learn_fields(ds[0])
        P.check_structure(json.loads(json.dumps(st)), fields)


def test_check_leaf_messages():
    field = {"name": "image", "dtype": "float32", "shape": [3, 224, 224], "pad": False}
    msg = P.check_leaf(17, field, "float32", (3, 200, 224), True)
    assert msg.startswith("dataset[17]: field 'image' has shape (3, 200, 224), the pipeline's is "
                          "(3, 224, 224) (learnt from dataset[0]);"), msg
    assert P.check_leaf(1, field, "float64", (3, 224, 224), True) is None  # same_kind
    assert "cannot be cast" in P.check_leaf(2, {"name": "y", "dtype": "int64", "shape": [],
                                                "pad": False}, "float32", (), True)
    pad = {"name": "tok", "dtype": "int64", "shape": [5], "pad": True}
    assert P.check_leaf(0, pad, "int64", (5,), False) is None
    assert P.check_leaf(0, pad, "int64", (0,), False) is None
    assert "at most 5" in P.check_leaf(0, pad, "int64", (6,), False)


def test_write_leaf_pad_and_bfloat16():
    dst = np.full(5, 9, dtype=np.int64)
    ln = np.zeros((), dtype=np.int64)
    P.write_leaf(dst, np.array([1, 2], dtype=np.int32), {"name": "t", "dtype": "int64",
                                                         "shape": [5], "pad": True}, ln)
    assert dst.tolist() == [1, 2, 0, 0, 0] and int(ln) == 2
    bits = np.zeros(3, dtype=np.uint16)
    P.write_leaf(bits, torch.tensor([1.5, -2.0, 3.0]), {"name": "b", "dtype": "bfloat16",
                                                         "shape": [3], "pad": False})
    back = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float()
    assert back.tolist() == [1.5, -2.0, 3.0]


# --------------------------------------------------------------- seeding

def _ref_splitmix(x):
    m = (1 << 64) - 1
    z = (x + 0x9e3779b97f4a7c15) & m
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & m
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & m
    return z ^ (z >> 31)


def test_sample_seed_is_the_documented_function():
    for seed, epoch, idx in [(0, 0, 0), (7, 3, 12345), ((1 << 64) - 1, 1 << 40, 99)]:
        s = _ref_splitmix(seed ^ 0x5059444154415345)
        s = _ref_splitmix(s ^ epoch)
        s = _ref_splitmix(s ^ idx) & ((1 << 63) - 1)  # torch's seeds are int64
        assert P.sample_seed(seed, epoch, idx) == s
    assert P.sample_seed(0, 0, 0) == 4980929881311350946  # docs/python.md's example
    assert len({P.sample_seed(1, e, i) for e in range(4) for i in range(50)}) == 200


def test_python_random_state_is_the_documented_one():
    # docs/python.md, "Seeding": pair k of the 624 words is splitmix64(s + k)
    s = 4980929881311350946
    words = []
    for k in range(312):
        z = _ref_splitmix(s + k)
        words += [z & 0xffffffff, z >> 32]
    want = (3, tuple(words) + (624,), None)
    got = []
    for how in ("C", "numpy"):  # loaderd._fast's fill, and without it
        P._mt_seed = None if how == "C" else False
        random.seed(1)
        random.gauss(0, 1)  # a cached second normal, which seeding clears
        P.seed_all(s)
        assert random.getstate() == want, how
        got.append((random.random(), random.gauss(0, 1), np.random.random(),
                    torch.rand(1).item()))
    P._mt_seed = None
    assert P._mt_fill(), "loaderd._fast was built: its mt_seed is used"
    P.seeder()(s)  # a worker's per-sample seeding: the same states
    assert random.getstate() == want
    got.append((random.random(), random.gauss(0, 1), np.random.random(), torch.rand(1).item()))
    assert got[0] == got[1] == got[2]
    assert (words[0], words[1], words[623]) == (0x1fcb4557, 0xa9039a5f, 0xc9ca2617)


def test_seed_all_reproduces_a_sample():
    ds = D.RandomAugment(n=4)
    outs = []
    for _ in range(2):
        P.seed_all(P.sample_seed(5, 2, 3))
        outs.append(ds[3])
    same(list(outs[0]), list(outs[1]))
    P.seed_all(P.sample_seed(5, 3, 3))
    assert not torch.equal(ds[3][0], outs[0][0])


def test_build_spec_learns_seeded_and_keeps_the_trainers_rng():
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    r, n, t = random.random(), np.random.random(), torch.rand(1)
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    ds = D.RandomAugment(n=10)
    spec, payload = P.build_spec(ds, overrides={"batch_size": 4, "seed": 3}, num_workers=2)
    assert (random.random(), np.random.random()) == (r, n) and torch.equal(torch.rand(1), t)
    src = spec["source"]
    assert src["kind"] == "python" and src["dataset"] == "pydatasets:RandomAugment"
    assert src["samples"] == 10 and src["collate"] == ""
    assert src["digest"] == __import__("hashlib").sha256(pickle.dumps(
        ds, protocol=pickle.HIGHEST_PROTOCOL)).hexdigest()
    assert [(f["name"], f["dtype"], f["shape"]) for f in src["fields"]] == [
        ("0", "float32", [3, 24, 24]), ("1", "int64", []), ("2", "float64", [])]
    prefix = f"py-{os.geteuid()}-randomaugment-"   # the uid: a name of the caller's own
    assert spec["name"].startswith(prefix) and len(spec["name"]) == len(prefix) + 10
    assert payload["nworkers"] == 2 and payload["dataset"]["pickle"]
    # the same dataset, the same spec and name; another seed, another name
    spec2, _ = P.build_spec(D.RandomAugment(n=10), overrides={"batch_size": 4, "seed": 3})
    assert spec2["name"] == spec["name"]
    spec3, _ = P.build_spec(D.RandomAugment(n=10), overrides={"batch_size": 4, "seed": 4})
    assert spec3["name"] != spec["name"]
    # what the worker writes for epoch 0 index 0 is what was learnt from
    P.seed_all(P.sample_seed(3, 0, 0))
    assert list(ds[0][0].shape) == [3, 24, 24]


def test_build_spec_import_path_collate_and_pickling_errors():
    spec, payload = P.build_spec({"source": {"kind": "python", "dataset": "pydatasets:Plain",
                                             "args": {"n": 9}}, "name": "p"},
                                 overrides={"batch_size": 3}, collate_fn=D.stack_collate)
    src = spec["source"]
    assert src["samples"] == 9 and src["digest"] == "" and src["collate"] == \
        "pydatasets:stack_collate"
    # a collate_fn's output has an object part by default (its later outputs
    # may have other shapes): 64 KiB a row here
    assert [(f["name"], f["dtype"], f["shape"]) for f in src["fields"]] == [
        ("0", "float32", [3]), ("1", "int32", []), ("__obj__", "uint8", [65536]),
        ("__obj___len", "int64", [])]
    assert payload["dataset"] == {"import": "pydatasets:Plain", "args": {"n": 9}}
    with pytest.raises(AttributeError, match="Can't pickle local object.*worker_init_fn cannot "
                                             "be pickled"):
        P.build_spec(D.Plain(), overrides={}, worker_init_fn=lambda w: None)
    with pytest.raises(P.SampleError, match="'name'"):
        P.build_spec(D.WithString(), overrides={}, object_bytes=0)
    with pytest.raises(ValueError, match="num_workers"):
        P.build_spec(D.Plain(), overrides={}, num_workers=1000)


def test_host_imports_no_torch():
    code = ("import sys, loaderd, loaderd._pyhost, loaderd._pywire, loaderd._pyworker; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# ------------------------------------------ host and workers, fake daemon

class FakeDaemon:
    """The daemon's end of <socket>.workers, driven step by step by a test:
    one slab (a memfd), the host handshake, then TASKs to chosen workers."""

    def __init__(self, workdir, fields, nslots=2, batch_size=4, nsamples=25, seed=0,
                 on_error=0):
        self.path = os.path.join(workdir, "ld.sock")
        self.fields = fields
        self.places = []
        off = 0
        for f in fields:
            sb = int(np.prod(f["shape"], dtype=np.int64)) * P.field_np_dtype(f["dtype"]).itemsize
            self.places.append((off, sb))
            off += (sb * batch_size + 63) // 64 * 64
        self.slot_bytes = max(64, off)
        self.nslots, self.batch_size, self.nsamples = nslots, batch_size, nsamples
        self.seed, self.on_error = seed, on_error
        self.size = self.slot_bytes * nslots
        self.fd = os.memfd_create("fake-slab")
        os.ftruncate(self.fd, self.size)
        import mmap
        self.mm = mmap.mmap(self.fd, self.size)
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path + ".workers")
        self.srv.listen(16)
        self.srv.settimeout(60)
        self.workers = {}
        self.task_id = 0

    def welcome(self, nworkers):
        body = W.WELCOME_S.pack(0, len(self.fields), self.size, self.slot_bytes, self.nslots,
                                self.batch_size, self.nsamples, self.seed, self.on_error,
                                nworkers)
        return body + b"".join(W.FIELD_S.pack(o, s) for o, s in self.places)

    def accept_host(self):
        c, _ = self.srv.accept()
        c.settimeout(60)
        t, body = W.recv(c)
        assert t == W.HELLO
        version, role, nworkers, _, pid, _, name = W.HELLO_S.unpack(body)
        assert (version, role) == (1, W.ROLE_HOST)
        self.nworkers, self.host_pid = nworkers, pid
        self.pipeline = name.rstrip(b"\0").decode()
        payload = self.welcome(nworkers)
        hdr = W.HDR.pack(W.MAGIC, W.WELCOME, 0, len(payload))
        socket.send_fds(c, [hdr + payload], [self.fd])
        assert W.recv(c) == (W.MAPPED, b"")
        W.send(c, W.READY)
        self.host = c

    def accept_worker(self):
        c, _ = self.srv.accept()
        c.settimeout(60)
        t, body = W.recv(c)
        assert t == W.HELLO
        version, role, nworkers, wid, pid, _, name = W.HELLO_S.unpack(body)
        assert (version, role, nworkers) == (1, W.ROLE_WORKER, self.nworkers)
        W.send(c, W.WELCOME, self.welcome(self.nworkers))
        self.workers[wid] = (c, pid)
        return wid, pid

    def task(self, wid, epoch, slot, row0, idx):
        self.task_id += 1
        c = self.workers[wid][0]
        W.send(c, W.TASK, W.TASK_S.pack(self.task_id, epoch, slot, row0, len(idx), 0) +
               struct.pack(f"={len(idx)}Q", *idx))
        t, body = W.recv(c)
        if t == W.DONE:
            tid, skipped = W.DONE_S.unpack(body)
            assert tid == self.task_id
            return "done", skipped
        assert t == W.FAIL, t
        tid, index, status, _ = W.FAIL_S.unpack_from(body)
        assert tid == self.task_id and status < 0
        return "fail", (index, body[W.FAIL_S.size:].decode())

    def field(self, slot, i, nrows):
        off, sb = self.places[i]
        f = self.fields[i]
        start = slot * self.slot_bytes + off
        a = np.frombuffer(self.mm, dtype=P.field_np_dtype(f["dtype"]), count=sb * nrows //
                          P.field_np_dtype(f["dtype"]).itemsize, offset=start)
        return a.reshape([nrows] + f["shape"]).copy()

    def close(self):
        for c, _ in self.workers.values():
            c.close()
        if getattr(self, "host", None):
            self.host.close()
        self.srv.close()
        self.mm.close()
        os.close(self.fd)


def start_host(fd, ds, overrides=None, **kw):
    spec, payload = P.build_spec(ds, overrides=dict(overrides or {}), **kw)
    host = _pystart.start(payload, "exec")   # as the trainer starts it (host_command)
    host.go(payload, fd.path, None)
    host.proc.channel = host                 # the trainer's end stays open
    return spec, host.proc


def expected(ds, seed, epoch, idx):
    out = []
    for i in idx:
        P.seed_all(P.sample_seed(seed, epoch, i))
        out.append(ds[i])
    return out


@pytest.fixture
def fake(workdir):
    made = []

    def make(ds, nworkers=2, overrides=None, batch_size=4, on_error=0, seed=0, **kw):
        fields, _ = P.learn_fields(ds[0]) if "fields" not in kw else (P.check_fields(kw["fields"]), 0)
        if kw.get("collate_fn") is not None:
            fields, _ = P.learn_fields(kw["collate_fn"]([ds[0]]), batched=True)
        fd = FakeDaemon(workdir, fields, batch_size=batch_size, nsamples=len(ds), seed=seed,
                        on_error=on_error)
        spec, proc = start_host(fd, ds, overrides={"seed": seed, **(overrides or {})},
                                num_workers=nworkers, **kw)
        made.append((fd, proc))
        fd.accept_host()
        for _ in range(nworkers):
            fd.accept_worker()
        fd.proc = proc
        return fd
    yield make
    for fd, proc in made:
        fd.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("the host did not exit within 10 s of EOF")


def test_workers_fill_slots_exactly(fake):
    ds = D.RandomAugment(n=12)
    fd = fake(ds, nworkers=2, seed=11)
    idx = [5, 0, 11, 3]
    assert fd.task(1, 2, 1, 0, idx[:2]) == ("done", 0)
    assert fd.task(0, 2, 1, 2, idx[2:]) == ("done", 0)
    want = expected(ds, 11, 2, idx)
    got = [fd.field(1, i, 4) for i in range(3)]
    for r, s in enumerate(want):
        assert np.array_equal(got[0][r], s[0].numpy())
        assert got[1][r] == s[1] and got[2][r] == s[2]


def test_worker_info_and_init_fn(fake):
    fd = fake(D.WorkerInfoSamples(), nworkers=2, worker_init_fn=D.init_marker)
    for wid in (0, 1):
        assert fd.task(wid, 0, 0, wid, [wid]) == ("done", 0)
    rows = fd.field(0, 0, 2)
    assert rows.tolist() == [[0, 0, 0, 1], [1, 1, 1, 1]]


def test_exception_reaches_fail_with_traceback(fake):
    fd = fake(D.Plain(fail={6}), nworkers=1)
    state, (index, text) = fd.task(0, 0, 0, 0, [4, 6, 7])
    assert state == "fail" and index == 6
    assert text.startswith("dataset[6] raised ValueError: bad sample 6 (at pydatasets.py:"), text
    assert "in __getitem__)\nworker 0 (pid" in text and "Traceback" in text
    assert "_pyworker.py" not in text, "loaderd's own frames are left out"
    assert fd.task(0, 0, 0, 0, [4]) == ("done", 0)  # the worker goes on


def test_skip_replaces_with_next_index(fake):
    ds = D.Plain(n=10, fail={3, 4, 9})
    fd = fake(ds, nworkers=1, on_error=1)
    assert fd.task(0, 1, 0, 0, [3, 9, 2]) == ("done", 2)
    assert fd.field(0, 1, 3).tolist() == [5, 0, 2]   # 3 -> 5 (4 fails too), 9 -> 0 (wraps)
    assert np.array_equal(fd.field(0, 0, 3)[0], np.arange(5, 8, dtype=np.float32))


def test_bad_shape_names_the_field(fake):
    fd = fake(D.BadShape(), nworkers=1)
    state, (index, text) = fd.task(0, 0, 0, 0, [2, 3])
    assert state == "fail" and index == 3
    assert text.startswith("dataset[3]: field '0' has shape (4,), the pipeline's is (3,) "
                           "(learnt from dataset[0])"), text


def test_pad_fields(fake):
    fields = [{"name": "tok", "dtype": "int64", "shape": [6], "pad": True},
              {"name": "y", "dtype": "int64", "shape": []}]
    fd = fake(D.VarLen(), nworkers=1, fields=fields)
    assert fd.task(0, 0, 0, 0, [0, 3, 4]) == ("done", 0)
    tok, y, ln = (fd.field(0, i, 3) for i in range(3))
    assert tok.tolist() == [[0, 0, 0, 0, 0, 0], [3, 4, 5, 6, 0, 0], [4, 5, 6, 7, 8, 0]]
    assert ln.tolist() == [1, 4, 5] and y.tolist() == [0, 3, 4]


def test_collate_fn_task(fake):
    fd = fake(D.Plain(), nworkers=1, collate_fn=D.stack_collate)
    assert fd.task(0, 0, 1, 0, [1, 2, 3, 4]) == ("done", 0)
    x, y = fd.field(1, 0, 4), fd.field(1, 1, 4)
    assert y.tolist() == [1, 2, 3, 4] and x[2].tolist() == [6, 8, 10]


def test_dead_worker_is_reported_and_restarted(fake):
    fd = fake(D.Plain(), nworkers=2)
    c, pid = fd.workers[1]
    os.kill(pid, signal.SIGKILL)
    fd.host.settimeout(20)
    t, body = W.recv(fd.host)
    assert t == W.WORKER_EXIT
    wid, wpid, status, _ = W.WORKER_EXIT_S.unpack(body)
    assert (wid, wpid) == (1, pid) and os.WIFSIGNALED(status) and \
        os.WTERMSIG(status) == signal.SIGKILL
    c.close()
    wid2, pid2 = fd.accept_worker()
    assert wid2 == 1 and pid2 != pid
    assert fd.task(1, 0, 0, 0, [7]) == ("done", 0)


def test_host_exits_on_eof_and_kills_workers(fake):
    fd = fake(D.Plain(), nworkers=2)
    pids = [p for _, p in fd.workers.values()]
    fd.host.close()
    fd.host = None
    assert fd.proc.wait(timeout=10) == 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and
                 open(f"/proc/{p}/stat").read().split()[2] != "Z"]
        if not alive:
            break
        time.sleep(0.05)
    assert not alive


def test_setup_failure_fails_tasks(fake, workdir):
    fd = fake(D.Plain(), nworkers=1, worker_init_fn=D.raise_in_init)
    state, (index, text) = fd.task(0, 0, 0, 0, [2])
    assert state == "fail" and index == 2 and "could not start" in text and "init boom" in text


def _alive(pids):
    out = []
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(p)
        except OSError:
            pass
    return out


def test_host_sigterm_stops_workers(fake):
    fd = fake(D.Plain(), nworkers=2)
    pids = [p for _, p in fd.workers.values()]
    fd.proc.send_signal(signal.SIGTERM)
    assert fd.proc.wait(timeout=10) == 0
    deadline = time.monotonic() + 5
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pids)
    fd.host.settimeout(5)
    assert W.recv(fd.host) is None  # the host's connection closed, no WORKER_EXIT for its own stop


def test_host_code_comes_from_loaderd_only(fake, workdir, monkeypatch):
    """A trainer whose working directory holds a planted loaderd/ package and
    modules named as the host's imports (anyone may write a shared
    directory): none of them runs; the workers build the batch."""
    plant = os.path.join(workdir, "plant")
    os.makedirs(os.path.join(plant, "loaderd"))
    marker = os.path.join(workdir, "marker")
    code = f"open({marker!r}, 'a').write(__name__ + '\\n')\n"
    for rel in ("loaderd/__init__.py", "loaderd/_pyhost.py", "loaderd/_pywire.py", "select.py",
                "mmap.py", "traceback.py", "ctypes.py"):
        with open(os.path.join(plant, rel), "w") as f:
            f.write(code)
    monkeypatch.chdir(plant)
    fd = fake(D.Plain(), nworkers=1)
    assert fd.task(0, 0, 0, 0, [3, 4]) == ("done", 0)
    assert fd.field(0, 1, 2).tolist() == [3, 4]
    assert not os.path.exists(marker), open(marker).read()
    assert os.readlink(f"/proc/{fd.proc.pid}/cwd") == plant   # the Dataset's relative paths


def test_other_structure_is_named(fake):
    fd = fake(D.Changing(), nworkers=1)
    assert fd.task(0, 0, 0, 0, [0, 1, 2]) == ("done", 0)  # the quick path
    state, (index, text) = fd.task(0, 0, 0, 0, [2, 3])
    assert state == "fail" and index == 3 and "has no field '1'" in text, text
    # a dict with the same names is not the learnt tuple, but its leaves fit
    assert fd.task(0, 0, 0, 0, [4]) == ("done", 0)


# ----------------------------------------------- a task's rows, field by field

def _worker_over(fields, structure, dataset, rows):
    """A worker (loaderd._pyworker.Worker) over a slab in memory: one slot
    of @rows rows of @fields, @dataset its Dataset, no daemon."""
    from loaderd import _pyworker as PW
    sizes = []
    for f in fields:
        n = int(np.prod(f["shape"], dtype=np.int64)) if f["shape"] else 1
        sizes.append(n * P.field_np_dtype(f["dtype"]).itemsize)
    offs, off = [], 0
    for sb in sizes:
        offs.append(off)
        off += sb * rows
    slab = bytearray(off)
    w = PW.Worker({"nworkers": 1, "fields": fields, "learnt": True, "seeding": "sample",
                   "dataset": {"object": dataset}, "pipeline": "p", "structure": structure},
                  None, 0, slab)
    w.w = {"seed": 1, "slot_bytes": off, "fields": list(zip(offs, sizes)), "on_error": 0,
           "nsamples": len(dataset), "nfields": len(fields)}
    w.setup()
    w.prepare_views()

    def field(i):
        f = fields[i]
        return np.frombuffer(slab, P.field_np_dtype(f["dtype"]), count=rows * (sizes[i] //
                             P.field_np_dtype(f["dtype"]).itemsize), offset=offs[i]).reshape(
                             [rows] + list(f["shape"]))
    return w, field


def _task(w, idx):
    return W.TASK_S.pack(1, 0, 0, 0, len(idx), 0) + struct.pack(f"={len(idx)}Q", *idx)


class _Rows:
    """Samples of several shapes of structure, as Datasets return them."""

    def __init__(self, kind, n=6):
        self.kind, self.n = kind, n
        self.m = np.arange(n * 4, dtype=np.float64).reshape(n, 4)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.kind == "tuple":     # a float64 row into a float32 field, a label
            return self.m[i], i * 10
        if self.kind == "dict":      # tensors, a numpy scalar
            return {"x": torch.tensor(self.m[i], dtype=torch.float32), "y": np.float32(i) / 2}
        if self.kind == "one":       # a single leaf: a bfloat16 tensor
            return torch.tensor(self.m[i], dtype=torch.bfloat16)
        if self.kind == "mixed":     # a numpy row, then a tensor row: row by row
            return (self.m[i] if i % 2 else torch.tensor(self.m[i]), i)
        raise AssertionError(self.kind)


@pytest.mark.parametrize("kind", ["tuple", "dict", "one", "mixed"])
def test_a_tasks_rows_are_written_as_each_sample_would_be(kind):
    ds = _Rows(kind)
    if kind in ("tuple", "mixed"):
        fields = [dict(name="0", dtype="float32", shape=[4], pad=False),
                  dict(name="1", dtype="int64", shape=[], pad=False)]
        st = {"tuple": [{"f": "0"}, {"f": "1"}]}
    elif kind == "dict":
        fields = [dict(name="x", dtype="float32", shape=[4], pad=False),
                  dict(name="y", dtype="float64", shape=[], pad=False)]
        st = {"dict": [["x", {"f": "x"}], ["y", {"f": "y"}]]}
    else:
        fields = [dict(name="sample", dtype="bfloat16", shape=[4], pad=False)]
        st = {"f": "sample"}
    w, field = _worker_over(fields, st, ds, 4)
    idx = [5, 0, 3, 2]
    w.task(_task(w, idx))
    rows = np.array([ds.m[i] for i in idx])
    if kind == "one":
        got = torch.from_numpy(field(0).view(np.int16).copy()).view(torch.bfloat16).float().numpy()
        assert got.tolist() == rows.tolist()  # small integers: exact in bfloat16
        return
    assert field(0).tolist() == rows.astype(np.float32).tolist()
    if kind == "dict":
        assert field(1).tolist() == [i / 2 for i in idx]
    else:
        assert field(1).tolist() == [i * 10 if kind == "tuple" else i for i in idx]


def test_a_tasks_misfit_names_the_sample():
    class Bad(_Rows):
        def __getitem__(self, i):
            return (np.zeros(5 if i == 3 else 4), i)
    fields = [dict(name="0", dtype="float32", shape=[4], pad=False),
              dict(name="1", dtype="int64", shape=[], pad=False)]
    w, _ = _worker_over(fields, {"tuple": [{"f": "0"}, {"f": "1"}]}, Bad("tuple"), 4)
    from loaderd import _pyworker as PW
    with pytest.raises(PW._Fail) as e:
        w.task(_task(w, [1, 2, 3, 4]))
    assert e.value.index == 3
    assert e.value.text.startswith("dataset[3]: field '0' has shape (5,), the pipeline's is (4,)")
