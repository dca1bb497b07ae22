# SPDX-License-Identifier: MIT
"""Many nodes (docs/deploy.md): two daemons, one per "node", each with its
own object cache, read one bucket in partition mode with a global rank and
world size: ranks 0 and 1 attach to node A's daemon, ranks 2 and 3 to node
B's, world 4, as torchrun places them (RANK = node * LOCAL_WORLD_SIZE +
LOCAL_RANK).

Each daemon runs in a network namespace of its own (nsforward.py): a node
whose only device is its loopback. The one real S3 server (SeaweedFS,
s3server.py) runs on the host's loopback, which such a namespace cannot
reach, so each node gets a bridge that never leaves loopback: a forwarder
inside the namespace listens on 127.0.0.1 at the server's own port (so
every node and the uploader name one endpoint URL, as in a cluster) and
relays over a Unix socket, a file system path that crosses network
namespaces, to a counting proxy on the host side (FaultProxy on a Unix
socket), one per node, which forwards to the server. Chosen over a veth
pair on a private /30 for the store's namespace because it needs no
addresses, routes or iproute2, and because the per-node proxy sees every
request a node's daemon makes, which is what the test counts. The
trainers run in their node's namespace too (they talk to their daemon over
its Unix socket only).

Asserted: each epoch's samples over the four ranks of both nodes are the
epoch, each sample once but for DistributedSampler's padding (the ranks'
shares are DistributedSampler's, torch's own for an unshuffled pipeline);
each node's daemon GETs exactly the objects its ranks read, each once
(concurrent creates of one node included), and a second epoch and a
second job on the same nodes GET nothing.
"""

import collections
import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import s3server
from imgtest import parse_image_dump, write_shard_tarfile
from ldrtest import partition_share, python_client_env
from loaderd_harness import LOADERCTL, child_env, sanitizer_report
from nsforward import Node, available
from s3server import FaultProxy, aws_env

BUCKET = "alice-data"
NSHARDS = 8
SHARD_SAMPLES = [9, 9, 9, 9, 9, 9, 8, 8]  # 70 samples: world 4 pads 2
N = sum(SHARD_SAMPLES)
WORLD, LOCAL_WORLD = 4, 2
BS = 4
SIDE = 4


@pytest.fixture(scope="module")
def s3():
    srv, d = s3server.make_server()
    yield srv
    s3server.stop_server(srv, d)


def pixels(i):
    """Sample i's 4x4 RGB image: says which sample it is."""
    a = np.zeros((SIDE, SIDE, 3), np.uint8)
    a[..., 0], a[..., 1] = i % 256, i // 256
    a[..., 2] = np.arange(SIDE * SIDE, dtype=np.uint8).reshape(SIDE, SIDE) * 7
    return a


def upload_shards(s3, workdir):
    """NSHARDS webdataset shards of PNGs (label = the sample's global
    index) to s3://alice-data/nodes/train-{000..007}.tar; {key: shard
    size} and the shard of each sample."""
    from PIL import Image
    alice = s3.client("alice")
    sizes, shard_of = {}, []
    i = 0
    for s, count in enumerate(SHARD_SAMPLES):
        members = []
        for _ in range(count):
            buf = io.BytesIO()
            Image.fromarray(pixels(i)).save(buf, format="PNG")
            members += [(f"s{i:05d}.png", buf.getvalue()), (f"s{i:05d}.cls", str(i).encode())]
            shard_of.append(s)
            i += 1
        path = write_shard_tarfile(os.path.join(workdir, f"train-{s:03d}.tar"), members,
                                   tarfile.USTAR_FORMAT)
        with open(path, "rb") as f:
            body = f.read()
        alice.put(BUCKET, f"nodes/train-{s:03d}.tar", body)
        sizes[f"nodes/train-{s:03d}.tar"] = len(body)
    return sizes, shard_of


