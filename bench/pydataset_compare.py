#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Your own Dataset: torch's DataLoader against loaderd.DataLoader(dataset, ...).

    /usr/bin/python3 bench/pydataset_compare.py [--build build] [--json out.json]
                                                [--seconds 8] [--warmup 3] [--quick]

The same map-style Dataset object (bench/pyds_bench.py) goes to
torch.utils.data.DataLoader(ds, batch_size=B, shuffle=True, num_workers=2,
pin_memory=False, persistent_workers=True) and to
loaderd.DataLoader(ds, batch_size=B, shuffle=True, num_workers=2, seed=1,
mode=..., socket=...), both with their defaults otherwise (no prefetch or
inflight tuning). Datasets:

  jpeg   384 JPEG files (256x256, seeded, in a temp dir, page cache), each
         visited 16 times an epoch: PIL decode + RandomResizedCrop(160) +
         RandomHorizontalFlip + ToTensor + Normalize -> (float32 [3,160,160],
         int); batch 32
  rows   float32 [100000, 256] .npy, memory-mapped: (row, int); batch 256
         (next to no work per sample: the loaders' own overhead)

Scenarios, each dataset:
  single  one trainer; loaderd in its default mode (a private partition stream)
  K=4     four trainers: 4 torch DataLoaders (2 workers each, 8 workers in all)
          against 4 loaderd trainers in mode="broadcast" on one pipeline (the
          same dataset object: the same pipeline; the first trainer creates
          it and spawns its 2 workers, the others attach)

A trainer is a process that iterates `for x, y in loader` (a new `for` at the
end of each epoch) and touches every batch (sums element 0 of every row).
Once every trainer has its first batch, the parent sets a common measuring
window (--warmup s later, --seconds long); each trainer counts the samples it
receives inside it and the time it spent waiting in next().

  samples/s   samples delivered to all trainers inside the window / seconds
  CPU ms/smp  utime+stime over the window (/proc/PID/stat) of every process
              involved / delivered samples: the trainers and their torch
              workers; for loaderd also the daemon, the workers' host (found
              by the pipeline status python.host_pid) and its worker children
  wait        share of the window the trainers spent in next()

The daemon (BUILD/daemon/loaderd, --workers = CPUs) is started on a private
socket for each loaderd scenario.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CLK = os.sysconf("SC_CLK_TCK")

N_JPEG = 384
REPEAT = 16
N_ROWS = 100_000
ROW_DIM = 256
BATCH = {"jpeg": 32, "rows": 256}
WORKERS = 2
SEED = 1


def make_dataset(data, d):
    sys.path.insert(0, HERE)
    import pyds_bench
    if data == "jpeg":
        root = os.path.join(d, "jpeg")
        return pyds_bench.JpegCrops(root, sorted(os.listdir(root)), REPEAT)
    return pyds_bench.Rows(os.path.join(d, "rows.npy"))


# ------------------------------------------------------------------ trainer

def trainer(a):
    """One trainer process (run as: pydataset_compare.py --trainer ...)."""
    import warnings
    import torch
    torch.set_num_threads(1)
    # torch's default_collate on the read-only memmap rows (its forked workers inherit this)
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    ds = make_dataset(a.data, a.dir)
    info = {}
    if a.system == "torch":
        dl = torch.utils.data.DataLoader(ds, batch_size=BATCH[a.data], shuffle=True,
                                         num_workers=WORKERS, pin_memory=False,
                                         persistent_workers=True)
    else:
        sys.path.insert(0, os.path.join(REPO, "client", "python"))
        import loaderd
        dl = loaderd.DataLoader(ds, batch_size=BATCH[a.data], shuffle=True,
                                num_workers=WORKERS, seed=SEED, mode=a.mode, socket=a.socket)
        info = {"pipeline": dl.pipeline, "created": dl.created}

    def batches():
        while True:
            yield from dl  # one `for` per epoch, as a training loop
    it = batches()
    first = next(it)
    print(json.dumps(dict(info, ready=True)), flush=True)
    del first
    t0 = t1 = None
    n = acc = 0
    wait = 0.0
    while True:
        w0 = time.perf_counter()
        x, y = next(it)
        dw = time.perf_counter() - w0
        acc += float(x.reshape(x.shape[0], -1)[:, 0].sum()) + int(y.sum())  # touch every row
        now = time.time()
        if t0 is None:
            if os.path.exists(a.tfile):
                with open(a.tfile) as f:
                    t0 = float(f.read())
                t1 = t0 + a.seconds
        elif now >= t1:
            break
        elif now >= t0:
            n += x.shape[0]
            wait += min(dw, now - t0)
        del x, y
    print(json.dumps({"samples": n, "wait_s": wait, "acc": acc}), flush=True)
    sys.stdin.read()  # keep the workers alive until the parent's last snapshot


