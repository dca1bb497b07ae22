# SPDX-License-Identifier: MIT
"""Sources over s3:// (docs/storage.md) against a real S3 server.

SeaweedFS's `weed mini` verifies SigV4 (s3server.py); a fault proxy between
the daemon and it counts the requests and injects faults. The trainer's
credentials travel with the create (libloader reads them from loaderctl's
environment, as from a trainer's); the daemon fetches each object once into
its cache (cache_dir/objects) and every pipeline reads that copy. Batches
are held byte for byte to the same files read from local disk.
"""

import hashlib
import json
import subprocess
import sys
import os
import re
import signal
import struct
import tarfile
import threading
import time

import numpy as np
import pytest

import s3server
from imgtest import image_spec, make_folder, wds_members, write_shard_tarfile
from ldrtest import npy_spec, python_client_env, write_npy
from users import open_to_all, shared_config
from s3server import IDENTITIES, FaultProxy, aws_env
from users import users  # noqa: F401 (a fixture)

BUCKET = "alice-data"


@pytest.fixture(scope="module")
def s3():
    srv, d = s3server.make_server()
    yield srv
    s3server.stop_server(srv, d)


def s3_daemon(daemon, workdir, cache_bytes=None, name="cache"):
    cache = os.path.join(workdir, name)
    args = ["--cache-dir", cache]
    if cache_bytes is not None:
        cfg = os.path.join(workdir, name + ".json")
        with open(cfg, "w") as f:
            json.dump({"cache_bytes": cache_bytes}, f)
        args += ["--config", cfg]
    return daemon(*args), cache


def create(ld, spec, env, check=True):
    return ld.ctl("create", "--spec", ld.spec_file(spec), env=env, check=check)


def shards(workdir, s3, prefix, nshards=3, seed=6, per_class=3):
    """nshards webdataset shards, local and uploaded as alice to
    s3://alice-data/PREFIX-{000..}.tar; the local pattern and the URL one."""
    root = os.path.join(workdir, "imgs-" + prefix.replace("/", "_"))
    samples = make_folder(root, ["cat", "dog", "eel"], per_class, [(30, 40), (44, 33)], seed=seed)
    members = wds_members(samples)
    per = len(members) // nshards
    local = os.path.join(workdir, "shards-" + prefix.replace("/", "_"))
    os.makedirs(local)
    alice = s3.client("alice")
    for s in range(nshards):
        p = write_shard_tarfile(os.path.join(local, f"train-{s:03d}.tar"),
                                members[s * per:(s + 1) * per if s < nshards - 1 else None], tarfile.USTAR_FORMAT)
        with open(p, "rb") as f:
            alice.put(BUCKET, f"{prefix}-{s:03d}.tar", f.read())
    hi = f"{nshards - 1:03d}"
    return (os.path.join(local, "train-{000.." + hi + "}.tar"),
            f"s3://{BUCKET}/{prefix}-{{000..{hi}}}.tar", len(samples))


OPS = [{"op": "random_resized_crop", "size": 20}, {"op": "horizontal_flip"}]


def wds(name, url, **kw):
    kw.setdefault("shuffle", True)
    return image_spec(name, {"kind": "webdataset", "urls": [url]}, OPS, dtype="uint8", seed=9,
                      batch_size=4, **kw)


def gets(proxy):
    return sum(1 for h in proxy.heads if h.startswith(b"GET "))


def test_webdataset_over_s3_equals_local(daemon, workdir, s3):
    local, url, _ = shards(workdir, s3, "wds/a")
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    try:
        ld, cache = s3_daemon(daemon, workdir)
        env = aws_env(proxy.endpoint)
        ld.create(wds("local", local))
        want = ld.consume("local").dump
        create(ld, wds("remote", url), env)
        assert ld.consume("remote").dump == want
        assert gets(proxy) == 3, [h.split(b"\r\n")[0] for h in proxy.heads]
        st = ld.status()
        oc = st["object_cache"]
        sizes = sum(os.path.getsize(local.replace("{000..002}", f"{s:03d}")) for s in range(3))
        assert (oc["misses"], oc["hits"], oc["objects"], oc["bytes_fetched"], oc["bytes_used"]) == \
            (3, 0, 3, sizes, sizes)
        files = sorted(os.listdir(os.path.join(cache, "objects")))
        assert len(files) == 6 and all(len(f) in (32, 35) for f in files), files
        for f in files:
            assert os.stat(os.path.join(cache, "objects", f)).st_mode & 0o777 == 0o600
        # a second pipeline over the same objects: HEADs (alice's keys
        # checked), no GET; the cached copies are served
        heads_before = len(proxy.heads)
        create(ld, wds("again", url), env)
        assert ld.consume("again").dump == want
        assert gets(proxy) == 3
        assert [h.split(b" ")[0] for h in proxy.heads[heads_before:]] == [b"HEAD"] * 3
        oc = ld.status()["object_cache"]
        assert (oc["misses"], oc["hits"], oc["pinned"]) == (3, 3, 3)
        # status and the log show the key id's last 4 characters, never more
        ak, sk, _ = IDENTITIES["alice"]
        text = json.dumps(ld.status())
        assert ld.pipeline("remote")["store"] == {
            "endpoint": proxy.endpoint, "region": "us-east-1", "access_key_id": ak[-4:],
            "session_token": False, "expires": None, "expired": False, "credentials_updates": 0}
        for secret in (sk, ak, ak[:-4]):
            assert secret not in text
            assert secret not in ld.log()
        metrics = ld.ctl("status", json_out=True).stdout
        assert sk not in metrics and ak not in metrics
        ld.ctl("drop", "remote")
        ld.ctl("drop", "again")
        assert ld.status()["object_cache"]["pinned"] == 0
    finally:
        proxy.stop()


def test_many_shards_fetched_at_once(daemon, workdir, s3):
    # more shards than the fetch threads and than a source's first table
    local, url, n = shards(workdir, s3, "wds/many", nshards=21, per_class=7)
    ld, _ = s3_daemon(daemon, workdir)
    ld.create(wds("local", local))
    want = ld.consume("local").dump
    create(ld, wds("remote", url), aws_env(s3.endpoint))
    assert ld.consume("remote").dump == want
    oc = ld.status()["object_cache"]
    assert (oc["objects"], oc["misses"], oc["pinned"]) == (21, 21, 21)


