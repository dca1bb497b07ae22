# SPDX-License-Identifier: MIT
"""A trainer of tests/integration/test_credentials.py whose store keys are
rotated while it reads.

Usage: creds_trainer.py SOCKET OUTDIR LOCAL P1 P2 P3
It reads the first batch of pipelines P1, P2 and P3 (one DataLoader each),
writes OUTDIR/paused and waits for OUTDIR/go: JSON of the new keys
{"access_key_id", "secret_access_key", "expires"} (the test rotated them in
the store and handed P1 its new ones with loaderctl meanwhile). It puts
them in its environment, as a trainer's credential refresh does, hands P2
the new ones with Client.set_store(), lets P3's DataLoader hand them by
itself on a read the store refuses, reads the rest of the epoch of each, and writes
OUTDIR/result (JSON): per pipeline whether its batches equal those of
LOCAL (the same spec over the local files), and what each hand-over
returned.
"""
import errno
import json
import os
import sys
import time

import loaderd

sock, out, local = sys.argv[1], sys.argv[2], sys.argv[3]
names = sys.argv[4:]


def batch_bytes(b):
    return b["image"].tobytes() + b["label"].tobytes()


def epoch(dl):
    return [batch_bytes(b) for b in dl]


want = epoch(loaderd.DataLoader(local, socket=sock, as_numpy=True))
loaders = {n: loaderd.DataLoader(n, socket=sock, as_numpy=True) for n in names}
its = {n: iter(dl) for n, dl in loaders.items()}
got = {n: [batch_bytes(next(it))] for n, it in its.items()}
open(os.path.join(out, "paused"), "w").close()
go = os.path.join(out, "go")
while not os.path.exists(go):
    time.sleep(0.01)
with open(go) as f:
    keys = json.load(f)
os.environ.update(AWS_ACCESS_KEY_ID=keys["access_key_id"], AWS_SECRET_ACCESS_KEY=keys["secret_access_key"],
                  AWS_CREDENTIAL_EXPIRATION=keys["expires"])
res = {"handed": {}}
c = loaderd.Client(sock)
# the Client: always hands them; if_changed only when they differ
res["handed"]["client"] = [c.set_store(names[1]), c.set_store(names[1], if_changed=True)]
# the DataLoader, by itself: its next read is refused by the store for the
# keys. Whole objects are fetched at create today, so a running pipeline
# makes no request to be refused: the refusal, as the daemon words it, is
# put in place of that read's answer (the loader's own path otherwise)
dl = loaders[names[2]]
dl._fast_off, dl._fast = True, None
att, real_next, real_err = dl._att, dl._att.next, loaderd.loader._err
refusals = []


def refused_once(wait):
    if not refusals:
        refusals.append(wait)
        return -errno.EACCES
    return real_next(wait)


def store_err(r, op):
    if r != -errno.EACCES:
        return real_err(r, op)
    return loaderd.Error(r, f"s3://alice-data/cred/a-001.tar: InvalidAccessKeyId: The access key ID you "
                         "provided does not exist in our records. (HTTP 403)", op)


att.next, loaderd.loader._err = refused_once, store_err
got[names[2]].append(batch_bytes(next(its[names[2]])))
att.next, loaderd.loader._err = real_next, real_err
# handed (and the read tried again) already: the same keys are not sent again
res["handed"]["dataloader"] = [len(refusals), dl.refresh_credentials()]
for n, it in its.items():
    got[n] += [batch_bytes(b) for b in it]
res["equal"] = {n: got[n] == want for n in names}
res["batches"] = {n: len(got[n]) for n in names}
res["want"] = len(want)
res["store"] = {p["name"]: p.get("store") for p in c.status()["pipelines"] if p["name"] in names}
with open(os.path.join(out, "result"), "w") as f:
    json.dump(res, f)