# ------------------------------------------------------------- measurement

def proc_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / CLK  # utime, stime
    except (OSError, IndexError):
        return None


def ppids():
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    out[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def descendants(pids, pp):
    out = set(pids)
    grew = True
    while grew:
        grew = False
        for p, q in pp.items():
            if q in out and p not in out:
                out.add(p)
                grew = True
    return out


def roles(trainers, daemon, host):
    """pid -> role of every process involved."""
    pp = ppids()
    r = {}
    if host:
        for p in descendants([host], pp):
            r[p] = "pyworkers"
        r[host] = "host"
    for p in descendants(trainers, pp):
        r.setdefault(p, "workers" if p not in trainers else "trainers")
    if daemon:
        r[daemon] = "daemon"
    return r


class Daemon:
    def __init__(self, build, d, workers):
        self.socket = os.path.join(d, "bench.sock")
        self.log = open(os.path.join(d, "loaderd.log"), "a")
        self.proc = subprocess.Popen([os.path.join(build, "daemon", "loaderd"), "--socket",
                                      self.socket, "--workers", str(workers), "--log-level",
                                      "warning"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while not (os.path.exists(self.socket) and os.path.exists(self.socket + ".fds")):
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit("loaderd did not start")
            time.sleep(0.02)
        time.sleep(0.1)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        for p in (self.socket, self.socket + ".fds", self.socket + ".workers"):
            try:
                os.unlink(p)
            except OSError:
                pass


def readline(p, what, timeout=180):
    import select
    deadline = time.time() + timeout
    while time.time() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 1.0)
        if r:
            line = p.stdout.readline()
            if not line:
                break
            try:
                return json.loads(line)
            except ValueError:
                continue  # not ours (a library's print)
        if p.poll() is not None:
            break
    raise SystemExit(f"trainer failed or timed out ({what})")


def run_scenario(a, system, data, k):
    daemon = None
    extra = []
    if system != "torch":
        daemon = Daemon(a.build, a.dir, os.cpu_count())
        extra = ["--socket", daemon.socket, "--mode",
                 "broadcast" if system == "broadcast" else "partition"]
    tfile = os.path.join(a.dir, f"t0-{system}-{data}-{k}")
    what = f"{system} {data} K={k}"
    procs = []
    for _ in range(k):
        cmd = [sys.executable, os.path.abspath(__file__), "--trainer", "--system", system,
               "--data", data, "--dir", a.dir, "--tfile", tfile,
               "--seconds", repr(a.seconds)] + extra
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, env=dict(os.environ, OMP_NUM_THREADS="1")))
    ready = [readline(p, what + " start") for p in procs]
    host = None
    status = None
    if daemon:
        import loaderd
        pipeline = ready[0]["pipeline"]
        assert all(r["pipeline"] == pipeline for r in ready), ready
        assert sum(1 for r in ready if r["created"]) == 1, ready
        with loaderd.Client(daemon.socket) as c:
            host = c.pipeline(pipeline)["python"]["host_pid"]
    t0 = time.time() + a.warmup
    with open(tfile + ".tmp", "w") as f:
        f.write(repr(t0))
    os.rename(tfile + ".tmp", tfile)
    tpids = [p.pid for p in procs]
    dpid = daemon.proc.pid if daemon else None
    while time.time() < t0:
        time.sleep(0.005)
    rl = roles(tpids, dpid, host)
    before = {p: c for p in rl if (c := proc_cpu(p)) is not None}
    built0 = None
    if daemon:
        with loaderd.Client(daemon.socket) as c:
            built0 = c.pipeline(pipeline)["python"].get("samples_built")
    time.sleep(max(0.0, t0 + a.seconds - time.time()))
    rl.update({p: r for p, r in roles(tpids, dpid, host).items() if p not in rl})
    after = {p: c for p in rl if (c := proc_cpu(p)) is not None}
    if daemon:
        with loaderd.Client(daemon.socket) as c:
            status = c.pipeline(pipeline)
    cpu = {}
    for p, c in after.items():
        cpu[rl[p]] = cpu.get(rl[p], 0.0) + c - before.get(p, 0.0)
    res = [readline(p, what + " result", 60) for p in procs]
    for p in procs:
        p.stdin.close()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if daemon:
        daemon.stop()
    samples = sum(r["samples"] for r in res)
    total = sum(cpu.values())
    out = {"system": system, "data": data, "k": k, "batch": BATCH[data],
           "workers": WORKERS, "samples": samples,
           "samples_per_s": samples / a.seconds, "cpu_s": total,
           "cpu_ms_per_sample": total / samples * 1000 if samples else float("inf"),
           "cpu_s_by_role": cpu, "wait_frac": sum(r["wait_s"] for r in res) / (k * a.seconds),
           "processes": len(after), "loadavg": os.getloadavg()[0]}
    if status:
        py = status.get("python", {})
        out["python_status"] = py
        if built0 is not None and py.get("samples_built") is not None:
            out["samples_built_per_s"] = (py["samples_built"] - built0) / a.seconds
    return out


