# SPDX-License-Identifier: MIT
"""Your own Dataset (docs/python.md, "Your own Dataset"): the pure-Python half.

What the trainer and the workers share, with no daemon and no torch import at
module level (the workers' host, loaderd._pyhost, must stay clean of torch):

- the seeding function of a sample, sample_seed(seed, epoch, index), and
  seed_all() that seeds Python's random, numpy's global RNG and torch's;
- flatten(): a sample (tensor, ndarray, int, float, bool, numpy scalar, or a
  tuple/list/dict of them, nested) -> its structure (JSON) and its leaves,
  named as fields ("0", "1.0", "a.b"; a bare leaf is "sample");
- learn_fields(): fields from a sample (dtype, shape), check_leaf() and
  write_leaf() (into a field's place in the slab); the leaves that are not
  fixed-shape numbers (str, None, objects, empty tensors) travel in the
  rows' object part (loaderd._objpart), a leaf of the structure {"o": name};
- rebuild(): the batch the trainer gets, as torch's default_collate would
  have made it (tuple -> list, dict -> dict, a tensor -> the batched tensor);
  check_structure(): a structure read from a spec, which another process
  (another user) may have written: its vocabulary is closed (loaderd's
  own containers), and nothing it names is ever imported or called;
- plan_spec() and finish_spec(): the "python" spec and the host's payload
  from a Dataset object, or from a spec naming its class by import path,
  before and after what a worker learns (learnt_of(): dataset[0]'s fields);
  identity(): the digest of the pickles; build_spec() learns in-process;
- get_worker_info() (loaderd.get_worker_info()).
"""

import collections
import hashlib
import importlib
import json
import keyword
import os
import pickle
import re
import sys
import uuid

from . import _objpart as O

M64 = (1 << 64) - 1
M63 = (1 << 63) - 1  # torch's seeds are int64 (torch.initial_seed(), get_worker_info().seed)
SEED_TAG = 0x5059444154415345  # "PYDATASE": keeps sample seeds apart from the permutation's keys

DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "bfloat16", "float32", "float64")
MAX_FIELDS = 16
MAX_STRUCTURE = 8192
MAX_DEPTH = 40           # levels of a structure, leaves included (63-character names nest 33)
MAX_NODES = 1024         # nodes of a structure
BARE = "sample"          # the field name of a sample that is a single leaf
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,63}$")

_TORCH_DTYPES = {  # torch dtype name (str(dtype) without "torch.") -> field dtype
    "bool": "bool", "uint8": "uint8", "int8": "int8", "int16": "int16", "int32": "int32",
    "int64": "int64", "float16": "float16", "bfloat16": "bfloat16", "float32": "float32",
    "float64": "float64", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
}


class SampleError(ValueError):
    """A sample (or a declared field) that cannot be a loaderd field."""


# ------------------------------------------------------------------ seeding

