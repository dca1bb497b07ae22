# SPDX-License-Identifier: MIT
"""Your own Dataset end to end (issue 12, docs/python.md "Your own Dataset"):
a "python" pipeline built by the trainer's worker processes (loaderd._pyhost
and the workers it forks) into the real daemon's slots.

Each trainer runs as its own /usr/bin/python3 process (a script written to the
test's directory, printing one JSON line), with the loaderd package of this
checkout and the libloader of the build under test (ASan runtime preloaded in
a sanitizer build). The datasets are tests/pyharness/pydatasets.py.
"""

import errno
import json
import os
import subprocess
import textwrap

import pytest

from ldrtest import REPO_ROOT, python_client_env, sanitizer_report

HARNESS = os.path.join(REPO_ROOT, "tests", "pyharness")

pytest.importorskip("torch")
pytest.importorskip("torchvision")


PRELUDE = textwrap.dedent("""
    import hashlib, json, os, signal, sys, time
    import numpy as np
    import loaderd
    import pydatasets as D
    SOCK = sys.argv[1]

    def digest(batch):
        leaves = []
        def walk(x):
            if isinstance(x, dict):
                for k in x:
                    walk(x[k])
            elif isinstance(x, (list, tuple)):
                for v in x:
                    walk(v)
            else:
                leaves.append(np.ascontiguousarray(x.numpy() if hasattr(x, "numpy") else x))
        walk(batch)
        h = hashlib.sha256()
        for a in leaves:
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.tobytes())
        return h.hexdigest()

    def drop(name):
        c = loaderd.Client(SOCK)
        c.drop_pipeline(name, force=True)
        c.close()

    def out(**kw):
        print("RESULT " + json.dumps(kw), flush=True)
""")


