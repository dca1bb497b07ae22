#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Kill streaming consumers, round after round, and check the daemon lets them go.

    tests/stress/sigkill_streaming.py [BUILD_DIR] [--rounds N]      (build, 300)

Not part of scripts/test (it takes minutes and wants a loaded machine: run two
busy loops beside it). Each round: a broadcast pipeline with min_clients 2,
one consumer SIGKILLed while it streams, a second that must get its 300
batches, then no client may stay listed for 10 s. nng 1.5.2 can wedge its
reaper thread in such a round (a reply racing the killed client's close);
from then on the daemon's sweep (daemon/server/nngfix.c, on_sweep_timer) is what releases
the dead clients. Prints the round it got stuck at, or how many clients the
sweep released.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    args = sys.argv[1:]
    rounds = 300
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i:i + 2]
    build = os.path.abspath(args[0] if args else os.path.join(ROOT, "build"))
    d = tempfile.mkdtemp(prefix="ldr-stress-", dir="/tmp")
    sock = os.path.join(d, "ld.sock")
    log_path = os.path.join(d, "loaderd.log")
    daemon = subprocess.Popen([os.path.join(build, "daemon", "loaderd"), "--socket", sock, "--workers", "2"],
                              stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    ctl = [os.path.join(build, "client", "loaderctl"), "--socket", sock]

    def status():
        r = subprocess.run(ctl + ["--json", "status"], capture_output=True, text=True, timeout=30)
        return json.loads(r.stdout)

    for _ in range(100):
        if subprocess.run(ctl + ["status"], capture_output=True).returncode == 0:
            break
        time.sleep(0.05)
    tok = os.path.join(d, "e.bin")
    np.random.default_rng(1).integers(0, 50000, size=400 * 16 + 1).astype(np.uint16).tofile(tok)
    spec = {"name": "e", "source": {"kind": "tokens", "path": tok, "dtype": "uint16", "seq_len": 16},
            "batch_size": 8, "epochs": 0, "prefetch": 3, "min_clients": 2}
    with open(os.path.join(d, "spec.json"), "w") as f:
        json.dump(spec, f)
    subprocess.run(ctl + ["create", "--spec", os.path.join(d, "spec.json")], check=True, capture_output=True)
    stuck = None
    for rnd in range(rounds):
        victim = subprocess.Popen(ctl + ["consume", "e"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        other = subprocess.Popen(ctl + ["consume", "e", "--batches", "300", "--timeout", "60000"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while time.time() - t0 < 20:
            c = [x for x in status()["clients"] if x["pid"] == victim.pid]
            if c and c[0]["delivered"] >= 5:
                break
            time.sleep(0.02)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        if other.wait(timeout=120) != 0:
            stuck = f"round {rnd}: the surviving consumer failed"
            break
        t0 = time.time()
        while time.time() - t0 < 10 and status()["clients"]:
            time.sleep(0.05)
        if status()["clients"]:
            stuck = f"round {rnd}: clients still listed 10 s after they exited"
            break
    daemon.terminate()
    daemon.wait(timeout=30)
    with open(log_path) as f:
        swept = 0
        for line in f:
            if "never reported closed" in line:      # the first, then counts every 10 s
                m = re.search(r"released (\d+) more clients", line)
                swept += int(m.group(1)) if m else 1
    print(stuck or f"{rounds} rounds, no client stuck; the sweep released {swept} clients nng did not report")
    print(f"daemon log: {log_path}")
    return 1 if stuck else 0


if __name__ == "__main__":
    sys.exit(main())
