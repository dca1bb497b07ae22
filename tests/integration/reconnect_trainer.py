# SPDX-License-Identifier: MIT
"""A streaming trainer of tests/integration/test_reconnect.py.

Usage: reconnect_trainer.py SOCKET OUTDIR PAUSE_AT LOADER...
LOADER is NAME:PIPELINE:MODE[:RANK:WORLD] (PIPELINE a name, or @FILE of a JSON
spec the trainer creates). The trainer iterates one epoch of each loader in
turn, batch by batch, appending every batch's input and target bytes to
OUTDIR/NAME.dump. After PAUSE_AT batches of the first loader it writes
OUTDIR/paused and waits for OUTDIR/go (the test restarts the daemon
meanwhile), holding the numpy arrays of its last batch. Once it goes on it
writes OUTDIR/resumed before its next next(). At the end it writes those
arrays' bytes again to OUTDIR/held.dump (they must not have changed),
libloader's reconnection count to OUTDIR/reconnects, each loader's count as
it went on and after its first batch since to OUTDIR/across (JSON), and the
"ring" flag of each of its attachments in the daemon's status to
OUTDIR/rings (JSON).
"""
import json
import os
import sys
import time

import loaderd

sock, out, pause_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
loaders = []
for arg in sys.argv[4:]:
    parts = arg.split(":")
    name, pipe, mode = parts[:3]
    kw = {}
    if mode == "partition":
        kw = {"rank": int(parts[3]), "world_size": int(parts[4])}
    if pipe.startswith("@"):
        with open(pipe[1:]) as f:
            pipe = json.load(f)
    loaders.append((name, loaderd.DataLoader(pipe, socket=sock, mode=mode, as_numpy=True, **kw)))

its = [(name, iter(ld)) for name, ld in loaders]
dumps = {name: open(os.path.join(out, name + ".dump"), "wb") for name, _ in loaders}
held = None
taken = 0
across = None
while its:
    for name, it in list(its):
        try:
            b = next(it)
        except StopIteration:
            its.remove((name, it))
            continue
        dumps[name].write(b["input"].tobytes() + b["target"].tobytes())
        if across is not None and name not in across["after"]:
            across["after"][name] = dict(loaders)[name].reconnects
        if name == loaders[0][0]:
            taken += 1
            if taken == pause_at:
                held = (b["input"], b["target"])  # the arrays, not a copy
                with open(os.path.join(out, "held.expected"), "wb") as f:
                    f.write(held[0].tobytes() + held[1].tobytes())
                open(os.path.join(out, "paused"), "w").close()
                while not os.path.exists(os.path.join(out, "go")):
                    time.sleep(0.01)
                across = {"before": {n: ld.reconnects for n, ld in loaders}, "after": {}}
                open(os.path.join(out, "resumed"), "w").close()
for f in dumps.values():
    f.close()
if held is not None:
    with open(os.path.join(out, "held.dump"), "wb") as f:
        f.write(held[0].tobytes() + held[1].tobytes())
with open(os.path.join(out, "reconnects"), "w") as f:
    f.write(str(loaders[0][1].reconnects))
with open(os.path.join(out, "across"), "w") as f:
    json.dump(across, f)
# which batch path each attachment of this process has now (the new daemon's)
st = loaderd.Client(sock).status()
with open(os.path.join(out, "rings"), "w") as f:
    json.dump([a["ring"] for c in st["clients"] if c["pid"] == os.getpid()
               for a in c["attachments"]], f)
for _, ld in loaders:
    ld.close()
