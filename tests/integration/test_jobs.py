# SPDX-License-Identifier: MIT
"""Jobs (docs/spec.md, "Jobs"): a broadcast or dynamic stream that the clients
of one job have left starts again from its first batch for the next job, as
a fresh daemon's would, and min_clients holds the new job's clients together
again; the clients of one job (a name they share, or one process) go on
where the stream stands."""

import json
import os
import signal
import subprocess
import textwrap

from ldrtest import position_indices, position_tokens, python_client_env, token_spec

L = 8
BATCH = 4
N = 96                   # 24 batches an epoch, far more than the 4 slots


def make(ld, workdir, name, **kw):
    path = os.path.join(workdir, "pos.bin")
    position_tokens(path, N * L + 1)
    ld.create(token_spec(name, path, L, "uint32", batch_size=BATCH, prefetch=4, **kw))


def starts(res):
    """(first batch, the samples of each batch) of a consume's dump."""
    nb = res.json["batches"]
    first = res.json["first_epoch"] * (N // BATCH) + res.json["first_batch"]
    return first, position_indices(res.dump, L, [BATCH] * nb)


def whole_epoch():
    return [list(range(i, i + BATCH)) for i in range(0, N, BATCH)]


def attached(ld, name):
    p = [x for x in ld.status()["pipelines"] if x["name"] == name]
    return p[0]["clients"] if p else 0


def test_a_new_sweep_starts_from_the_first_batch(ld, workdir):
    """Two trials (min_clients 2) read 5 batches and end; the next two,
    started at once on the same pipeline, each get the whole epoch from
    batch 0, as on a fresh daemon, and the first waits for the second."""
    make(ld, workdir, "sweep", min_clients=2, epochs=1)
    first = [ld.popen_consume("sweep", "--batches", 5) for _ in range(2)]
    for c in first:
        assert starts(c.wait(check=True)) == (0, whole_epoch()[:5])
    ld.wait_for(lambda s: attached(ld, "sweep") == 0, "the first trials left")
    a = ld.popen_consume("sweep")
    ld.wait_for(lambda s: any(c["pid"] == a.pid and c["attachments"] for c in s["clients"]),
                "the new job's first trial attached")
    b = ld.popen_consume("sweep")
    for c in (a, b):
        assert starts(c.wait(check=True)) == (0, whole_epoch())
    assert "stream.restart pipeline=sweep mode=broadcast job=\"process %d@" % a.pid in ld.log()


def test_one_job_goes_on_where_its_stream_stands(ld, workdir):
    """Clients that name one job share its stream across their attaches;
    another job starts it again; the dynamic stream as the broadcast one."""
    make(ld, workdir, "j", epochs=0)
    r = ld.consume("j", "--job", "run-1", "--batches", 5)
    assert starts(r) == (0, whole_epoch()[:5])
    ld.wait_for(lambda s: attached(ld, "j") == 0, "run-1 left")
    r = ld.consume("j", "--job", "run-1", "--batches", 3)
    # past the 5 it read (and what its window took besides): no batch again
    first, got = starts(r)
    assert first >= 5 and got == whole_epoch()[first:first + 3], (first, got)
    ld.wait_for(lambda s: attached(ld, "j") == 0, "run-1 left again")
    r = ld.consume("j", "--job", "run-2", "--batches", 3)
    assert starts(r) == (0, whole_epoch()[:3])
    ld.wait_for(lambda s: attached(ld, "j") == 0, "run-2 left")
    # dynamic: the same
    seen = []
    for job in ("d1", "d1", "d2"):
        r = ld.consume("j", "--mode", "dynamic", "--job", job, "--batches", 2, "--verbose")
        seen.append(position_indices(r.dump, L, [BATCH] * 2)[0][0] // BATCH)
        ld.wait_for(lambda s: attached(ld, "j") == 0, f"{job} left")
    assert seen[1] >= 2 and seen[2] == 0, seen
    # status names the job
    c = ld.popen_consume("j", "--job", "run-3", "--delay", 60000, "--batches", 1)
    st = ld.wait_for(lambda s: any(x["pid"] == c.pid and x["attachments"] for x in s["clients"]),
                     "run-3 attached")
    att = [x for x in st["clients"] if x["pid"] == c.pid][0]["attachments"][0]
    assert att["job"] == "run-3"
    c.signal(signal.SIGTERM)
    c.wait()


def test_bad_job_names_are_refused(ld, workdir):
    make(ld, workdir, "b")
    for job, msg in [("x" * 129, "job name is 129 bytes, the most is 128"),
                     ("a\tb", "job name has byte 0x09 at 1: printable ASCII only")]:
        r = ld.ctl("consume", "b", "--job", job, "--batches", 1, check=False)
        assert r.returncode != 0 and msg in r.stderr, r.stderr


def test_dataloader_job(ld, workdir):
    """loaderd.DataLoader(job=...): checked, sent, and the same job goes on."""
    make(ld, workdir, "dl", epochs=0)
    code = textwrap.dedent(f"""
        import json, loaderd
        for bad in ("", "x" * 129, "a\\nb", 7):
            try:
                loaderd.DataLoader("dl", socket={ld.socket!r}, mode="broadcast", job=bad)
                print("accepted", repr(bad))
            except ValueError as e:
                print(e)
        firsts = []
        for job in ("trial-1", "trial-1", "trial-2"):
            loader = loaderd.DataLoader("dl", socket={ld.socket!r}, mode="broadcast",
                                        as_numpy=True, job=job, inflight=1)
            it = iter(loader)
            firsts.append(int(next(it)["input"][0][0]) // {L * BATCH})
            for _ in range(3):
                next(it)
            loader.close()
        print(json.dumps(firsts))
    """)
    r = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                       env=python_client_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    bad = "job must be a name of 1..128 printable ASCII characters, not "
    assert lines[:4] == [bad + "''", bad + repr("x" * 129), bad + repr("a\nb"), bad + "7"]
    firsts = json.loads(lines[4])
    assert firsts[0] == 0 and firsts[1] >= 4 and firsts[2] == 0, firsts


def test_a_config_pipeline_is_shared_by_every_job(daemon, workdir):
    """A pipeline of the daemon's config is a service: a dynamic consumer of
    another job that attaches after the last one left goes on where the
    stream stands (each batch still goes to one client once), and no
    stream.restart is logged; a broadcast reader too."""
    path = os.path.join(workdir, "pos.bin")
    position_tokens(path, N * L + 1)
    cfg = os.path.join(workdir, "loaderd.json")
    with open(cfg, "w") as f:
        json.dump({"log_level": "info", "pipelines": [
            token_spec("svc", path, L, "uint32", batch_size=BATCH, prefetch=4, epochs=0)]}, f)
    d = daemon("--config", cfg)
    seen = []
    for job in ("d1", "d2"):
        r = d.consume("svc", "--mode", "dynamic", "--job", job, "--batches", 2, "--verbose")
        seen.append([b[0] // BATCH for b in position_indices(r.dump, L, [BATCH] * 2)])
        d.wait_for(lambda s: attached(d, "svc") == 0, f"{job} left")
    assert seen[0] == [0, 1] and seen[1][0] >= 2 and seen[1][1] > seen[1][0], seen
    r = d.consume("svc", "--job", "b1", "--batches", 2)
    d.wait_for(lambda s: attached(d, "svc") == 0, "b1 left")
    r = d.consume("svc", "--job", "b2", "--batches", 2)
    assert starts(r)[0] >= 2, starts(r)
    assert "stream.restart" not in d.log()
