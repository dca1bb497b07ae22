# SPDX-License-Identifier: MIT
"""A worker of a python pipeline, forked by its host (loaderd._pyhost).

It makes its own connection to <socket>.workers (HELLO role WORKER), learns
the fields' places from WELCOME, then (only now, in the worker) imports
torch and the user's code and unpickles the dataset. For each TASK it builds
the rows: seeds the sample (pydataset.sample_seed), runs dataset[idx],
flattens it, checks each leaf against its field and copies it into the
slab, in place (one copy, no pickling), then answers DONE, or FAIL with the
index and the traceback. What does not fit a field (a str, None, an object,
a tensor of another shape, a sample or collate_fn output of another
structure) goes pickled into the rows' object part when the pipeline has
one (loaderd._objpart).
"""

import errno
import os
import pickle
import struct
import sys
import traceback

from . import _objpart as O
from . import _pywire as W
from . import pydataset as P


class _Fail(Exception):
    def __init__(self, index, text, status=-errno.EINVAL):
        self.index, self.text, self.status = index, text, status


def _exc_text(what, e, wid, pipeline):
    tb = e.__traceback__
    own = (__file__, P.__file__)
    while tb is not None and tb.tb_frame.f_code.co_filename in own:
        tb = tb.tb_next
    where = ""
    frames = traceback.extract_tb(tb) if tb is not None else []
    if frames:
        last = frames[-1]
        where = f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"
    msg = str(e)
    # a builtin by its name, else module.qualname: what the trainer re-raises
    # it as (errors.dataset_error)
    # (the trainer's script runs here as __mp_main__, multiprocessing's spawn)
    t = type(e)
    mod = "__main__" if t.__module__ == "__mp_main__" else t.__module__
    tname = t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"
    of = f"of pipeline {pipeline!r}" if pipeline else "learning the fields of a new pipeline"
    return (f"{what} {tname}: {msg}{where}\n"
            f"worker {wid} (pid {os.getpid()}) {of}:\n"
            + "".join(traceback.format_exception(type(e), e, tb)))


def _callable(v):
    """A collate_fn or worker_init_fn of the payload: None, the object
    itself (forked from the trainer), its pickle, or an import path."""
    if v is None:
        return None
    if isinstance(v, dict):
        return v["object"] if "object" in v else P.resolve(v["import"])
    return pickle.loads(v)