def mix64(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def splitmix64(x):
    return mix64((x + 0x9e3779b97f4a7c15) & M64)


def epoch_seed(seed, epoch):
    """What sample_seed() mixes the index into: one value per epoch."""
    s = splitmix64((int(seed) & M64) ^ SEED_TAG)
    return splitmix64(s ^ (int(epoch) & M64))


def sample_seed(seed, epoch, index, epoch_value=None):
    """The seed of sample @index in epoch @epoch of a pipeline of spec seed
    @seed (docs/python.md, "Seeding"): 63 bits, as torch's seeds, so that
    torch.initial_seed() in the Dataset is one torch itself could give
    (a torch.tensor of it, an int64 of it work); @epoch_value, when given, is
    epoch_seed(seed, epoch), computed once."""
    s = epoch_seed(seed, epoch) if epoch_value is None else epoch_value
    return splitmix64(s ^ (int(index) & M64)) & M63


def mt_words(s):
    """The 624 words of Python's random state for seed @s (docs/python.md,
    "Seeding"): pair k is splitmix64(s + k), low half first."""
    out = []
    for k in range(312):
        z = splitmix64((int(s) + k) & M64)
        out += (z & 0xffffffff, z >> 32)
    return out


_mt_seed = None  # loaderd._fast.mt_seed where it fills Python's random as mt_words() says


def _mt_fill():
    """loaderd._fast.mt_seed, checked once against mt_words(), or False."""
    global _mt_seed
    if _mt_seed is None:
        _mt_seed = False
        try:
            import _random
            import random
            from . import _lib
            mod = _lib.fast()
            if mod is not None and hasattr(mod, "mt_seed"):
                mod.mt_setup(_random.Random)
                r = random.Random()
                mod.mt_seed(r, 0x123456789abcdef)
                if r.getstate() == (3, tuple(mt_words(0x123456789abcdef)) + (624,), None):
                    _mt_seed = mod.mt_seed
        except Exception:  # no libloader, no _fast, another interpreter's layout
            pass
    return _mt_seed


def seed_random(s):
    """Python's random (its module functions' instance) seeded with @s:
    the state mt_words(@s), as setstate() takes it; in C where it can."""
    import random
    fill = _mt_fill()
    if fill:
        fill(random._inst, s)
        random._inst.gauss_next = None
        return
    import numpy as np
    k = np.arange(312, dtype=np.uint64) + np.uint64(int(s) & M64) + np.uint64(0x9e3779b97f4a7c15)
    z = (k ^ (k >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
    z ^= z >> np.uint64(31)
    words = np.empty(624, dtype=np.uint32)
    words[0::2] = z & np.uint64(0xffffffff)
    words[1::2] = z >> np.uint64(32)
    random.setstate((3, tuple(words.tolist()) + (624,), None))


def seed_all(s):
    """Seed Python's random, numpy's global RNG and torch's default
    generator (when torch is imported) from the seed @s (sample_seed())."""
    seed_random(s)
    np = sys.modules.get("numpy")
    if np is not None:
        # one 32-bit word, as numpy's legacy seeding takes it: 5 us a sample
        # where a [low, high] array costs 22 (init_by_array)
        np.random.seed((s ^ (s >> 32)) & 0xffffffff)
    torch = sys.modules.get("torch")
    if torch is not None:
        # what torch.manual_seed(s) does, without its per-call overhead (about
        # 90 us: it visits every device type); CUDA only once it is in use
        torch.default_generator.manual_seed(s)
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            cuda.manual_seed_all(s)


def seeder():
    """seed_all() for a worker's hot path, per sample: the same states, the
    lookups done once.
    Made after the Dataset is set up: a numpy or torch imported later is
    still seeded, through seed_all()."""
    import random
    np = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    inst = random._inst
    fill = _mt_fill()
    if not fill or np is None or torch is None:
        return seed_all
    np_seed = np.random.seed
    gen = torch.default_generator
    cuda = getattr(torch, "cuda", None)
    cuda_on = cuda.is_initialized if cuda is not None else (lambda: False)

    def seed(s):
        fill(inst, s)
        inst.gauss_next = None
        np_seed((s ^ (s >> 32)) & 0xffffffff)
        gen.manual_seed(s)
        if cuda_on():
            cuda.manual_seed_all(s)
    return seed


class _SavedRNG:
    """Save and restore the trainer's RNG states around a seeded dataset[0]."""

    def __enter__(self):
        import random
        self.py = random.getstate()
        np = sys.modules.get("numpy")
        self.np = np.random.get_state() if np is not None else None
        torch = sys.modules.get("torch")
        self.torch = torch.get_rng_state() if torch is not None else None
        return self

    def __exit__(self, *exc):
        import random
        random.setstate(self.py)
        np = sys.modules.get("numpy")
        if np is not None and self.np is not None:
            np.random.set_state(self.np)
        torch = sys.modules.get("torch")
        if torch is not None and self.torch is not None:
            torch.set_rng_state(self.torch)


# ------------------------------------------------------------ worker info

class WorkerInfo:
    """loaderd.get_worker_info() in a worker: id, num_workers, seed, dataset,
    pipeline, pid."""

    __slots__ = ("id", "num_workers", "seed", "dataset", "pipeline", "pid")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    def __repr__(self):
        return (f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed}, "
                f"pipeline={self.pipeline!r}, pid={self.pid})")


_worker_info = None


def get_worker_info():
    """In a loaderd worker process: its WorkerInfo (id, num_workers, seed,
    dataset, pipeline, pid). Elsewhere (the trainer): None."""
    return _worker_info


def worker_seed(seed, worker_id):
    """WorkerInfo.seed (torch's get_worker_info().seed as well): 63 bits,
    as torch's base_seed + worker_id."""
    return splitmix64(((int(seed) & M64) ^ SEED_TAG) + int(worker_id) & M64) & M63


# ------------------------------------------------------------------ leaves

def _torch_mod():
    return sys.modules.get("torch")


def _is_tensor(x):
    t = _torch_mod()
    return t is not None and isinstance(x, t.Tensor)


def _describe(x):
    r = repr(x)
    if len(r) > 40:
        r = r[:37] + "..."
    return f"a {type(x).__module__ + '.' if type(x).__module__ not in ('builtins',) else ''}" \
           f"{type(x).__qualname__} ({r})"


def leaf_info(name, x):
    """(dtype, shape) of leaf @x of field @name, or SampleError."""
    import numpy as np
    if _is_tensor(x):
        dt = str(x.dtype).replace("torch.", "")
        if dt not in _TORCH_DTYPES:
            raise SampleError(f"field {name!r}: a tensor of dtype torch.{dt} cannot be a loaderd "
                              f"field (dtypes: {', '.join(DTYPES)})")
        return _TORCH_DTYPES[dt], tuple(int(d) for d in x.shape)
    if isinstance(x, bool):
        return "bool", ()
    if isinstance(x, int):
        return "int64", ()
    if isinstance(x, float):
        return "float64", ()
    if isinstance(x, (np.ndarray, np.generic)):
        dt = np.dtype(x.dtype)
        if dt.name not in DTYPES or dt.byteorder == ">":
            raise SampleError(f"field {name!r}: a numpy {type(x).__name__} of dtype {dt} cannot be "
                              f"a loaderd field (dtypes: {', '.join(DTYPES)}); strings and objects "
                              "are not samples: encode them as numbers in __getitem__")
        return dt.name, tuple(int(d) for d in np.shape(x))
    raise SampleError(f"field {name!r}: {_describe(x)} cannot be a loaderd field: a sample is made "
                      "of tensors, numpy arrays, int, float, bool and numpy scalars (or tuples, "
                      "lists and dicts of them); encode strings and other objects as numbers in "
                      "__getitem__, or leave them out")


_GOOD_NAMES = set()


def _check_name(name, where):
    if name in _GOOD_NAMES:
        return
    if _NAME_RE.match(name):
        if len(_GOOD_NAMES) < 4096:
            _GOOD_NAMES.add(name)
    else:
        raise SampleError(f"{where}: field name {name!r} is not valid: 1..63 characters of "
                          "A-Z a-z 0-9 . _ -")


def flatten(sample, batched=False, types=None):
    """(structure, [(field name, leaf)]) of @sample. @batched: the output of a
    collate_fn (containers kept as they are when rebuilt). @types, a dict:
    gets the namedtuple classes met, by the "type" the structure names them."""
    leaves = []

    def walk(x, prefix):
        def child(key):
            return f"{prefix}.{key}" if prefix else str(key)
        if isinstance(x, dict):
            items = []
            for k, v in x.items():
                if not isinstance(k, str):
                    raise SampleError(f"dict key {k!r}{' in ' + repr(prefix) if prefix else ''}: "
                                      "dict keys of a sample must be str")
                if "." in k:
                    raise SampleError(f"dict key {k!r}: '.' separates nested names; it cannot be "
                                      "in a key")
                _check_name(child(k), f"dict key {k!r}")
                items.append([k, walk(v, child(k))])
            if not items:
                raise SampleError(f"{prefix or 'the sample'}: an empty dict has no field")
            return {"dict": items}
        if isinstance(x, (tuple, list)) and not _is_tensor(x):
            if not x:
                raise SampleError(f"{prefix or 'the sample'}: an empty {type(x).__name__} "
                                  "has no field")
            kind = "list" if isinstance(x, list) else "tuple"
            node = {kind: [walk(v, child(i)) for i, v in enumerate(x)]}
            if kind == "tuple" and hasattr(type(x), "_fields"):
                cls = type(x)
                node["type"] = _import_path(cls, "namedtuple")
                names = cls._fields
                if _tuple_names_error(names, len(x)) is None:
                    node["names"] = list(names)  # elsewhere: a namedtuple of these fields
                if types is not None:
                    types[node["type"]] = cls    # here: rebuilt as itself (own_types)
            return node
        name = prefix or BARE
        _check_name(name, "sample")
        leaves.append((name, x))
        return {"f": name}

    structure = walk(sample, "")
    if batched:
        structure = {"collated": structure}
    return structure, leaves


def learn_fields(sample, batched=False, object_bytes=None):
    """(fields, structure) learnt from one sample (or one collated batch of
    one sample when @batched: the leading dimension 1 is the batch's). The
    namedtuple classes of the sample are remembered for own_types().

    A leaf that cannot be a field (a str, None, an object, an empty tensor;
    @batched: no leading dimension 1) is an object leaf {"o": name}: the
    rows then have an object part (the pad field OBJ) of @object_bytes per
    row, by default max(64 KiB, 4x this sample's object leaves pickled).
    @batched (a collate_fn's output) always has one by default, of max(64
    KiB, 4x the whole output pickled): a collate_fn's later outputs may
    have other shapes (padded per batch) or another structure, whatever
    collate_fn([dataset[0]]) was. @object_bytes 0: none, such a leaf is
    refused as before; given for an all-numeric sample: an object part all
    the same (for later samples that do not fit)."""
    types = {}
    structure, leaves = flatten(sample, batched, types)
    fields, objects = [], {}
    for name, x in leaves:
        if name in (O.OBJ, O.OBJ_LEN):
            raise SampleError(f"field {name!r}: the name is loaderd's own (the object part)")
        try:
            dtype, shape = leaf_info(name, x)
        except SampleError:
            if object_bytes == 0:
                raise
            objects[name] = x
            continue
        if batched and (not shape or shape[0] != 1):
            if object_bytes == 0:
                raise SampleError(f"field {name!r}: collate_fn([dataset[0]]) gave shape "
                                  f"{list(shape)}: a collate_fn's output must have the batch as "
                                  "its first dimension (1 here), or travel as an object "
                                  "(object_bytes= above 0)")
            objects[name] = x
            continue
        if batched:
            shape = shape[1:]
        if 0 in shape and object_bytes != 0:
            objects[name] = x  # an empty tensor: no field can hold it
            continue
        fields.append({"name": name, "dtype": dtype, "shape": list(shape), "pad": False})
    if objects:
        structure = _mark_objects(structure, set(objects))
    if objects or object_bytes or (batched and object_bytes is None):
        if object_bytes is None:
            object_bytes = O.default_bytes(O.blob_size(sample if batched else objects)[2])
        fields.append({"name": O.OBJ, "dtype": "uint8", "shape": [int(object_bytes)],
                       "pad": True})
    fields = check_fields(fields)
    if types:
        _remember_types(structure, types)
    return fields, structure


def _mark_objects(s, names):
    """@s with its leaves of @names as object leaves {"o": name}."""
    if "f" in s:
        return {"o": s["f"]} if s["f"] in names else s
    if "collated" in s:
        return {"collated": _mark_objects(s["collated"], names)}
    if "dict" in s:
        return {"dict": [[k, _mark_objects(v, names)] for k, v in s["dict"]]}
    kind = "tuple" if "tuple" in s else "list"
    return dict(s, **{kind: [_mark_objects(v, names) for v in s[kind]]})


def object_bytes_of(fields):
    """The object part's bytes per row of @fields, None when it has none."""
    for f in fields:
        if f["name"] == O.OBJ:
            return f["shape"][0]
    return None


def check_fields(fields):
    """Normalise declared fields (a list of {"name", "dtype", "shape", "pad"},
    or a dict name -> {"dtype", "shape", "pad"}); adds the "<name>_len"
    field of each pad field when missing."""
    if isinstance(fields, dict):
        fields = [dict(v, name=k) for k, v in fields.items()]
    out = []
    for i, f in enumerate(fields):
        if not isinstance(f, dict):
            raise SampleError(f"fields[{i}]: must be a dict with name, dtype, shape")
        unknown = set(f) - {"name", "dtype", "shape", "pad"}
        if unknown:
            raise SampleError(f"fields[{i}]: unknown key {sorted(unknown)[0]!r}")
        name = f.get("name")
        if not isinstance(name, str):
            raise SampleError(f"fields[{i}]: name is required")
        _check_name(name, f"fields[{i}]")
        dtype = f.get("dtype")
        if dtype not in DTYPES:
            raise SampleError(f"field {name!r}: dtype must be one of {', '.join(DTYPES)}, "
                              f"not {dtype!r}")
        shape = f.get("shape", [])
        if not isinstance(shape, (list, tuple)) or \
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise SampleError(f"field {name!r}: shape must be a list of sizes >= 0, not {shape!r}")
        pad = bool(f.get("pad", False))
        if pad and (not shape or shape[0] < 1):
            raise SampleError(f"field {name!r}: a pad field needs a shape with its maximum "
                              "length first")
        out.append({"name": name, "dtype": dtype, "shape": [int(d) for d in shape], "pad": pad})
    names = [f["name"] for f in out]
    for f in list(out):
        if f["pad"] and f["name"] + "_len" not in names:
            out.append({"name": f["name"] + "_len", "dtype": "int64", "shape": [], "pad": False})
            names.append(f["name"] + "_len")
    for f in out:
        if f["pad"]:
            ln = next(g for g in out if g["name"] == f["name"] + "_len")
            if ln["dtype"] != "int64" or ln["shape"] or ln["pad"]:
                raise SampleError(f"field {ln['name']!r}: the length of pad field {f['name']!r} "
                                  "must be int64 of shape []")
    for f in out:
        if f["name"] == O.OBJ and (f["dtype"] != "uint8" or len(f["shape"]) != 1 or
                                   not f["pad"]):
            raise SampleError(f"field {O.OBJ!r} (the object part) must be uint8 of shape "
                              "[bytes per row], \"pad\": true")
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SampleError(f"field {sorted(dup)[0]!r} is declared twice")
    if not 1 <= len(out) <= MAX_FIELDS:
        raise SampleError(f"a sample has {len(out)} fields; loaderd takes 1..{MAX_FIELDS} "
                          "(the '<name>_len' of pad fields count)")
    return out


def structure_from_names(fields):
    """The structure of declared fields: dotted names nest; a level whose keys
    are 0..k-1 is a list, else a dict; a lone field "sample" is a bare leaf."""
    lens = {f["name"] + "_len" for f in fields if f["pad"]}
    names = [f["name"] for f in fields if f["name"] not in lens and f["name"] != O.OBJ]
    if names == [BARE]:
        return {"f": BARE}
    tree = {}
    for n in names:
        node = tree
        parts = n.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise SampleError(f"field {n!r}: {p!r} is a field and a group")
        if parts[-1] in node:
            raise SampleError(f"field {n!r}: is a field and a group")
        node[parts[-1]] = n

    def conv(node):
        if isinstance(node, str):
            return {"f": node}
        keys = list(node)
        if sorted(keys, key=lambda k: int(k) if k.isdigit() else -1) == \
                [str(i) for i in range(len(keys))]:
            return {"list": [conv(node[str(i)]) for i in range(len(keys))]}
        return {"dict": [[k, conv(node[k])] for k in keys]}
    return conv(tree)


# ------------------------------------------------------------------ rebuild

def rebuild(structure, batch, pads=(), types=None, objects=None):
    """The trainer's batch from the fields of @batch (name -> tensor), in the
    form torch's default_collate gives (tuple -> list), or as a collate_fn
    made it. A pad field becomes its padded tensor plus its "<name>_len"
    lengths: a sibling key "<key>_len" in a dict, else the pair
    [padded, lengths]. A namedtuple is its class in @types (own_types()),
    else a namedtuple loaderd makes with its field names. @objects (an
    Objects): the batch's object part, unpickled. (No closures: the result
    must not keep @batch alive through a reference cycle, or its slot would
    wait for the GC.)"""
    collated = "collated" in structure
    if collated:
        structure = structure["collated"]
    types = types or _NO_TYPES
    if objects is not None:
        whole = objects.whole(structure, batch, types)
        if whole is not _NOTHING:
            return whole
    return _rebuild(structure, batch, pads, collated, types, objects)


_NOTHING = object()


class Objects:
    """A batch's object part for rebuild(): @rows, a list of dicts (leaf
    name -> object, O.WHOLE -> a whole sample that did not match the
    structure) one per row, or for a collated batch a list of one dict (the
    collate_fn's output). @collate: what makes the batch of a leaf from its
    per-row values (torch's default_collate; default_convert of the one
    value when unbatched). @scalars: the fields that were Python numbers.
    @sliced: @batch holds row 0 itself (unbatched)."""

    __slots__ = ("rows", "collated", "collate", "scalars", "sliced")

    def __init__(self, rows, collated, collate, scalars=(), sliced=False):
        self.rows, self.collated, self.collate = rows, collated, collate
        self.scalars, self.sliced = scalars, sliced

    def row_value(self, batch, f, r):
        v = batch[f] if self.sliced else batch[f][r]
        return v.item() if f in self.scalars else v

    def leaf(self, batch, f, seq):
        """Field @f's batch when a row holds it as an object, else _NOTHING.
        @seq: in a tuple or list, whose items default_collate gets as a
        tuple (zip), where a dict's are a list (a str leaf stays so)."""
        rows = self.rows
        if self.collated:
            return rows[0].get(f, _NOTHING)
        if not any(f in row for row in rows):
            return _NOTHING
        values = [row[f] if f in row else self.row_value(batch, f, r)
                  for r, row in enumerate(rows)]
        return self.collate(tuple(values) if seq else values)

    def obj(self, name, seq):
        if self.collated:
            return self.rows[0][name]
        values = [row[name] for row in self.rows]
        return self.collate(tuple(values) if seq else values)

    def whole(self, s, batch, types):
        """The batch when a row is a whole sample (default collate: all the
        rows' samples collated), else _NOTHING."""
        rows = self.rows
        if not any(O.WHOLE in row for row in rows):
            return _NOTHING
        if self.collated:
            return rows[0][O.WHOLE]
        return self.collate([row[O.WHOLE] if O.WHOLE in row else
                             self._sample(s, batch, r, row, types)
                             for r, row in enumerate(rows)])

    def _sample(self, s, batch, r, row, types):
        """Row @r as the sample it was (its leaves rows of the fields)."""
        f = s.get("f")
        if f is not None:
            return row[f] if f in row else self.row_value(batch, f, r)
        o = s.get("o")
        if o is not None:
            return row[o]
        d = s.get("dict")
        if d is not None:
            return {k: self._sample(v, batch, r, row, types) for k, v in d}
        t = s.get("tuple")
        if t is not None:
            items = [self._sample(v, batch, r, row, types) for v in t]
            cls = _tuple_class(s, types)
            return cls(*items) if cls is not None else tuple(items)
        return [self._sample(v, batch, r, row, types) for v in s["list"]]


# A structure is read by every trainer that attaches to the pipeline, and
# another user may have written it (a pipeline of "access": "all"): its words
# are loaderd's own, and a name in it ("type") is never imported or called.
# A namedtuple is rebuilt as its own class only in a process that learnt that
# very structure from its own sample (it holds the class: own_types), else as
# a namedtuple of the same name and fields that loaderd makes.

_OWN_TYPES = {}          # canonical text of a structure learnt here -> {"type": class}
_MADE_TUPLES = {}        # (type name, field names) -> a namedtuple class loaderd made
_CACHE_MAX = 256
_NO_TYPES = {}


def _canon(structure):
    return json.dumps(structure, sort_keys=True, separators=(",", ":"))


def _remember_types(structure, types):
    if len(_OWN_TYPES) >= _CACHE_MAX:
        del _OWN_TYPES[next(iter(_OWN_TYPES))]
    _OWN_TYPES[_canon(structure)] = dict(types)


def own_types(structure):
    """The namedtuple classes of @structure when this process learnt that
    structure from a sample of its own (learn_fields), else {}: what
    rebuild() may build a namedtuple as, found by identity, not by import."""
    try:
        return _OWN_TYPES.get(_canon(structure), _NO_TYPES)
    except (TypeError, ValueError):
        return _NO_TYPES


def _tuple_names_error(names, n):
    """None when @names can be the fields of a namedtuple of @n items, else
    what is wrong (collections.namedtuple's rules)."""
    if not isinstance(names, (list, tuple)) or len(names) != n:
        return f"must be a list of {n} field names, one per item"
    for k in names:
        if not isinstance(k, str) or not k.isidentifier() or keyword.iskeyword(k) or \
                k.startswith("_") or len(k) > 63:
            return (f"{k!r} cannot be a namedtuple field (an identifier of at most 63 "
                    "characters, not a keyword, not starting with '_')")
    if len(set(names)) != n:
        return "a field name is there twice"
    return None


def _made_namedtuple(path, names):
    """A namedtuple class loaderd makes: the name of @path, fields @names."""
    tname = path.rsplit(":", 1)[-1].rsplit(".", 1)[-1] if isinstance(path, str) else ""
    if not tname.isidentifier() or keyword.iskeyword(tname) or len(tname) > 63:
        tname = "namedtuple"
    key = (tname, tuple(names))
    cls = _MADE_TUPLES.get(key)
    if cls is None:
        cls = collections.namedtuple(tname, names)
        if len(_MADE_TUPLES) >= _CACHE_MAX:
            del _MADE_TUPLES[next(iter(_MADE_TUPLES))]
        _MADE_TUPLES[key] = cls
    return cls


def _tuple_class(s, types):
    """What a tuple node @s is rebuilt as: a class (this process's own, or
    one loaderd makes), or None for a list (a tuple when collated)."""
    path = s.get("type")
    if path is None:
        return None
    cls = types.get(path)
    if cls is not None:
        return cls  # default_collate keeps a namedtuple's type
    names = s.get("names")
    if names is None:
        return None  # an older client's structure names no fields: a list, as a tuple
    return _made_namedtuple(path, names)


def check_structure(structure, fields, where="the structure"):
    """Check @structure, read from a spec that another process may have
    written, against the spec's @fields: loaderd's own words only ("f",
    "dict", "list", "tuple" with an optional "type" and "names", a top
    "collated"), at most MAX_DEPTH levels and MAX_NODES nodes, every leaf a
    declared field. SampleError says what is wrong and where."""
    if not isinstance(fields, list) or not all(
            isinstance(f, dict) and isinstance(f.get("name"), str) for f in fields):
        raise SampleError(f"{where}: the spec's fields are not a list of {{name, dtype, shape}}")
    declared = {f["name"] for f in fields}
    nodes = [0]

    def fail(path, msg):
        raise SampleError(f"{where}: {'node ' + repr(path) if path else 'the top node'} {msg}")

    def walk(s, path, depth):
        nodes[0] += 1
        if nodes[0] > MAX_NODES:
            fail(path, f"is one node too many: a structure has at most {MAX_NODES}")
        if depth > MAX_DEPTH:
            fail(path, f"is nested too deep: a structure has at most {MAX_DEPTH} levels")
        if not isinstance(s, dict):
            fail(path, f"must be an object, not {type(s).__name__}")
        kinds = [k for k in ("f", "o", "dict", "list", "tuple") if k in s]
        top_only = " (\"collated\" is only the top node)" if "collated" in s else ""
        if len(kinds) != 1:
            fail(path, "must have one of the keys \"f\", \"o\", \"dict\", \"list\", "
                 "\"tuple\"" + top_only)
        kind = kinds[0]
        extra = set(s) - {kind} - ({"type", "names"} if kind == "tuple" else set())
        if extra:
            fail(path, f"has the unknown key {sorted(map(str, extra))[0]!r}{top_only}")
        v = s[kind]
        if kind == "f":
            if not isinstance(v, str) or v not in declared or v in (O.OBJ, O.OBJ_LEN):
                raise SampleError(f"{where} names field {str(v)[:80]!r}, which is not declared")
            return
        if kind == "o":
            if not isinstance(v, str) or not _NAME_RE.match(v):
                fail(path, "\"o\" must name an object leaf: 1..63 characters of A-Z a-z 0-9 "
                     ". _ -")
            if O.OBJ not in declared:
                fail(path, f"is an object leaf, but the fields have no {O.OBJ!r} (object part)")
            return
        if not isinstance(v, list) or not v:
            fail(path, f"\"{kind}\" must be a non-empty array")
        if kind == "dict":
            for i, kv in enumerate(v):
                if not (isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str) and
                        1 <= len(kv[0]) <= 63):
                    fail(path, f"\"dict\" entry {i} must be [key, node], the key a string of "
                         "1..63 characters")
                walk(kv[1], f"{path}.{kv[0]}" if path else kv[0], depth + 1)
            return
        for i, sub in enumerate(v):
            walk(sub, f"{path}.{i}" if path else str(i), depth + 1)
        if kind == "tuple":
            t = s.get("type")
            if t is not None and not (isinstance(t, str) and 1 <= len(t) <= 255):
                fail(path, "\"type\" must be a string of 1..255 characters (a name, never "
                     "imported)")
            if "names" in s:
                msg = _tuple_names_error(s["names"], len(v))
                if msg is not None:
                    fail(path, f"\"names\" {msg}")

    top = structure
    if isinstance(top, dict) and "collated" in top:
        if len(top) != 1:
            fail("", "has \"collated\" and other keys")
        top = top["collated"]
    walk(top, "", 1)
    return structure


def reader_structure(src):
    """(structure, pads, types) of a python source read from the daemon (a
    pipeline attached by name, whoever wrote its spec): checked, and the
    namedtuple classes only those of a structure this process learnt."""
    fields = src.get("fields")
    if not isinstance(fields, list):
        raise SampleError("its spec's source.fields is not a list of fields")
    structure = src.get("structure")
    if structure is None:
        structure = structure_from_names(check_fields(fields))
    check_structure(structure, fields, "its spec's source.structure")
    names = {f["name"] for f in fields}
    pads = {f["name"] for f in fields if f.get("pad") and f["name"] + "_len" in names and
            f["name"] != O.OBJ}
    return structure, pads, own_types(structure)


def _rebuild(s, batch, pads, collated, types, ob, seq=False):
    f = s.get("f")
    if f is not None:
        if ob is not None and f not in pads:
            v = ob.leaf(batch, f, seq)
            if v is not _NOTHING:
                return v
        return [batch[f], batch[f + "_len"]] if f in pads else batch[f]
    o = s.get("o")
    if o is not None:
        return ob.obj(o, seq)
    d = s.get("dict")
    if d is not None:
        out = {}
        for k, sub in d:
            f = sub.get("f")
            if f is not None and f in pads:
                out[k] = batch[f]
                if k + "_len" not in out:
                    out[k + "_len"] = batch[f + "_len"]
            else:
                out[k] = _rebuild(sub, batch, pads, collated, types, ob)
        return out
    t = s.get("tuple")
    if t is not None:
        items = [_rebuild(v, batch, pads, collated, types, ob, True) for v in t]
        cls = _tuple_class(s, types)
        if cls is not None:
            return cls(*items)
        return tuple(items) if collated else items
    return [_rebuild(v, batch, pads, collated, types, ob, True) for v in s["list"]]


# -------------------------------------------------------- check and write

def field_np_dtype(dtype):
    import numpy as np
    return np.dtype("uint16") if dtype == "bfloat16" else np.dtype(dtype)


def _can_cast(src, dst):
    import numpy as np
    s = "float32" if src == "bfloat16" else src
    d = "float32" if dst == "bfloat16" else dst
    return bool(np.can_cast(np.dtype(s), np.dtype(d), casting="same_kind"))


def _shape_s(shape):
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def check_leaf(index, field, dtype, shape, learnt):
    """None when a leaf of @dtype/@shape fits @field, else the message."""
    fshape = tuple(field["shape"])
    origin = " (learnt from dataset[0])" if learnt else ""
    if not _can_cast(dtype, field["dtype"]):
        return (f"dataset[{index}]: field {field['name']!r} has dtype {dtype}, the pipeline's is "
                f"{field['dtype']}{origin}; {dtype} cannot be cast to {field['dtype']} (numpy "
                "casting 'same_kind'): return the same dtype for every sample, or declare "
                "fields=")
    if field["pad"]:
        if len(shape) != len(fshape) or tuple(shape[1:]) != fshape[1:] or shape[0] > fshape[0]:
            return (f"dataset[{index}]: field {field['name']!r} has shape {_shape_s(shape)}, the "
                    f"pipeline's is {_shape_s(fshape)} padded along dim 0 (at most {fshape[0]} "
                    "long, the other dimensions equal)")
        return None
    if tuple(shape) != fshape:
        return (f"dataset[{index}]: field {field['name']!r} has shape {_shape_s(shape)}, the "
                f"pipeline's is {_shape_s(fshape)}{origin}; every sample must have the same "
                "shape: resize or crop in __getitem__, or declare the field with \"pad\": true "
                "and its maximum length for a variable first dimension")
    return None


def leaf_array(x, field_dtype):
    """@x as a numpy array ready to copy into a field of @field_dtype (for
    bfloat16: its raw bits as uint16)."""
    import numpy as np
    if _is_tensor(x):
        torch = _torch_mod()
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        if x.dtype == torch.bfloat16:
            if field_dtype == "bfloat16":
                return x.contiguous().view(torch.int16).numpy().view(np.uint16)
            x = x.float()
        elif field_dtype == "bfloat16":
            return x.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)
        return x.resolve_conj().resolve_neg().numpy() if hasattr(x, "resolve_conj") else x.numpy()
    if isinstance(x, bool):
        a = np.asarray(x, dtype=np.bool_)
    elif isinstance(x, int):
        a = np.asarray(x, dtype=np.int64)
    elif isinstance(x, float):
        a = np.asarray(x, dtype=np.float64)
    else:
        a = np.asarray(x)
    if field_dtype == "bfloat16":
        torch = _torch_mod()
        if torch is None:
            import torch
        t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)
        return t.view(torch.int16).numpy().view(np.uint16)
    return a