def test_python_trainer_sends_its_profile(daemon, workdir, s3):
    """A trainer in Python (libloader through ctypes) with its keys in a
    profile of its ~/.aws files, not in the environment."""
    local, url, _ = shards(workdir, s3, "wds/py", nshards=2)
    ld, _ = s3_daemon(daemon, workdir)
    ld.create(wds("local", local))
    want = ld.consume("local").dump
    ak, sk, _ = IDENTITIES["alice"]
    home = os.path.join(workdir, "home")
    os.makedirs(os.path.join(home, ".aws"))
    with open(os.path.join(home, ".aws", "credentials"), "w") as f:
        f.write(f"[train]\naws_access_key_id = {ak}\naws_secret_access_key = {sk}\n")
    with open(os.path.join(home, ".aws", "config"), "w") as f:
        f.write(f"[profile train]\nregion = us-east-1\nendpoint_url = {s3.endpoint}\n")
    env = python_client_env(base={k: v for k, v in os.environ.items() if not k.startswith("AWS_")})
    env.update(HOME=home, AWS_PROFILE="train")
    code = ("import json, sys, loaderd\n"
            "c = loaderd.Client(sys.argv[1])\n"
            "c.create_pipeline(json.loads(sys.argv[2]))\n")
    r = subprocess.run([sys.executable, "-c", code, ld.socket, json.dumps(wds("remote", url))],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ld.consume("remote").dump == want
    assert ld.pipeline("remote")["store"]["access_key_id"] == ak[-4:]


def test_image_folder_under_a_prefix_equals_local(daemon, workdir, s3):
    root = os.path.join(workdir, "folder")
    # 39 images: past the first size of a source's index of its objects
    make_folder(root, ["cat", "dog", "eel"], 12, [(30, 40), (44, 33)], seed=11)
    # a nested folder, a file of the root and one that is no image: as locally
    make_folder(os.path.join(root, "dog", "deep"), ["inner"], 3, [(20, 25)], seed=12)
    for p, body in ((os.path.join(root, "README.txt"), b"not a class"),
                    (os.path.join(root, "eel", "notes.txt"), b"not an image")):
        with open(p, "wb") as f:
            f.write(body)
    alice = s3.client("alice")
    for d, _, files in os.walk(root):
        for name in files:
            p = os.path.join(d, name)
            with open(p, "rb") as f:
                alice.put(BUCKET, "folder/" + os.path.relpath(p, root), f.read())
    # a sibling prefix that starts alike is not under "folder/"
    alice.put(BUCKET, "folder2/zzz/x.jpg", b"not read")
    ld, _ = s3_daemon(daemon, workdir)
    src = lambda p: {"kind": "image_folder", "path": p}  # noqa: E731
    ld.create(image_spec("local", src(root), OPS, dtype="uint8", seed=3, batch_size=5, shuffle=True))
    want = ld.consume("local").dump
    create(ld, image_spec("remote", src(f"s3://{BUCKET}/folder"), OPS, dtype="uint8", seed=3, batch_size=5,
                          shuffle=True), aws_env(s3.endpoint))
    assert ld.consume("remote").dump == want
    assert ld.status()["object_cache"]["objects"] == 39  # the images only
    assert ld.pipeline("remote")["samples"] == 39


def test_npy_over_s3_equals_local(daemon, workdir, s3):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((37, 5)).astype(np.float32)
    y = rng.integers(0, 1000, size=(37,)).astype(np.int64)
    px, py = os.path.join(workdir, "x.npy"), os.path.join(workdir, "y.npy")
    write_npy(px, x)
    write_npy(py, y)
    alice = s3.client("alice")
    for p in (px, py):
        with open(p, "rb") as f:
            alice.put(BUCKET, "npy/" + os.path.basename(p), f.read())
    ld, _ = s3_daemon(daemon, workdir)
    ld.create(npy_spec("local", [px, py], batch_size=6, shuffle=True, seed=4))
    want = ld.consume("local").dump
    create(ld, npy_spec("remote", [f"s3://{BUCKET}/npy/x.npy", f"s3://{BUCKET}/npy/y.npy"],
                        batch_size=6, shuffle=True, seed=4), aws_env(s3.endpoint))
    assert ld.consume("remote").dump == want


def test_missing_object_and_no_credentials(daemon, workdir, s3):
    _, url, _ = shards(workdir, s3, "wds/m", nshards=2)
    ld, _ = s3_daemon(daemon, workdir)
    r = create(ld, wds("missing", f"s3://{BUCKET}/wds/m-{{000..002}}.tar"), aws_env(s3.endpoint), check=False)
    assert r.returncode != 0
    assert (f"s3://{BUCKET}/wds/m-002.tar: NoSuchKey: The specified key does not exist. (HTTP 404)"
            in r.stderr), r.stderr
    # no keys: unsigned requests, which the store refuses
    env = {k: v for k, v in aws_env(s3.endpoint).items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    r = create(ld, wds("anon", url), env, check=False)
    assert r.returncode != 0 and f"s3://{BUCKET}/wds/m-000.tar: AccessDenied" in r.stderr, r.stderr
    # a wrong secret
    r = create(ld, wds("wrong", url), aws_env(s3.endpoint, AWS_SECRET_ACCESS_KEY="nope"), check=False)
    assert r.returncode != 0 and f"s3://{BUCKET}/wds/m-000.tar: SignatureDoesNotMatch" in r.stderr, r.stderr
    assert "nope" not in ld.log()


def stream_daemon(daemon, workdir, cache_bytes, fetch_ahead, name):
    cache = os.path.join(workdir, name)
    cfg = os.path.join(workdir, name + ".json")
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": cache_bytes, "fetch_ahead": fetch_ahead}, f)
    return daemon("--cache-dir", cache, "--config", cfg), os.path.join(cache, "objects")


def cached_bytes(objects):
    """Bytes of the object cache's files on disk (temporaries included)."""
    n = 0
    for f in os.listdir(objects) if os.path.isdir(objects) else []:
        if not f.endswith(".id") and ".id." not in f:
            try:
                n += os.path.getsize(os.path.join(objects, f))
            except FileNotFoundError:
                pass  # evicted, or renamed from its temporary, meanwhile
    return n


def consume_bounded(ld, name, objects, limit, *args):
    """consume NAME, checking while it runs that the object cache (status
    and the files on disk) never holds more than @limit bytes."""
    c = ld.popen_consume(name, *args)
    seen = 0
    while True:
        running = c.proc.poll() is None
        oc = ld.status()["object_cache"]
        on_disk = cached_bytes(objects)
        assert oc["bytes_used"] <= limit and on_disk <= limit, (oc, on_disk)
        seen = max(seen, on_disk)
        if not running:
            break
        time.sleep(0.02)
    res = c.wait(timeout=120)
    assert res.rc == 0, res.describe() + ld.log()[-3000:]
    return res, seen


def test_stream_larger_than_cache(daemon, workdir, s3):
    """A webdataset of 3x cache_bytes read as a stream: two epochs, batches
    byte for byte those of the same shards on disk, the cache never over its
    bound; in order (no shuffle) every shard is fetched at least once per
    epoch (the cache cannot keep it until the next), and once the last
    batch is read nothing is fetched, held or pinned any more.

    Every assertion holds whatever the threads' timing (each says why):
    none polls, none reads a figure that a fetch still under way could
    change."""
    local, url, n = shards(workdir, s3, "wds/st", nshards=9, per_class=12)
    sizes = [os.path.getsize(local.replace("{000..008}", f"{s:03d}")) for s in range(9)]
    total, size = sum(sizes), sizes[0]
    # tar files are whole 10 KiB records: every shard one size, so bytes
    # count fetches; and one batch of 4 is one shard's 4 samples
    assert sizes == [size] * 9 and n == 36, sizes
    # room for 3 shards: one fetched ahead (fetch_ahead) and one per batch
    # being built (prefetch 2: at most 2 batches in the ring at once)
    limit = 3 * size
    ld, objects = stream_daemon(daemon, workdir, limit, size, "stream")
    env = aws_env(s3.endpoint)
    # (a shuffled stream reads its samples by range instead:
    # test_shuffled_webdataset_stream_reads_samples_by_range)
    for shuffle in (False,):
        tag = "shuf" if shuffle else "seq"
        ld.create(wds("local-" + tag, local, shuffle=shuffle, epochs=2, prefetch=2))
        want = ld.consume("local-" + tag).dump
        before = ld.status()["object_cache"]
        create(ld, wds("remote-" + tag, url, shuffle=shuffle, epochs=2, prefetch=2), env)
        # the create opens each shard once to index it, one at a time, and
        # keeps none; no stream reads before a client attaches (attach.c),
        # so these figures are the create's alone. The second create finds
        # the shards the first pipeline's reads left in the cache.
        oc = ld.status()["object_cache"]
        opened = (oc["misses"] - before["misses"]) + (oc["hits"] - before["hits"])
        assert opened == 9 and oc["pinned"] == 0 and oc["fetching"] == 0, (before, oc)
        assert oc["bytes_fetched"] - before["bytes_fetched"] == (oc["misses"] - before["misses"]) * size
        if not shuffle:
            assert oc["bytes_fetched"] - before["bytes_fetched"] == total, (before, oc)
        got, seen = consume_bounded(ld, "remote-" + tag, objects, limit)
        assert got.dump == want and len(want) == 2 * n * (20 * 20 * 3 + 8)
        assert seen > 0
        # One status, no poll: once the client has every batch, every read
        # is done (each gives its pin back before its batch is built), and
        # the fetch-ahead is idle for good: it only fetches for batches no
        # read has begun (objects.c, next_wanted()), so none after the last
        # one began, and each of its holds ends at the read of the last row
        # it counted, all read by now. A fetch it had under way was one a
        # read needed: that read waited for it.
        st = ld.status()
        after = st["object_cache"]
        [stream] = [p["store"]["stream"] for p in st["pipelines"] if p["name"] == "remote-" + tag]
        assert (stream["fetching_objects"], stream["fetching_bytes"], stream["readers_waiting"],
                stream["ahead_objects"], stream["ahead_bytes"]) == (0, 0, 0, 0, 0), stream
        assert (after["pinned"], after["fetching"], after["fetching_bytes"]) == (0, 0, 0), after
        assert stream["fetch_ahead"] == size
        assert after["objects"] == after["misses"] - after["evictions"], after
        assert after["bytes_used"] == cached_bytes(objects) <= limit, after
        fetched = after["bytes_fetched"] - oc["bytes_fetched"]
        assert fetched == (after["misses"] - oc["misses"]) * size, (oc, after)
        # An upper bound whatever the timing: every fetch is an open that
        # did not find its object, by a read (one per sample read: 2 epochs
        # of n) or by the fetch-ahead (at most one per row it walks, each
        # row once: its place only moves on, next_wanted()). A shard is
        # fetched again only once evicted, which its pin per sample allows
        # between two of its reads (docs/storage.md).
        assert fetched <= (2 * n + 2 * n) * size, (fetched, total)
        # In order, at least once per epoch: a shard's next read in the
        # next epoch comes after the 6 shards of the batches between
        # were opened (at most 2 batches in the ring, and the
        # fetch-ahead one shard past the batches begun), at least 4 of
        # them fetched, with 2 cached at most before; each fetch needs
        # room in the full cache of 3, least recently opened first, and
        # the shard, pinned by nobody then, is older than all of them.
        assert fetched >= 2 * total, (fetched, total)
        print(f"{tag}: {fetched / total:.2f} x the dataset in 2 epochs")
        ld.ctl("drop", "remote-" + tag)
    assert ld.status()["object_cache"]["pinned"] == 0


def test_stream_shuffle_window_fetches_each_shard_once(daemon, workdir, s3):
    """A shuffled stream with "shuffle_window" (docs/spec.md, "Shuffle
    windows") larger than its cache: each shard fetched at most once an
    epoch (a GET each), the batches byte for byte the same spec's over local
    files."""
    local, url, n = shards(workdir, s3, "wds/win", nshards=9, per_class=12)
    sizes = [os.path.getsize(local.replace("{000..008}", f"{s:03d}")) for s in range(9)]
    # What is read at once fits: the 2 batches built at once (2 slots) read
    # 2 windows of 2 shards at most, and the fetch-ahead holds 1 more; so
    # the least recently opened shard, the one evicted, is always of a
    # window done with. Still a stream: the 9 shards are more.
    limit = 6 * max(sizes)
    assert sum(sizes) > limit
    ld, objects = stream_daemon(daemon, workdir, limit, max(sizes), "swin")
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    try:
        spec = dict(shuffle=True, shuffle_window=2, epochs=2, prefetch=2)
        ld.create(wds("local-win", local, **spec))
        want = ld.consume("local-win").dump
        create(ld, wds("remote-win", url, **spec), aws_env(proxy.endpoint))
        indexed = get_urls(proxy.heads)
        assert sorted(indexed) == sorted(f"/{BUCKET}/wds/win-{s:03d}.tar" for s in range(9))
        got, _ = consume_bounded(ld, "remote-win", objects, limit)
        assert got.dump == want and len(want) == 2 * n * (20 * 20 * 3 + 8)
        # the create's GET of each shard to index it, then at most one an
        # epoch: none where an epoch found it cached still; at least the
        # shards the cache cannot hold are fetched again each epoch
        per_shard = [get_urls(proxy.heads).count(u) for u in sorted(set(indexed))]
        assert all(1 <= c <= 3 for c in per_shard), per_shard
        assert sum(per_shard) >= 9 + 2 * (9 - limit // min(sizes)), (per_shard, limit, sizes)
        ld.ctl("drop", "remote-win")
    finally:
        proxy.stop()


def get_urls(heads):
    """The paths of the GETs among @heads, in order."""
    return [h.split(b" ")[1].split(b"?")[0].decode() for h in heads if h.startswith(b"GET ")]


def test_stream_index_fetches_shards_at_once(daemon, workdir, s3):
    """A streamed create over 12 shards through a store slow to answer
    (50 ms a GET): the shards are fetched several at once ahead of the
    index, yet the index is the local files' sample for sample (the
    batches equal) and each shard was fetched exactly once to build it."""
    nshards = 12
    local, url, n = shards(workdir, s3, "wds/ix", nshards=nshards, per_class=8)
    sizes = [os.path.getsize(local.replace("{000..011}", f"{s:03d}")) for s in range(nshards)]
    total = sum(sizes)
    # streamed (more than the cache), half the cache fetched ahead: 5+ shards
    ld, _ = stream_daemon(daemon, workdir, total - 1, (total - 1) // 2, "ixa")
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    try:
        proxy.delay = 0.05
        ld.create(wds("local", local, shuffle=False))
        want = ld.consume("local").dump
        create(ld, wds("remote", url, shuffle=False), aws_env(proxy.endpoint))
        # the create's GETs: no read began (none before a client attaches)
        got = get_urls(proxy.heads)
        assert sorted(got) == [f"/{BUCKET}/wds/ix-{s:03d}.tar" for s in range(nshards)], got
        # several at once (each GET waits 50 ms in the proxy: the next
        # thread's is there meanwhile); one at a time before
        assert proxy.gets_most > 1, proxy.gets_most
        oc = ld.status()["object_cache"]
        assert (oc["misses"], oc["bytes_fetched"], oc["pinned"]) == (nshards, total, 0), oc
        assert ld.consume("remote").dump == want
        ld.ctl("drop", "remote")
    finally:
        proxy.stop()


def test_stream_index_refused_fetch_ahead(daemon, workdir, s3):
    """The first GET ahead of the index is refused (403) once: that fetch
    is dropped, the index fetches the shard itself when it comes to it, and
    the create ends as without the fault: the index the local files', each
    shard held once, one more GET than shards."""
    nshards = 12
    local, url, n = shards(workdir, s3, "wds/ixr", nshards=nshards, per_class=4)
    sizes = [os.path.getsize(local.replace("{000..011}", f"{s:03d}")) for s in range(nshards)]
    total = sum(sizes)
    ld, _ = stream_daemon(daemon, workdir, total - 1, (total - 1) // 2, "ixr")
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    try:
        ld.create(wds("local", local, shuffle=False))
        want = ld.consume("local").dump
        # the 12 HEADs through, then the first GET refused
        proxy.add(*([None] * nshards), ("answer", 403, b"<Error><Code>AccessDenied</Code>"
                                        b"<Message>Access Denied.</Message></Error>"))
        create(ld, wds("remote", url, shuffle=False), aws_env(proxy.endpoint))
        assert proxy.faults.empty()
        got = get_urls(proxy.heads)
        assert len(got) == nshards + 1 and sorted(set(got)) == \
            [f"/{BUCKET}/wds/ixr-{s:03d}.tar" for s in range(nshards)], got
        oc = ld.status()["object_cache"]
        # the refused fetch counts as a miss too
        assert (oc["misses"], oc["bytes_fetched"], oc["pinned"]) == (nshards + 1, total, 0), oc
        assert ld.consume("remote").dump == want
    finally:
        proxy.stop()


def test_stream_index_first_bad_shard_in_order(daemon, workdir, s3):
    """Shards 3 and 9 of 12 are no tars: however the fetches ahead of the
    index fall, the create fails on shard 3 with the local files' message,
    and gives back every shard it held."""
    nshards = 12
    local, url, n = shards(workdir, s3, "wds/ixbad", nshards=nshards, per_class=4)
    sizes = [os.path.getsize(local.replace("{000..011}", f"{s:03d}")) for s in range(nshards)]
    alice = s3.client("alice")
    for s in (3, 9):
        bad = b"no tar at all " * 100
        with open(local.replace("{000..011}", f"{s:03d}"), "wb") as f:
            f.write(bad)
        alice.put(BUCKET, f"wds/ixbad-{s:03d}.tar", bad)
        sizes[s] = len(bad)
    ld, _ = stream_daemon(daemon, workdir, sum(sizes) - 1, (sum(sizes) - 1) // 2, "ixbad")
    r = ld.ctl("create", "--spec", ld.spec_file(wds("local", local)), check=False)
    assert r.returncode != 0
    want = r.stderr.replace(local.replace("{000..011}", "003"), f"s3://{BUCKET}/wds/ixbad-003.tar")
    assert "ixbad-003" in want, want
    r = create(ld, wds("remote", url), aws_env(s3.endpoint), check=False)
    assert r.returncode != 0 and r.stderr == want, (r.stderr, want)
    oc = ld.status()["object_cache"]
    assert oc["pinned"] == 0 and oc["misses"] <= nshards, oc


def test_stream_slow_store_is_limited_by_io(daemon, workdir, s3):
    """A slow store (every GET delayed) and a small fetch_ahead: the reads
    wait for objects, and status says limited_by io naming the store."""
    local, url, _ = shards(workdir, s3, "wds/slow", nshards=6, per_class=8)
    sizes = [os.path.getsize(local.replace("{000..005}", f"{s:03d}")) for s in range(6)]
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    try:
        ld, objects = stream_daemon(daemon, workdir, 2 * max(sizes), 1, "slow")
        create(ld, wds("remote", url, shuffle=False, epochs=100), aws_env(proxy.endpoint))
        proxy.delay = 0.4
        c = ld.popen_consume("remote", dump=False)
        seen = None
        deadline = time.monotonic() + 90  # a bound on a hang, not a timing
        while c.proc.poll() is None and seen is None and time.monotonic() < deadline:
            p = ld.pipeline("remote")
            if p["stats"]["limited_by"] == "io":
                seen = p
            time.sleep(0.05)
        c.signal(signal.SIGTERM)
        c.wait(timeout=60)
        assert seen is not None, ld.pipeline("remote")["stats"]
        assert f"objects from the store {proxy.endpoint} are fetched slower" in seen["stats"]["limited_why"], seen
        stream = ld.pipeline("remote")["store"]["stream"]
        assert stream["fetch_ahead"] == 1 and stream["reads_waited"] > 0 and stream["wait_seconds"] > 0, stream
    finally:
        proxy.stop()


def test_stream_store_outage_loses_nothing(daemon, workdir, s3):
    """The store answers 503 to every request for longer than the daemon's
    store_retry_seconds while a stream reads (its cache too small to keep
    the shards: each is fetched again): the batches that need it wait,
    shown in status, and are built again once the store answers. Nothing is
    skipped, failed, lost or repeated (on_error skip: an outage is no bad
    sample)."""
    local, url, n = shards(workdir, s3, "wds/out", nshards=6, per_class=4)
    sizes = [os.path.getsize(local.replace("{000..005}", f"{s:03d}")) for s in range(6)]
    limit = 3 * max(sizes)
    assert sum(sizes) > limit
    cache = os.path.join(workdir, "outage")
    cfg = os.path.join(workdir, "outage.json")
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": limit, "fetch_ahead": max(sizes), "store_retry_seconds": 0.3}, f)
    ld = daemon("--cache-dir", cache, "--config", cfg)
    spec = dict(shuffle=False, epochs=2, on_error="skip", prefetch=2)
    ld.create(wds("local", local, **spec))
    want = ld.consume("local").dump
    assert len(want) == 2 * n * (20 * 20 * 3 + 8)
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    try:
        create(ld, wds("remote", url, **spec), aws_env(proxy.endpoint))
        # the store down: every request answered 503 until the faults are
        # cleared (the create's HEADs and GETs went through)
        proxy.add(*(["503"] * 100000))
        c = ld.popen_consume("remote")
        seen = {}
        deadline = time.monotonic() + 90  # a bound on a hang, not a timing
        while c.proc.poll() is None and len(seen) < 2 and time.monotonic() < deadline:
            p = ld.pipeline("remote")
            stream = p["store"]["stream"]
            if stream["parked_batches"] and stream["parked"][0]["tries"] >= 2:
                seen.setdefault("parked", stream)
            if p["stats"]["limited_by"] == "io" and "does not answer" in p["stats"]["limited_why"]:
                seen.setdefault("stats", p["stats"])
            time.sleep(0.05)
        assert c.proc.poll() is None, c.wait().describe()
        assert set(seen) == {"parked", "stats"}, (seen, ld.pipeline("remote"))
        first = seen["parked"]["parked"][0]
        assert (first["epoch"], first["why"]) == (0, "store") and first["waiting_seconds"] > 0, first
        assert re.fullmatch(re.escape(f"s3://{BUCKET}/wds/out-") + r"00[0-5]\.tar: SlowDown: Please "
                            r"reduce your request rate\. \(HTTP 503\); retried for 0\.3 s", first["error"]), first
        assert f"batches wait for the store {proxy.endpoint}, which does not answer" in \
            seen["stats"]["limited_why"], seen["stats"]
        # the store answers again: the stream goes on by itself
        while not proxy.faults.empty():
            proxy.faults.get_nowait()
        res = c.wait(timeout=120)
        assert res.rc == 0, res.describe() + ld.log()[-3000:]
        assert res.dump == want
        p = ld.pipeline("remote")
        assert (p["state"], p["error"], p["skipped"], p["batches_failed"], p["store"]["stream"]["parked_batches"],
                p["store"]["stream"]["parked"]) == ("done", None, 0, 0, 0, []), p
        assert "waits for the store" in ld.log() and "the store answers again" in ld.log()
    finally:
        proxy.stop()
    # the config key: checked, and taken at a restart
    conf = {"cache_bytes": limit, "fetch_ahead": max(sizes)}
    for bad in (0, 3601, "1"):
        with open(cfg, "w") as f:
            json.dump(dict(conf, store_retry_seconds=bad), f)
        r = ld.ctl("reload", check=False)
        assert r.returncode == 1 and f"{cfg}: store_retry_seconds: must be a number of seconds in 0.1..3600" \
            in r.stderr, r.stderr
    with open(cfg, "w") as f:
        json.dump(dict(conf, store_retry_seconds=5), f)
    assert ld.ctl_json("reload")["restart_needed"] == [{"key": "store_retry_seconds", "running": 0.3, "file": 5.0}]


def test_lru_eviction_spares_pinned(daemon, workdir, s3):
    la, ua, _ = shards(workdir, s3, "wds/e1", nshards=2, seed=1)
    lb, ub, _ = shards(workdir, s3, "wds/e2", nshards=2, seed=2)
    size = lambda pat: sum(os.path.getsize(pat.replace("{000..001}", f"{s:03d}")) for s in range(2))  # noqa: E731
    ld, cache = s3_daemon(daemon, workdir, cache_bytes=max(size(la), size(lb)) + 10)
    env = aws_env(s3.endpoint)
    create(ld, wds("a", ua), env)
    # a's objects are pinned by its open source: b finds no room
    r = create(ld, wds("b", ub), env, check=False)
    assert r.returncode != 0 and "no room for its" in r.stderr and "held by open pipelines" in r.stderr, r.stderr
    ld.ctl("drop", "a")
    create(ld, wds("b", ub), env)
    oc = ld.status()["object_cache"]
    assert oc["evictions"] == 2 and oc["objects"] == 2 and oc["bytes_used"] == size(lb), oc
    ld.ctl("drop", "b")
    # a again: fetched again (evicted), b's evicted in turn
    create(ld, wds("a2", ua), env)
    assert ld.status()["object_cache"]["misses"] == 6


def test_503_storm_then_success(daemon, workdir, s3):
    local, url, _ = shards(workdir, s3, "wds/s")
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    try:
        ld, _ = s3_daemon(daemon, workdir)
        ld.create(wds("local", local))
        want = ld.consume("local").dump
        proxy.add(*(["503"] * 6 + ["429"] * 2))
        create(ld, wds("remote", url), aws_env(proxy.endpoint))
        assert ld.consume("remote").dump == want
        assert proxy.faults.empty()
    finally:
        proxy.stop()


def test_corrupted_body_is_fetched_again(daemon, workdir, s3):
    """A GET body with one byte flipped on its way (its length kept): its MD5
    is not its ETag, so it is deleted and fetched again; the batches are the
    local files' and the cache holds only good copies. Flipped every time:
    the create fails naming the URL and both digests, nothing is cached."""
    local, url, _ = shards(workdir, s3, "wds/flip")
    paths = [local.replace("{000..002}", f"{s:03d}") for s in range(3)]
    bodies = [open(p, "rb").read() for p in paths]
    # the test means something only if the store's ETag is the body's MD5
    for s, body in enumerate(bodies):
        status, h, got = s3.client("alice").request("GET", BUCKET, f"wds/flip-{s:03d}.tar", b"")
        assert (status, got) == (200, body)
        assert h["etag"] == f'"{hashlib.md5(body).hexdigest()}"'
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    try:
        msock = os.path.join(workdir, "flip-metrics.sock")
        cfg = os.path.join(workdir, "flip.json")
        with open(cfg, "w") as f:
            json.dump({"metrics_address": msock, "store_retry_seconds": 1}, f)
        cache = os.path.join(workdir, "flipcache")
        ld = daemon("--cache-dir", cache, "--config", cfg)
        env = aws_env(proxy.endpoint)
        ld.create(wds("local", local))
        want = ld.consume("local").dump
        proxy.flip = 2
        create(ld, wds("remote", url), env)
        assert proxy.flipped == 2 and proxy.flip == 0
        assert gets(proxy) == 5
        assert ld.consume("remote").dump == want
        oc = ld.status()["object_cache"]
        assert (oc["checksum_mismatches"], oc["misses"], oc["objects"]) == (2, 3, 3), oc
        objects = os.path.join(cache, "objects")
        kept = sorted(open(os.path.join(objects, f), "rb").read() for f in os.listdir(objects)
                      if len(f) == 32)
        assert kept == sorted(bodies)
        assert sorted(len(f) for f in os.listdir(objects)) == [32] * 3 + [35] * 3
        from test_metrics import get_unix, parse
        fams = parse(get_unix(msock)[2])
        assert [s.value for s in fams["loaderd_object_cache_checksum_mismatches"].samples] == [2]
        # every GET flipped: retried for store_retry_seconds, then the error
        bad, etag = bodies[0], f'"{hashlib.md5(bodies[0]).hexdigest()}"'
        s3.client("alice").put(BUCKET, "wds/flip-bad.tar", bad)
        proxy.flip = -1
        before = gets(proxy)
        r = create(ld, wds("bad", f"s3://{BUCKET}/wds/flip-bad.tar"), env, check=False)
        assert r.returncode != 0
        msg = (f"s3://{BUCKET}/wds/flip-bad.tar: the body's MD5 "
               f"{hashlib.md5(FaultProxy.flip_body(bad)).hexdigest()} does not match its ETag {etag} "
               f"({len(bad)} bytes); retried for 1 s")
        assert msg in r.stderr, r.stderr
        proxy.flip = 0
        tries = gets(proxy) - before
        assert tries >= 2 and proxy.flipped == 2 + tries
        oc = ld.status()["object_cache"]
        assert (oc["checksum_mismatches"], oc["objects"]) == (2 + tries, 3), oc
        assert sorted(len(f) for f in os.listdir(objects)) == [32] * 3 + [35] * 3
    finally:
        proxy.stop()


def test_kill9_during_fetch_serves_no_partial(daemon, workdir, s3):
    local, url, _ = shards(workdir, s3, "wds/k", nshards=1)
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    try:
        ld, cache = s3_daemon(daemon, workdir)
        ld.create(wds("local", local.replace("{000..000}", "000")))
        want = ld.consume("local").dump
        objects = os.path.join(cache, "objects")
        proxy.add(None, "stall")  # the HEAD goes through, the GET's body stalls half way
        t = threading.Thread(target=create, args=(ld, wds("remote", url), aws_env(proxy.endpoint)),
                             kwargs={"check": False}, daemon=True)
        t.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
                os.path.isdir(objects) and any(".tmp." in f for f in os.listdir(objects))):
            time.sleep(0.05)
        time.sleep(0.5)
        tmps = [f for f in os.listdir(objects) if ".tmp." in f]
        assert tmps and os.path.getsize(os.path.join(objects, tmps[0])) > 0, os.listdir(objects)
        ld.kill9()
        t.join(30)
        proxy.stall_release.set()
        # a new daemon on the same cache: the temporary is gone, nothing is
        # served from it, and the object is fetched whole
        os.unlink(ld.socket)
        ld2 = daemon("--cache-dir", cache, socket=os.path.join(workdir, "ld2.sock"))
        create(ld2, wds("remote", url), aws_env(s3.endpoint))
        assert ld2.status()["object_cache"]["misses"] == 1
        assert ld2.consume("remote").dump == want
        assert not [f for f in os.listdir(objects) if ".tmp." in f]
        ld2.stop()
        # and a third start reuses the complete file
        ld3 = daemon("--cache-dir", cache, socket=os.path.join(workdir, "ld3.sock"))
        create(ld3, wds("remote", url), aws_env(s3.endpoint))
        oc = ld3.status()["object_cache"]
        assert (oc["hits"], oc["misses"], oc["bytes_fetched"]) == (1, 0, 0), oc
        assert ld3.consume("remote").dump == want
    finally:
        proxy.stop()


def test_power_loss_rechecks_objects_of_another_boot(daemon, workdir, s3):
    """Cached files are renamed into place without an fsync: only a crash
    of the machine can tear one, and that is another boot. Each NAME.id
    carries the boot id it was written in and the CRC32C of the bytes
    fetched; an object of another boot is read and checked at its first
    open, a torn one fetched again, never served. (The power loss is the
    one thing a test cannot cause: its traces are written by hand, a boot
    id not this one and zeros over a file's middle.)"""
    local, url, _ = shards(workdir, s3, "wds/p")
    ld, cache = s3_daemon(daemon, workdir)
    ld.create(wds("local", local))
    want = ld.consume("local").dump
    create(ld, wds("remote", url), aws_env(s3.endpoint))
    assert ld.consume("remote").dump == want
    ld.stop()
    objects = os.path.join(cache, "objects")
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    ids = {}
    for f in sorted(os.listdir(objects)):
        if f.endswith(".id"):
            lines = open(os.path.join(objects, f)).read().split("\n")
            ids[lines[1].split(" ")[1]] = (f[:-3], lines)
    assert sorted(ids) == [url.replace("{000..002}", n) for n in ("000", "001", "002")]
    for name, lines in ids.values():
        assert len(lines) == 4 and lines[3] == "", lines
        stamp, crc = lines[2].split(" ")
        assert stamp == boot and re.fullmatch(r"[0-9a-f]{8}", crc), lines
        body = open(os.path.join(objects, name), "rb").read()
        assert int(lines[0]) == len(body)
    torn, whole, old = (ids[k] for k in sorted(ids))
    other = "00000000-0000-0000-0000-000000000000"
    for name, lines in (torn, whole):
        with open(os.path.join(objects, name + ".id"), "w") as f:
            f.write("\n".join(lines[:2] + [other + " " + lines[2].split(" ")[1], ""]))
    size = os.path.getsize(os.path.join(objects, torn[0]))
    with open(os.path.join(objects, torn[0]), "r+b") as f:  # its length kept, its middle zeros
        f.seek(size // 3)
        f.write(bytes(size // 3))
    with open(os.path.join(objects, old[0] + ".id"), "w") as f:  # an older daemon's id: no sum
        f.write("\n".join(old[1][:2] + [""]))
    msock = os.path.join(workdir, "power-metrics.sock")
    cfg = os.path.join(workdir, "power.json")
    with open(cfg, "w") as f:
        json.dump({"metrics_address": msock}, f)
    ld2 = daemon("--cache-dir", cache, "--config", cfg, socket=os.path.join(workdir, "ld2.sock"))
    create(ld2, wds("remote", url), aws_env(s3.endpoint))
    oc = ld2.status()["object_cache"]
    assert (oc["rechecked"], oc["recheck_failures"], oc["hits"], oc["misses"]) == (2, 1, 1, 2), oc
    assert oc["bytes_fetched"] == size + os.path.getsize(os.path.join(objects, old[0])), oc
    assert ld2.consume("remote").dump == want
    from test_metrics import get_unix, parse
    fams = parse(get_unix(msock)[2])
    assert [s.value for s in fams["loaderd_object_cache_rechecked"].samples] == [2]
    assert [s.value for s in fams["loaderd_object_cache_recheck_failures"].samples] == [1]
    for name, lines in ids.values():  # every id of this boot again, each sum the same
        assert open(os.path.join(objects, name + ".id")).read().split("\n") == lines
    ld2.stop()
    # a third start: nothing to check, every object from the cache
    ld3 = daemon("--cache-dir", cache, socket=os.path.join(workdir, "ld3.sock"))
    create(ld3, wds("remote", url), aws_env(s3.endpoint))
    oc = ld3.status()["object_cache"]
    assert (oc["rechecked"], oc["recheck_failures"], oc["hits"], oc["misses"]) == (0, 0, 3, 0), oc
    assert ld3.consume("remote").dump == want


def test_bob_cannot_read_alices_objects(daemon, workdir, s3, users):
    alice_u, bob_u = users
    open_to_all(workdir)
    local, url, _ = shards(workdir, s3, "wds/u")
    cache = os.path.join(workdir, "cache")
    ld = daemon("--cache-dir", cache, "--config", shared_config(workdir))
    ld.create(wds("local", local))
    want = ld.consume("local").dump

    def spec_file(spec):
        p = ld.spec_file(spec)
        os.chmod(p, 0o644)
        return p

    # alice fetches them into the cache, in a pipeline every user may read
    r = alice_u.run(ld.ctl_cmd("create", "--spec", spec_file(wds("alices", url, access="all"))),
                    env=aws_env(s3.endpoint, "alice"))
    assert r.returncode == 0, r.stderr
    assert ld.status()["object_cache"]["objects"] == 3
    # bob's own pipeline over them: his keys are checked (a HEAD as bob),
    # the cached copies are never his
    r = bob_u.run(ld.ctl_cmd("create", "--spec", spec_file(wds("bobs", url))), env=aws_env(s3.endpoint, "bob"))
    assert r.returncode != 0
    assert r.stderr == f"loaderctl: create: s3://{BUCKET}/wds/u-000.tar: AccessDenied: Access Denied. (HTTP 403)\n", \
        r.stderr
    assert ld.status()["object_cache"]["hits"] == 0
    # bob's create of alice's spec with exist_ok joins nothing of hers
    r = bob_u.run(ld.ctl_cmd("create", "--exist-ok", "--spec", spec_file(wds("alices", url, access="all"))),
                  env=aws_env(s3.endpoint, "bob"))
    assert r.returncode != 0 and "exist_ok joins only your own pipelines" in r.stderr, r.stderr
    # but alice shared her pipeline ("access": "all"): bob may attach to it
    # and read what her keys fetched, as with her local files; he never
    # sees her keys, and his own create over her objects stays refused
    # (docs/security.md, "Objects in a store")
    bobdir = os.path.join(workdir, "bob")
    os.mkdir(bobdir)
    os.chown(bobdir, bob_u.uid, bob_u.gid)
    r = bob_u.run(ld.ctl_cmd("consume", "alices", "--dump", os.path.join(bobdir, "bob.dump")))
    assert r.returncode == 0, r.stderr
    with open(os.path.join(bobdir, "bob.dump"), "rb") as f:
        assert f.read() == want
    # alice's keys in status: the last 4 characters of hers, to bob too
    st = json.loads(bob_u.run(ld.ctl_cmd("status", json_out=True)).stdout)
    mine = [p for p in st["pipelines"] if p["name"] == "alices"]
    assert mine and mine[0]["store"]["access_key_id"] == IDENTITIES["alice"][0][-4:]
    assert IDENTITIES["alice"][1] not in json.dumps(st)


def write_megatron_pair(prefix, docs):
    """A Megatron-LM .bin/.idx pair of uint16 documents (one sequence each),
    in the MMIDIDX format megatron-core's IndexedDatasetBuilder writes."""
    lens = [len(d) for d in docs]
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype=np.uint16).tobytes())
    ptrs = np.concatenate([[0], np.cumsum(lens)[:-1] * 2]).astype(np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
        f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(docs) + 1))
        f.write(np.asarray(lens, dtype=np.int32).tobytes() + ptrs.tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())
    return prefix


def test_megatron_over_s3_equals_local(daemon, workdir, s3):
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 5000, size=int(rng.integers(3, 40))) for _ in range(60)]
    prefix = write_megatron_pair(os.path.join(workdir, "corpus"), docs)
    alice = s3.client("alice")
    for ext in (".bin", ".idx"):
        with open(prefix + ext, "rb") as f:
            alice.put(BUCKET, "mg/corpus" + ext, f.read())
    ld, _ = s3_daemon(daemon, workdir)
    spec = lambda name, p: {"name": name, "batch_size": 4,  # noqa: E731
                            "source": {"kind": "megatron", "prefix": p, "seq_len": 16}}
    ld.create(spec("local", prefix))
    want = ld.consume("local").dump
    assert want
    create(ld, spec("remote", f"s3://{BUCKET}/mg/corpus"), aws_env(s3.endpoint))
    assert ld.consume("remote").dump == want
    assert ld.status()["object_cache"]["objects"] == 2


def upload_pair(s3, prefix, key):
    alice = s3.client("alice")
    for ext in (".bin", ".idx"):
        with open(prefix + ext, "rb") as f:
            alice.put(BUCKET, key + ext, f.read())


def megatron_index_rows(cache, url):
    """The sample_index rows (document positions) of the megatron index that
    the daemon cached in @cache for the object @url (its key names it:
    megatron-cache.c's layout), and its key."""
    found = []
    for name in os.listdir(cache):
        if not (name.startswith("megatron-") and name.endswith(".index")):
            continue
        with open(os.path.join(cache, name), "rb") as f:
            b = f.read()
        assert b[:8] == b"LDRMGIX5"
        klen = struct.unpack_from("<Q", b, 8)[0]
        key = b[16:16 + klen].decode()
        at = 16 + (klen + 7) // 8 * 8
        ndoc, nsamples, _, _ = struct.unpack_from("<4Q", b, at)
        at += 32 + 40 + (ndoc * 4 + 7) // 8 * 8
        rows = np.frombuffer(b, dtype=np.int32, count=2 * (nsamples + 1), offset=at)[0::2]
        if f" {url} " in key:
            found.append((rows, key))
    assert len(found) == 1, [k for _, k in found]
    return found[0]


def test_megatron_larger_than_cache_read_by_range(daemon, workdir, s3):
    """A megatron pair of more than cache_bytes: its .idx fetched whole into
    the cache, its .bin read by range (a ranged GET per document piece of a
    sample, straight into the batch, nothing of it on disk): two shuffled
    epochs byte for byte the pair on local disk. The index is cached under
    the objects' URLs and ETags: reused by a second create and after a
    restart, built again for an object written again. A blend of a ranged
    prefix and one that fits; 503s park a batch, then it is built; an .idx
    more than the cache is an error naming it."""
    rng = np.random.default_rng(21)
    docs = [rng.integers(0, 5000, size=int(rng.integers(3, 40))) for _ in range(90)]
    local = write_megatron_pair(os.path.join(workdir, "mgr"), docs)
    upload_pair(s3, local, "mg/rg/c")
    small = write_megatron_pair(os.path.join(workdir, "mgs"), docs[:6])
    upload_pair(s3, small, "mg/rg/small")
    bin_size, idx_size = os.path.getsize(local + ".bin"), os.path.getsize(local + ".idx")
    small_size = os.path.getsize(small + ".bin") + os.path.getsize(small + ".idx")
    assert idx_size + small_size < bin_size - 1
    ld, objects, msock = ranged_daemon(daemon, workdir, bin_size - 1, "mgrange")
    cache = os.path.dirname(objects)
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    env = aws_env(proxy.endpoint)
    url = f"s3://{BUCKET}/mg/rg/c"
    L = 16

    def spec(name, prefix, **kw):
        src = dict({"kind": "megatron", "prefix": prefix, "seq_len": L}, **kw)
        return {"name": name, "batch_size": 4, "shuffle": True, "seed": 3, "epochs": 2, "source": src}

    try:
        ld.create(spec("local", local))
        want = ld.consume("local").dump
        n0, g0 = len(proxy.heads), gets(proxy)
        create(ld, spec("remote", url), env)
        heads = proxy.heads[n0:]
        # a HEAD of each object, the .idx fetched whole (one GET), no more
        assert sorted(h.split(b" ")[0:2] for h in heads) == [
            [b"GET", b"/alice-data/mg/rg/c.idx"], [b"HEAD", b"/alice-data/mg/rg/c.bin"],
            [b"HEAD", b"/alice-data/mg/rg/c.idx"]], heads
        assert ld.consume("remote").dump == want
        p = ld.pipeline("remote")
        assert p["cache"]["index"] == "built", p["cache"]
        rows, key = megatron_index_rows(cache, url + ".bin")
        assert f"object {proxy.endpoint} {url}.idx " in key, key
        # each sample one ranged GET per document it spans (the rows' own
        # positions, whatever the shuffle), two epochs
        pieces = int(np.sum(rows[1:] - rows[:-1] + 1))
        ntok = 2 * (len(rows) - 1) * (L + 1)
        assert gets(proxy) - g0 - 1 == 2 * pieces, (gets(proxy) - g0, pieces)
        store = p["store"]
        assert (store["ranged"], store["ranged_gets"], store["ranged_bytes"], store["parked_batches"]) == \
            (True, 2 * pieces, 2 * ntok, 0), store
        oc = ld.status()["object_cache"]
        assert (oc["objects"], oc["bytes_fetched"], oc["ranged_gets"]) == (1, idx_size, 2 * pieces), oc
        # on disk: the .idx alone, nothing of the .bin
        assert cached_bytes(objects) == idx_size
        from test_metrics import get_unix, parse
        fams = parse(get_unix(msock)[2])
        assert [s.value for s in fams["loaderd_object_store_ranged_gets"].samples] == [2 * pieces]

        # a second create: the index reused (keyed by URL and ETag), the
        # .idx taken from the cache
        create(ld, spec("again", url), env)
        assert ld.pipeline("again")["cache"]["index"] == "reused"
        assert ld.consume("again").dump == want
        # vocab_size: the create scans the tokens by range (64 Ki tokens a
        # GET: one here), and a token past it fails the create naming the
        # offset in the .bin
        g0 = gets(proxy)
        create(ld, spec("vocab", url, vocab_size=5000), env)
        assert gets(proxy) - g0 == 1
        assert ld.consume("vocab").dump == want
        big = max(range(len(docs)), key=lambda i: int(np.max(docs[i])))
        top = int(np.max(docs[big]))
        off = 2 * (sum(len(d) for d in docs[:big]) + int(np.argmax(docs[big])))
        r = create(ld, spec("vocab-bad", url, vocab_size=top), env, check=False)
        assert r.returncode != 0 and f"{url}.bin: offset {off}: token id {top} is not in 0..{top - 1} " \
            f"(source.vocab_size {top})" in r.stderr, r.stderr

        # a blend of the ranged prefix and one that fits (fetched whole)
        def bspec(name, prefixes):
            sp = spec(name, None, prefixes=prefixes, weights=[0.7, 0.3], num_samples=30)
            del sp["source"]["prefix"]
            return sp
        ld.create(bspec("l-blend", [local, small]))
        create(ld, bspec("r-blend", [url, f"s3://{BUCKET}/mg/rg/small"]), env)
        want_blend = ld.consume("l-blend").dump
        assert want_blend and ld.consume("r-blend").dump == want_blend
        assert cached_bytes(objects) == idx_size + small_size
        # status: the ranged part's GETs, under its part (the pair that
        # fits makes none)
        pl = ld.pipeline("r-blend")
        parts = pl["source"]["parts"]
        assert parts[0]["ranged"] and parts[0]["ranged_gets"] > 0 and "ranged" not in parts[1], parts
        # and in the pipeline's store, as for a single source
        assert (pl["store"]["ranged"], pl["store"]["ranged_gets"], pl["store"]["ranged_bytes"]) == \
            (True, parts[0]["ranged_gets"], parts[0]["ranged_bytes"]), pl["store"]

        # the store does not answer: a batch parks, then is built (a
        # single pair, and a blend's ranged part)
        for name, sp, expect in (("r-out", spec("r-out", url), want),
                                 ("rb-out", bspec("rb-out", [url, f"s3://{BUCKET}/mg/rg/small"]),
                                  want_blend)):
            create(ld, sp, env)
            proxy.add(*(["503"] * 100000))
            c = ld.popen_consume(name)
            ld.wait_for(lambda st: [p for p in st["pipelines"] if p["name"] == name][0]["store"]
                        ["parked_batches"] > 0, "a batch parked for the store", timeout=60)
            parked = ld.pipeline(name)["store"]["parked"][0]
            assert parked["why"] == "store" and parked["error"] == (
                f"{url}.bin: SlowDown: Please reduce your request rate. (HTTP 503); retried for 0.3 s"), parked
            ld.wait_for(lambda st: "wait for the store" in [p for p in st["pipelines"] if p["name"] == name][0]
                        ["stats"]["limited_why"], "limited_why naming the store", timeout=60)
            assert f"batches wait for the store {proxy.endpoint}, which does not answer" in \
                ld.pipeline(name)["stats"]["limited_why"]
            while not proxy.faults.empty():
                proxy.faults.get_nowait()
            res = c.wait(timeout=120)
            assert res.rc == 0 and res.dump == expect, res.describe()
            assert (ld.pipeline(name)["skipped"], ld.pipeline(name)["store"]["parked_batches"]) == (0, 0)

        # a restart: the index found again under the same URLs and ETags
        ld.stop()
        ld = daemon("--cache-dir", cache, "--config", os.path.join(workdir, "mgrange.json"))
        create(ld, spec("restarted", url), env)
        assert ld.pipeline("restarted")["cache"]["index"] == "reused"
        assert ld.consume("restarted").dump == want
        create(ld, spec("old", url), env)

        # the pair written again (new ETags, same sizes): a new index
        docs2 = [rng.integers(0, 5000, size=len(d)) for d in docs]
        local2 = write_megatron_pair(os.path.join(workdir, "mgr2"), docs2)
        upload_pair(s3, local2, "mg/rg/c")
        create(ld, spec("changed", url), env)
        assert ld.pipeline("changed")["cache"]["index"] == "built"
        ld.create(spec("local2", local2))
        want2 = ld.consume("local2").dump
        assert want2 != want and ld.consume("changed").dump == want2
        # a pipeline of the old objects fails naming the .bin (If-Match)
        r = ld.consume("old", check=False)
        assert r.rc != 0 and f"{url}.bin: PreconditionFailed" in r.stderr, r.stderr
        p = ld.pipeline("old")
        assert p["state"] == "failed" and f"{url}.bin: PreconditionFailed" in p["error"], p

        # an .idx more than the cache: the create fails naming it
        tiny = write_megatron_pair(os.path.join(workdir, "mgt"), [[7]] * 400)
        upload_pair(s3, tiny, "mg/rg/tiny")
        tiny_idx = os.path.getsize(tiny + ".idx")
        assert tiny_idx > bin_size - 1
        r = create(ld, spec("big-idx", f"s3://{BUCKET}/mg/rg/tiny"), env, check=False)
        assert r.returncode != 0
        assert f"s3://{BUCKET}/mg/rg/tiny.idx: {tiny_idx} bytes, more than the object cache's " \
            f"cache_bytes {bin_size - 1}: a megatron .idx is read whole (only its .bin by range)" in r.stderr, \
            r.stderr
    finally:
        proxy.stop()


def test_megatron_blend_of_pairs_that_fit_alone(daemon, workdir, s3):
    """A blend of two pairs that each fit cache_bytes, not both: the one
    opened last finds no room beside the other's and is read by range
    (both, when they fetched at once) instead of failing the create; the
    batches are the local blend's."""
    rng = np.random.default_rng(2)
    local, remote = [], []
    for i in range(2):
        docs = [rng.integers(0, 5000, size=int(rng.integers(3, 40))) for _ in range(40)]
        local.append(write_megatron_pair(os.path.join(workdir, f"fa{i}"), docs))
        upload_pair(s3, local[i], f"mg/fa/p{i}")
        remote.append(f"s3://{BUCKET}/mg/fa/p{i}")
    one = max(os.path.getsize(p + ".bin") + os.path.getsize(p + ".idx") for p in local)
    ld, objects, _ = ranged_daemon(daemon, workdir, one * 3 // 2, "fitalone")

    def spec(name, prefixes):
        return {"name": name, "batch_size": 4, "shuffle": True, "seed": 1, "source": {
            "kind": "megatron", "prefixes": prefixes, "weights": [0.5, 0.5], "num_samples": 40,
            "seq_len": 8}}
    ld.create(spec("local", local))
    want = ld.consume("local").dump
    create(ld, spec("remote", remote), aws_env(s3.endpoint))
    assert want and ld.consume("remote").dump == want
    p = ld.pipeline("remote")
    ranged = [q for q in p["source"]["parts"] if q.get("ranged")]
    assert ranged and p["store"]["ranged_gets"] == sum(q["ranged_gets"] for q in ranged) > 0, p
    assert cached_bytes(objects) <= one * 3 // 2


def test_cache_bytes_config(daemon, workdir):
    """cache_bytes (docs/config.md): a size, read at start; a reload that
    changes it names it as needing a restart; a bad value is an error
    naming the file and the key."""
    cfg = os.path.join(workdir, "loaderd.json")
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": "2G", "cache_dir": os.path.join(workdir, "c")}, f)
    d = daemon("--config", cfg)
    assert d.status()["object_cache"]["cache_bytes"] == 2 << 30
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": 1000, "cache_dir": os.path.join(workdir, "c")}, f)
    assert d.ctl_json("reload")["restart_needed"] == [{"key": "cache_bytes", "running": 2 << 30, "file": 1000}]
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": "lots"}, f)
    r = d.ctl("reload", check=False)
    assert r.returncode == 1 and r.stderr == (f"loaderctl: reload: {cfg}: cache_bytes: must be bytes or a size "
                                              'like "10G"; the running config is kept\n'), r.stderr
    # the folders are made only when a store is first read
    assert not os.path.exists(os.path.join(workdir, "c"))


def test_fetch_ahead_config(daemon, workdir):
    """fetch_ahead (docs/config.md): a size, at most half of cache_bytes;
    a reload that changes it names it as needing a restart."""
    cfg = os.path.join(workdir, "loaderd.json")
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": "1G", "fetch_ahead": "64M", "cache_dir": os.path.join(workdir, "c")}, f)
    d = daemon("--config", cfg)
    assert d.status()["object_cache"]["fetch_ahead"] == 64 << 20
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": "1G", "fetch_ahead": "2G", "cache_dir": os.path.join(workdir, "c")}, f)
    assert d.ctl_json("reload")["restart_needed"] == [{"key": "fetch_ahead", "running": 64 << 20, "file": 2 << 30}]
    with open(cfg, "w") as f:
        json.dump({"fetch_ahead": -1}, f)
    r = d.ctl("reload", check=False)
    assert r.returncode == 1 and r.stderr == (f"loaderctl: reload: {cfg}: fetch_ahead: must be bytes or a size "
                                              'like "256M"; the running config is kept\n'), r.stderr
    d.stop()
    # without it: 256 MiB, at most half of cache_bytes
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": "100M", "cache_dir": os.path.join(workdir, "c")}, f)
    d = daemon("--config", cfg, socket=os.path.join(workdir, "ld2.sock"))
    assert d.status()["object_cache"]["fetch_ahead"] == 50 << 20


def test_stream_object_changed_mid_run(daemon, workdir, s3):
    """A shard replaced in the store after the create: its GET is refused
    (If-Match), the batch fails naming it (on_error fail), or its samples
    are skipped (on_error skip); /metrics shows the stream's counters."""
    local, url, n = shards(workdir, s3, "wds/chg", nshards=4, per_class=8)
    sizes = [os.path.getsize(local.replace("{000..003}", f"{s:03d}")) for s in range(4)]
    msock = os.path.join(workdir, "metrics.sock")
    cache = os.path.join(workdir, "chg")
    cfg = os.path.join(workdir, "chg.json")
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": 2 * max(sizes), "metrics_address": msock}, f)
    ld = daemon("--cache-dir", cache, "--config", cfg)
    env = aws_env(s3.endpoint)
    create(ld, wds("fail", url, shuffle=False, on_error="fail"), env)
    create(ld, wds("skip", url, shuffle=False, on_error="skip"), env)
    with open(local.replace("{000..003}", "001"), "rb") as f:
        s3.client("alice").put(BUCKET, "wds/chg-000.tar", f.read())
    r = ld.consume("fail", check=False)
    assert r.rc != 0
    assert f"s3://{BUCKET}/wds/chg-000.tar: PreconditionFailed" in r.stderr, r.stderr
    assert "the object changed since its ETag" in r.stderr, r.stderr
    r = ld.consume("skip")
    per_shard = n // 4
    p = ld.pipeline("skip")
    assert p["stats"]["skipped_total"] == per_shard, p["stats"]
    assert len(r.dump) == n * (20 * 20 * 3 + 8)
    st = ld.status()
    oc, stream = st["object_cache"], ld.pipeline("skip")["store"]["stream"]
    from test_metrics import get_unix, parse
    fams = parse(get_unix(msock)[2])

    def value(name, pipeline=None):
        fam = fams[name]
        got = [s.value for s in fam.samples if pipeline is None or s.labels.get("pipeline") == pipeline]
        assert len(got) == 1, (name, fam.samples)
        return got[0]
    assert value("loaderd_object_cache_misses") == oc["misses"]
    assert value("loaderd_object_cache_evictions") == oc["evictions"]
    assert value("loaderd_object_cache_fetching_objects") == oc["fetching"] == 0
    assert value("loaderd_object_cache_fetch_ahead_bytes") == oc["fetch_ahead"] == max(sizes)
    assert value("loaderd_pipeline_stream_reads_waited", "skip") == stream["reads_waited"]
    assert value("loaderd_pipeline_stream_readers_waiting", "skip") == 0


def tokens_corpus(workdir, s3, prefix):
    """Three uint16 token shards with eos (0) documents, on disk and as
    alice's s3://alice-data/PREFIX/shard-00N.bin; the local directory."""
    rng = np.random.default_rng(12)
    local = os.path.join(workdir, prefix.replace("/", "_"))
    os.makedirs(local)
    alice = s3.client("alice")
    for s, n in enumerate((301, 157, 240)):
        arr = rng.integers(1, 3000, size=n).astype(np.uint16)
        arr[rng.choice(n, size=n // 25, replace=False)] = 0
        arr.tofile(os.path.join(local, f"shard-{s:03d}.bin"))
        alice.put(BUCKET, f"{prefix}/shard-{s:03d}.bin", arr.tobytes())
    # keys a glob over the prefix must pass by: one level down, another name
    alice.put(BUCKET, f"{prefix}/shard-sub/shard-9.bin", b"\0\0")
    alice.put(BUCKET, f"{prefix}/other.bin", b"\0\0")
    return local


def test_tokens_over_s3_equals_local(daemon, workdir, s3):
    local = tokens_corpus(workdir, s3, "tok/a")
    url = f"s3://{BUCKET}/tok/a"
    ld, _ = s3_daemon(daemon, workdir)
    env = aws_env(s3.endpoint)

    def spec(name, paths, **src):
        src = dict({"kind": "tokens", "paths": paths, "dtype": "uint16"}, **src)
        src.setdefault("seq_len", 12) if "packing" not in src else None
        return {"name": name, "batch_size": 3, "shuffle": True, "seed": 5, "source": src}

    for what, src in (("file", {"boundaries": "file"}), ("doc", {"boundaries": "document", "eos": 0}),
                      ("pack", {"boundaries": "document", "eos": 0, "packing": {"seq_len": 12}})):
        # a brace range, a plain name and a glob over the prefix
        for form, lp, rp in (("list", [local + "/shard-{000..001}.bin", local + "/shard-002.bin"],
                              [url + "/shard-{000..001}.bin", url + "/shard-002.bin"]),
                             ("glob", [local + "/shard-*.bin"], [url + "/shard-*.bin"])):
            ld.create(spec(f"l-{what}-{form}", lp, **src))
            want = ld.consume(f"l-{what}-{form}").dump
            assert want
            create(ld, spec(f"r-{what}-{form}", rp, **src), env)
            assert ld.consume(f"r-{what}-{form}").dump == want, (what, form)
    # each object fetched once, the decoys never
    oc = ld.status()["object_cache"]
    assert (oc["objects"], oc["misses"]) == (3, 3), oc
    # a glob that matches nothing, one over https, a missing shard
    for paths, msg in (([url + "/none-*.bin"], f"{url}/none-*.bin: no object matches"),
                       ([s3.endpoint + "/alice-data/tok/a/shard-*.bin"],
                        f"{s3.endpoint}/alice-data/tok/a/shard-*.bin: a glob needs a local path or an s3:// "
                        "URL (an http(s):// server cannot be listed)"),
                       ([f"s3://{BUCKET}*"], f"s3://{BUCKET}*: a glob in a bucket's name (s3://bucket/key: only "
                        "the key's file name may have one)"),
                       ([url + "/shard-{000..003}.bin"],
                        f"{url}/shard-003.bin: NoSuchKey: The specified key does not exist. (HTTP 404)")):
        r = create(ld, spec("bad", paths), env, check=False)
        assert r.returncode != 0 and msg in r.stderr, r.stderr


def blend(name, parts):
    return {"name": name, "batch_size": 4, "shuffle": True, "seed": 2,
            "source": {"kind": "blend", "sources": parts, "weights": [2, 1], "size": 90}}


def test_blend_of_local_and_s3_parts(daemon, workdir, s3, users):
    """A blend's parts fetch with the pipeline's keys (its creator's)."""
    _, bob_u = users
    open_to_all(workdir)
    rng = np.random.default_rng(9)
    prefixes = []
    for name in ("bl0", "bl1"):
        docs = [rng.integers(0, 5000, size=int(rng.integers(3, 40))) for _ in range(40)]
        prefixes.append(write_megatron_pair(os.path.join(workdir, name), docs))
        for ext in (".bin", ".idx"):
            with open(prefixes[-1] + ext, "rb") as f:
                s3.client("alice").put(BUCKET, f"blend/{name}{ext}", f.read())
    local = tokens_corpus(workdir, s3, "blend/tok")
    ld = daemon("--cache-dir", os.path.join(workdir, "cache"), "--config", shared_config(workdir))
    env = aws_env(s3.endpoint)
    tok = lambda p, n: {"kind": "tokens", "paths": [p + "/shard-{000..002}.bin"],  # noqa: E731
                        "dtype": "uint16", "seq_len": 16, "name": n}
    mg = lambda p: {"kind": "megatron", "prefix": p, "seq_len": 16}  # noqa: E731
    remote = f"s3://{BUCKET}/blend/"
    # megatron parts, one local and one in the store, then both in the store
    ld.create(blend("mg-local", [mg(prefixes[0]), mg(prefixes[1])]))
    want = ld.consume("mg-local").dump
    assert want
    create(ld, blend("mg-half", [mg(prefixes[0]), mg(remote + "bl1")]), env)
    assert ld.consume("mg-half").dump == want
    create(ld, blend("mg-both", [mg(remote + "bl0"), mg(remote + "bl1")]), env)
    assert ld.consume("mg-both").dump == want
    assert ld.pipeline("mg-both")["store"]["access_key_id"] == IDENTITIES["alice"][0][-4:]
    # tokens parts: one local, one in the store
    ld.create(blend("tok-local", [tok(local, "a"), tok(local, "b")]))
    want = ld.consume("tok-local").dump
    create(ld, blend("tok-half", [tok(local, "a"), tok(remote + "tok", "b")]), env)
    assert ld.consume("tok-half").dump == want
    # bob's blend of the same parts, with his own keys: his HEAD is refused,
    # though alice's copies are in the cache
    hits = ld.status()["object_cache"]["hits"]
    p = ld.spec_file(blend("bobs", [mg(prefixes[0]), mg(remote + "bl1")]))
    os.chmod(p, 0o644)
    r = bob_u.run(ld.ctl_cmd("create", "--spec", p), env=aws_env(s3.endpoint, "bob"))
    assert r.returncode != 0
    assert r.stderr == (f"loaderctl: create: source.sources[1]: {remote}bl1.bin: AccessDenied: "
                        "Access Denied. (HTTP 403)\n"), r.stderr
    assert ld.status()["object_cache"]["hits"] == hits


def ranged_daemon(daemon, workdir, cache_bytes, name):
    cache = os.path.join(workdir, name)
    cfg = os.path.join(workdir, name + ".json")
    msock = os.path.join(workdir, name + "-metrics.sock")
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": cache_bytes, "store_retry_seconds": 0.3, "metrics_address": msock}, f)
    return daemon("--cache-dir", cache, "--config", cfg), os.path.join(cache, "objects"), msock


def assert_nothing_cached(ld, objects, msock, all_gets):
    """Sources read by range: nothing fetched into the node's cache, nothing
    on its disk, and @all_gets ranged GETs in status and /metrics."""
    oc = ld.status()["object_cache"]
    assert (oc["objects"], oc["misses"], oc["bytes_fetched"], oc["ranged_gets"]) == (0, 0, 0, all_gets), oc
    assert cached_bytes(objects) == 0
    from test_metrics import get_unix, parse
    fams = parse(get_unix(msock)[2])
    assert [s.value for s in fams["loaderd_object_store_ranged_gets"].samples] == [all_gets]


def park_reads(ld, proxy, name, fault, stream=False):
    """Every answer of the store is @fault while @name is read: its reader
    (the consume) and the first parked batch once one parks (in
    store.stream for a source read as a stream)."""
    def store(st):
        p = [p for p in st["pipelines"] if p["name"] == name][0]["store"]
        return p["stream"] if stream else p
    proxy.add(*([fault] * 100000))
    c = ld.popen_consume(name)
    ld.wait_for(lambda st: store(st)["parked_batches"] > 0, "a batch parked", timeout=60)
    return c, store(ld.status())["parked"][0]


def unpark(ld, proxy, c, name, want, stream=False):
    """The store answers again: the reader @c of @name ends well with
    @want, nothing skipped, nothing parked."""
    with proxy.faults.mutex:
        proxy.faults.queue.clear()
    res = c.wait(timeout=120)
    assert res.rc == 0 and res.dump == want, res.describe()
    p = ld.pipeline(name)
    assert (p["skipped"], (p["store"]["stream"] if stream else p["store"])["parked_batches"]) == (0, 0), p


def refuse_keys(ld, proxy, name):
    """park_reads() of a store that refuses the keys (403 AccessDenied)."""
    denied = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code>"
              b"<Message>Access Denied.</Message></Error>")
    return park_reads(ld, proxy, name, ("answer", 403, denied))


def test_tokens_larger_than_cache_read_by_range(daemon, workdir, s3):
    """A tokens corpus of more than cache_bytes is read by range: each
    window one ranged GET per file it touches, straight into the batch,
    nothing in the cache; two shuffled epochs byte for byte the same files
    on disk, for boundaries file, none (windows across files: two GETs),
    random_offset, document (the create's scan reads each object once, by
    range) and packing (a GET per piece of a row). Then a store outage and
    refused keys park batches, and a changed object fails naming it."""
    local = tokens_corpus(workdir, s3, "tok/rg")
    url = f"s3://{BUCKET}/tok/rg"
    sizes = [os.path.getsize(os.path.join(local, f"shard-{s:03d}.bin")) // 2 for s in range(3)]
    total = 2 * sum(sizes)
    ld, objects, msock = ranged_daemon(daemon, workdir, total - 1, "ranged")
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    env = aws_env(proxy.endpoint)
    L = 12
    firsts = [sum(sizes[:i]) for i in range(3)]

    def spec(name, paths, **src):
        src = dict({"kind": "tokens", "paths": paths, "dtype": "uint16"}, **src)
        if "packing" not in src:
            src["seq_len"] = L
        return {"name": name, "batch_size": 3, "shuffle": True, "seed": 5, "epochs": 2, "source": src}

    def files_touched(start):  # files the window [start, start + L + 1) reads
        return sum(1 for f, n in zip(firsts, sizes) if f < start + L + 1 and start < f + n)

    all_gets = 0
    try:
        for what, src in (("file", {"boundaries": "file"}), ("none", {"boundaries": "none"}),
                          ("rand", {"sampling": "random_offset", "samples_per_epoch": 40}),
                          ("doc", {"boundaries": "document", "eos": 0}),
                          ("pack", {"boundaries": "document", "eos": 0, "packing": {"seq_len": L}})):
            ld.create(spec(f"l-{what}", [local + "/shard-{000..002}.bin"], **src))
            want = ld.consume(f"l-{what}").dump
            # a sample: input and target (int64); packed rows add position_ids
            # (int64), cu_seqlens (int32, L + 1) and loss_mask (float32)
            per_sample = 2 * L * 8 + (L * 8 + (L + 1) * 4 + L * 4 if what == "pack" else 0)
            per_epoch = len(want) // (2 * per_sample)
            assert per_epoch and len(want) == 2 * per_epoch * per_sample
            n0, g0 = len(proxy.heads), gets(proxy)
            create(ld, spec(f"r-{what}", [url + "/shard-{000..002}.bin"], **src), env)
            heads = proxy.heads[n0:]
            # a HEAD of each object; the scan of documents reads each once
            assert sum(1 for h in heads if h.startswith(b"HEAD ")) == 3, heads
            create_gets = 3 if what in ("doc", "pack") else 0
            assert gets(proxy) - g0 == create_gets, heads
            got = ld.consume(f"r-{what}")
            assert got.dump == want, what
            pl = ld.pipeline(f"r-{what}")
            if what == "none":
                ranges = sum(files_touched(i * L) for i in range(per_epoch))
                assert ranges > per_epoch  # some windows cross a file's end
            elif what == "pack":
                ranges = pl["packing"]["pieces"]  # each piece of a row: one range
                assert ranges > per_epoch
            else:
                ranges = per_epoch
            assert gets(proxy) - g0 - create_gets == 2 * ranges, what
            all_gets += create_gets + 2 * ranges
            store = pl["store"]
            assert (store["ranged"], store["ranged_gets"]) == (True, create_gets + 2 * ranges), store
            tokens = pl["packing"]["tokens"] if what == "pack" else per_epoch * (L + 1)
            read = 2 * tokens * 2 + (total if create_gets else 0)
            assert store["ranged_bytes"] == read, store
            assert store["parked_batches"] == 0 and "stream" not in store, store
        assert_nothing_cached(ld, objects, msock, all_gets)

        # the store does not answer (503s past store_retry_seconds): the
        # batches wait, shown in status, then are built once it answers
        create(ld, spec("r-out", [url + "/shard-{000..002}.bin"]), env)
        proxy.add(*(["503"] * 100000))
        c = ld.popen_consume("r-out")
        ld.wait_for(lambda st: [p for p in st["pipelines"] if p["name"] == "r-out"][0]["store"]
                    ["parked_batches"] > 0, "a batch parked for the store", timeout=60)
        p = ld.pipeline("r-out")
        # limited_by names the store (its trainer waits: the batch is parked)
        ld.wait_for(lambda st: "wait for the store" in [p for p in st["pipelines"] if p["name"] == "r-out"][0]
                    ["stats"]["limited_why"], "limited_why naming the store", timeout=60)
        assert f"batches wait for the store {proxy.endpoint}, which does not answer" in \
            ld.pipeline("r-out")["stats"]["limited_why"]
        parked = p["store"]["parked"][0]
        assert parked["why"] == "store" and re.fullmatch(
            re.escape(f"{url}/shard-00") + r"[0-2]\.bin: SlowDown: Please reduce your request rate\. "
            r"\(HTTP 503\); retried for 0\.3 s", parked["error"]), parked
        while not proxy.faults.empty():
            proxy.faults.get_nowait()
        res = c.wait(timeout=120)
        assert res.rc == 0 and res.dump == ld.consume("l-file").dump, res.describe()
        p = ld.pipeline("r-out")
        assert (p["skipped"], p["store"]["parked_batches"]) == (0, 0), p

        # the store refuses the keys while a pipeline reads: its batch waits
        # for fresh ones (as a stream's, docs/storage.md), then goes on
        create(ld, spec("r-keys", [url + "/shard-{000..002}.bin"]), env)
        c, parked = refuse_keys(ld, proxy, "r-keys")
        assert parked["why"] == "keys" and re.fullmatch(
            re.escape(f"{url}/shard-00") + r"[0-2]\.bin: AccessDenied: Access Denied\. \(HTTP 403\)",
            parked["error"]), parked
        # the reader is told the store's words once, at the first batch
        # (loaderctl exits on them): nothing was delivered
        res = c.wait(timeout=120)
        assert res.rc != 0 and f"{url}/shard-00" in res.stderr and \
            ".bin: AccessDenied: Access Denied. (HTTP 403)" in res.stderr, res.describe()
        while not proxy.faults.empty():
            proxy.faults.get_nowait()
        ld.ctl("credentials", "r-keys", env=env)
        # a reader attached now reads it all, the parked batches built
        # again with the same bytes
        assert ld.consume("r-keys").dump == ld.consume("l-file").dump
        p = ld.pipeline("r-keys")
        assert (p["state"], p["store"]["parked_batches"], p["store"]["credentials_updates"]) == \
            ("done", 0, 1), p

        # an object changed after the create: a read of it fails the
        # pipeline naming it (If-Match; tokens have no on_error: a token
        # source never skips a window)
        create(ld, spec("r-fail", [url + "/shard-{000..002}.bin"]), env)
        s3.client("alice").put(BUCKET, "tok/rg/shard-001.bin", np.arange(sizes[1], dtype=np.uint16).tobytes())
        r = ld.consume("r-fail", check=False)
        assert r.rc != 0
        assert f"{url}/shard-001.bin: PreconditionFailed" in r.stderr, r.stderr
        assert "the object changed since its ETag" in r.stderr, r.stderr
        p = ld.pipeline("r-fail")
        assert p["state"] == "failed" and f"{url}/shard-001.bin: PreconditionFailed" in p["error"], p
    finally:
        proxy.stop()


def write_npy_padded(path, a, pad):
    """A .npy (version 1.0) of C-order @a whose header dict holds @pad
    spaces before its closing brace: a header longer than a first read."""
    text = "{'descr': '%s', 'fortran_order': False, 'shape': %r, %s}" % (a.dtype.str, a.shape, " " * pad)
    text += " " * (-(10 + len(text) + 1) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode() + a.tobytes())
    assert np.array_equal(np.load(path), a)


def test_npy_larger_than_cache_read_by_range(daemon, workdir, s3):
    """Arrays of more than cache_bytes are read by range: at create a HEAD
    and one ranged GET of the first 4096 bytes (the header) of each object,
    one more for a longer header; then each sample's row one ranged GET per
    array, straight into the batch, nothing in the cache. Two shuffled
    epochs read by two partition ranks are byte for byte the same arrays on
    disk. Then 503s park batches until the store answers, refused keys until
    fresh ones come, a changed object fails the pipeline naming it, and an
    object shorter than its header says fails the create."""
    N, W = 37, 2
    rng = np.random.default_rng(21)
    x = rng.standard_normal((N, 16, 16)).astype(np.float32)  # 1 KiB rows
    y = rng.integers(0, 1000, size=(N,)).astype(np.int64)
    d = os.path.join(workdir, "npyrg")
    os.makedirs(d)
    px, py, pl = (os.path.join(d, n) for n in ("x.npy", "y.npy", "long.npy"))
    write_npy(px, x)
    write_npy(py, y)
    write_npy_padded(pl, x[:, 0, :4].copy(), 6000)
    alice = s3.client("alice")
    sizes = {}
    for p in (px, py, pl):
        with open(p, "rb") as f:
            body = f.read()
        alice.put(BUCKET, "npyrg/" + os.path.basename(p), body)
        sizes[os.path.basename(p)] = len(body)
    url = f"s3://{BUCKET}/npyrg/"
    ld, objects, msock = ranged_daemon(daemon, workdir, min(sizes.values()) - 1, "npyranged")
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    env = aws_env(proxy.endpoint)
    per_rank = -(-N // W)  # DistributedSampler pads the epoch to W * per_rank

    def spec(name, paths):
        return npy_spec(name, paths, batch_size=4, shuffle=True, seed=7, epochs=2)

    def ranks(name):
        return [ld.consume(name, "--mode", "partition", "--rank", r, "--world-size", W).dump for r in range(W)]

    try:
        all_gets = 0
        for what, names in (("xy", ("x.npy", "y.npy")), ("long", ("long.npy",))):
            ld.create(spec(f"l-{what}", [os.path.join(d, n) for n in names]))
            want = ranks(f"l-{what}")
            row = sum(np.load(os.path.join(d, n), mmap_mode="r")[0].nbytes for n in names)
            assert all(len(w) == 2 * per_rank * row for w in want)
            n0, g0 = len(proxy.heads), gets(proxy)
            create(ld, spec(f"r-{what}", [url + n for n in names]), env)
            heads = proxy.heads[n0:]
            # a HEAD and a GET of the header of each; the long one's header
            # (6000 bytes and more) a second GET
            assert sum(1 for h in heads if h.startswith(b"HEAD ")) == len(names), heads
            create_gets = len(names) + (what == "long")
            assert gets(proxy) - g0 == create_gets, heads
            create_bytes = sum(min(sizes[n], 4096) for n in names)
            if what == "long":
                with open(pl, "rb") as f:
                    hlen = struct.unpack("<H", f.read(10)[8:])[0]
                assert hlen > 6000
                create_bytes += 10 + hlen - 4096
            assert ranks(f"r-{what}") == want, what
            reads = W * 2 * per_rank * len(names)  # a GET per sample and array
            assert gets(proxy) - g0 == create_gets + reads, what
            all_gets += create_gets + reads
            store = ld.pipeline(f"r-{what}")["store"]
            assert (store["ranged"], store["ranged_gets"], store["ranged_bytes"]) == \
                (True, create_gets + reads, create_bytes + W * 2 * per_rank * row), store
            assert store["parked_batches"] == 0 and "stream" not in store, store
        assert_nothing_cached(ld, objects, msock, all_gets)

        # 503s past store_retry_seconds: the batches wait, then are built
        create(ld, spec("r-out", [url + "x.npy", url + "y.npy"]), env)
        c, parked = park_reads(ld, proxy, "r-out", "503")
        assert parked["why"] == "store" and re.fullmatch(
            re.escape(url) + r"[xy]\.npy: SlowDown: Please reduce your request rate\. "
            r"\(HTTP 503\); retried for 0\.3 s", parked["error"]), parked
        ld.create(spec("l-all", [px, py]))
        unpark(ld, proxy, c, "r-out", ld.consume("l-all").dump)

        # the store refuses the keys: the batch waits for fresh ones, then
        # is built again with the same bytes
        create(ld, spec("r-keys", [url + "x.npy", url + "y.npy"]), env)
        c, parked = refuse_keys(ld, proxy, "r-keys")
        assert parked["why"] == "keys" and re.fullmatch(
            re.escape(url) + r"[xy]\.npy: AccessDenied: Access Denied\. \(HTTP 403\)", parked["error"]), parked
        res = c.wait(timeout=120)
        assert res.rc != 0 and "npy: AccessDenied: Access Denied. (HTTP 403)" in res.stderr, res.describe()
        while not proxy.faults.empty():
            proxy.faults.get_nowait()
        ld.ctl("credentials", "r-keys", env=env)
        assert ld.consume("r-keys").dump == ld.consume("l-all").dump
        p = ld.pipeline("r-keys")
        assert (p["state"], p["store"]["parked_batches"], p["store"]["credentials_updates"]) == ("done", 0, 1), p

        # an object changed after the create: a read fails the pipeline
        # naming it (If-Match the create's ETag)
        create(ld, spec("r-fail", [url + "x.npy", url + "y.npy"]), env)
        write_npy(os.path.join(d, "y2.npy"), y + 1)
        with open(os.path.join(d, "y2.npy"), "rb") as f:
            alice.put(BUCKET, "npyrg/y.npy", f.read())
        r = ld.consume("r-fail", check=False)
        assert r.rc != 0
        assert f"{url}y.npy: PreconditionFailed" in r.stderr and "the object changed since its ETag" in r.stderr, \
            r.stderr
        p = ld.pipeline("r-fail")
        assert p["state"] == "failed" and f"{url}y.npy: PreconditionFailed" in p["error"], p

        # shorter than its header says: the create fails, naming it
        with open(px, "rb") as f:
            alice.put(BUCKET, "npyrg/short.npy", f.read()[:-1])
        r = create(ld, spec("r-short", [url + "short.npy"]), env, check=False)
        assert r.returncode != 0
        assert r.stderr == (f"loaderctl: create: {url}short.npy: truncated: shape needs {sizes['x.npy']} bytes, "
                            f"the file has {sizes['x.npy'] - 1}\n"), r.stderr
    finally:
        proxy.stop()


def test_ranged_reads_ahead_through_a_slow_store(daemon, workdir, s3):
    """Through a store slow to answer (20 ms a GET), a worker GETs the
    ranges of a batch's samples at once, not one after the other (several
    GETs in the proxy at a time: one at a time without the read-ahead),
    yet the batches are byte for byte the local files' (one worker) and each range is
    still exactly one GET: a tokens corpus (windows across files two) and
    two .npy arrays (a GET per sample and array), two shuffled epochs."""
    local = tokens_corpus(workdir, s3, "tok/ra")
    url = f"s3://{BUCKET}/tok/ra"
    sizes = [os.path.getsize(os.path.join(local, f"shard-{s:03d}.bin")) // 2 for s in range(3)]
    N = 29
    rng = np.random.default_rng(4)
    d = os.path.join(workdir, "npyra")
    os.makedirs(d)
    arrays = {"x.npy": rng.standard_normal((N, 8, 8)).astype(np.float32),
              "y.npy": rng.integers(0, 1000, size=(N,)).astype(np.int64)}
    for n, a in arrays.items():
        write_npy(os.path.join(d, n), a)
        with open(os.path.join(d, n), "rb") as f:
            s3.client("alice").put(BUCKET, "npyra/" + n, f.read())
    # one worker: GETs at once are its read-ahead's, not batches built side by side
    cfg = os.path.join(workdir, "rahead.json")
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": 2 * sum(sizes) - 1, }, f)
    objects = os.path.join(workdir, "rahead", "objects")
    ld = daemon("--cache-dir", os.path.join(workdir, "rahead"), "--config", cfg, "--workers", "1")
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    env = aws_env(proxy.endpoint)
    L = 12
    firsts = [sum(sizes[:i]) for i in range(3)]
    tok = {"kind": "tokens", "dtype": "uint16", "seq_len": L, "boundaries": "none"}
    try:
        proxy.delay = 0.02
        for what, lspec, rspec in (
                ("tok", dict(tok, paths=[local + "/shard-{000..002}.bin"]),
                 dict(tok, paths=[url + "/shard-{000..002}.bin"])),
                ("npy", {"kind": "npy", "paths": [os.path.join(d, n) for n in arrays]},
                 {"kind": "npy", "paths": [f"s3://{BUCKET}/npyra/{n}" for n in arrays]}),
                # a blend's parts read by range (megatron's prefixes are one)
                ("blend", {"kind": "blend", "weights": [0.6, 0.4], "sources": [
                    dict(tok, paths=[local + "/shard-{000..002}.bin"])] * 2},
                 {"kind": "blend", "weights": [0.6, 0.4], "sources": [
                     dict(tok, paths=[url + "/shard-{000..002}.bin"])] * 2})):
            base = {"batch_size": 8, "shuffle": True, "seed": 3, "epochs": 2}
            ld.create(dict(base, name=f"l-{what}", source=lspec))
            want = ld.consume(f"l-{what}").dump
            create(ld, dict(base, name=f"r-{what}", source=rspec), env)
            g0 = gets(proxy)
            proxy.gets_most = 0
            assert ld.consume(f"r-{what}").dump == want, what
            if what == "blend":
                # every GET a range of its parts', several at once
                st = ld.pipeline(f"r-{what}")["store"]
                assert st["ranged"] and gets(proxy) - g0 == st["ranged_gets"] > 0, st
                assert proxy.gets_most > 1, (what, proxy.gets_most)
                continue
            if what == "tok":
                per_epoch = len(want) // (2 * 2 * L * 8)  # input and target, int64
                ranges = sum(sum(1 for f, n in zip(firsts, sizes) if f < i * L + L + 1 and i * L < f + n)
                             for i in range(per_epoch))
                assert ranges > per_epoch  # some windows cross a file's end
            else:
                ranges = N * len(arrays)
            # each range one GET, each epoch; several in flight at once
            assert gets(proxy) - g0 == 2 * ranges, what
            assert ld.pipeline(f"r-{what}")["store"]["ranged_gets"] == 2 * ranges + (2 if what == "npy" else 0)
            assert proxy.gets_most > 1, (what, proxy.gets_most)
        assert cached_bytes(objects) == 0
    finally:
        proxy.stop()


def test_image_folder_larger_than_cache_streamed(daemon, workdir, s3):
    """An image folder under a prefix whose images are more than
    cache_bytes is read as a stream: the create lists and HEADs them and
    fetches none; each image is fetched into the cache when read or ahead
    of the reads in the sampler's order, within the bound. Two shuffled
    epochs are byte for byte the same folder on disk; once the last batch is
    read nothing is fetched, held or pinned."""
    root = os.path.join(workdir, "sfolder")
    samples = make_folder(root, ["cat", "dog", "eel"], 4, [(30, 40), (44, 33)], seed=14)
    alice = s3.client("alice")
    for p, _ in samples:
        with open(p, "rb") as f:
            alice.put(BUCKET, "sfolder/" + os.path.relpath(p, root), f.read())
    sizes = [os.path.getsize(p) for p, _ in samples]
    total = sum(sizes)
    limit = total // 2
    # fetch_ahead: half the cache; store_retry_seconds 0.3
    ld, objects, _ = ranged_daemon(daemon, workdir, limit, "sfolder")
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    env = aws_env(proxy.endpoint)
    try:
        spec = lambda name, p: image_spec(name, {"kind": "image_folder", "path": p}, OPS,  # noqa: E731
                                          dtype="uint8", seed=3, batch_size=4, shuffle=True, epochs=2, prefetch=2)
        ld.create(spec("local", root))
        want = ld.consume("local").dump
        assert len(want) == 2 * len(samples) * (20 * 20 * 3 + 8)
        create(ld, spec("remote", f"s3://{BUCKET}/sfolder"), env)
        # the create: one listing, a HEAD per image, no GET of one
        lines = [h.split(b"\r\n")[0] for h in proxy.heads]
        assert sum(1 for h in lines if h.startswith(b"HEAD ")) == len(samples), lines
        assert [h for h in lines if h.startswith(b"GET ")] == [h for h in lines if b"list-type=2" in h], lines
        assert len([h for h in lines if b"list-type=2" in h]) == 1, lines
        oc = ld.status()["object_cache"]
        assert (oc["misses"], oc["objects"], oc["bytes_fetched"]) == (0, 0, 0), oc
        got, seen = consume_bounded(ld, "remote", objects, limit)
        assert got.dump == want
        st = ld.status()
        after = st["object_cache"]
        [stream] = [p["store"]["stream"] for p in st["pipelines"] if p["name"] == "remote"]
        # the client has every batch: every read is done, nothing held
        assert (stream["fetching_objects"], stream["readers_waiting"], stream["ahead_objects"],
                stream["ahead_bytes"]) == (0, 0, 0, 0), stream
        assert (after["pinned"], after["fetching"]) == (0, 0), after
        assert after["bytes_used"] == cached_bytes(objects) <= limit, after
        assert after["objects"] == after["misses"] - after["evictions"], after
        # every image fetched at least once (the cache held none), each
        # GET one image's; images evicted are fetched again
        gets_ = [h for h in [h.split(b"\r\n")[0] for h in proxy.heads] if h.startswith(b"GET ")
                 and b"list-type=2" not in h]
        assert len(gets_) == after["misses"] >= len(samples) and after["bytes_fetched"] >= total, after
        assert {h.split(b" ")[1].split(b"?")[0] for h in gets_} == \
            {f"/{BUCKET}/sfolder/{os.path.relpath(p, root)}".encode() for p, _ in samples}

        # 503s past store_retry_seconds: a read that must fetch parks its
        # batch (no bad image: on_error does not skip it), built once the
        # store answers
        create(ld, spec("r-out", f"s3://{BUCKET}/sfolder"), env)
        c, parked = park_reads(ld, proxy, "r-out", "503", stream=True)
        assert parked["why"] == "store" and re.fullmatch(
            re.escape(f"s3://{BUCKET}/sfolder/") + r"(cat|dog|eel)/[^ /]+\.jpg: SlowDown: Please reduce your "
            r"request rate\. \(HTTP 503\); retried for 0\.3 s", parked["error"]), parked
        unpark(ld, proxy, c, "r-out", want, stream=True)
    finally:
        proxy.stop()


def range_of(head):
    """(path, Range) of a GET's request head; Range None for a whole GET."""
    lines = head.split(b"\r\n")
    path = lines[0].split(b" ")[1].decode()
    rng = [ln.split(b":", 1)[1].strip().decode() for ln in lines[1:] if ln.lower().startswith(b"range:")]
    match = [ln for ln in lines[1:] if ln.lower().startswith(b"if-match:")]
    return path, (rng[0] if rng else None), bool(match)


def test_shuffled_webdataset_stream_reads_samples_by_range(daemon, workdir, s3):
    """A shuffled webdataset stream (no shuffle_window) of more than
    cache_bytes reads each sample's image member with one ranged GET
    (If-Match the create's ETag) instead of its shard whole: two epochs read
    by two partition ranks byte for byte the same shards on disk; each shard
    GOT whole once (the create's index), then exactly one ranged GET per
    sample and epoch, counted at the store and in status, and the reads
    write nothing to the cache. With shuffle_window the same shards are
    still read as a stream (whole shards, no range). 503s park batches until
    the store answers, refused keys until fresh ones come; a shard changed
    after the create fails, naming it (or is skipped)."""
    local, url, n = shards(workdir, s3, "wds/rg", nshards=8, per_class=8)
    paths = [local.replace("{000..007}", f"{s:03d}") for s in range(8)]
    sizes = [os.path.getsize(p) for p in paths]
    assert n == 24 and sum(sizes) > 6 * max(sizes)
    # each sample's image member: its range in its shard
    ranges = {}
    for s, p in enumerate(paths):
        with tarfile.open(p) as t:
            for m in t.getmembers():
                if not m.name.endswith(".cls"):
                    ranges[(f"/{BUCKET}/wds/rg-{s:03d}.tar", f"bytes={m.offset_data}-"
                            f"{m.offset_data + m.size - 1}")] = m.size
    assert len(ranges) == n
    cache = os.path.join(workdir, "wdsrg")
    cfg = os.path.join(workdir, "wdsrg.json")
    with open(cfg, "w") as f:
        json.dump({"cache_bytes": 6 * max(sizes), "fetch_ahead": max(sizes), "store_retry_seconds": 0.3}, f)
    # one worker: GETs at once are its read-ahead's (below)
    ld = daemon("--cache-dir", cache, "--config", cfg, "--workers", "1")
    objects = os.path.join(cache, "objects")
    proxy = FaultProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    env = aws_env(proxy.endpoint)
    W = 2

    def ranks(name):
        return [ld.consume(name, "--mode", "partition", "--rank", r, "--world-size", W).dump for r in range(W)]

    def got(since):
        return [range_of(h) for h in proxy.heads[since:] if h.startswith(b"GET ")]

    try:
        spec = dict(epochs=2, prefetch=2)
        ld.create(wds("l-rg", local, **spec))
        want = ranks("l-rg")
        assert all(len(w) == 2 * (n // W) * (20 * 20 * 3 + 8) for w in want)
        create(ld, wds("r-rg", url, **spec), env)
        # the create: each shard GOT whole once, to index it; nothing pinned
        created = got(0)
        assert sorted(created) == sorted((f"/{BUCKET}/wds/rg-{s:03d}.tar", None, True) for s in range(8)), created
        oc = ld.status()["object_cache"]
        assert (oc["misses"], oc["pinned"], oc["fetching"]) == (8, 0, 0), oc
        files = sorted(os.listdir(objects))
        since = len(proxy.heads)
        assert ranks("r-rg") == want
        # one ranged GET per sample and epoch (each rank reads half of each
        # epoch), If-Match the create's ETag; no GET of a shard whole
        reads = got(since)
        assert all(m for _, _, m in reads), reads
        assert {r: sum(1 for u, g, _ in reads if (u, g) == r) for r in ranges} == {r: 2 for r in ranges}, reads
        assert len(reads) == 2 * n
        store = ld.pipeline("r-rg")["store"]
        assert (store["ranged"], store["ranged_gets"], store["ranged_bytes"], store["parked_batches"]) == \
            (True, 2 * n, 2 * sum(ranges.values()), 0), store
        assert "stream" not in store, store
        # the reads wrote nothing to the cache, and nothing is pinned
        after = ld.status()["object_cache"]
        assert (after["misses"], after["hits"], after["pinned"], after["ranged_gets"]) == \
            (8, 0, 0, 2 * n), after
        assert sorted(os.listdir(objects)) == files
        assert ld.pipeline("r-rg")["stats"]["skipped_total"] == 0

        # through a store slow to answer, a batch's samples are GOT several
        # at once (the read-ahead), still one GET each
        one = ld.consume("l-rg").dump
        create(ld, wds("r-slow", url, **spec), env)
        since, proxy.gets_most, proxy.delay = len(proxy.heads), 0, 0.02
        assert ld.consume("r-slow").dump == one
        proxy.delay = 0
        assert sorted((u, g) for u, g, _ in got(since)) == sorted(list(ranges) * 2)
        assert proxy.gets_most > 1, proxy.gets_most
        ld.ctl("drop", "r-slow")

        # with shuffle_window: read as a stream, whole shards (no range)
        win = dict(spec, shuffle_window=2)
        ld.create(wds("l-win", local, **win))
        since = len(proxy.heads)
        create(ld, wds("r-win", url, **win), env)
        assert ld.consume("r-win").dump == ld.consume("l-win").dump
        whole = got(since)
        assert whole and all(g is None for _, g, _ in whole), whole
        store = ld.pipeline("r-win")["store"]
        assert "stream" in store and "ranged" not in store, store
        ld.ctl("drop", "r-win")

        # 503s past store_retry_seconds: the batches wait, then are built
        create(ld, wds("r-out", url, **spec), env)
        c, parked = park_reads(ld, proxy, "r-out", "503")
        assert parked["why"] == "store" and re.fullmatch(
            re.escape(f"s3://{BUCKET}/wds/rg-") + r"00[0-7]\.tar: SlowDown: Please reduce your request rate\. "
            r"\(HTTP 503\); retried for 0\.3 s", parked["error"]), parked
        unpark(ld, proxy, c, "r-out", one)

        # the store refuses the keys: the batch waits for fresh ones, then
        # is built again with the same bytes
        create(ld, wds("r-keys", url, **spec), env)
        c, parked = refuse_keys(ld, proxy, "r-keys")
        assert parked["why"] == "keys" and re.fullmatch(
            re.escape(f"s3://{BUCKET}/wds/rg-") + r"00[0-7]\.tar: AccessDenied: Access Denied\. \(HTTP 403\)",
            parked["error"]), parked
        res = c.wait(timeout=120)
        assert res.rc != 0 and ".tar: AccessDenied: Access Denied. (HTTP 403)" in res.stderr, res.describe()
        with proxy.faults.mutex:
            proxy.faults.queue.clear()
        ld.ctl("credentials", "r-keys", env=env)
        assert ld.consume("r-keys").dump == one
        p = ld.pipeline("r-keys")
        assert (p["state"], p["skipped"], p["store"]["parked_batches"], p["store"]["credentials_updates"]) == \
            ("done", 0, 0, 1), p

        # a shard changed after the create: a read fails the pipeline naming
        # it (on_error fail), or its samples are skipped (on_error skip)
        create(ld, wds("r-fail", url, on_error="fail", **spec), env)
        create(ld, wds("r-skip", url, on_error="skip", **spec), env)
        with open(paths[3], "rb") as f:
            body = bytearray(f.read())
        body[-1] ^= 1  # tar padding: the same samples, a new ETag
        s3.client("alice").put(BUCKET, "wds/rg-003.tar", bytes(body))
        r = ld.consume("r-fail", check=False)
        assert r.rc != 0
        shard = f"s3://{BUCKET}/wds/rg-003.tar"
        assert f"{shard}: PreconditionFailed" in r.stderr and "the object changed since its ETag" in r.stderr, \
            r.stderr
        p = ld.pipeline("r-fail")
        assert p["state"] == "failed" and f"{shard}: PreconditionFailed" in p["error"], p
        r = ld.consume("r-skip")
        assert len(r.dump) == 2 * n * (20 * 20 * 3 + 8)
        assert ld.pipeline("r-skip")["stats"]["skipped_total"] == n // 8
    finally:
        proxy.stop()