def spec(name, **kw):
    s = {"name": name,
         "source": {"kind": "webdataset", "urls": [f"s3://{BUCKET}/nodes/train-{{000..007}}.tar"]},
         "transforms": [{"op": "center_crop", "size": SIDE}],
         "output": {"dtype": "uint8", "layout": "NHWC"}, "batch_size": BS}
    s.update(kw)
    return s


class Cluster:
    """Two nodes, each a namespace, a counting proxy and a daemon."""

    def __init__(self, daemon, workdir, s3):
        port = int(s3.endpoint.rsplit(":", 1)[1])
        self.endpoint = s3.endpoint  # the same URL on every node
        self.proxies, self.nodes, self.daemons = [], [], []
        for n in "ab":
            proxy = FaultProxy(("127.0.0.1", port), unix=os.path.join(workdir, f"store-{n}.sock"))
            self.proxies.append(proxy)
            node = Node(port, proxy.unix)
            self.nodes.append(node)
            self.daemons.append(daemon("--cache-dir", os.path.join(workdir, f"cache-{n}"),
                                       socket=os.path.join(workdir, f"node-{n}.sock"),
                                       wrap=node.wrap))

    def stop(self):
        for node in self.nodes:
            node.stop()
        for proxy in self.proxies:
            proxy.stop()

    def gets(self, node):
        """{key: GETs} that @node's daemon sent to the store."""
        out = collections.Counter()
        for h in self.proxies[node].heads:
            method, path = h.split(b" ")[:2]
            if method == b"GET":
                out[path.decode().split("?")[0].removeprefix(f"/{BUCKET}/")] += 1
        return out

    def heads(self, node):
        return sum(1 for h in self.proxies[node].heads if h.startswith(b"HEAD "))

    def run(self, node, cmd, env):
        """Start @cmd in @node's namespace."""
        return subprocess.Popen(self.nodes[node].wrap + cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)


def finish(procs, what):
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and sanitizer_report(err) is None, f"{what}: {p.args}\n{err}"
        outs.append(out)
    return outs


def node_of(rank):
    return rank // LOCAL_WORLD