def trainer(ld, body, timeout=240, check=True):
    """Run PRELUDE + @body as a trainer against daemon @ld; its RESULT dict."""
    ld._spec_no += 1
    path = os.path.join(ld.dir, f"trainer{ld._spec_no}.py")
    with open(path, "w") as f:
        f.write(PRELUDE + textwrap.dedent(body))
    r = subprocess.run(["/usr/bin/python3", path, ld.socket], capture_output=True, text=True,
                       env=python_client_env(HARNESS), timeout=timeout, cwd=ld.dir)
    m = sanitizer_report(r.stderr)
    assert m is None, f"the trainer printed a {m} report:\n{r.stderr}"
    res = [line[7:] for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if check:
        assert r.returncode == 0 and res, (f"trainer failed (exit {r.returncode}):\n"
                                           f"stdout: {r.stdout[-3000:]}\nstderr: "
                                           f"{r.stderr[-6000:]}\ndaemon log:\n{ld.log()[-4000:]}")
    return json.loads(res[-1]) if res else None, r


# ------------------------------------------- (a) workers and resume, exact

AUGMENT = """
    ds = D.RandomAugment(n=40)
    kw = dict(batch_size=5, shuffle=True, seed=3, socket=SOCK, timeout=120)
    dl = loaderd.DataLoader(ds, num_workers={workers}, **kw)
    name = dl.pipeline
    stream = [digest(b) for b in dl] + [digest(b) for b in dl]    # epochs 0 and 1
    resumed = []
    if {resume}:
        dl.close()
        drop(name)
        dl = loaderd.DataLoader(ds, num_workers={workers}, **kw)
        for k, b in enumerate(dl):
            resumed.append(digest(b))
            if k == 2:
                state = dl.state_dict()
                break
        dl.close()
        dl2 = loaderd.DataLoader(ds, num_workers={workers}, **kw)   # finds the pipeline
        assert not dl2.created
        dl2.load_state_dict(state)
        resumed += [digest(b) for b in dl2]          # the rest of epoch 0
        resumed += [digest(b) for b in dl2]          # epoch 1
        dl2.close()
    else:
        dl.close()
    drop(name)
    out(name=name, stream=stream, resumed=resumed, nbatches=len(stream))
"""


def test_random_transforms_identical_across_workers_and_resume(ld):
    runs = {}
    for workers in (1, 2, 4):
        res, _ = trainer(ld, AUGMENT.format(workers=workers, resume=workers == 2))
        runs[workers] = res
    ref = runs[1]["stream"]
    assert runs[1]["nbatches"] == 16 and len(set(ref)) == 16
    assert runs[2]["stream"] == ref, "2 workers built other bytes than 1"
    assert runs[4]["stream"] == ref, "4 workers built other bytes than 1"
    assert runs[2]["resumed"] == ref, "the resumed stream differs"
    assert runs[1]["name"].startswith(f"py-{os.geteuid()}-randomaugment-")


# --------------------------------------------------- (b) errors and skip

def test_exception_reaches_the_trainer(ld):
    res, r = trainer(ld, """
        dl = loaderd.DataLoader(D.Plain(n=12, fail={6}), batch_size=4, socket=SOCK,
                                num_workers=2, epochs=1, timeout=60, as_numpy=True)
        try:
            for b in dl:
                pass
            out(raised=None)
        except loaderd.Error as e:
            out(raised=type(e).__name__, text=str(e))
    """)
    assert res["raised"] is not None, "the epoch ended without the dataset's exception"
    text = res["text"]
    assert "dataset[6] raised ValueError: bad sample 6" in text, text
    assert "Traceback" in text and "pydatasets.py" in text and "worker " in text, text


def test_whole_traceback_reaches_the_trainer(ld):
    res, r = trainer(ld, """
        dl = loaderd.DataLoader(D.Deep(n=12), batch_size=4, socket=SOCK, num_workers=1,
                                epochs=1, timeout=60, as_numpy=True)
        try:
            for b in dl:
                pass
            out(raised=None)
        except loaderd.Error as e:
            out(raised=type(e).__name__, text=str(e))
    """)
    text = res["text"]
    assert "dataset[5] raised RuntimeError: long xxx" in text, text[:500]
    assert "x" * 3000 + " END-OF-MESSAGE-5" in text, text[-500:]
    assert "[Previous line repeated 17 more times]" in text, text  # all 21 frames


def test_on_error_skip_counts(ld):
    res, _ = trainer(ld, """
        dl = loaderd.DataLoader(D.Plain(n=12, fail={6}), batch_size=4, socket=SOCK,
                                num_workers=1, epochs=1, timeout=60, as_numpy=True,
                                on_error="skip")
        labels = [int(v) for x, y in dl for v in y]
        st = [p for p in loaderd.Client(SOCK).status()["pipelines"] if p["name"] == dl.pipeline]
        out(labels=labels, skipped=st[0].get("skipped"), spec_on_error=dl.spec.get("on_error"))
    """)
    assert res["labels"] == [0, 1, 2, 3, 4, 5, 7, 7, 8, 9, 10, 11]
    assert res["skipped"] == 1, res


@pytest.mark.parametrize("ring", ["1", "0"])
def test_on_error_raise_keeps_the_stream_going(ld, ring):
    # the daemon's side of torch's semantics, over the batch ring and over
    # Next replies: the failed batch is an error in its place for every
    # reader, the batches after it come, and the pipeline stays running
    res, _ = trainer(ld, f"""
        os.environ["LOADERD_RING"] = "{ring}"
        def read(dl, n):
            got = []
            for _ in range(n):
                try:
                    b = dl.next_batch()
                    got.append(None if b is None else [int(v) for v in b[1]])
                except loaderd.Error as e:
                    got.append(["raised", type(e).__name__, e.code, e.message.splitlines()[0]])
            return got
        # min_clients: the stream waits for both readers (a broadcast loader
        # attaching to a running stream joins it where it stands)
        owner = loaderd.DataLoader({{"source": {{"kind": "python", "dataset": "pydatasets:Plain",
                                                "args": {{"n": 12, "fail": [5, 9]}}}},
                                    "batch_size": 2, "min_clients": 2}}, socket=SOCK,
                                   num_workers=2, epochs=1, timeout=60, as_numpy=True,
                                   on_error="raise", mode="broadcast")
        # a client by name runs none of the Dataset's code: a plain Error
        other = loaderd.DataLoader(owner.pipeline, socket=SOCK, timeout=60, as_numpy=True,
                                   mode="broadcast")
        got = {{"owner": [], "other": []}}
        for _ in range(7):
            got["owner"] += read(owner, 1)
            got["other"] += read(other, 1)
        # done once the last releases are in (they travel on their own)
        deadline = time.monotonic() + 30
        while True:
            st = loaderd.Client(SOCK).pipeline(owner.pipeline)
            if st["state"] != "running" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        out(got=got, spec_on_error=owner.spec.get("on_error"), state=st["state"],
            failed=st["batches_failed"], errors=st["stats"]["errors_total"])
    """)
    raised = lambda i, typ: ["raised", typ, -errno.EINVAL,
                             f"dataset[{i}] raised ValueError: bad sample {i} (at "
                             "pydatasets.py:108 in __getitem__)"]
    want = lambda typ: [[0, 1], [2, 3], raised(5, typ), [6, 7], raised(9, typ), [10, 11], None]
    assert res["got"]["owner"] == want("ValueError"), res["got"]
    assert res["got"]["other"] == want("Error"), res["got"]
    assert res["spec_on_error"] == "raise"
    assert res["state"] == "done" and res["failed"] == 2 and res["errors"] == 2, res


def test_on_error_fail_still_fails_the_pipeline(ld):
    res, _ = trainer(ld, """
        dl = loaderd.DataLoader(D.Plain(n=12, fail={5}), batch_size=2, socket=SOCK,
                                num_workers=2, epochs=1, timeout=60, as_numpy=True,
                                on_error="fail")
        it = iter(dl)
        got = [[int(v) for v in next(it)[1]] for _ in range(2)]
        raised = []
        try:
            next(it)
        except ValueError as e:
            raised.append(str(e).splitlines()[0])
        try:   # the epoch ended with it
            next(it)
        except StopIteration:
            raised.append("StopIteration")
        st = loaderd.Client(SOCK).pipeline(dl.pipeline)
        out(got=got, raised=raised, state=st["state"], failed=st["batches_failed"],
            error=st["error"].splitlines()[0])
    """)
    assert res["got"] == [[0, 1], [2, 3]]
    assert len(res["raised"]) == 2 and "dataset[5] raised ValueError: bad sample 5" in \
        res["raised"][0] and res["raised"][1] == "StopIteration", res
    assert res["state"] == "failed" and res["failed"] == 0, res
    assert res["error"].startswith("dataset[5] raised ValueError: bad sample 5"), res


# ------------------------------------------ (c) a worker killed mid-epoch

def test_sigkill_worker_mid_epoch(ld):
    res, _ = trainer(ld, """
        def workers_of(pid):
            kids = []
            for d in os.listdir("/proc"):
                if d.isdigit():
                    try:
                        with open(f"/proc/{d}/stat") as f:
                            st = f.read().rsplit(")", 1)[1].split()
                    except OSError:
                        continue
                    if int(st[1]) == pid and st[0] != "Z":
                        kids.append(int(d))
            return kids

        import warnings   # a rebuilt batch must give its slot back when dropped, not at GC
        warnings.filterwarnings("error", message=".*kept more batches")
        n = 160
        dl = loaderd.DataLoader(D.Plain(n=n, sleep=0.01), batch_size=4, socket=SOCK,
                                num_workers=2, epochs=1, timeout=60, as_numpy=True)
        xs, ys, killed = [], [], None
        for k, (x, y) in enumerate(dl):
            xs.append(x.copy()); ys.append(y.copy())
            if k == 5:
                kids = workers_of(dl._host.pid)
                killed = kids[0]
                os.kill(killed, signal.SIGKILL)
        x, y = np.concatenate(xs), np.concatenate(ys)
        ok_x = bool(np.array_equal(x, np.stack([np.arange(i, i + 3, dtype=np.float32)
                                                for i in range(n)])))
        # the host restarts the killed worker when it reaps it (_pyhost.py,
        # reap/start_due): wait for that rather than sleep a guess of it
        deadline = time.monotonic() + 30
        now = workers_of(dl._host.pid)
        while (killed in now or len(now) != 2) and time.monotonic() < deadline:
            time.sleep(0.05)
            now = workers_of(dl._host.pid)
        out(labels=y.tolist(), ok_x=ok_x, killed=killed, now=now)
    """)
    assert res["killed"], "no worker found to kill"
    assert res["labels"] == list(range(160)) and res["ok_x"]
    assert res["killed"] not in res["now"] and len(res["now"]) == 2, res["now"]


# ----------------------------------- (d) dicts and tuples as default_collate

@pytest.mark.parametrize("cls", ["DictSamples", "TupleSamples", "NamedSamples"])
def test_rebuilt_as_default_collate(ld, cls):
    res, _ = trainer(ld, f"""
        import torch
        from torch.utils.data import default_collate
        ds = D.{cls}(n=30)
        dl = loaderd.DataLoader(ds, batch_size=8, socket=SOCK, num_workers=2, epochs=1,
                                timeout=60)

        def same(a, b):
            if isinstance(a, torch.Tensor):
                return isinstance(b, torch.Tensor) and a.dtype == b.dtype and \\
                    a.shape == b.shape and bool(torch.equal(a, b))
            if type(a) is not type(b):
                return False
            if isinstance(a, dict):
                return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        bad, nb = [], 0
        for k, b in enumerate(dl):
            want = default_collate([ds[i] for i in range(8 * k, min(30, 8 * k + 8))])
            if not same(b, want):
                bad.append([k, repr(b)[:500], repr(want)[:500]])
            nb += 1
        # a trainer attaching by name rebuilds the same way (the spec's structure)
        by_name = loaderd.DataLoader(dl.pipeline, socket=SOCK, timeout=60)
        first = next(iter(by_name))
        out(bad=bad, nb=nb, by_name=same(first, default_collate([ds[i] for i in range(8)])))
    """)
    assert res["nb"] == 4 and not res["bad"], res["bad"]
    assert res["by_name"], "a loader attached by name did not rebuild the samples"


# --------------------------------------- (e) broadcast, decoded once

def test_broadcast_decodes_once(ld):
    counts = os.path.join(ld.dir, "counts")
    os.mkdir(counts)
    body = f"""
        spec = {{"name": "bc", "source": {{"kind": "python", "dataset": "pydatasets:Counting",
                                          "args": {{"n": 48, "count_dir": {counts!r},
                                                   "sleep": 0.002}}}},
                "batch_size": 6, "min_clients": 2, "epochs": 1}}
        dl = loaderd.DataLoader(spec, socket=SOCK, mode="broadcast", num_workers=2, timeout=120)
        stream = [digest(b) for b in dl]
        st = [p for p in loaderd.Client(SOCK).status()["pipelines"] if p["name"] == "bc"]
        out(stream=stream, created=dl.created, status=st[0] if st else None)
    """
    ld._spec_no += 1
    paths = []
    for i in range(2):
        p = os.path.join(ld.dir, f"bc{i}.py")
        with open(p, "w") as f:
            f.write(PRELUDE + textwrap.dedent(body))
        paths.append(p)
    procs = [subprocess.Popen(["/usr/bin/python3", p, ld.socket], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=python_client_env(HARNESS), cwd=ld.dir)
             for p in paths]
    results = []
    for pr in procs:
        o, e = pr.communicate(timeout=240)
        assert pr.returncode == 0, f"trainer failed:\n{o[-2000:]}\n{e[-4000:]}\n{ld.log()[-3000:]}"
        results.append(json.loads([line for line in o.splitlines()
                                   if line.startswith("RESULT ")][-1][7:]))
    assert sorted(r["created"] for r in results) == [False, True]
    assert results[0]["stream"] == results[1]["stream"] and len(results[0]["stream"]) == 8
    built = []
    for fn in os.listdir(counts):
        assert fn not in {str(pr.pid) for pr in procs}, "a trainer ran __getitem__"
        with open(os.path.join(counts, fn)) as f:
            built += [int(v) for v in f.read().split()]
    # each trainer's worker 0 learnt the fields from dataset[0] (one more 0
    # each), then one host's workers built every sample once
    assert sorted(built) == [0, 0] + list(range(48)), sorted(built)
    st = [r["status"] for r in results if r["created"]][0]
    assert st["python"]["samples_built"] == 48, st


# ------------------------- collate_fn, pad fields, worker info, __main__

def test_collate_fn_pad_and_worker_info(ld):
    res, _ = trainer(ld, """
        import torch
        dl = loaderd.DataLoader(D.Plain(n=10), batch_size=4, socket=SOCK, num_workers=1,
                                epochs=1, timeout=60, collate_fn=D.stack_collate)
        col = [(x.tolist(), y.tolist(), str(y.dtype), type(b).__name__)
               for b in dl for x, y in [b]]
        fields = [{"name": "tok", "dtype": "int64", "shape": [6], "pad": True},
                  {"name": "y", "dtype": "int64", "shape": []}]
        dl2 = loaderd.DataLoader(D.VarLen(n=7), batch_size=7, socket=SOCK, num_workers=1,
                                 epochs=1, timeout=60, fields=fields, pipeline_name="varlen")
        assert dl2.pipeline == "varlen"
        pad = [{k: v.tolist() for k, v in b.items()} for b in dl2]
        dl3 = loaderd.DataLoader(D.WorkerInfoSamples(n=8, meet=2), batch_size=1, socket=SOCK,
                                 num_workers=2, epochs=1, timeout=60,
                                 worker_init_fn=D.init_marker)
        info = sorted({tuple(b[0].tolist()) for b in dl3})
        host = dl3._host
        drop(dl3.pipeline)
        out(col=col, pad=pad, info=info, host_rc=host.wait(timeout=20))
    """)
    col = res["col"]
    assert [c[1] for c in col] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert col[0][0][1] == [2.0, 4.0, 6.0] and col[0][2] == "torch.int32"
    assert col[0][3] == "tuple"  # a collate_fn's output keeps its own structure
    assert res["pad"] == [{"tok": [[0, 0, 0, 0, 0, 0], [1, 2, 0, 0, 0, 0], [2, 3, 4, 0, 0, 0],
                                   [3, 4, 5, 6, 0, 0], [4, 5, 6, 7, 8, 0], [5, 0, 0, 0, 0, 0],
                                   [6, 7, 0, 0, 0, 0]],
                           "tok_len": [1, 2, 3, 4, 5, 1, 2], "y": list(range(7))}]
    # [torch's id, loaderd's id, worker_init_fn's id, torch threads] of each worker
    assert [list(t) for t in res["info"]] == [[0, 0, 0, 1], [1, 1, 1, 1]]
    assert res["host_rc"] == 0, "the host did not exit 0 after the pipeline was dropped"


MAIN_SCRIPT = """
import sys
import numpy as np
import torch
import loaderd


class Squares(torch.utils.data.Dataset):       # defined in the trainer's __main__
    def __len__(self):
        return 9

    def __getitem__(self, i):
        return {"x": torch.tensor([i, i * i]), "r": torch.rand(2)}


if __name__ == "__main__":
    dl = loaderd.DataLoader(Squares(), batch_size=3, socket=sys.argv[1], num_workers=2,
                            epochs=1, timeout=60)
    xs = [b["x"].tolist() for b in dl]
    print("RESULT", xs, flush=True)
"""


def test_dataset_class_in_main(ld):
    path = os.path.join(ld.dir, "main_trainer.py")
    with open(path, "w") as f:
        f.write(MAIN_SCRIPT)
    r = subprocess.run(["/usr/bin/python3", path, ld.socket], capture_output=True, text=True,
                       env=python_client_env(HARNESS), timeout=240, cwd=ld.dir)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-5000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1]
    assert line == "RESULT " + str([[[i, i * i] for i in range(j, j + 3)] for j in (0, 3, 6)])