class Worker:
    def __init__(self, payload, host_welcome, wid, slab):
        self.p = payload
        self.wid = wid
        self._epoch_seed = None   # (epoch, pydataset.epoch_seed()) of the last sample
        self.slab_buf = slab
        self.nworkers = payload["nworkers"]
        self.fields = payload["fields"]
        self.learnt = payload.get("learnt", False)
        # "sample": seeded before each sample; "worker": once, before worker_init_fn
        self.per_sample = payload.get("seeding", "sample") == "sample"
        self.seed_all = P.seed_all
        self.setup_error = None

    def connect(self):
        self.sock = W.connect(self.p["socket"] + ".workers", self.p.get("daemon_uid"))
        W.hello(self.sock, W.ROLE_WORKER, self.p["pipeline"], nworkers=self.nworkers,
                worker_id=self.wid)
        self.w = W.parse_welcome(W.expect(self.sock, W.WELCOME, "WELCOME"))
        if self.w["nfields"] != len(self.fields):
            raise W.ProtocolError(f"WELCOME has {self.w['nfields']} fields, the spec "
                                  f"{len(self.fields)}")

    def setup(self):
        """Everything that runs user code; an error here fails every TASK."""
        # one thread a worker (there are many workers), as torch.set_num_threads(1)
        # below; before numpy and torch start their pools. A user's value stays.
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
        import numpy as np
        self.np = np
        p = self.p
        main = p.get("main") or {}
        try:
            from multiprocessing import spawn
            if main.get("name"):
                spawn._fixup_main_from_name(main["name"])
            elif main.get("path"):
                spawn._fixup_main_from_path(main["path"])
        except Exception:
            raise RuntimeError("importing the trainer's __main__ (where the dataset's class "
                               "lives) failed:\n" + traceback.format_exc())
        try:
            import torch
            torch.set_num_threads(1)
        except ImportError:
            torch = None
        ds = p["dataset"]
        if "object" in ds:  # forked from the trainer: its own object, as it is
            self.dataset = ds["object"]
        elif "pickle" in ds:
            self.dataset = pickle.loads(ds["pickle"])
        else:
            self.dataset = P.resolve(ds["import"])(**(ds.get("args") or {}))
        self.collate = _callable(p.get("collate_fn"))
        init = _callable(p.get("worker_init_fn"))
        seed = P.worker_seed(self.w["seed"], self.wid)
        P._worker_info = P.WorkerInfo(id=self.wid, num_workers=self.nworkers, seed=seed,
                                      dataset=self.dataset, pipeline=p["pipeline"],
                                      pid=os.getpid())
        if torch is not None:
            from torch.utils.data._utils import worker as tw
            tw._worker_info = tw.WorkerInfo(id=self.wid, num_workers=self.nworkers, seed=seed,
                                            dataset=self.dataset)
        if not self.per_sample:
            P.seed_all(seed)  # as torch seeds its workers; worker_init_fn's seeding stays
        if init is not None:
            init(self.wid)
        self.seed_all = P.seeder()  # per sample: seed_all(), its lookups done once

    def prepare_views(self):
        np = self.np
        self.base = np.frombuffer(self.slab_buf, dtype=np.uint8)
        self.places = []
        by_name = {f["name"]: i for i, f in enumerate(self.fields)}
        self.by_name = by_name
        for f, (off, sb) in zip(self.fields, self.w["fields"]):
            dt = P.field_np_dtype(f["dtype"])
            n = 1
            for d in f["shape"]:
                n *= d
            if n * dt.itemsize != sb:
                raise W.ProtocolError(f"field {f['name']!r}: WELCOME says {sb} bytes a sample, "
                                      f"{f['dtype']}{f['shape']} is {n * dt.itemsize}")
            self.places.append((off, sb, dt, tuple(f["shape"])))
        self.len_of = {}
        for i, f in enumerate(self.fields):
            if f["pad"]:
                self.len_of[i] = by_name[f["name"] + "_len"]

        # per field: the (type, dtype, shape) of leaves already checked, so
        # that a sample like the last ones is copied without the full checks
        self.ok = [set() for _ in self.fields]
        self.views = {}
        st = self.p.get("structure") or {}
        self.sstruct = None if "collated" in st else st
        self.cstruct = st.get("collated")
        self.obj = by_name.get(O.OBJ)          # the object part's field, None: none
        self.obj_len = by_name.get(O.OBJ_LEN)
        # a sample that is one leaf, or a tuple, list or dict of leaves:
        # (its shape, the dict's keys, the fields in that order),
        # put_rows()'s quick walk; else None (match())
        self.flat = None
        st = self.sstruct or {}
        items = st.get("tuple") or st.get("list")
        if "f" in st:
            self.flat = ("one", None, [by_name[st["f"]]])
        elif items and all(set(it) == {"f"} for it in items):
            self.flat = ("seq", None, [by_name[it["f"]] for it in items])
        elif st.get("dict") and all(set(sub) == {"f"} for _, sub in st["dict"]):
            self.flat = ("dict", [k for k, _ in st["dict"]], [by_name[sub["f"]]
                                                             for _, sub in st["dict"]])

    def region(self, slot, row, nrows, i):
        """Rows @row..@row+@nrows-1 of field @i of slot @slot, as one uint8
        array (a field's rows are contiguous)."""
        off, sb, _, _ = self.places[i]
        start = slot * self.w["slot_bytes"] + off + row * sb
        return self.base[start:start + nrows * sb]

    def view(self, slot, row, i):
        key = (slot, row, i)
        v = self.views.get(key)
        if v is None:
            off, sb, dt, shape = self.places[i]
            start = slot * self.w["slot_bytes"] + off + row * sb
            v = self.base[start:start + sb].view(dt).reshape(shape)
            if len(self.views) < 65536:
                self.views[key] = v
        return v

    def match(self, s, x, out, objs):
        """Append (field, leaf) of sample @x to @out, and put its object
        leaves in @objs, when it has exactly the learnt structure @s (a quick
        walk, no names checked); False when not (the full flatten then says
        what differs)."""
        f = s.get("f")
        if f is not None:
            if isinstance(x, (tuple, list, dict)) and not P._is_tensor(x):
                return False
            out.append((f, x))
            return True
        o = s.get("o")
        if o is not None:
            objs[o] = x
            return True
        d = s.get("dict")
        if d is not None:
            if type(x) is not dict or len(x) != len(d):
                return False
            for k, sub in d:
                if k not in x or not self.match(sub, x[k], out, objs):
                    return False
            return True
        items = s.get("tuple")
        if items is None:
            items = s.get("list")
        if items is None or not isinstance(x, (tuple, list)) or len(x) != len(items):
            return False
        for sub, v in zip(items, x):
            if not self.match(sub, v, out, objs):
                return False
        return True

    def misfit(self, idx, i, x, nrows=None):
        """None when leaf @x fits field @i (@nrows: as the rows of a
        collated batch), else what is wrong."""
        f = self.fields[i]
        ok = self.ok[i]
        key = (type(x), getattr(x, "dtype", None), getattr(x, "shape", None))
        if key in ok:
            return None
        name = f["name"]
        try:
            dtype, shape = P.leaf_info(name, x)
        except P.SampleError as e:
            return f"{'collate_fn output' if nrows else f'dataset[{idx}]'}: {e}"
        if nrows is None:
            msg = P.check_leaf(idx, f, dtype, shape, self.learnt)
        elif not shape or shape[0] != nrows:
            msg = (f"collate_fn: field {name!r} has shape {list(shape)}, its first dimension "
                   f"must be the batch's {nrows} rows")
        else:
            msg = P.check_leaf(idx, f, dtype, shape[1:], self.learnt)
            msg = msg and "collate_fn output: " + msg
        if msg is None and len(ok) < 256:
            ok.add(key)
        return msg

    def put(self, idx, sample, slot, row):
        """Write one sample into row @row of slot @slot."""
        out, objs = [], {}
        if self.sstruct is None or not self.match(self.sstruct, sample, out, objs):
            if self.obj is None:
                out = list(self.leaves(idx, sample, False).items())  # raises what differs
            else:
                out, objs = [], {O.WHOLE: sample}  # another structure: the whole sample
        by_name, fields = self.by_name, self.fields
        for name, x in out:
            i = by_name[name]
            f = fields[i]
            msg = self.misfit(idx, i, x)
            if msg is not None:
                if self.obj is None or f["pad"]:
                    raise _Fail(idx, msg + self.obj_hint())
                objs[name] = x  # travels as an object: default_collate decides
                continue
            P.write_leaf(self.view(slot, row, i), x, f,
                         self.view(slot, row, self.len_of[i]) if f["pad"] else None)
        if self.obj is not None:
            self.put_objects(idx, objs, slot, row, None)

    def put_rows(self, idxs, samples, slot, row0):
        """Write @samples (of indices @idxs) into rows @row0.. of slot
        @slot: each field's leaves in one copy (np.stack, torch.stack or a
        list assignment) when every sample has the learnt structure and
        fits; else row by row (put(), which names what differs)."""
        if self.sstruct is None or self.obj is not None or self.len_of:
            for k, x in enumerate(samples):
                self.put(idxs[k], x, slot, row0 + k)
            return
        cols = [[] for _ in self.fields]
        by_name, st, match, misfit = self.by_name, self.sstruct, self.match, self.misfit
        flat, ok = self.flat, self.ok
        for k, x in enumerate(samples):
            got = self.flat_leaves(x) if flat is not None else None
            if got is not None:
                # the learnt structure: its leaves in field order
                for i, leaf in zip(flat[2], got):
                    key = (type(leaf), getattr(leaf, "dtype", None), getattr(leaf, "shape", None))
                    if key not in ok[i]:
                        if isinstance(leaf, (tuple, list, dict)) and not P._is_tensor(leaf):
                            break  # not a leaf: put() says what differs
                        msg = misfit(idxs[k], i, leaf)
                        if msg is not None:
                            raise _Fail(idxs[k], msg + self.obj_hint())
                    cols[i].append(leaf)
                else:
                    continue
            else:
                out = []
                if match(st, x, out, {}):
                    for name, leaf in out:
                        i = by_name[name]
                        msg = misfit(idxs[k], i, leaf)
                        if msg is not None:
                            raise _Fail(idxs[k], msg + self.obj_hint())
                        cols[i].append(leaf)
                    continue
            for k2, x2 in enumerate(samples):  # raises at the first that differs
                self.put(idxs[k2], x2, slot, row0 + k2)
            return
        n = len(samples)
        if any(0 < len(col) < n for col in cols):
            # a field some samples lack: row by row, each in its own row
            for k, x in enumerate(samples):
                self.put(idxs[k], x, slot, row0 + k)
            return
        for i, col in enumerate(cols):
            off, sb, dt, shape = self.places[i]
            start = slot * self.w["slot_bytes"] + off + row0 * sb
            region = self.base[start:start + n * sb].view(dt).reshape((n,) + shape)
            if col and self.put_column(region, col, self.fields[i]["dtype"]):
                continue
            for r, leaf in enumerate(col):
                P.write_leaf(region[r], leaf, self.fields[i])

    def flat_leaves(self, x):
        """@x's leaves in self.flat's field order when it has that shape
        (a container's items are checked to be leaves by the caller), or None."""
        kind, keys, fields = self.flat
        if kind == "seq":
            return x if type(x) in (tuple, list) and len(x) == len(fields) else None
        if kind == "dict":
            if type(x) is not dict or len(x) != len(keys):
                return None
            try:
                return [x[k] for k in keys]
            except KeyError:
                return None
        return (x,)

    def put_column(self, region, col, dtype):
        """One copy of leaves @col into @region (n rows of their field),
        where they are alike: numpy arrays, CPU tensors or numbers; False
        when not done (row by row then: write_leaf's casts and errors)."""
        if dtype == "bfloat16":
            return False
        t = type(col[0])
        for x in col:
            if type(x) is not t:
                return False
        np = self.np
        try:
            if t in (int, float, bool) or issubclass(t, np.generic):
                region[...] = col
            elif issubclass(t, np.ndarray) and region.ndim > 1:
                # each leaf has the field's shape: one concatenation along
                # its first dimension (np.stack indexes every leaf again,
                # which costs a np.memmap's rows 2 us each)
                np.concatenate(col, out=region.reshape((-1,) + region.shape[2:]))
            elif issubclass(t, np.ndarray):
                region[...] = col
            elif P._is_tensor(col[0]):
                import torch
                torch.stack(col, out=torch.from_numpy(region))
            else:
                return False
        except Exception:  # a cast stack refuses, a tensor needing grad, on a GPU
            return False
        return True

    def obj_hint(self):
        if self.obj is not None or not self.learnt:
            return ""
        return (" (or pass object_bytes= to loaderd.DataLoader: what does not fit a field then "
                "travels pickled with the batch, as torch's DataLoader takes it)")

    def put_objects(self, idx, objs, slot, row, nrows):
        """The object part of row @row (@nrows: of the collated batch of
        that many rows from @row): @objs pickled, or empty."""
        n = nrows or 1
        lens = self.region(slot, row, n, self.obj_len).view(self.np.int64)
        if not objs:
            lens[:] = 0
            return
        region = self.region(slot, row, n, self.obj)
        where = (f"dataset[{idx}]" if nrows is None else
                 f"the collate_fn output of the batch of dataset[{idx}], ... ({nrows} rows)")
        what = ("the whole sample, not of dataset[0]'s structure" if O.WHOLE in objs else
                "leaf " + ", ".join(repr(k) for k in objs))
        try:
            size = O.pack(objs, region)
        except O.TooBig as e:
            per_row = O.round_up(-(-e.needed // n))
            raise _Fail(idx, f"{where}: what travels pickled with the batch ({what}: what is "
                             "not a fixed-shape array of its field) takes "
                             f"{e.needed} bytes, more than the {e.capacity} bytes "
                             f"{'its row has' if nrows is None else 'the batch has'} for it "
                             f"({e.capacity // n} a row): pass object_bytes={per_row} or more "
                             "to loaderd.DataLoader (bytes per row; the default is "
                             "max(64 KiB, 4x what dataset[0]'s needed))", -errno.EMSGSIZE)
        except Exception as e:
            raise _Fail(idx, f"{where}: {what} cannot travel with the batch: pickling it "
                             f"failed ({type(e).__name__}: {e})")
        lens[:] = 0
        lens[0] = size

    # ----------------------------------------------------------- samples

    def sample(self, epoch, idx):
        if not self.per_sample:
            return self.dataset[idx]  # the worker's RNGs go on from its seeding
        es = self._epoch_seed
        if es is None or es[0] != epoch:
            es = self._epoch_seed = (epoch, P.epoch_seed(self.w["seed"], epoch))
        self.seed_all(P.sample_seed(self.w["seed"], epoch, idx, es[1]))
        return self.dataset[idx]

    def sample_or_skip(self, epoch, idx):
        """(sample, its index, skipped): with on_error skip the next index
        that does not raise replaces a failing one."""
        try:
            return self.sample(epoch, idx), idx, 0
        except Exception as e:
            if not self.w["on_error"]:
                raise _Fail(idx, self.exc_text(idx, e))
            first = (idx, e)
        n = self.w["nsamples"]
        j = idx
        for _ in range(max(0, n - 1)):
            j = (j + 1) % n
            try:
                return self.sample(epoch, j), j, 1
            except Exception:
                continue
        raise _Fail(first[0], "on_error skip: every sample raised; the first: " +
                    self.exc_text(*first))

    def exc_text(self, idx, e):
        """'dataset[IDX] raised TYPE: MSG (at FILE:LINE in FUNC)', the worker,
        then the traceback from the dataset's frame on (loaderd's own frames
        left out): the first line says what and where even when cut."""
        return _exc_text(f"dataset[{idx}] raised", e, self.wid, self.p["pipeline"])



    def leaves(self, idx, sample, batched):
        try:
            _, leaves = P.flatten(sample, batched)
        except P.SampleError as e:
            raise _Fail(idx, f"dataset[{idx}]: {e}")
        got = {}
        for name, x in leaves:
            if name not in self.by_name:
                raise _Fail(idx, f"dataset[{idx}]: field {name!r} is not one of the pipeline's "
                                 f"({', '.join(f['name'] for f in self.fields)})"
                                 f"{' (learnt from dataset[0])' if self.learnt else ''}")
            got[name] = x
        for i, f in enumerate(self.fields):
            if f["name"] not in got and not self._is_len(f["name"]):
                raise _Fail(idx, f"dataset[{idx}]: has no field {f['name']!r} (the pipeline's "
                                 f"fields: {', '.join(g['name'] for g in self.fields)})")
        return got

    def _is_len(self, name):
        return name.endswith("_len") and any(f["pad"] and f["name"] + "_len" == name
                                             for f in self.fields)

    def write(self, idx, got, slot, row, nrows=None):
        """Write a sample's leaves (@nrows: a collated batch of that many rows
        from @row)."""
        for name, x in got.items():
            i = self.by_name[name]
            f = self.fields[i]
            try:
                dtype, shape = P.leaf_info(name, x)
            except P.SampleError as e:
                raise _Fail(idx, f"dataset[{idx}]: {e}")
            if nrows is None:
                msg = P.check_leaf(idx, f, dtype, shape, self.learnt)
                if msg:
                    raise _Fail(idx, msg)
                P.write_leaf(self.view(slot, row, i), x, f,
                             self.view(slot, row, self.len_of[i]) if f["pad"] else None)
            else:
                if not shape or shape[0] != nrows:
                    raise _Fail(idx, f"collate_fn: field {name!r} has shape {list(shape)}, "
                                     f"its first dimension must be the batch's {nrows} rows")
                msg = P.check_leaf(idx, f, dtype, shape[1:], self.learnt)
                if msg:
                    raise _Fail(idx, "collate_fn output: " + msg)
                a = P.leaf_array(x, f["dtype"])
                for r in range(nrows):
                    P.write_leaf(self.view(slot, row + r, i), a[r], f,
                                 self.view(slot, row + r, self.len_of[i]) if f["pad"] else None)

    def task(self, body):
        task_id, epoch, slot, row0, nrows, _ = W.TASK_S.unpack_from(body)
        idx = struct.unpack_from(f"={nrows}Q", body, W.TASK_S.size)
        if self.setup_error is not None:
            raise _Fail(idx[0] if idx else 0, self.setup_error)
        skipped = 0
        if self.collate is None:
            samples, used = [], []
            for i in idx:
                s, u, sk = self.sample_or_skip(epoch, i)
                skipped += sk
                samples.append(s)
                used.append(u)
            self.put_rows(used, samples, slot, row0)
        else:
            samples = []
            for i in idx:
                s, used, sk = self.sample_or_skip(epoch, i)
                skipped += sk
                samples.append(s)
            try:
                out = self.collate(samples)
            except Exception as e:
                raise _Fail(idx[0], _exc_text(f"collate_fn of the batch of dataset[{idx[0]}], "
                                              f"... ({nrows} rows) raised", e, self.wid,
                                              self.p["pipeline"]))
            self.put_batch(idx[0], out, slot, row0, nrows)
        return task_id, skipped

    def put_batch(self, idx, out, slot, row0, nrows):
        """Write a collate_fn's output @out: its leaves that fit their field
        as @nrows rows from @row0, the rest in the object part."""
        fixed, objs = [], {}
        if self.cstruct is None or not self.match(self.cstruct, out, fixed, objs):
            if self.obj is None:
                self.write(idx, self.leaves(idx, out, True), slot, row0, nrows)  # or raises
                return
            fixed, objs = [], {O.WHOLE: out}  # another structure: the whole output
        for name, x in fixed:
            i = self.by_name[name]
            f = self.fields[i]
            msg = self.misfit(idx, i, x, nrows)
            if msg is not None:
                if self.obj is None or f["pad"]:
                    raise _Fail(idx, msg + self.obj_hint())
                objs[name] = x
                continue
            a = P.leaf_array(x, f["dtype"])
            for r in range(nrows):
                P.write_leaf(self.view(slot, row0 + r, i), a[r], f,
                             self.view(slot, row0 + r, self.len_of[i]) if f["pad"] else None)
        if self.obj is not None:
            self.put_objects(idx, objs, slot, row0, nrows)

    def loop(self):
        while True:
            msg = W.recv(self.sock)
            if msg is None:
                return 0
            W.check_error(msg)
            if msg[0] != W.TASK:
                continue
            task_id = W.TASK_S.unpack_from(msg[1])[0]
            try:
                task_id, skipped = self.task(msg[1])
            except _Fail as f:
                W.send(self.sock, W.FAIL, W.FAIL_S.pack(task_id, f.index, f.status, 0) +
                       W.cut_utf8(f.text, W.MSG_MAX))
                continue
            except Exception as e:  # a bug of ours, or the copy itself
                W.send(self.sock, W.FAIL, W.FAIL_S.pack(task_id, 0, -errno.EIO, 0) +
                       W.cut_utf8(f"worker {self.wid} (pid {os.getpid()}): {type(e).__name__}: "
                                  f"{e}\n" + traceback.format_exc(), W.MSG_MAX))
                continue
            W.send(self.sock, W.DONE, W.DONE_S.pack(task_id, skipped))


def main(payload, host_welcome, wid, addr, slab):
    w = Worker(payload, host_welcome, wid, slab)
    try:
        w.connect()
    except W.PeerError as e:
        sys.stderr.write(f"loaderd worker {wid} (pid {os.getpid()}): the daemon refused: {e}\n")
        return 3
    except (OSError, W.ProtocolError) as e:
        sys.stderr.write(f"loaderd worker {wid} (pid {os.getpid()}): {e}\n")
        return 4
    try:
        w.setup()
        w.prepare_views()
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        text = (f"worker {wid} (pid {os.getpid()}) of pipeline {payload['pipeline']!r} could not "
                f"start: {type(e).__name__}: {e}\n" + traceback.format_exc())
        sys.stderr.write("loaderd " + text)
        w.setup_error = text
        if not hasattr(w, "np"):
            import numpy
            w.np = numpy
    try:
        return w.loop()
    except (OSError, W.ProtocolError) as e:
        sys.stderr.write(f"loaderd worker {wid} (pid {os.getpid()}): {e}\n")
        return 4
    except W.PeerError as e:
        sys.stderr.write(f"loaderd worker {wid} (pid {os.getpid()}): the daemon says: {e}\n")
        return 3


def learn(payload):
    """Worker 0 before its pipeline exists (the host forks it for this):
    set up as a worker (worker info, worker_init_fn), then what
    payload["learn"] asks: len(dataset), and dataset[0] seeded as a worker
    seeds epoch 0 index 0 (through collate_fn when there is one) flattened
    into fields. {"learnt": {...}} or {"error": {"kind", "text"}}: kind
    "raised" (the text as a worker's FAIL words it: errors.dataset_error
    finds the type), "sample" (a SampleError), "empty", "start"."""
    ask = payload["learn"]
    w = Worker(payload, None, 0, None)
    w.w = {"seed": payload["seed"]}
    try:
        w.setup()
    except Exception as e:
        return {"error": {"kind": "start", "text": (
            f"worker 0 (pid {os.getpid()}) could not start: {type(e).__name__}: {e}\n"
            + traceback.format_exc())}}
    out = {}
    try:
        n = len(w.dataset)
    except Exception as e:
        return {"error": {"kind": "raised", "text": _exc_text("len(dataset) raised", e, 0, None)}}
    if ask.get("samples"):
        out["samples"] = n
    if ask.get("fields"):
        if n < 1:
            return {"error": {"kind": "empty", "text": "loaderd: the dataset is empty (len 0)"}}
        try:
            sample = w.sample(0, 0)
        except Exception as e:
            return {"error": {"kind": "raised", "text": _exc_text("dataset[0] raised", e, 0, None)}}
        if w.collate is not None:
            try:
                sample = w.collate([sample])
            except Exception as e:
                return {"error": {"kind": "raised", "text": _exc_text(
                    "collate_fn of the batch of dataset[0] (1 rows) raised", e, 0, None)}}
        try:
            out.update(P.learnt_of(sample, w.collate is not None, payload.get("object_bytes")))
        except P.SampleError as e:
            return {"error": {"kind": "sample", "text": str(e)}}
    return {"learnt": out}