def share_rows(world=WORLD):
    per = -(-N // world)
    return [BS] * (per // BS) + ([per % BS] if per % BS else [])


def check_fetched(cl, sizes, shard_of, labels):
    """Each node's daemon GET each object its ranks read exactly once, and
    nothing else; its object cache says the same."""
    for node in (0, 1):
        read = {i for r in range(WORLD) if node_of(r) == node for i in labels[r]}
        need = {f"nodes/train-{shard_of[i]:03d}.tar" for i in read}
        assert cl.gets(node) == {k: 1 for k in need}, (node, cl.gets(node), sorted(need))
        oc = cl.daemons[node].status()["object_cache"]
        assert (oc["misses"], oc["objects"], oc["bytes_fetched"]) == \
            (len(need), len(need), sum(sizes[k] for k in need)), oc


def test_two_nodes_one_bucket_partition(daemon, workdir, s3):
    why = available()
    if why:
        pytest.skip(why)
    sizes, shard_of = upload_shards(s3, workdir)
    cl = Cluster(daemon, workdir, s3)
    try:
        run_jobs(cl, workdir, sizes, shard_of)
    finally:
        cl.stop()


def run_jobs(cl, workdir, sizes, shard_of):
    env = child_env({k: v for k, v in aws_env(cl.endpoint).items() if k.startswith("AWS_")})

    # job 1, loaderctl: both local ranks of each node create the pipeline at
    # once (one fetch per object and node), then the four ranks read two
    # shuffled epochs, each attached to its own node's daemon only
    sp = spec("nodes", shuffle=True, seed=11, epochs=2)
    path = os.path.join(workdir, "spec.json")
    with open(path, "w") as f:
        json.dump(sp, f)
    finish([cl.run(node_of(r), [LOADERCTL, "--socket", cl.daemons[node_of(r)].socket, "create",
                                "--exist-ok", "--spec", path], env) for r in range(WORLD)],
           "create")
    dumps = [os.path.join(workdir, f"rank{r}.dump") for r in range(WORLD)]
    finish([cl.run(node_of(r), [LOADERCTL, "--socket", cl.daemons[node_of(r)].socket, "--json",
                                "consume", "nodes", "--mode", "partition", "--rank", str(r),
                                "--world-size", str(WORLD), "--dump", dumps[r]], env)
            for r in range(WORLD)], "consume")
    rows = share_rows()
    labels = {}
    for r in range(WORLD):
        with open(dumps[r], "rb") as f:
            parts = parse_image_dump(f.read(), rows * 2, (SIDE, SIDE, 3), "uint8")
        for imgs, labs in parts:
            for img, lab in zip(imgs, labs):
                assert np.array_equal(img, pixels(int(lab))), f"rank {r}: sample {lab}'s image"
        labels[r] = [int(x) for _, labs in parts for x in labs]
    per = sum(rows)
    orders = []
    for e in range(2):
        got = {r: labels[r][e * per:(e + 1) * per] for r in range(WORLD)}
        # the epoch's order as the ranks read it (position r + W*j), then
        # each rank's share held to DistributedSampler's rule over it
        order = [None] * N
        for r in range(WORLD):
            for j, i in enumerate(got[r]):
                if r + WORLD * j < N:
                    order[r + WORLD * j] = i
        assert sorted(order) == list(range(N)), f"epoch {e}: not every sample once"
        for r in range(WORLD):
            assert got[r] == partition_share(order, r, WORLD), f"epoch {e} rank {r}"
        counts = collections.Counter(i for r in range(WORLD) for i in got[r])
        assert sorted(i for i, c in counts.items() if c == 2) == sorted(order[:WORLD * per - N])
        orders.append(order)
    assert orders[0] != orders[1], "two epochs of one order"
    check_fetched(cl, sizes, shard_of, labels)
    # one create per node HEADs the objects (the creator's keys checked);
    # the other rank's, of the same user and spec, waited for it and joined
    assert [cl.heads(n) for n in (0, 1)] == [NSHARDS, NSHARDS]

    # job 2, Python trainers as torchrun starts them (RANK, WORLD_SIZE,
    # LOCAL_RANK, LOCAL_WORLD_SIZE), unshuffled: torch's DistributedSampler
    # is the reference; the objects are in each node's cache already, so
    # only HEADs (each trainer's keys checked) reach the store
    code = ("import json, sys, loaderd\n"
            "ld = loaderd.DataLoader(json.loads(sys.argv[1]), as_numpy=True)\n"
            "out = [int(x) for b in ld for x in b['label']]\n"
            "print(json.dumps({'rank': ld.rank, 'world': ld.world_size, 'labels': out}))\n")
    procs = []
    for r in range(WORLD):
        penv = python_client_env(base=aws_env(cl.endpoint))
        penv.update(RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(r % LOCAL_WORLD),
                    LOCAL_WORLD_SIZE=str(LOCAL_WORLD), TORCHELASTIC_RUN_ID="job2",
                    LOADERD_SOCKET=cl.daemons[node_of(r)].socket)
        procs.append(cl.run(node_of(r), [sys.executable, "-c", code, json.dumps(spec("plain"))],
                            penv))
    outs = [json.loads(o) for o in finish(procs, "python trainer")]
    import torch.utils.data as tud
    for r, o in enumerate(outs):
        want = list(tud.DistributedSampler(range(N), num_replicas=WORLD, rank=r, shuffle=False))
        assert (o["rank"], o["world"], o["labels"]) == (r, WORLD, want), r
    check_fetched(cl, sizes, shard_of, labels)
    assert [cl.heads(n) for n in (0, 1)] == [2 * NSHARDS, 2 * NSHARDS]