def write_leaf(dst, x, field, len_dst=None):
    """Copy leaf @x into @dst (the field's place for one row, a numpy view of
    the field's full shape); pad fields also write the length into
    @len_dst (an int64 view of shape ())."""
    import numpy as np
    a = leaf_array(x, field["dtype"])
    if field["pad"]:
        n = a.shape[0]
        np.copyto(dst[:n], a, casting="unsafe")
        if n < dst.shape[0]:
            dst[n:] = 0
        len_dst[...] = n
    else:
        np.copyto(dst, a, casting="unsafe")


def leaf_dtype_shape(name, x):
    return leaf_info(name, x)


# --------------------------------------------------------------- the spec

def _import_path(obj, what):
    mod = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None)
    if not mod or not qual:
        raise TypeError(f"loaderd: the {what} {obj!r} has no module:qualname")
    return f"{mod}:{qual}"


def _spec_path(obj):
    """The spec's "module:QualName" label of the class (or function) of
    @obj: a callable object is named by its class, a local class or a lambda
    by its qualname with what the daemon's import-path check refuses
    ("<locals>", "<lambda>") made a name. A label: the workers get the
    object itself (forked) or its pickle, never this path."""
    if not isinstance(obj, type) and getattr(obj, "__qualname__", None) is None:
        obj = type(obj)
    mod = getattr(obj, "__module__", None) or "builtins"
    qual = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    if mod == "__mp_main__":
        mod = "__main__"  # the trainer's script, as multiprocessing's spawn names it
    parts = [re.sub(r"\W", "_", p) or "_" for p in f"{mod}.{qual}".split(".")]
    parts = ["_" + p if p[0].isdigit() else p for p in parts]
    n = len(mod.split("."))
    return (".".join(parts[:n]) + ":" + ".".join(parts[n:]))[:255]