def test_worker_setup_failure_reaches_the_trainer(ld):
    res, _ = trainer(ld, """
        try:   # worker 0, which learns the fields at construction, runs it first
            dl = loaderd.DataLoader(D.Plain(n=8), batch_size=4, socket=SOCK, num_workers=1,
                                    epochs=1, timeout=60, worker_init_fn=D.raise_in_init)
            n = len(list(dl))
            out(raised=None, n=n)
        except loaderd.Error as e:
            out(raised=type(e).__name__, text=str(e))
    """)
    assert res["raised"], res
    assert "could not start" in res["text"] and "RuntimeError: init boom" in res["text"], res


# -------------------- (g) the wire: a host and workers that lie (item 12)

def test_wire_identities_from_the_kernel_counts_checked(ld):
    """A hand-made host and workers on <socket>.workers: their HELLOs say
    pid 1, the host reports an exit of a worker it does not run, one worker
    answers DONE with 2^64-1 samples skipped, the next a FAIL naming sample
    2^64-1. The daemon shows the kernel's pid, refuses each bad count with
    an ERROR that names it (logged with the pipeline and the real pid),
    hands the task to the next worker, and the trainer gets its batch."""
    res, _ = trainer(ld, """
        import errno, mmap, socket, struct, threading
        from loaderd import _pywire as W
        M64 = (1 << 64) - 1
        c = loaderd.Client(SOCK)
        c.create_pipeline({"name": "liar", "batch_size": 4, "epochs": 1, "source": {
            "kind": "python", "dataset": "nowhere:Nothing", "samples": 8,
            "fields": [{"name": "x", "dtype": "int64", "shape": []}]}})

        def hello(role):
            s = W.connect(SOCK + ".workers")
            s.settimeout(60)
            W.send(s, W.HELLO, W.HELLO_S.pack(1, role, 1, 0, 1, 0, b"liar"))   # "pid 1"
            return s
        host = hello(W.ROLE_HOST)
        fds = []
        wel = W.parse_welcome(W.expect(host, W.WELCOME, "WELCOME", fds))
        mm = mmap.mmap(fds[0], wel["slab_size"])
        W.send(host, W.MAPPED)
        W.expect(host, W.READY, "READY")
        W.send(host, W.WORKER_EXIT, W.WORKER_EXIT_S.pack(7, 1, 9, 0))   # it runs worker 0 only
        replies = []

        def task(w):
            msg = W.recv(w)
            if msg is None or msg[0] != W.TASK:
                return None
            tid, epoch, slot, row0, nrows, _ = W.TASK_S.unpack_from(msg[1])
            return tid, slot, row0, struct.unpack_from(f"={nrows}Q", msg[1], W.TASK_S.size)

        def refused(w):
            while True:   # tasks sent before the refusal, then ERROR and EOF
                msg = W.recv(w)
                if msg is None or msg[0] == W.ERROR:
                    break
            replies.append(None if msg is None else
                           [struct.unpack_from("=i", msg[1])[0], msg[1][4:].decode()])
            assert W.recv(w) is None

        def workers():
            w = hello(W.ROLE_WORKER)
            W.expect(w, W.WELCOME, "WELCOME")
            W.send(w, W.DONE, W.DONE_S.pack(task(w)[0], M64))
            refused(w)
            w = hello(W.ROLE_WORKER)
            W.expect(w, W.WELCOME, "WELCOME")
            W.send(w, W.FAIL, W.FAIL_S.pack(task(w)[0], M64, -errno.EINVAL, 0) + b"no")
            refused(w)
            w = hello(W.ROLE_WORKER)
            W.expect(w, W.WELCOME, "WELCOME")
            off, sb = wel["fields"][0]
            while True:
                t = task(w)
                if t is None:
                    return
                tid, slot, row0, idx = t
                for k, i in enumerate(idx):
                    struct.pack_into("=q", mm, slot * wel["slot_bytes"] + off + (row0 + k) * sb,
                                     10 * i)
                W.send(w, W.DONE, W.DONE_S.pack(tid, 0))
        th = threading.Thread(target=workers, daemon=True)
        th.start()
        dl = loaderd.DataLoader("liar", socket=SOCK, timeout=60, as_numpy=True)
        xs = sorted(int(v) for b in dl for v in b["x"])
        st = c.pipeline("liar")
        out(xs=xs, replies=replies, pid=os.getpid(), host_pid=st["python"]["host_pid"],
            skipped=st["skipped"], exits=st["python"]["worker_exits"])
        dl.close()
        drop("liar")
    """)
    assert res["xs"] == [10 * i for i in range(8)]
    assert res["host_pid"] == res["pid"]            # the kernel's, not the HELLO's 1
    assert res["exits"] == 0 and res["skipped"] == 0
    (s1, t1), (s2, t2) = res["replies"]
    assert s1 == -errno.EPROTO and s2 == -errno.EPROTO
    assert t1.startswith("pipeline 'liar': DONE for task ") and \
        t1.endswith(f" skipped {(1 << 64) - 1} samples, more than its 4 rows"), t1
    assert t2.startswith("pipeline 'liar': FAIL for task ") and \
        t2.endswith(f" names sample {(1 << 64) - 1}, the source has 8"), t2
    log = ld.log()
    assert f"python workers: pid {res['pid']} (uid {os.getuid()}): {t1}" in log
    assert f"python workers: pid {res['pid']} (uid {os.getuid()}): {t2}" in log
    assert (f"pipeline liar: its Python worker host (pid {res['pid']}, uid {os.getuid()}) says "
            "worker 7 exited; it runs 1: ignored") in log
    assert "pid 1 " not in log and "(pid 1)" not in log
