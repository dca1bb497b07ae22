#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Time to the first batch of your own Dataset: torch's DataLoader against
loaderd.DataLoader(dataset, ...), for a Dataset whose module is slow to
import (it sleeps --import-s at import, standing in for Lightning or
transformers).

    /usr/bin/python3 bench/first_batch.py [--build build] [--runs 5] [--import-s 1]
                                          [--package client/python]

Each run is a fresh trainer process that imports the Dataset's module (it
pays the import once itself, as a real training script does), then times
`loader = DataLoader(ds, batch_size=8, num_workers=2, ...)` and the first
`next(iter(loader))`: what a trainer waits before its first step. Loaders:
torch (fork and spawn contexts) and loaderd (fork and spawn contexts), on a
daemon started on a private socket; each loaderd run makes a new pipeline
(another seed). --package: the loaderd package to time (another checkout's
client/python, to compare with an older version). Prints the median and
the range of the runs, in seconds.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

MODULE = """
import time
import torch
time.sleep({import_s})      # a heavy import: Lightning, transformers


class Heavy(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return torch.full((3, 32, 32), float(i)), i
"""

TRAINER = """
import sys, time
import torch
import heavyds


def main():
    which, ctx, sock, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    kw = dict(batch_size=8, num_workers=2, multiprocessing_context=None if ctx == "fork" else ctx)
    t0 = time.monotonic()
    if which == "torch":
        dl = torch.utils.data.DataLoader(heavyds.Heavy(), **kw)
    else:
        import loaderd
        dl = loaderd.DataLoader(heavyds.Heavy(), socket=sock, seed=seed, **kw)
    x, y = next(iter(dl))
    print(f"{time.monotonic() - t0:.4f}", flush=True)
    if which != "torch":
        loaderd.Client(sock).drop_pipeline(dl.pipeline, force=True)


if __name__ == "__main__":   # spawn contexts import this script again
    main()
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("LOADERD_BUILD", os.path.join(REPO, "build")))
    ap.add_argument("--package", default=os.path.join(REPO, "client", "python"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--import-s", type=float, default=1.0)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    with tempfile.TemporaryDirectory(prefix="ldr-first-", dir="/tmp") as d:
        with open(os.path.join(d, "heavyds.py"), "w") as f:
            f.write(MODULE.format(import_s=a.import_s))
        with open(os.path.join(d, "trainer.py"), "w") as f:
            f.write(TRAINER)
        sock = os.path.join(d, "ld.sock")
        log = open(os.path.join(d, "loaderd.log"), "w")
        daemon = subprocess.Popen([os.path.join(build, "daemon", "loaderd"), "--socket", sock,
                                   "--workers", "2", "--log-level", "warning"],
                                  stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not os.path.exists(sock + ".workers") and time.monotonic() < deadline:
            time.sleep(0.02)
        env = dict(os.environ, PYTHONPATH=os.path.abspath(a.package) + os.pathsep + d,
                   LOADERD_LIBRARY=os.path.join(build, "client", "libloader.so"))
        try:
            for which in ("torch", "loaderd"):
                for ctx in ("fork", "spawn"):
                    times = []
                    for run in range(a.runs):
                        r = subprocess.run([sys.executable, os.path.join(d, "trainer.py"), which,
                                            ctx, sock, str(run + 1)], capture_output=True,
                                           text=True, env=env, cwd=d, timeout=300)
                        if r.returncode != 0:
                            sys.exit(f"{which} {ctx} failed:\n{r.stderr[-3000:]}")
                        times.append(float(r.stdout.split()[0]))
                    print(f"{which:8s} {ctx:6s} first batch: median {statistics.median(times):.3f} s "
                          f"(runs {min(times):.3f}..{max(times):.3f})", flush=True)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(10)
            log.close()


if __name__ == "__main__":
    main()