def resolve(path):
    """The object of an import path "module:qualname"."""
    if not isinstance(path, str) or ":" not in path:
        raise ValueError(f"loaderd: {path!r} is not an import path \"module:qualname\"")
    mod, qual = path.split(":", 1)
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _dumps(obj, what):
    """The pickle of @obj for workers that do not share the trainer's
    memory (multiprocessing_context "spawn" or "forkserver"): what cannot
    be pickled fails as it does with torch's DataLoader in those contexts,
    the exception's own type and words, and says what to do."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        text = (f"{e} (loaderd: the {what} cannot be pickled for the worker processes, as "
                "torch pickles it with a spawn or forkserver multiprocessing_context: define "
                "it at the top level of a module (not a lambda, a local class or function, "
                "no open file), or leave multiprocessing_context unset to fork the workers "
                "from this process)")
        try:
            err = type(e)(text)
        except Exception:
            err = TypeError(text)
        raise err from e


class _HashWriter:
    """A file for pickle.Pickler that only hashes what is written."""

    def __init__(self):
        self.h = hashlib.sha256()

    def write(self, b):
        self.h.update(b)
        return len(b)


def identity(*objs):
    """The digest of the pickles of @objs (None ones left out): the same
    objects, the same digest, in any process; None when one cannot be
    pickled (docs/python.md, "Your own Dataset": its pipeline is then this
    loader's own). The pickles are hashed as they are written, never held."""
    w = _HashWriter()
    try:
        for o in objs:
            if o is not None:
                pickle.Pickler(w, protocol=pickle.HIGHEST_PROTOCOL).dump(o)
    except Exception:
        return None
    return w.h.hexdigest()


def main_info():
    """How a worker finds the trainer's __main__ (as multiprocessing's spawn
    does): {"name": module} for `python -m`, {"path": file} for a script."""
    main = sys.modules.get("__main__")
    if main is None:
        return {}
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None) if spec is not None else None
    if name and name not in ("__main__", "__mp_main__"):
        if name.endswith(".__main__"):
            name = name[:-9]
        return {"name": name}
    path = getattr(main, "__file__", None)
    if path and os.path.exists(path):
        return {"path": os.path.abspath(path)}
    return {}


