# SPDX-License-Identifier: MIT
"""A dynamic-mode reader of tests/integration/test_credentials.py
(test_refused_dynamic_readers_told_once) whose pipeline's keys the store
refuses while it reads.

Usage: dyn_reader.py SOCKET PIPELINE JOB OUT
It reads PIPELINE in mode "dynamic" (job JOB, shared with the other reader)
with next_batch() to its end. An error of a read is recorded and written to
OUT.told (code and words); the read after it waits for the batch the test
lets come by handing fresh keys. Its DataLoader hands no keys of its own
(its refresh_credentials() is replaced by one that records the call and
hands none): what it is told is the daemon's alone. It writes OUT (JSON):
{"errors": [[code, message]...], "refreshes": N, "batches": [[epoch,
index, hex of image and label bytes]...]}.
"""
import json
import os
import sys

import loaderd

sock, name, job, out = sys.argv[1:5]
dl = loaderd.DataLoader(name, socket=sock, as_numpy=True, mode="dynamic", job=job)
res = {"errors": [], "refreshes": 0, "batches": []}


def refresh():
    res["refreshes"] += 1
    return False


dl.refresh_credentials = refresh
while True:
    try:
        b = dl.next_batch()
    except loaderd.Error as e:
        res["errors"].append([e.code, e.message])
        with open(out + ".told.tmp", "w") as f:
            json.dump(res["errors"], f)
        os.rename(out + ".told.tmp", out + ".told")
        continue
    if b is None:
        break
    res["batches"].append([b.epoch, b.index, (b["image"].tobytes() + b["label"].tobytes()).hex()])
with open(out + ".tmp", "w") as f:
    json.dump(res, f)
os.rename(out + ".tmp", out)
