# SPDX-License-Identifier: MIT
"""Augment seeds (docs/spec.md, "Augment seeds"): broadcast clients of one
image pipeline that each ask for their own seed get the random crops and
flips of that seed, from one decode of each image.

The ground truth of a seeded stream is computed independently: a solo run
of the same spec with that seed as the spec's seed (shuffle off, so the
order does not depend on the seed), read by one client of a pipeline of its
own. The images are generated here, small and few."""

import json
import os
import subprocess
import textwrap
import time

import pytest

pytest.importorskip("PIL")
pytest.importorskip("torchvision")

from imgtest import image_spec, make_folder  # noqa: E402
from ldrtest import BUILD_DIR, python_client_env  # noqa: E402
from users import open_to_all, shared_config, users  # noqa: E402,F401 (fixture)

N = 10          # images
BATCH = 4       # 3 batches an epoch: 4, 4, 2
EPOCHS = 2
TRANSFORMS = [{"op": "random_resized_crop", "size": [16, 16]},
              {"op": "horizontal_flip", "p": 0.5}]


def images(workdir):
    root = os.path.join(workdir, "imgs")
    make_folder(root, ["a", "b"], N // 2, [(40, 52), (48, 36), (44, 44)], seed=3)
    return root


def spec(name, root, seed, exact=True, **kw):
    kw.setdefault("shuffle", False)
    kw.setdefault("epochs", EPOCHS)
    kw.setdefault("prefetch", 8)   # 4 seeds take 4 slots a batch
    return image_spec(name, {"kind": "image_folder", "path": root}, TRANSFORMS, dtype="uint8",
                      layout="NHWC", batch_size=BATCH, seed=seed,
                      decode={"dct_scaling": not exact}, on_error="fail", **kw)


def solo(ld, root, seed, exact=True):
    """The bytes a lone client reads of the spec with @seed as its seed."""
    name = f"solo{seed}{'' if exact else 'd'}"
    ld.create(spec(name, root, seed, exact))
    res = ld.consume(name)
    assert ld.pipeline(name)["decoded"] == N * EPOCHS
    return res.dump


def seed_groups(ld, name):
    return sorted((g["seed"], g["clients"]) for g in ld.pipeline(name)["seed_groups"])


def test_seeded_clients_match_solo_runs(ld, workdir):
    root = images(workdir)
    truth = {s: solo(ld, root, s) for s in (7, 11, 12, 13)}
    # the seeds change the crops (else this test could not fail)
    assert len({truth[s] for s in truth}) == 4

    # 6 broadcast clients: no seed (the spec's, 7), 11 twice, 12, 13, and 7
    # asked for by name, which is the no-seed clients' group
    ld.create(spec("sweep", root, 7, min_clients=6))
    seeds = [None, 11, 12, 13, 7]
    cons = [ld.popen_consume("sweep", *([] if s is None else ["--augment-seed", s]))
            for s in seeds]
    ld.wait_for(lambda st: next(p for p in st["pipelines"] if p["name"] == "sweep")["clients"] == 5,
                "five broadcast clients")
    # waiting for the sixth: nothing is built, the groups are there
    p = ld.pipeline("sweep")
    assert p["batches_produced"] == 0 and p["decoded"] == 0
    assert seed_groups(ld, "sweep") == [(7, 2), (11, 1), (12, 1), (13, 1)]
    text = ld.ctl("status").stdout
    assert ("sweep: augment seeds 7 (2 clients), 11 (1 client), 12 (1 client), 13 (1 client); "
            "0 images decoded\n") in text, text
    cons.append(ld.popen_consume("sweep", "--augment-seed", 11))
    seeds.append(11)
    dumps = [c.wait(check=True).dump for c in cons]
    for s, d in zip(seeds, dumps):
        assert d == truth[7 if s is None else s], f"augment seed {s}"
    # one decode per image per epoch for all four seeds, one job per batch
    p = ld.pipeline("sweep")
    assert p["decoded"] == N * EPOCHS
    assert p["batches_produced"] == 3 * EPOCHS
    assert p["seed_groups"] == []


def test_seeds_with_the_decoded_cache(ld, workdir):
    """With the decoded-image cache the first epoch decodes each image once
    for all seeds and the second decodes none; the streams stay the solo
    runs' (the cache keeps these small images at full size)."""
    root = images(workdir)
    truth = {s: solo(ld, root, s) for s in (7, 11, 12)}
    s = spec("cached", root, 7, min_clients=3)
    s["cache"] = {"decoded": True, "bytes": "64M"}
    ld.create(s)
    cons = [ld.popen_consume("cached", *([] if s == 7 else ["--augment-seed", s]))
            for s in (7, 11, 12)]
    for seed, c in zip((7, 11, 12), cons):
        assert c.wait(check=True).dump == truth[seed], f"augment seed {seed}"
    assert ld.pipeline("cached")["decoded"] == N


def test_dct_scaling_decodes_once_per_scale(ld, workdir):
    """With DCT scaling, seeds whose crops pick different scales each decode
    at theirs: every stream still equals its solo run."""
    root = images(workdir)
    truth = {s: solo(ld, root, s, exact=False) for s in (7, 21, 22)}
    ld.create(spec("sweep", root, 7, exact=False, min_clients=3))
    cons = [ld.popen_consume("sweep", *([] if s == 7 else ["--augment-seed", s]))
            for s in (7, 21, 22)]
    for s, c in zip((7, 21, 22), cons):
        assert c.wait(check=True).dump == truth[s], f"augment seed {s}"
    decoded = ld.pipeline("sweep")["decoded"]
    assert N * EPOCHS <= decoded <= 3 * N * EPOCHS


def test_shuffled_sweep_keeps_the_order(ld, workdir):
    """With shuffle the order stays the spec's: every seed sees the same
    samples in the same order; a seeded stream is the one a partition
    client with the same augment_seed reads (how a reconnect resumes it)."""
    root = images(workdir)
    ld.create(spec("shuf", root, 5, shuffle=True, min_clients=2))
    a = ld.popen_consume("shuf")
    b = ld.popen_consume("shuf", "--augment-seed", 99)
    da, db = a.wait(check=True).dump, b.wait(check=True).dump
    ld.create(spec("shuf2", root, 5, shuffle=True))
    dp = ld.consume("shuf2", "--mode", "partition", "--augment-seed", 99).dump
    assert db == dp
    assert da != db
    img = 16 * 16 * 3

    def labels(d):
        out, pos = [], 0
        for rows in [4, 4, 2] * EPOCHS:
            pos += rows * img
            out += [int.from_bytes(d[pos + 8 * i:pos + 8 * i + 8], "little") for i in range(rows)]
            pos += rows * 8
        return out
    assert labels(da) == labels(db)


def test_augment_seed_without_random_transforms(ld, workdir):
    """A pipeline whose transforms draw nothing: every seed gives the same
    bytes, one group."""
    root = images(workdir)
    s = spec("plain", root, 1, min_clients=3)
    s["transforms"] = [{"op": "resize", "size": [16, 16]}]
    ld.create(s)
    cons = [ld.popen_consume("plain"), ld.popen_consume("plain", "--augment-seed", 42)]
    # the third is awaited: the two are one group, of the spec's seed
    ld.wait_for(lambda st: seed_groups(ld, "plain") == [(1, 2)], "one group of two")
    cons.append(ld.popen_consume("plain", "--augment-seed", 43))
    dumps = [c.wait(check=True).dump for c in cons]
    assert dumps[0] == dumps[1] == dumps[2]
    assert ld.pipeline("plain")["decoded"] == N * EPOCHS


ERRORS = r'''
import json, sys
from loaderd import loader, errors
a = json.loads(sys.argv[1])
c = loader._Client(a["socket"], "errs", None)
keep = []
for name, mode, seeds in a["cases"]:
    out = []
    for s in seeds:
        try:
            keep.append(loader._Attachment(c, name, mode, 0, 1, None, None, None, s))
            out.append("ok")
        except errors.Error as e:
            out.append(e.message)
    print(json.dumps(out), flush=True)
sys.stdin.readline()  # attached until told
'''


def attach_errors(ld, cases, then=None):
    """Each case's attach results (\"ok\" or the error); @then() runs while
    the attachments made are still attached."""
    p = subprocess.Popen(["/usr/bin/python3", "-c", ERRORS,
                          json.dumps({"socket": ld.socket, "cases": cases})],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=python_client_env())
    out = [json.loads(p.stdout.readline() or "null") for _ in cases]
    if then:
        then()
    _, err = p.communicate("\n", timeout=60)
    assert p.returncode == 0, err
    return out


def test_bad_augment_seeds_are_refused(ld, workdir):
    root = images(workdir)
    ld.create(spec("many", root, 0, prefetch=16, epochs=0))
    ld.create(spec("small", root, 0, prefetch=2, epochs=0))
    s = spec("plain", root, 0)
    s["transforms"] = [{"op": "center_crop", "size": [16, 16]}]
    ld.create(s)
    many, noseed, small, plain, dyn, big = attach_errors(ld, [
        ["many", "broadcast", list(range(1, 10))],
        ["many", "broadcast", [None, 3]],
        ["small", "broadcast", [1, 2, 3]],
        ["plain", "broadcast", [5, 6]],
        ["many", "dynamic", [1]],
        ["many", "broadcast", [1 << 63]],
    ])
    assert many[:8] == ["ok"] * 8
    assert many[8] == (
        "attach: augment_seed 9: pipeline 'many' serves 8 distinct augment seeds already "
        "(1 (1 client), 2 (1 client), 3 (1 client), 4 (1 client), 5 (1 client), "
        "6 (1 client), 7 (1 client), 8 (1 client)), the most one pipeline serves "
        "(LDR_AUGMENT_SEEDS_MAX 8); attach with one of those seeds or without augment_seed")
    # without augment_seed a client reads the spec's seed (0): never refused
    # for the limit, so that seeds cannot lock a plain client out
    assert noseed == ["ok", "ok"]
    assert small[:2] == ["ok", "ok"]
    assert small[2] == (
        "attach: augment_seed 3: pipeline 'small''s broadcast clients would read 3 distinct "
        "augment seeds, so each of its batches takes 3 slots, but its prefetch of 2 split "
        "between 1 streams leaves it 2; create the pipeline with a prefetch of at least 3")
    assert plain == ["ok", "ok"]
    assert dyn == ["attach: augment_seed applies to broadcast and partition clients: a dynamic "
                   "stream's batches go to whichever client asks first, so none can follow one "
                   "client's seed"]
    assert big == ["attach: augment_seed 9223372036854775808 is above 9223372036854775807 "
                   "(2^63 - 1): an augment seed takes a spec seed's place, and spec seeds are "
                   "0..2^63 - 1"]
    # the daemon serves on
    assert ld.pipeline("many")["clients"] == 0


def test_seeds_without_clients_hold_nothing(ld, workdir):
    """A sweep whose trials are gone leaves no seed behind: the ring's
    batches that nobody received give their seeds' slots back, so the next
    sweep gets 8 new seeds (the pipeline builds for the spec's seed alone
    meanwhile, which takes no seed's place)."""
    root = images(workdir)
    ld.create(spec("p", root, 0, prefetch=64, epochs=0))
    first, = attach_errors(ld, [["p", "broadcast", list(range(1, 9))]])
    assert first == ["ok"] * 8
    ld.wait_for(lambda s: [p for p in s["pipelines"] if p["name"] == "p"][0]["clients"] == 0,
                "the first sweep gone")
    assert seed_groups(ld, "p") == []
    groups, reads = [], []

    def while_attached():
        groups.append(seed_groups(ld, "p"))
        # the spec's seed besides 8 others: 9 slots a batch, built and read
        for args in [(), ("--augment-seed", 12)]:
            r = ld.consume("p", "--batches", 3, *args)
            reads.append((r.rc, r.json["batches"]))

    second, = attach_errors(ld, [["p", "broadcast", list(range(9, 18))]], then=while_attached)
    assert second[:8] == ["ok"] * 8
    assert second[8] == (
        "attach: augment_seed 17: pipeline 'p' serves 8 distinct augment seeds already "
        "(9 (1 client), 10 (1 client), 11 (1 client), 12 (1 client), 13 (1 client), "
        "14 (1 client), 15 (1 client), 16 (1 client)), the most one pipeline serves "
        "(LDR_AUGMENT_SEEDS_MAX 8); attach with one of those seeds or without augment_seed")
    assert groups == [[(s, 1) for s in range(9, 17)]]
    assert reads == [(0, 3), (0, 3)]
    assert ld.pipeline("p")["state"] != "failed"


def test_other_streams_and_prefetch_leave_the_seeds_their_slots(ld, workdir):
    """Two seeds take 2 slots a batch: of a prefetch of 4, a second stream
    leaves them 2, a third 1 (refused); a live prefetch of 3 is refused too."""
    root = images(workdir)
    ld.create(spec("four", root, 0, prefetch=4, epochs=0))
    set_r = []
    seeds, parts = attach_errors(
        ld, [["four", "broadcast", [1, 2]], ["four", "partition", [None, None]]],
        then=lambda: set_r.append(ld.ctl("set", "prefetch", "four", "3", check=False)))
    assert seeds == ["ok", "ok"]
    assert parts == ["ok",
                     "attach: pipeline 'four''s broadcast clients read 2 distinct augment seeds, "
                     "so each of its batches takes 2 slots, and a new stream would leave it 1 of "
                     "its prefetch of 4 (3 streams); create the pipeline with a prefetch of at "
                     "least 6"]
    r = set_r[0]
    assert r.returncode != 0 and (
        "prefetch: pipeline 'four''s broadcast clients read 2 distinct augment seeds, so each "
        "of its batches takes 2 slots: with 2 streams reading it, at least 4") in r.stderr, r.stderr


def test_loaderctl_rejects_bad_augment_seeds(ld, workdir):
    root = images(workdir)
    ld.create(spec("x", root, 0))
    for args, msg in [(["--augment-seed", "-1"], "invalid augment seed (0..2^63-1) -- '-1'"),
                      (["--augment-seed", str(1 << 63)],
                       f"invalid augment seed (0..2^63-1) -- '{1 << 63}'"),
                      (["--augment-seed", "1", "--mode", "dynamic"],
                       "consume: --augment-seed applies to broadcast and partition clients")]:
        r = ld.ctl("consume", "x", *args, check=False)
        assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_dataloader_augment_seed(ld, workdir):
    root = images(workdir)
    truth = solo(ld, root, 31)
    ld.create(spec("dl", root, 7))
    code = textwrap.dedent(f"""
        import sys, loaderd
        for bad in (-1, 1 << 63, "3", True, 1.5):
            try:
                loaderd.DataLoader("dl", socket={ld.socket!r}, augment_seed=bad)
                print("accepted", bad)
            except ValueError as e:
                print(e)
        try:
            loaderd.DataLoader("dl", socket={ld.socket!r}, mode="dynamic", augment_seed=1)
        except ValueError as e:
            print(e)
        loader = loaderd.DataLoader("dl", socket={ld.socket!r}, as_numpy=True, augment_seed=31)
        out = b""
        for epoch in range({EPOCHS}):
            loader.set_epoch(epoch)
            for b in loader:
                out += b["image"].tobytes() + b["label"].tobytes()
        sys.stdout.buffer.write(b"@@" + out)
    """)
    r = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True,
                       env=python_client_env(), timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    text, data = r.stdout.split(b"@@", 1)
    bad = "augment_seed must be an integer in 0..2**63-1 (a spec seed), not "
    assert text.decode().splitlines() == [
        bad + "-1", bad + str(1 << 63), bad + "'3'", bad + "True", bad + "1.5",
        "augment_seed is for mode='broadcast' and 'partition': a dynamic stream's batches go "
        "to whichever loader asks first"]
    assert data == truth


def test_reconnect_keeps_the_seed(daemon, workdir):
    """A broadcast trainer with an augment seed whose daemon is killed and
    started again mid-epoch: libloader re-attaches with its seed, so its
    stream is the solo run of that seed, byte for byte."""
    root = images(workdir)
    d1 = daemon()
    sp = spec("rc", root, 7)
    err_path = os.path.join(workdir, "trainer.err")
    code = textwrap.dedent(f"""
        import sys, loaderd
        loader = loaderd.DataLoader({sp!r}, socket={d1.socket!r}, mode="broadcast",
                                    as_numpy=True, augment_seed=11)
        out, n = b"", 0
        for epoch in range({EPOCHS}):
            for b in loader:
                out += b["image"].tobytes() + b["label"].tobytes()
                n += 1
                if n == 2:
                    print("took", flush=True)
                    sys.stdin.readline()
        print(loader.reconnects, file=sys.stderr)
        sys.stdout.buffer.write(b"@@" + out)
    """)
    with open(err_path, "wb") as err:
        p = subprocess.Popen(["/usr/bin/python3", "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=err, env=python_client_env())
    assert p.stdout.readline() == b"took\n"
    d1.kill9()
    deadline = time.monotonic() + 30
    while True:
        with open(err_path, errors="replace") as f:
            if "went away" in f.read():
                break
        assert time.monotonic() < deadline, "the client did not see the daemon go within 30 s"
        time.sleep(0.05)
    d2 = daemon(socket=d1.socket)
    out, _ = p.communicate(b"\n", timeout=120)
    with open(err_path, errors="replace") as f:
        err = f.read()
    assert p.returncode == 0, err
    assert "(pipeline 'rc') re-attached at epoch 0 batch 2" in err, err
    assert out.split(b"@@", 1)[1] == solo(d2, root, 11)


def test_seeds_on_a_cuda_device(daemon, workdir, monkeypatch):
    """CUDA delivery over the emulated driver: each seed's slot is copied to
    the device for its clients (a copy per seed and batch)."""
    fake = os.path.join(BUILD_DIR, "tests", "unit", "gpu", "libfakecuda.so")
    if not os.path.exists(fake):
        pytest.skip("no emulated CUDA driver (loaderd built without CUDA)")
    monkeypatch.setenv("LOADERD_CUDA_LIBRARY", fake)  # the daemon's and loaderctl's
    d = daemon()
    root = images(workdir)
    truth = {s: solo(d, root, s) for s in (11, 12)}
    d.create(spec("dev", root, 7, min_clients=2))
    cons = [d.popen_consume("dev", "--device", "cuda:0", "--augment-seed", s) for s in (11, 12)]
    for s, c in zip((11, 12), cons):
        assert c.wait(check=True).dump == truth[s], f"augment seed {s}"
    assert d.status()["cuda"]["devices"]["cuda:0"]["copies"] == 2 * 3 * EPOCHS


def batch_bytes(dump):
    """A dump of this file's specs split into its batches."""
    out, pos = [], 0
    for rows in [4, 4, 2] * EPOCHS:
        n = rows * (16 * 16 * 3 + 8)
        out.append(dump[pos:pos + n])
        pos += n
    assert pos == len(dump)
    return out


def test_new_seed_joins_at_the_next_batch_built(ld, workdir):
    """A client with a seed nobody reads, attaching while another client
    reads, starts at the first batch nobody has received (those built
    already are built again with its slot); from there its stream is its
    seed's solo run, and the other client's is unchanged."""
    root = images(workdir)
    truth = {s: batch_bytes(solo(ld, root, s)) for s in (7, 11)}
    ld.create(spec("late", root, 7))
    # A's window pinned at 2: it has received 3 of the 6 batches at most;
    # 500 ms a batch leaves B (a loaderctl start) seconds to attach in
    a = ld.popen_consume("late", "--delay", 500, "--inflight", 2)
    ld.wait_for(lambda st: any(c["pid"] == a.pid and c["leases"] >= 1 for c in st["clients"]),
                "A holds a batch")
    rb = ld.consume("late", "--augment-seed", 11)
    first = rb.json["first_epoch"] * 3 + rb.json["first_batch"]
    assert first >= 1
    assert b"".join(truth[11][first:]) == rb.dump
    assert a.wait(check=True).dump == b"".join(truth[7])


def test_seeds_come_and_go_under_a_long_reader(ld, workdir):
    """Seeded clients attach and leave, one after another and with seeds
    used again, while a client without a seed reads on: its stream stays
    the spec's, byte for byte, and each short reader's is a contiguous run
    of its seed's solo stream."""
    root = images(workdir)
    epochs = 12
    truth = {}
    for s in (7, 21, 22):
        ld.create(spec(f"long{s}", root, s, epochs=epochs))
        truth[s] = ld.consume(f"long{s}").dump
    per = [4, 4, 2] * epochs
    offs = [sum(r * (16 * 16 * 3 + 8) for r in per[:i]) for i in range(len(per) + 1)]
    ld.create(spec("churn", root, 7, epochs=epochs))
    # 80 ms a batch: 36 batches, about 3 s for the first short reader to come
    a = ld.popen_consume("churn", "--delay", 80, "--inflight", 2)
    ld.wait_for(lambda st: any(c["pid"] == a.pid and c["leases"] >= 1 for c in st["clients"]),
                "the long reader reads")
    runs = 0
    for s in (21, 22, 21, 22):
        r = ld.consume("churn", "--augment-seed", s, "--batches", 3, "--inflight", 1)
        if not r.json["batches"]:
            continue  # the long reader was done
        first = r.json["first_epoch"] * 3 + r.json["first_batch"]
        n = r.json["batches"]
        assert r.dump == truth[s][offs[first]:offs[first + n]], f"seed {s} from batch {first}"
        runs += 1
    assert runs >= 1
    assert a.wait(check=True).dump == truth[7]


@pytest.mark.parametrize("seeded", [True, False], ids=["8 seeds", "no seed"])
def test_seeded_clients_leave_another_stream_its_slots(daemon, workdir, users, seeded):
    """bob reads alice's `access: all` pipeline with 8 broadcast clients of 8
    augment seeds (or none): the first takes a batch and holds it, the
    second reads as fast as it can, the other six attach then. His broadcast stream,
    alone, took every slot, most in batches his fast client received and
    his first has not. alice's own partition stream of the pipeline still
    gets its share of the slots (docs/protocol.md, "Sharing slots"): her
    whole epoch, exact, while bob's clients hold theirs (no slow-client
    timeout frees them: it is an hour)."""
    alice, bob = users
    open_to_all(workdir)
    root = images(workdir)
    shared = os.path.join(workdir, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    subprocess.run(["chmod", "-R", "a+rX", root], check=True)
    d = daemon("--config", shared_config(workdir))
    d.create(spec("ref", root, 7, epochs=1))
    truth = d.consume("ref", "--mode", "partition").dump
    assert len(truth) == (4 + 4 + 2) * (16 * 16 * 3 + 8)
    path = os.path.join(shared, "open.json")
    with open(path, "w") as f:
        json.dump(spec("open", root, 7, epochs=0, prefetch=64, access="all", persist=True,
                       slow_client_timeout=3600), f)
    os.chmod(path, 0o644)
    alice.ctl(d, "create", "--spec", path, check=True)

    def as_bob(seed, *args):
        seed = ["--augment-seed", seed] if seeded else []
        p = subprocess.Popen(d.ctl_cmd("consume", "open", *seed, *args),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, **bob.popen_kwargs())
        d._children.append(p)
        return p

    def bobs(st):
        return {c["pid"]: a for c in st["clients"] if c["uid"] == bob.uid
                for a in c["attachments"]}
    hold = as_bob(100, "--delay", 3600000, "--batches", 1)
    d.wait_for(lambda st: any(a["leases"] for a in bobs(st).values()), "bob's first holds")
    fast = as_bob(101, "--batches", 1000000)
    def pipeline(st):
        return [x for x in st["pipelines"] if x["name"] == "open"][0]
    d.wait_for(lambda st: (pipeline(st)["held_back_by"] or {}).get("pid") == hold.pid,
               "bob's fast client held back by his first")
    held = [hold, fast] + [as_bob(102 + i, "--delay", 3600000, "--batches", 1) for i in range(6)]
    d.wait_for(lambda st: len(bobs(st)) == 8, "bob's 8 clients attached")
    p = pipeline(d.status())
    # his batches take a slot per seed: the stream can build no more
    assert p["stats"]["slots_free"] < (8 if seeded else 1), p["stats"]
    dump = os.path.join(shared, "alice.bin")
    r = alice.ctl(d, "consume", "open", "--mode", "partition", "--epochs", 1, "--timeout", 30000,
                  "--dump", dump, json_out=True)
    assert r.returncode == 0, r.stderr
    with open(dump, "rb") as f:
        assert f.read() == truth
    # bob's clients held their batches all along, and still do
    assert all(p.poll() is None for p in held)
    assert bobs(d.status())[hold.pid]["leases"] >= 1
    for p in held:
        p.kill()
        p.wait()