def is_dataset(obj):
    return not isinstance(obj, (dict, str, bytes)) and hasattr(obj, "__getitem__") and \
        hasattr(obj, "__len__")


def _sanitize(s):
    s = re.sub(r"[^a-z0-9-]+", "-", s.lower()).strip("-")
    return s[:40] or "dataset"


def plan_spec(dataset_or_spec, *, overrides, num_workers=None, collate_fn=None,
              worker_init_fn=None, fields=None, name=None, forked=False, seeding=None,
              object_bytes=None):
    """(spec, payload) of a python pipeline before what a worker learns:
    payload["learn"] says what that is (samples: len() of a Dataset the spec
    names by import path; fields: dataset[0]'s), finish_spec() completes
    both. @forked: the workers' host is forked from this process and uses
    the objects themselves (nothing pickled but for the digest), else the
    payload holds their pickles (only builtin types: the host, a fresh
    interpreter, unpickles no user object). The trainer runs no __getitem__
    and, for the import-path form, imports nothing of the Dataset's. @seeding:
    "sample" (None: the spec's, else that) or "worker" (docs/python.md,
    "Seeding"). @object_bytes: the object part's bytes per row (learn_fields;
    with @fields, an object part only when given)."""
    if object_bytes is not None and (isinstance(object_bytes, bool) or
                                     not isinstance(object_bytes, int) or
                                     not 0 <= object_bytes <= 1 << 30):
        raise ValueError("object_bytes must be the bytes per row of the object part, "
                         f"0..{1 << 30} (0: none), not {object_bytes!r}")
    if object_bytes:
        object_bytes = O.round_up(object_bytes)  # rows 64-byte aligned: the buffers in them
    nworkers = 1 if not num_workers else int(num_workers)
    if not 1 <= nworkers <= 256:
        raise ValueError("num_workers must be in 0..256 (0 means 1: loaderd always builds "
                         "samples in worker processes)")
    if isinstance(dataset_or_spec, dict):
        spec = json.loads(json.dumps(dataset_or_spec))
        src = spec.setdefault("source", {})
        args = src.get("args") or {}
        if not isinstance(args, dict):
            raise TypeError("loaderd: source.args must be a dict of keyword arguments")
        src.setdefault("args", args)
        ds_payload = {"import": src.get("dataset"), "args": args}
        if fields is None and src.get("fields") is not None:
            fields = src["fields"]
        src.setdefault("digest", "")
    else:
        dataset = dataset_or_spec
        n = len(dataset)
        if n < 1:
            raise ValueError("loaderd: the dataset is empty (len 0)")
        if forked:
            ds_payload = {"object": dataset}
            digest = identity(dataset, collate_fn, worker_init_fn)
            if digest is None:
                # no pickle, no identity across processes: a pipeline of
                # this loader's own (docs/python.md, "Your own Dataset")
                digest = "unique-" + uuid.uuid4().hex
        else:
            blob = _dumps(dataset, "dataset")
            ds_payload = {"pickle": blob}
            digest = None
        spec = {"source": {"kind": "python", "dataset": _spec_path(type(dataset)),
                           "args": {}, "digest": digest, "samples": n}}
        src = spec["source"]
    if name is not None:
        spec["name"] = name
    if seeding is None:
        seeding = src.get("seeding", "sample")
    if seeding not in ("sample", "worker"):
        raise ValueError("seeding must be \"sample\" (each sample seeded from seed, epoch "
                         "and index: the same draws for any number of workers) or \"worker\" "
                         f"(each worker seeded once, as torch's), not {seeding!r}")
    src.pop("seeding", None)
    if seeding == "worker":
        src["seeding"] = "worker"  # the daemon's canonical form leaves "sample" out
    spec.update(overrides)
    seed = int(spec.get("seed", 0) or 0)

    if collate_fn is None and src.get("collate"):
        collate = {"import": src["collate"]}  # resolved by the workers
        batched = True
    elif forked:
        collate = {"object": collate_fn} if collate_fn is not None else None
        batched = collate_fn is not None
    else:
        collate = _dumps(collate_fn, "collate_fn") if collate_fn is not None else None
        batched = collate_fn is not None
    if collate_fn is not None:
        src["collate"] = _spec_path(collate_fn)
    src.setdefault("collate", "")
    if forked:
        init = {"object": worker_init_fn} if worker_init_fn is not None else None
    else:
        init = _dumps(worker_init_fn, "worker_init_fn") if worker_init_fn is not None else None
    if src.get("digest") is None:  # the pickles made here: the digest as identity() makes it
        h = hashlib.sha256(ds_payload["pickle"])
        for b in (collate, init):
            if b is not None:
                h.update(b)
        src["digest"] = h.hexdigest()

    structure = None
    if fields is not None:
        if isinstance(fields, dict):
            fields = [dict(v, name=k) for k, v in fields.items()]
        if object_bytes and object_bytes_of(fields) is None:
            fields = list(fields) + [{"name": O.OBJ, "dtype": "uint8",
                                      "shape": [object_bytes], "pad": True}]
        fields = check_fields(fields)
        structure = src.get("structure") or structure_from_names(fields)
        if batched and "collated" not in structure:
            structure = {"collated": structure}
    payload = {
        "version": 2,
        "sys_path": list(sys.path),
        "cwd": os.getcwd(),
        "main": {} if forked or not _mentions_main(ds_payload, collate, init) else main_info(),
        "pipeline": spec.get("name"),
        "nworkers": nworkers,
        "dataset": ds_payload,
        "collate_fn": collate,
        "worker_init_fn": init,
        "fields": fields,
        "learnt": fields is None,
        "structure": structure,
        "seed": seed,
        "seeding": seeding,
        "object_bytes": object_bytes,
        "learn": {"samples": "samples" not in src, "fields": fields is None},
    }
    return spec, payload


