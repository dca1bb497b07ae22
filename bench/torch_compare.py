#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""loaderd against torch.utils.data.DataLoader, same data, same machine, one run.

    /usr/bin/python3 bench/torch_compare.py [--seconds 6] [--chart docs/torch_compare.png]
                                            [--json out.json] [--build build] [--quick]

Each "trainer" is a process that takes batches and touches every one of them
(sums element 0 of every row). It counts the samples it receives inside a
common measuring window of --seconds (everything before it is warm-up).
During the window the script samples every process involved: the trainers,
their children (torch's worker processes) and, for loaderd, the daemon.

  samples/s        samples delivered to all trainers inside the window / seconds
  CPU s/1000       (utime+stime of every process involved, over the window,
                   from /proc/PID/stat) / delivered samples * 1000
  peak RSS         the largest sum of VmRSS over the processes involved
                   (shared pages are counted in every process that maps them)
  peak PSS         the same with Pss (/proc/PID/smaps_rollup): shared pages split

Scenarios:
  single trainer, npy and tokens: loaderd (1 broadcast client) vs torch
      (num_workers=2, pin_memory=False, persistent workers)
  K = 1, 2, 4 trainers, npy: K torch DataLoaders (2 workers each) vs K clients
      of one broadcast pipeline (min_clients K) vs one partition pipeline
      (K ranks, each its 1/K share)

The torch side reads the same .npy / token files through np.memmap with a
map-style Dataset, shuffle=True, the same batch size. The daemon gets
--workers = the number of CPUs.
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

N_NPY = 100_000
NPY_DIM = 256          # float32 features: 1 KiB per sample, + an int64 label
N_TOKENS = 16_000_000  # uint16
SEQ = 256              # input+target int64: 4 KiB per sample
BATCH = 256


# ------------------------------------------------------------------ trainer

def trainer(args):
    """One trainer process (run as: torch_compare.py --trainer ...)."""
    import numpy as np
    import torch
    torch.set_num_threads(1)
    t0 = args.t0
    t1 = t0 + args.seconds
    key = "x" if args.data == "npy" else "input"
    if args.system == "torch":
        if args.data == "npy":
            class DS(torch.utils.data.Dataset):
                def __init__(self):
                    self.x = np.load(os.path.join(args.dir, "x.npy"), mmap_mode="r")
                    self.y = np.load(os.path.join(args.dir, "y.npy"), mmap_mode="r")

                def __len__(self):
                    return len(self.y)

                def __getitem__(self, i):
                    return {"x": torch.from_numpy(np.array(self.x[i])), "y": int(self.y[i])}
        else:
            class DS(torch.utils.data.Dataset):
                def __init__(self):
                    self.t = np.memmap(os.path.join(args.dir, "tok.bin"), dtype=np.uint16, mode="r")

                def __len__(self):
                    return (len(self.t) - 1) // SEQ

                def __getitem__(self, i):
                    w = self.t[i * SEQ:i * SEQ + SEQ + 1].astype(np.int64)
                    return {"input": torch.from_numpy(w[:-1]), "target": torch.from_numpy(w[1:])}
        dl = torch.utils.data.DataLoader(DS(), batch_size=BATCH, shuffle=True, num_workers=2,
                                         pin_memory=False, persistent_workers=True,
                                         drop_last=False)

        def batches():
            while True:
                yield from dl
    else:
        sys.path.insert(0, os.path.join(REPO, "client", "python"))
        import loaderd
        kw = {}
        if args.system == "partition":
            kw = dict(mode="partition", rank=args.rank, world_size=args.world)
        else:
            kw = dict(mode="broadcast")
        dl = loaderd.DataLoader(args.pipeline, socket=args.socket, **kw)

        def batches():
            while True:
                b = dl.next_batch()
                if b is None:
                    return
                yield b
    n = 0
    acc = 0
    for b in batches():
        x = b[key]
        acc += int(x[:, 0].sum())  # touch every row
        now = time.time()
        if now >= t1:
            break
        if now >= t0:
            n += x.shape[0]
        del b, x
    print(json.dumps({"samples": n, "acc": acc}), flush=True)
    # keep the workers alive until the parent has taken its last snapshot
    sys.stdin.read()


# ------------------------------------------------------------- measurement

def proc_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / CLK  # utime, stime
    except (OSError, IndexError):
        return None


def proc_mem(pid):
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


def children_of(pids):
    """pids and all their descendants."""
    ppid = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out = set(pids)
    grew = True
    while grew:
        grew = False
        for p, pp in ppid.items():
            if pp in out and p not in out:
                out.add(p)
                grew = True
    return out


def cpu_snapshot(pids):
    return {p: c for p in pids if (c := proc_cpu(p)) is not None}


# --------------------------------------------------------------- scenarios

class Daemon:
    def __init__(self, build, d, workers):
        self.socket = os.path.join(d, "bench.sock")
        self.log = open(os.path.join(d, "loaderd.log"), "w")
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
        self.proc.wait(10)
        self.log.close()


def spec(name, data, d, min_clients=1):
    if data == "npy":
        src = {"kind": "npy", "paths": [os.path.join(d, "x.npy"), os.path.join(d, "y.npy")]}
    else:
        src = {"kind": "tokens", "path": os.path.join(d, "tok.bin"), "dtype": "uint16",
               "seq_len": SEQ}
    return {"name": name, "source": src, "batch_size": BATCH, "shuffle": True, "seed": 1,
            "epochs": 0, "prefetch": 16, "min_clients": min_clients,
            "persist": True}  # made before its trainers start: must outlive that connection


def run_scenario(a, system, data, k):
    """K trainers of @system on @data; returns the measurements."""
    daemon = None
    extra = []
    pipeline = None
    if system != "torch":
        daemon = Daemon(a.build, a.dir, os.cpu_count())
        sys.path.insert(0, os.path.join(REPO, "client", "python"))
        import loaderd
        pipeline = f"{data}-{system}-{k}"
        with loaderd.Client(daemon.socket) as c:
            c.create_pipeline(spec(pipeline, data, a.dir, k if system == "broadcast" else 1))
        extra = ["--socket", daemon.socket, "--pipeline", pipeline]
    t0 = time.time() + a.warmup
    procs = []
    for r in range(k):
        cmd = [sys.executable, __file__, "--trainer", "--system", system, "--data", data,
               "--dir", a.dir, "--t0", repr(t0), "--seconds", repr(a.seconds),
               "--rank", str(r), "--world", str(k)] + extra
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, env=dict(os.environ, OMP_NUM_THREADS="1")))
    base = [p.pid for p in procs] + ([daemon.proc.pid] if daemon else [])
    while time.time() < t0:
        time.sleep(0.01)
    before = cpu_snapshot(children_of(base))
    peak_rss = peak_pss = 0
    t1 = t0 + a.seconds
    while time.time() < t1:
        rss = pss = 0
        for p in children_of(base):
            r_, p_ = proc_mem(p)
            rss += r_
            pss += p_
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        time.sleep(0.2)
    after = cpu_snapshot(children_of(base))
    cpu = sum(c - before.get(p, 0.0) for p, c in after.items())
    samples = 0
    for p in procs:
        line = p.stdout.readline()
        try:
            samples += json.loads(line)["samples"]
        except ValueError:
            raise SystemExit(f"trainer failed ({system} {data} k={k}): {line!r}")
    for p in procs:
        p.stdin.close()
        p.wait(30)
    if daemon:
        daemon.stop()
    nproc = len(after)
    return {"system": system, "data": data, "k": k, "samples": samples,
            "samples_per_s": samples / a.seconds, "cpu_s": cpu,
            "cpu_s_per_1000": cpu / samples * 1000 if samples else float("inf"),
            "peak_rss": peak_rss, "peak_pss": peak_pss, "processes": nproc}