def make_data(d, quick):
    sys.path.insert(0, HERE)
    import pyds_bench
    pyds_bench.make_jpegs(os.path.join(d, "jpeg"), N_JPEG, seed=0)
    pyds_bench.make_rows(os.path.join(d, "rows.npy"), N_ROWS, ROW_DIM, seed=0)
    for root, _, files in os.walk(d):  # into the page cache for everyone
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                while fh.read(1 << 24):
                    pass


def fmt_row(r):
    c = r["cpu_s_by_role"]
    roles_txt = " ".join(f"{k}={v:.2f}" for k, v in sorted(c.items()))
    return (f"{r['data']:5} {r['system']:9} {r['k']:2d}  {r['samples_per_s']:9.0f}  "
            f"{r['cpu_ms_per_sample']:8.3f}  {r['cpu_s']:6.2f}  {r['wait_frac']:5.2f}  "
            f"{r['processes']:3d}  {r['loadavg']:5.1f}  {roles_txt}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--tfile", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=8.0, help="measuring window per scenario")
    ap.add_argument("--warmup", type=float, default=3.0,
                    help="seconds between every trainer's first batch and the window")
    ap.add_argument("--build", default=os.environ.get("LOADERD_BUILD", os.path.join(REPO, "build")))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--data-sets", default="jpeg,rows", help="comma-separated: jpeg, rows")
    ap.add_argument("--quick", action="store_true", help="2 s windows, 1 s warm-up (a smoke test)")
    a = ap.parse_args()
    if a.trainer:
        return trainer(a)
    if a.quick:
        a.seconds, a.warmup = 2.0, 1.0
    a.build = os.path.abspath(a.build)
    os.environ.setdefault("LOADERD_LIBRARY", os.path.join(a.build, "client", "libloader.so"))
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    results = []
    with tempfile.TemporaryDirectory(prefix="ldr-pybench-", dir="/tmp") as d:
        a.dir = d
        make_data(d, a.quick)
        print(f"# {os.cpu_count()} CPUs, window {a.seconds} s after {a.warmup} s, "
              f"{WORKERS} workers per loader; jpeg: {N_JPEG} x {REPEAT} 256x256 JPEG -> "
              f"crop 160, batch {BATCH['jpeg']}; rows: {N_ROWS} x {ROW_DIM} float32, "
              f"batch {BATCH['rows']}")
        print("data  system     K  samples/s  CPU ms/smp  CPU s   wait  procs  load  CPU s by role")
        for data in a.data_sets.split(","):
            for k, systems in ((1, ("torch", "loaderd")), (4, ("torch", "broadcast"))):
                for system in systems:
                    r = run_scenario(a, system, data, k)
                    results.append(r)
                    print(fmt_row(r), flush=True)
    print()
    summary = []
    for data in a.data_sets.split(","):
        for k, ls, target in ((1, "loaderd", 1.0), (4, "broadcast", 3.0)):
            t = next(r for r in results if r["data"] == data and r["k"] == k and
                     r["system"] == "torch")
            l_ = next(r for r in results if r["data"] == data and r["k"] == k and
                      r["system"] == ls)
            sr = l_["samples_per_s"] / t["samples_per_s"] if t["samples_per_s"] else float("inf")
            cr = l_["cpu_ms_per_sample"] / t["cpu_ms_per_sample"]
            met = sr >= target and (k != 1 or cr < 1)
            line = (f"{data} K={k} {ls}/torch: {sr:.2f}x samples/s (target >= {target:g}x), "
                    f"{cr:.2f}x CPU per sample{' (target < 1x)' if k == 1 else ''}: "
                    f"{'met' if met else 'NOT met'}")
            summary.append({"data": data, "k": k, "samples_ratio": sr, "cpu_ratio": cr,
                            "target": target, "met": met})
            print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "summary": summary, "cpus": os.cpu_count(),
                       "seconds": a.seconds, "warmup": a.warmup}, f, indent=1)


if __name__ == "__main__":
    main()