def learnt_of(sample, batched, object_bytes=None):
    """What dataset[0] (@batched: collate_fn([dataset[0]])) teaches: its
    fields, structure and the names of its Python-number fields
    (@object_bytes: learn_fields())."""
    fields, structure = learn_fields(sample, batched, object_bytes=object_bytes)
    scalars = [] if batched else [n for n, x in flatten(sample)[1]
                                  if type(x) in (int, float, bool)]
    return {"fields": fields, "structure": structure, "scalars": scalars}


def finish_spec(spec, payload, learnt=None, scalars=None):
    """Complete (spec, payload) of plan_spec() with what a worker learnt
    (learnt_of(), and "samples"): the fields, the structure, the name.
    @scalars, a set: gets the names of the fields that were Python numbers
    in dataset[0]."""
    src = spec["source"]
    learnt = learnt or {}
    if "samples" in learnt:
        src["samples"] = int(learnt["samples"])
        if src["samples"] < 1:
            raise ValueError("loaderd: the dataset is empty (len 0)")
    if payload["learn"]["fields"]:
        fields = check_fields(learnt["fields"])
        structure = learnt["structure"]
        if scalars is not None:
            scalars.update(learnt.get("scalars") or ())
    else:
        fields, structure = payload["fields"], payload["structure"]
    check_structure(structure, fields)
    text = json.dumps(structure)
    if len(text) > MAX_STRUCTURE:
        raise SampleError(f"the sample's structure takes {len(text)} bytes of JSON, more than "
                          f"{MAX_STRUCTURE}: return fewer, larger arrays")
    src["fields"] = fields
    src["structure"] = structure
    src["kind"] = "python"
    if "name" not in spec:
        h = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
        cls = src["dataset"].rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        # the uid in it: a name computed here is the caller's own, and no
        # other user's pipeline of that name is ever joined (docs/security.md)
        spec["name"] = f"py-{os.geteuid()}-{_sanitize(cls)[:30].rstrip('-')}-{h}"
    payload.update(pipeline=spec["name"], fields=fields, structure=structure, learn={})
    return spec, payload


