# SPDX-License-Identifier: MIT
"""A trainer of tests/integration/test_credentials.py whose store keys are
rotated while it reads.

Usage: creds_trainer.py SOCKET OUTDIR LOCAL P1 P2 LOCAL3 P3 P4
It reads the first batch of pipelines P1, P2 and P3 (one DataLoader each),
writes OUTDIR/paused and waits for OUTDIR/go: JSON of the new keys
{"access_key_id", "secret_access_key", "expires"} (the test rotated them in
the store and handed P1 its new ones with loaderctl meanwhile). It puts
them in its environment, as a trainer's credential refresh does, hands P2
the new ones with Client.set_store(), and reads the rest of the epoch of P1
and P2. P3 is read as a stream over a small cache, 2 epochs: its later reads
must fetch again, the store refuses them for the old keys, and its
DataLoader hands the new ones by itself. P4 (as P3) is read with
next_batch() before the environment has the new keys, up to the refusal
that the DataLoader cannot cure and raises; Client.set_store() hands them
and the next read returns that batch. It writes OUTDIR/result (JSON): per
pipeline whether its batches equal those of LOCAL (LOCAL3 for P3: the same
spec over the local files), what each hand-over returned, and the refusals
the DataLoader met.
"""
import json
import os
import sys
import time

import loaderd

sock, out, local, p1, p2, local3, p3, p4 = sys.argv[1:9]
names = [p1, p2, p3, p4]
EPOCHS3 = 2


def batch_bytes(b):
    return b["image"].tobytes() + b["label"].tobytes()


def epoch(dl):
    return [batch_bytes(b) for b in dl]


want = epoch(loaderd.DataLoader(local, socket=sock, as_numpy=True))
dl3 = loaderd.DataLoader(local3, socket=sock, as_numpy=True)
want3 = [b for _ in range(EPOCHS3) for b in epoch(dl3)]
loaders = {n: loaderd.DataLoader(n, socket=sock, as_numpy=True) for n in names}
its = {n: iter(dl) for n, dl in loaders.items()}
got = {n: [batch_bytes(next(it))] for n, it in its.items()}
open(os.path.join(out, "paused"), "w").close()
go = os.path.join(out, "go")
while not os.path.exists(go):
    time.sleep(0.01)
with open(go) as f:
    keys = json.load(f)
res = {"handed": {}, "raised": []}
# P4 with the old keys: its reads go on until the store's refusal, raised
dl4 = loaders[p4]
while True:
    try:
        b = dl4.next_batch()
    except loaderd.Error as e:
        res["raised"].append([e.code, e.message])
        break
    if b is None:
        break
    got[p4].append(batch_bytes(b))
os.environ.update(AWS_ACCESS_KEY_ID=keys["access_key_id"], AWS_SECRET_ACCESS_KEY=keys["secret_access_key"],
                  AWS_CREDENTIAL_EXPIRATION=keys["expires"])
c = loaderd.Client(sock)
# the Client: always hands them; if_changed only when they differ
res["handed"]["client"] = [c.set_store(p2), c.set_store(p2, if_changed=True)]
for n in (p1, p2):
    got[n] += [batch_bytes(b) for b in its[n]]
# P4: handed by the Client, its next read is the batch that waited
res["handed"]["client4"] = c.set_store(p4)
while (b := dl4.next_batch()) is not None:
    got[p4].append(batch_bytes(b))
# the DataLoader, by itself: the refusals it meets (as the daemon words them)
# and what its own refresh returned each time, seen by wrapping both
dl = loaders[p3]
refusals, handed = [], []
real_refused, real_refresh = loaderd.loader._keys_refused, dl.refresh_credentials


def keys_refused(code, message):
    r = real_refused(code, message)
    if r:
        refusals.append([code, message])
    return r


def refresh():
    r = real_refresh()
    handed.append(r)
    return r


loaderd.loader._keys_refused, dl.refresh_credentials = keys_refused, refresh
got[p3] += [batch_bytes(b) for b in its[p3]]
for _ in range(EPOCHS3 - 1):
    got[p3] += epoch(dl)
loaderd.loader._keys_refused, dl.refresh_credentials = real_refused, real_refresh
# handed already: the same keys are not sent again
res["handed"]["dataloader"] = [handed, dl.refresh_credentials()]
res["refusals"] = refusals
res["equal"] = {n: got[n] == (want3 if n in (p3, p4) else want) for n in names}
res["batches"] = {n: len(got[n]) for n in names}
res["want"] = [len(want), len(want3)]
res["store"] = {p["name"]: p.get("store") for p in c.status()["pipelines"] if p["name"] in names}
with open(os.path.join(out, "result"), "w") as f:
    json.dump(res, f)