def make_data(d):
    import numpy as np
    rng = np.random.default_rng(0)
    np.save(os.path.join(d, "x.npy"), rng.standard_normal((N_NPY, NPY_DIM), dtype=np.float32))
    np.save(os.path.join(d, "y.npy"), rng.integers(0, 1000, N_NPY))
    rng.integers(0, 50000, N_TOKENS, dtype=np.uint16).tofile(os.path.join(d, "tok.bin"))
    for f in ("x.npy", "y.npy", "tok.bin"):  # into the page cache for everyone
        with open(os.path.join(d, f), "rb") as fh:
            while fh.read(1 << 24):
                pass


def fmt_row(r):
    return (f"{r['data']:6} {r['system']:9} {r['k']:2d}  {r['samples_per_s']:10.0f}  "
            f"{r['cpu_s_per_1000']:8.4f}  {r['cpu_s']:6.2f}  {r['peak_rss'] / 2**20:8.0f}  "
            f"{r['peak_pss'] / 2**20:8.0f}  {r['processes']:3d}")


def chart(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    ks = sorted({r["k"] for r in results if r["data"] == "npy"})
    systems = ["torch", "broadcast", "partition"]
    colors = {"torch": "#d62728", "broadcast": "#1f77b4", "partition": "#2ca02c"}
    metrics = [("samples_per_s", "aggregate samples/s"), ("cpu_s_per_1000", "CPU s per 1000 samples"),
               ("peak_rss", "peak RSS sum (MiB)")]
    for ax, (m, title) in zip(axes, metrics):
        w = 0.27
        for i, s in enumerate(systems):
            vals = []
            for k in ks:
                r = next((r for r in results if r["data"] == "npy" and r["system"] == s and
                          r["k"] == k and r.get("scenario") == "multi"), None)
                v = r[m] if r else 0
                vals.append(v / 2**20 if m == "peak_rss" else v)
            ax.bar([x + (i - 1) * w for x in range(len(ks))], vals, w, label=s, color=colors[s])
        ax.set_xticks(range(len(ks)))
        ax.set_xticklabels([f"K={k}" for k in ks])
        ax.set_title(title)
        if m == "cpu_s_per_1000":
            ax.set_yscale("log")
    axes[0].legend()
    fig.suptitle("loaderd vs torch DataLoader (2 workers each), npy, K trainers, one machine")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--pipeline", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=6.0, help="measuring window per scenario")
    ap.add_argument("--warmup", type=float, default=4.0, help="seconds before the window")
    ap.add_argument("--build", default=os.environ.get("LOADERD_BUILD", os.path.join(REPO, "build")))
    ap.add_argument("--chart", default=os.path.join(REPO, "docs", "torch_compare.png"))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--ks", default="1,2,4")
    ap.add_argument("--quick", action="store_true", help="2 s windows, K = 1, 2 (a smoke test)")
    a = ap.parse_args()
    if a.trainer:
        return trainer(a)
    if a.quick:
        a.seconds, a.warmup, a.ks = 2.0, 3.0, "1,2"
    os.environ.setdefault("LOADERD_LIBRARY", os.path.join(a.build, "client", "libloader.so"))
    with tempfile.TemporaryDirectory(prefix="ldr-bench-", dir="/tmp") as d:
        a.dir = d
        make_data(d)
        results = []
        print(f"# {os.cpu_count()} CPUs, window {a.seconds} s, batch {BATCH}; npy {N_NPY} x "
              f"{NPY_DIM} float32, tokens {N_TOKENS} uint16 seq_len {SEQ}")
        print("data   system     K   samples/s  CPU s/1k   CPU s  RSS MiB  PSS MiB  procs")
        for data in ("npy", "tokens"):
            for system in ("torch", "broadcast"):
                r = run_scenario(a, system, data, 1)
                r["scenario"] = "single"
                results.append(r)
                print(fmt_row(r), flush=True)
        for k in [int(x) for x in a.ks.split(",")]:
            for system in ("torch", "broadcast", "partition"):
                r = run_scenario(a, system, "npy", k)
                r["scenario"] = "multi"
                results.append(r)
                print(fmt_row(r), flush=True)
    kmax = max(int(x) for x in a.ks.split(","))

    def get(s):
        return next(r for r in results if r["scenario"] == "multi" and r["k"] == kmax and
                    r["system"] == s)
    t, b = get("torch"), get("broadcast")
    ratio = b["samples_per_s"] / t["samples_per_s"] if t["samples_per_s"] else float("inf")
    cpu_ratio = b["cpu_s_per_1000"] / t["cpu_s_per_1000"]
    rss_ratio = b["peak_rss"] / t["peak_rss"]
    print(f"\nK={kmax} broadcast vs torch: {ratio:.1f}x samples/s (target >= 3: "
          f"{'met' if ratio >= 3 else 'NOT met'}), {cpu_ratio:.3f}x CPU per sample (target <= 1/3: "
          f"{'met' if cpu_ratio <= 1 / 3 else 'NOT met'}), {rss_ratio:.2f}x RSS (target <= 1/2: "
          f"{'met' if rss_ratio <= 0.5 else 'NOT met'}); PSS {b['peak_pss'] / t['peak_pss']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    if a.chart:
        chart(results, a.chart)
        print(f"chart: {a.chart}")


if __name__ == "__main__":
    main()