def _find_class(path):
    """The class "module:QualName" among the modules imported here, or None
    (nothing is imported)."""
    mod, _, qual = path.partition(":")
    for name in (mod, {"__mp_main__": "__main__", "__main__": "__mp_main__"}.get(mod)):
        obj = sys.modules.get(name) if name else None
        for part in qual.split(".") if obj is not None else ():
            obj = getattr(obj, part, None)
        if isinstance(obj, type):
            return obj
    return None


def adopt_types(structure):
    """Remember the namedtuple classes of @structure, learnt by a worker of
    this trainer from the trainer's own Dataset, so that own_types() gives
    them: found among the modules imported here, never imported; one not
    found (a local class) is a namedtuple loaderd makes, of the same name
    and fields. Never for a structure read from the daemon."""
    types = {}

    def walk(s):
        if not isinstance(s, dict):
            return
        for kind in ("tuple", "list"):
            for sub in s.get(kind) or ():
                walk(sub)
        for kv in s.get("dict") or ():
            walk(kv[1])
        walk(s.get("collated"))
        path = s.get("type")
        if "tuple" in s and isinstance(path, str):
            cls = _find_class(path)
            if cls is not None and issubclass(cls, tuple) and \
                    list(getattr(cls, "_fields", ())) == s.get("names"):
                types[path] = cls
    walk(structure)
    if types:
        _remember_types(structure, types)


