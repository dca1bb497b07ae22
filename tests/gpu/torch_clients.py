# SPDX-License-Identifier: MIT
"""Trainer processes for tests/gpu/run.sh: torch clients of a running loaderd.

    torch_clients.py hashes SOCKET PIPELINE DEVICE OUT   sha256 of every batch's fields, one line each
    torch_clients.py hold SOCKET PIPELINE N              take N batches on cuda:0, keep them, sleep
    torch_clients.py bw SOCKET PIPELINE SECONDS          GB/s and batches/s delivered on cuda:0
    torch_clients.py latency SOCKET PIPELINE DEVICE N    next() times (us) with a 2 ms step

DEVICE is cpu or cuda:N. With $LOADERD_GPU_DRYRUN=1 (a machine without a GPU,
the emulated driver of tests/unit/gpu/fakecuda in $LOADERD_CUDA_LIBRARY) CUDA
batches come as loaderd.CudaArray and are read in place; that checks this
script, not the GPU.
"""

import ctypes
import hashlib
import json
import os
import statistics
import sys
import time

import loaderd

DRY = os.environ.get("LOADERD_GPU_DRYRUN") == "1"


def loader(sock, pipeline, device, **kw):
    # broadcast: the clients of run.sh share one stream (min_clients), which
    # is not the package's default (a private stream per loader)
    kw.setdefault("mode", "broadcast")
    return loaderd.DataLoader(pipeline, socket=sock, device=device,
                              as_numpy=DRY or device == "cpu", **kw)


def field_bytes(v):
    if isinstance(v, loaderd.CudaArray):  # dry run: emulated device memory is host memory
        return ctypes.string_at(v.ptr, v.nbytes)
    if hasattr(v, "is_cuda") and v.is_cuda:
        return v.cpu().numpy().tobytes()
    return v.tobytes() if hasattr(v, "tobytes") else v.numpy().tobytes()


def cmd_hashes(sock, pipeline, device, out):
    ld = loader(sock, pipeline, device)
    n = 0
    with open(out, "w") as f:
        while True:
            b = ld.next_batch()
            if b is None:
                break
            h = hashlib.sha256()
            for k in sorted(b.keys()):  # iterating a Batch gives its values
                if not DRY and device != "cpu":
                    assert b[k].device.type == "cuda", b[k].device
                h.update(field_bytes(b[k]))
            f.write(f"{b.epoch} {b.index} {h.hexdigest()}\n")
            n += 1
            b = None
    ld.close()
    print(f"{device}: {n} batches")


def cmd_hold(sock, pipeline, n):
    ld = loader(sock, pipeline, "cuda:0")
    kept = [ld.next_batch() for _ in range(int(n))]
    print(f"holding {len(kept)} batches", flush=True)
    time.sleep(3600)


def nbytes(b):
    return sum(getattr(v, "nbytes", 0) if isinstance(v, loaderd.CudaArray) else
               v.element_size() * v.nelement() for v in b.values())


def cmd_bw(sock, pipeline, seconds):
    ld = loader(sock, pipeline, "cuda:0")
    for _ in range(8):  # warm up: engine, mappings, torch's allocator
        ld.next_batch()
    total = count = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < float(seconds):
        b = ld.next_batch()
        total += nbytes(b)
        count += 1
        b = None
    dt = time.perf_counter() - t0
    ld.close()
    print(json.dumps({"gbps": total / dt / 1e9, "batches": count, "seconds": dt,
                      "batch_bytes": total // max(count, 1)}))


def cmd_latency(sock, pipeline, device, n):
    ld = loader(sock, pipeline, device)
    times = []
    for i in range(int(n) + 20):
        time.sleep(0.002)  # a trainer step: the pipeline is ahead
        t = time.perf_counter()
        b = ld.next_batch()
        dt = time.perf_counter() - t
        if i >= 20:
            times.append(dt * 1e6)
        b = None
    ld.close()
    times.sort()
    print(json.dumps({"device": device, "p50_us": statistics.median(times),
                      "p99_us": times[int(len(times) * 0.99) - 1]}))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"hashes": cmd_hashes, "hold": cmd_hold, "bw": cmd_bw, "latency": cmd_latency}[cmd](*args)
