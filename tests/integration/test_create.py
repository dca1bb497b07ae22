# SPDX-License-Identifier: MIT
"""Creates open their files off the loop (registry.c, engine_create_async):
ranks that create one name at once get one pipeline, indexed once, and the
daemon answers everyone else meanwhile."""

import io
import json
import os
import subprocess
import tarfile

from ldrtest import LOADERCTL


def big_shard(path, n):
    """A webdataset shard of @n samples: indexing reads n*3 headers."""
    png = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de"
                        "0000000c49444154789c63f8cfc0000003010100c9fe92ef0000000049454e44ae426082")
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(n):
            for ext, data in (("png", png), ("cls", str(i % 10).encode())):
                ti = tarfile.TarInfo(f"s{i:06d}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))


def test_ranks_creating_one_name_get_one_pipeline(daemon, workdir):
    d = daemon()
    shard = os.path.join(workdir, "big.tar")
    big_shard(shard, 20000)
    spec = {"name": "wds", "source": {"kind": "webdataset", "urls": shard},
            "transforms": [{"op": "resize", "size": [1, 1]}], "output": {"dtype": "uint8"},
            "batch_size": 100}
    path = d.spec_file(spec)
    procs = [subprocess.Popen([LOADERCTL, "--socket", d.socket, "--json", "create", "--spec", path,
                               "--exist-ok"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(8)]
    # the daemon answers status while they create
    st = d.status()
    assert st["pid"] == d.pid
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    assert sorted(o["created"] for o in outs) == [False] * 7 + [True]
    assert {o["name"] for o in outs} == {"wds"}
    assert d.log().count("pipeline.create pipeline=wds ") == 1
    p = d.pipeline("wds")
    assert p["samples"] == 20000
    res = d.consume("wds", "--batches", 3)
    assert res.json["batches"] == 3 and len(res.dump) == 3 * (100 * 3 + 100 * 8)


def test_create_errors_come_back_from_the_pool(ld, workdir):
    missing = os.path.join(workdir, "nope.bin")
    r = ld.create({"name": "m", "source": {"kind": "tokens", "path": missing, "seq_len": 4}},
                  check=False)
    assert r.returncode != 0 and f"{missing}: No such file or directory" in r.stderr, r.stderr
    assert "m" not in [p["name"] for p in ld.status()["pipelines"]]