def build_spec(dataset_or_spec, *, overrides, num_workers=None, collate_fn=None,
               worker_init_fn=None, fields=None, name=None, scalars=None, seeding=None,
               object_bytes=None):
    """(spec, payload) of a python pipeline for a host started by exec, with
    what a worker learns learnt here, in this process, seeded as a worker
    seeds epoch 0 index 0 (this process's random states kept): for tools and
    tests. loaderd.DataLoader learns in a worker instead (loaderd._pystart)."""
    spec, payload = plan_spec(dataset_or_spec, overrides=overrides, num_workers=num_workers,
                              collate_fn=collate_fn, worker_init_fn=worker_init_fn,
                              fields=fields, name=name, seeding=seeding,
                              object_bytes=object_bytes)
    learn, learnt = payload["learn"], {}
    if learn["samples"] or learn["fields"]:
        ds = dataset_or_spec
        if isinstance(ds, dict):
            ds = resolve(ds["source"]["dataset"])(**payload["dataset"]["args"])
        if learn["samples"]:
            learnt["samples"] = len(ds)
        if learn["fields"]:
            if len(ds) < 1:
                raise ValueError("loaderd: the dataset is empty (len 0)")
            collate = collate_fn
            if collate is None and isinstance(payload["collate_fn"], dict):
                collate = resolve(payload["collate_fn"]["import"])
            with _SavedRNG():
                seed_all(sample_seed(payload["seed"], 0, 0))
                sample = ds[0]
                if collate is not None:
                    sample = collate([sample])
            learnt.update(learnt_of(sample, collate is not None, payload["object_bytes"]))
    return finish_spec(spec, payload, learnt, scalars)


def _mentions_main(ds_payload, *blobs):
    for b in (ds_payload.get("pickle"),) + blobs:
        if isinstance(b, bytes) and (b"__main__" in b or b"__mp_main__" in b):
            return True
    return str(ds_payload.get("import") or "").startswith(("__main__:", "__mp_main__:"))
