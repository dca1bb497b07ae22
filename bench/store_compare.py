#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""loaderd over s3:// against MosaicML Streaming and LitData, one run (issue 28).

    /usr/bin/python3 bench/store_compare.py [--images 10000] [--per-shard 256]
                                            [--ks 1,4] [--json out.json]
                                            [--build build] [--quick]

One bucket on a real S3 server on loopback (SeaweedFS's `weed mini`, as the
suite starts it: tests/integration/s3server.py, $LOADERD_WEED or
scripts/s3-server-venv), which verifies SigV4. The corpus: --images
generated 256x256 RGB JPEGs (bench/images' generator, quality 90, 10
classes), written three ways from the same JPEG bytes, all uploaded to
s3://alice-data/ as current AWS tools upload them: AWS CLI v2 and boto3 >=
1.36 send an x-amz-checksum-crc32 of the body with every PUT by default
(their "when_supported" request checksums), which the store keeps and
gives back to a GET with x-amz-checksum-mode: ENABLED (loaderd then checks
that CRC32 and not the ETag's MD5: docs/storage.md); --put-checksum none
uploads without one (older tools: the ETag's MD5 is checked):

  wds/train-NNNNNN.tar   webdataset shards of --per-shard samples (KEY.jpg,
                         KEY.cls), what loaderd reads
  mds/                   MosaicML Streaming's MDS (its MDSWriter, columns
                         jpg: bytes, cls: int, shards of the tars' size)
  litdata/               LitData's optimized chunks (its optimize(), items
                         {"jpg": bytes, "cls": int}, chunks of that size)

Readers, each in its own run from a cold cache (a fresh daemon with a fresh
cache_dir; a fresh local directory for the peers):

  loaderd-local  loaderd over the same tar shards on local disk (page-cached):
                 the reference
  loaderd-s3     loaderd over s3://alice-data/wds/train-{...}.tar; the daemon
                 is started by this script with --cache-dir in /tmp; the
                 trainers' keys go with the create (AWS_ENDPOINT_URL ...)
  mosaic         streaming.StreamingDataset(remote="s3://alice-data/mds",
                 local=DIR, shuffle=True, batch_size=64) in
                 streaming.StreamingDataLoader (S3_ENDPOINT_URL); Debian's
                 torch 1.13 (bench/store-peers-venv's venv-bench-mosaic)
  litdata        litdata.StreamingDataset("s3://alice-data/litdata",
                 shuffle=True, storage_options: the endpoint and keys) in
                 litdata.StreamingDataLoader, its obstore client options
                 with allow_http added (they refuse plain http otherwise);
                 the current torch (venv-bench-litdata, which sees
                 ~/.cache/loaderd/venv-torch)

Every reader gives batches of 64 of RandomResizedCrop(224) (scale 0.08-1,
ratio 3/4-4/3), a horizontal flip with p 0.5 and ImageNet's normalize, float32
NCHW, shuffled. loaderd: the image pipeline of bench/images (its spec_json,
source webdataset, no prefetch: the default spec; workers = online CPUs, the
daemon's default). The peers:
the same ops on PIL images in their Dataset's __getitem__ (PIL's bilinear
resize of the crop box, torchvision's ToTensor + Normalize arithmetic, the
crop drawn as torchvision's RandomResizedCrop.get_params; written here
because venv-torch has no torchvision), in their own DataLoader with
max(1, CPUs / K) workers a trainer (what a user sets on this machine).

K trainers (--ks; default 1 and 4) are K processes started together, each
with RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT as
torchrun sets them (the peers' processes join a gloo process group, as DDP
does; loaderd's trainers are ranks of one partition pipeline). Each runs 2
epochs and touches every batch. After their imports (and the group's
rendezvous) they wait for one "go": from it, each times

  epoch 1 (cold)  go to its epoch 1's last batch: making the dataset (the
                  daemon's create with its fetches, the peers' index reads)
                  and every fetch from the store are in it
  epoch 2 (warm)  from there to its epoch 2's last batch

and img/s = the images all K trainers took in that epoch / the slowest
trainer's time (a DDP step waits for the slowest rank).

Bytes from the store: every reader talks to the server through a counting
TCP proxy of its own (this script's), which counts the bytes the server sent
(HTTP heads included); "x corpus" is that over the bytes of the format's
objects in the bucket: 1.0 means every object fetched once for the node.
"objects" is how many data objects (shards, chunks) were fetched whole, "max
GETs" the most whole GETs of one of them (index files left out), "ranged" the
GETs of a byte range (of any object).

CPU over epoch 1 (core-seconds, from go to the last trainer's epoch 1
line): "store" is the server's process (weed, /proc/PID/stat) and the
counting proxy's threads in this process (each thread's own CPU time),
"daemon" loaderd's process (the loaderd systems only), "machine" every
core's busy time (/proc/stat: everything, other users' load included), so
a row shows how much of the cores the store took beside the decode. The
proxy relays the server's answers with os.splice through a pipe (no copy
through Python), the requests with recv/send (their heads are parsed).

Ratios printed at the end, against the targets of issue 28: loaderd-s3's
epoch 1 within 10 % of loaderd-local's, epoch 2 equal (not below 0.95x: the
noise of one run), and K trainers fetching each object once (x corpus <=
1.05).

--store-cpu N: the store on a core of its own, as a store on another
machine: the server's threads and this script (whose threads are the
counting proxies) run on CPU N only, the daemon and every trainer (and
their DataLoader workers) on the other CPUs, for every system alike, the
local one too. The issue's target is epoch 1 within 10 % of local files
"when the store is not the limit": without it, on a machine of few cores,
the server's CPU is taken from the decode. Defaults stay the defaults
(the daemon's workers: the online CPUs; the peers' workers: CPUs / K).

Not measured: a dataset larger than the node's cache (read as a stream:
docs/storage.md; bench/stream_index.py times its create). The corpus is
sized below cache_bytes (the script sets cache_bytes to twice the shards'
bytes), so loaderd's create fetches every shard before the first batch.

--quick: 384 images in shards of 64, K = 1 and 2 (a smoke test of every path,
figures meaningless). Peers whose venv cannot be made are skipped with a
note (bench/store-peers-venv makes them once, from PyPI).
"""

import argparse
import base64
import collections
import importlib.machinery
import importlib.util
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from peer_loaders import MEAN, SIZE, STD, rrc_params  # noqa: E402

BATCH = 64
EPOCHS = 2
BUCKET = "alice-data"
SYSTEMS = ("loaderd-local", "loaderd-s3", "mosaic", "litdata")


# ------------------------------------------------------------ the trainers

def peer_transform(jpeg, rng):
    """RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize
    of one JPEG's bytes, on PIL (the peers' __getitem__)."""
    import numpy as np
    import torch
    from PIL import Image
    with Image.open(io.BytesIO(jpeg)) as im:
        im = im.convert("RGB")
        left, top, cw, ch = rrc_params(im.width, im.height, rng)
        im = im.resize((SIZE, SIZE), Image.BILINEAR, box=(left, top, left + cw, top + ch))
    if rng.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    x = np.asarray(im, dtype=np.float32) / 255.0
    x = (x - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


def with_transform(dataset_class):
    """@dataset_class (a peer's StreamingDataset) whose samples ({"jpg":
    bytes, "cls": int}) come out as (peer_transform(jpg), cls); each worker
    process draws from its own generator."""
    import numpy as np

    class Images(dataset_class):
        rng = None

        def __getitem__(self, i):
            if Images.rng is None:
                Images.rng = np.random.default_rng()
            s = super().__getitem__(i)
            return peer_transform(s["jpg"], Images.rng), s["cls"]
    return Images


def make_mosaic(a, cache):
    from streaming import StreamingDataLoader, StreamingDataset
    ds = with_transform(StreamingDataset)(remote=f"s3://{BUCKET}/mds", local=cache, shuffle=True,
                                          shuffle_seed=1, batch_size=BATCH)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=a.workers)


def litdata_options(endpoint):
    """litdata's storage_options (its boto3 client's arguments) for the
    loopback endpoint."""
    return {"endpoint_url": endpoint, "region_name": "us-east-1",
            "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"]}


def litdata_allow_http():
    """litdata fetches its chunks through obstore, with a store built from
    its boto3 client and client options of litdata's own
    (_OBSTORE_CLIENT_OPTIONS) that refuse plain http ("builder error,
    BadScheme"; obstore's AWS_ALLOW_HTTP is not read there, and
    storage_options go to boto3 only): those options plus allow_http, the
    one change a user of an http endpoint must make."""
    import litdata.streaming.downloader as dl
    dl._OBSTORE_CLIENT_OPTIONS = dict(dl._OBSTORE_CLIENT_OPTIONS, allow_http=True)


def make_litdata(a, cache):
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.resolver import Dir
    litdata_allow_http()
    ds = with_transform(StreamingDataset)(Dir(path=cache, url=f"s3://{BUCKET}/litdata"),
                                          shuffle=True, seed=1,
                                          storage_options=litdata_options(
                                              os.environ["AWS_ENDPOINT_URL"]))
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=a.workers)


def make_loaderd(a, cache):
    import loaderd
    with open(a.spec) as f:
        spec = json.load(f)
    return loaderd.DataLoader(spec, socket=a.socket, rank=a.rank, world_size=a.world)


def trainer(a):
    """One trainer process: 2 epochs, every batch touched; prints one JSON
    line after each epoch and waits for stdin's end before exiting."""
    import torch
    torch.set_num_threads(1)
    if a.system in ("mosaic", "litdata") and a.world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=a.rank, world_size=a.world)
    make = {"mosaic": make_mosaic, "litdata": make_litdata}.get(a.system, make_loaderd)
    # the imports before the start, as a trainer has them before its loop
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    for mod in ({"mosaic": "streaming", "litdata": "litdata"}.get(a.system, "loaderd"),
                "PIL.Image", "numpy"):
        importlib.import_module(mod)
    print("ready", flush=True)
    sys.stdin.readline()  # go
    t0 = time.time()
    loader = make(a, a.cache)
    t = t0
    acc = 0.0
    for epoch in range(EPOCHS):
        n = 0
        for b in loader:
            x = b["image"] if isinstance(b, dict) else b[0]
            acc += float(x[:, 0, 0, 0].sum())  # touch every row
            n += x.shape[0]
        now = time.time()
        print(json.dumps({"epoch": epoch + 1, "images": n, "seconds": now - t}), flush=True)
        t = now
    sys.stdin.read()  # the parent's last byte count is taken
    return 0


# ------------------------------------------------------------ the proxy

REQUEST = re.compile(rb"(?:^|\n)GET (/[^ ?]*)\S* HTTP/1\.1\r\n(.*?)\r\n\r\n", re.S)
RANGE = re.compile(rb"(?:^|\n)range:", re.I)


class CountingProxy:
    """A TCP relay on a free loopback port to @target; .down counts the bytes
    the server sent to every client (heads and bodies), .gets the whole GETs
    of each path and .ranged its GETs of a range (from the request heads the
    clients sent: GETs carry no body, and a head split between two reads is
    rare enough to ignore). The server's bytes go through a pipe by
    os.splice (the kernel moves them; counted, never read here); cpu() is
    the CPU seconds its threads took."""

    def __init__(self, target):
        self.target = target
        self.down = 0
        self.gets = collections.Counter()
        self.ranged = collections.Counter()
        self.lock = threading.Lock()
        self.live = set()  # native ids of the relay's threads now running
        self.dead_cpu = 0.0  # CPU seconds of those that ended
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(128)
        self.endpoint = f"http://127.0.0.1:{self.lsock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            try:
                s = socket.create_connection(self.target)
            except OSError:
                c.close()
                continue
            threading.Thread(target=self._relay, args=(self._pump, c, s), daemon=True).start()
            threading.Thread(target=self._relay, args=(self._splice, s, c), daemon=True).start()

    def _relay(self, how, src, dst):
        """@how(src, dst) until either end closes, its CPU time kept."""
        tid = threading.get_native_id()
        with self.lock:
            self.live.add(tid)
        try:
            how(src, dst)
        except OSError:
            pass
        finally:
            for sk in (src, dst):
                try:
                    sk.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self.lock:
                self.live.discard(tid)
                self.dead_cpu += time.thread_time()

    def _pump(self, src, dst):
        """The clients' requests: read, their GETs counted, sent on."""
        buf = bytearray(1 << 16)
        view = memoryview(buf)
        while True:
            n = src.recv_into(buf)
            if not n:
                break
            dst.sendall(view[:n])
            with self.lock:
                for m in REQUEST.finditer(buf, 0, n):
                    which = self.ranged if RANGE.search(m.group(2)) else self.gets
                    which[bytes(m.group(1))] += 1

    def _splice(self, src, dst):
        """The server's answers: socket to pipe to socket, counted."""
        r, w = os.pipe()
        try:
            while True:
                n = os.splice(src.fileno(), w, 1 << 20)
                if not n:
                    break
                with self.lock:
                    self.down += n
                while n:
                    n -= os.splice(r, dst.fileno(), n)
        finally:
            os.close(r)
            os.close(w)

    def cpu(self):
        """CPU seconds of the relay's threads so far (the ended ones' and
        the running ones' from /proc)."""
        with self.lock:
            total, live = self.dead_cpu, list(self.live)
        for tid in live:
            total += proc_cpu(f"/proc/self/task/{tid}/stat")
        return total

    def stop(self):
        self.lsock.close()


# ------------------------------------------------------------ the corpus

def bench_images():
    """bench/images as a module (its generator and spec)."""
    loader = importlib.machinery.SourceFileLoader("bench_images", os.path.join(HERE, "images"))
    spec = importlib.util.spec_from_loader("bench_images", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def make_corpus(d, nimg, per_shard):
    """The JPEGs, the list of (path, label) and the local webdataset shards."""
    root = os.path.join(d, "jpeg")
    bench_images().make_dataset(root, nimg)
    classes = sorted(os.listdir(root))
    samples = [(os.path.join(root, c, f), k) for k, c in enumerate(classes)
               for f in sorted(os.listdir(os.path.join(root, c)))]
    with open(os.path.join(d, "samples.json"), "w") as f:
        json.dump(samples, f)
    wds = os.path.join(d, "wds")
    os.makedirs(wds)
    nshards = (len(samples) + per_shard - 1) // per_shard
    for s in range(nshards):
        with tarfile.open(os.path.join(wds, f"train-{s:06d}.tar"), "w",
                          format=tarfile.USTAR_FORMAT) as tf:
            for i in range(s * per_shard, min(len(samples), (s + 1) * per_shard)):
                path, label = samples[i]
                for name, data in ((f"s{i:07d}.jpg", open(path, "rb").read()),
                                   (f"s{i:07d}.cls", str(label).encode())):
                    ti = tarfile.TarInfo(name)
                    ti.size, ti.mtime = len(data), 1700000000
                    tf.addfile(ti, io.BytesIO(data))
    return samples, nshards


def write_mds(a):
    from streaming import MDSWriter
    with open(a.samples) as f:
        samples = json.load(f)
    with MDSWriter(out=a.out, columns={"jpg": "bytes", "cls": "int"},
                   size_limit=a.shard_bytes) as w:
        for path, label in samples:
            with open(path, "rb") as f:
                w.write({"jpg": f.read(), "cls": label})


def _litdata_item(sample):
    path, label = sample
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": label}


def write_litdata(a):
    from litdata import optimize
    with open(a.samples) as f:
        samples = json.load(f)
    optimize(fn=_litdata_item, inputs=samples, output_dir=a.out, chunk_bytes=a.shard_bytes,
             num_workers=1, mode="overwrite")


def upload_tree(client, local, prefix, checksum):
    """Every file under @local to s3://BUCKET/PREFIX/...; their bytes. With
    @checksum "crc32" each PUT carries the body's x-amz-checksum-crc32, as
    AWS CLI v2's and boto3's (>= 1.36) do by default."""
    total = 0
    for dp, _, fs in os.walk(local):
        for fn in sorted(fs):
            p = os.path.join(dp, fn)
            with open(p, "rb") as f:
                data = f.read()
            key = prefix + "/" + os.path.relpath(p, local)
            headers = {}
            if checksum == "crc32":
                headers["x-amz-checksum-crc32"] = base64.b64encode(
                    zlib.crc32(data).to_bytes(4, "big")).decode()
            status, h, out = client.request("PUT", BUCKET, key, data, headers=headers)
            if status != 200:
                raise SystemExit(f"PUT {key}: HTTP {status}: {out[:300]!r}")
            for k, v in headers.items():  # the store answers the sum it kept
                if h.get(k) != v:
                    raise SystemExit(f"PUT {key}: {k} {v} answered {h.get(k)!r}")
            total += len(data)
    return total


# ------------------------------------------------------------ running

def peer_pythons(peers):
    """{peer: python} from bench/store-peers-venv, and notes for the others."""
    out = subprocess.run([os.path.join(HERE, "store-peers-venv")] + peers, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    pys = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    notes = {p: out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "not installed"
             for p in peers if p not in pys}
    return pys, notes


NODE_CPUS = None  # --store-cpu: the CPUs the daemon and the trainers run on


def on_node_cpus():
    """Popen's preexec_fn: the child on NODE_CPUS (all CPUs when unset)."""
    if NODE_CPUS:
        os.sched_setaffinity(0, NODE_CPUS)


def start_daemon(build, d, cache_bytes, **config):
    """loaderd of @build with its socket and cache_dir in @d, cache_bytes
    and the other @config keys (bench/stream_index.py's too)."""
    sock = os.path.join(d, "ld.sock")
    cfg = os.path.join(d, "loaderd.json")
    with open(cfg, "w") as f:
        json.dump(dict(config, cache_bytes=cache_bytes), f)
    log = open(os.path.join(d, "loaderd.log"), "w")
    proc = subprocess.Popen([os.path.join(build, "daemon", "loaderd"), "--socket", sock,
                             "--cache-dir", os.path.join(d, "cache"), "--config", cfg,
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=on_node_cpus)
    log.close()
    deadline = time.time() + 10
    while not (os.path.exists(sock) and os.path.exists(sock + ".fds")):
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"loaderd did not start (log: {d}/loaderd.log)")
        time.sleep(0.02)
    return proc, sock


def status(build, sock):
    out = subprocess.run([os.path.join(build, "client", "loaderctl"), "--socket", sock,
                          "--json", "status"], stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout)


def run_scenario(a, system, k, ctx):
    """K trainers of @system, 2 epochs from a cold cache: the measurements."""
    d = tempfile.mkdtemp(prefix=f"run-{system}-{k}-", dir=ctx["dir"])
    proxy = CountingProxy(ctx["server"])
    daemon = None
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), WORLD_SIZE=str(k), LOCAL_WORLD_SIZE=str(k),
               AWS_ENDPOINT_URL=proxy.endpoint, S3_ENDPOINT_URL=proxy.endpoint,
               AWS_ACCESS_KEY_ID=ctx["keys"][0], AWS_SECRET_ACCESS_KEY=ctx["keys"][1],
               AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1",
               TRANSFORMERS_VERBOSITY="error")
    extra = []
    python = sys.executable
    try:
        if system.startswith("loaderd"):
            daemon, sock = start_daemon(a.build, d, ctx["cache_bytes"])
            spec = ctx["images"].spec_json(f"bench-{system}-{k}", "", EPOCHS)
            spec["source"] = {"kind": "webdataset", "urls": [ctx["urls"][system]]}
            del spec["prefetch"]  # the default spec: what a user writes
            specf = os.path.join(d, "spec.json")
            with open(specf, "w") as f:
                json.dump(spec, f)
            extra = ["--socket", sock, "--spec", specf]
            env["LOADERD_LIBRARY"] = os.path.join(a.build, "client", "libloader.so")
        else:
            python = ctx["pythons"][system]
        procs = []
        for r in range(k):
            e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
            cmd = [python, __file__, "--trainer", "--system", system, "--rank", str(r),
                   "--world", str(k), "--workers", str(max(1, os.cpu_count() // k)),
                   "--cache", os.path.join(d, "local")] + extra
            with open(os.path.join(d, f"trainer-{r}.err"), "w") as err:
                procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=err, text=True, env=e, cwd=d,
                                              preexec_fn=on_node_cpus))
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                return failed(system, k, d, procs, "before its start")
        meter = CpuMeter(ctx["server_pid"], proxy, daemon.pid if daemon else None)
        meter.start()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        epochs = [[], []]
        fetched = []
        for e in range(EPOCHS):
            for p in procs:
                line = p.stdout.readline()
                try:
                    epochs[e].append(json.loads(line))
                except ValueError:
                    return failed(system, k, d, procs, f"in epoch {e + 1}")
            fetched.append(proxy.down)
            if e == 0:
                cpu = meter.stop()
        for p in procs:
            p.stdin.close()
            p.wait(60)
        oc = status(a.build, sock)["object_cache"] if daemon else None
    finally:
        proxy.stop()
        if daemon:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(10)
    corpus = ctx["bytes"][system]
    r = {"system": system, "k": k, "workers_per_trainer": max(1, os.cpu_count() // k)}
    for e in range(EPOCHS):
        n = sum(x["images"] for x in epochs[e])
        s = max(x["seconds"] for x in epochs[e])
        r[f"epoch{e + 1}"] = {"images": n, "seconds": round(s, 3),
                              "img_per_s": round(n / s, 1) if s else 0.0}
    r["cpu_epoch1"] = cpu
    r["bytes_fetched"] = fetched[-1]
    r["bytes_fetched_epoch2"] = fetched[-1] - fetched[0]
    r["corpus_bytes"] = corpus
    data = [n for path, n in proxy.gets.items() if not path.endswith((b".json", b"/"))]
    r["objects_got"] = len(data)
    r["most_gets_of_one"] = max(data, default=0)
    r["ranged_gets"] = sum(proxy.ranged.values())
    r["x_corpus"] = round(fetched[-1] / corpus, 3) if corpus else None
    if oc:
        r["object_cache"] = {key: oc[key] for key in ("misses", "hits", "bytes_fetched")}
    return r


def failed(system, k, d, procs, when):
    """The row of a scenario whose trainer failed: its error's last line
    (the run goes on with the next scenario; the trainers are ended)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    why = "no error output"
    for r in range(len(procs)):
        with open(os.path.join(d, f"trainer-{r}.err"), errors="replace") as f:
            lines = [x.strip() for x in f if x.strip() and not x.startswith((" ", "\t"))]
        if lines:
            why = lines[-1][:300]
            break
    print(f"# {system} K={k}: a trainer failed {when}: {why} (stderr: {d}/trainer-*.err; "
          "--keep keeps it)", flush=True)
    return {"system": system, "k": k, "error": f"a trainer failed {when}: {why}"}


def proc_cpu(stat_path):
    """utime + stime, in seconds, of a /proc/.../stat (0 once it is gone)."""
    try:
        with open(stat_path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy():
    """Core-seconds every core was busy since boot (/proc/stat: all but idle
    and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds of the store side (the server's process and @proxy's
    threads), of @daemon's process and of the whole machine, between
    start() and stop()."""

    def __init__(self, server_pid, proxy, daemon_pid):
        self.paths = {"store": f"/proc/{server_pid}/stat",
                      "daemon": f"/proc/{daemon_pid}/stat" if daemon_pid else None}
        self.proxy = proxy

    def read(self):
        return {"server": proc_cpu(self.paths["store"]), "proxy": self.proxy.cpu(),
                "daemon": proc_cpu(self.paths["daemon"]) if self.paths["daemon"] else None,
                "machine": machine_busy(), "wall": time.monotonic()}

    def start(self):
        self.t0 = self.read()

    def stop(self):
        t1 = self.read()
        d = {k: round(t1[k] - self.t0[k], 2) for k in t1 if t1[k] is not None}
        return {"store_s": round(d["server"] + d["proxy"], 2), "server_s": d["server"],
                "proxy_s": d["proxy"], "daemon_s": d.get("daemon"), "machine_s": d["machine"],
                "wall_s": d["wall"]}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def fmt_row(r):
    if "error" in r:
        return f"{r['system']:14} {r['k']:2d}  FAILED ({r['error'][:60]})"
    e1, e2, cpu = r["epoch1"], r["epoch2"], r["cpu_epoch1"]
    xc = "-" if r["x_corpus"] is None else f"{r['x_corpus']:.2f}"
    dm = "-" if cpu["daemon_s"] is None else f"{cpu['daemon_s']:.2f}"
    return (f"{r['system']:14} {r['k']:2d}  {e1['img_per_s']:9.1f}  {e2['img_per_s']:9.1f}  "
            f"{r['bytes_fetched'] / 2**20:11.1f}  {xc:>8}  {r['objects_got']:7d}  "
            f"{r['most_gets_of_one']:8d}  {r['ranged_gets']:6d}  {e1['images']:6d}  "
            f"{cpu['server_s']:6.2f}+{cpu['proxy_s']:.2f}  {dm:>8}  {cpu['machine_s']:7.2f}"
            f"/{cpu['wall_s'] * os.cpu_count():.2f}")


def verdicts(results):
    """The ratios against issue 28's targets, one line each."""
    out = []

    def get(system, k):
        return next((r for r in results if r["system"] == system and r["k"] == k and
                     "error" not in r), None)
    for k in sorted({r["k"] for r in results}):
        loc, s3 = get("loaderd-local", k), get("loaderd-s3", k)
        if loc and s3:
            r1 = s3["epoch1"]["img_per_s"] / loc["epoch1"]["img_per_s"]
            r2 = s3["epoch2"]["img_per_s"] / loc["epoch2"]["img_per_s"]
            out.append(f"K={k} loaderd s3/local: epoch 1 {r1:.2f}x (target >= 0.90: "
                       f"{'met' if r1 >= 0.9 else 'NOT met'}), epoch 2 {r2:.2f}x (target equal, "
                       f"not below 0.95: {'met' if r2 >= 0.95 else 'NOT met'}); fetched "
                       f"{s3['x_corpus']:.2f}x the shards (target 1: "
                       f"{'met' if s3['x_corpus'] <= 1.05 else 'NOT met'})")
        for peer in ("mosaic", "litdata"):
            p = get(peer, k)
            if p and s3:
                out.append(f"K={k} loaderd-s3/{peer}: epoch 1 "
                           f"{s3['epoch1']['img_per_s'] / p['epoch1']['img_per_s']:.2f}x, "
                           f"epoch 2 {s3['epoch2']['img_per_s'] / p['epoch2']['img_per_s']:.2f}x"
                           f" img/s; {peer} fetched {p['x_corpus']:.2f}x its objects")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for hidden in ("--system", "--spec", "--socket", "--cache", "--samples", "--out"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--write", choices=("mds", "litdata"), help=argparse.SUPPRESS)
    ap.add_argument("--shard-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--images", type=int, default=10000, help="JPEGs in the corpus")
    ap.add_argument("--per-shard", type=int, default=256, help="samples per webdataset shard")
    ap.add_argument("--ks", help="trainer counts (default 1,4; --quick 1,2)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--build", default=os.environ.get("LOADERD_BUILD", os.path.join(REPO, "build")))
    ap.add_argument("--put-checksum", choices=("crc32", "none"), default="crc32",
                    help="the x-amz-checksum-* each upload carries (default crc32, as AWS "
                         "CLI v2 and boto3 >= 1.36 send; none: as older tools)")
    ap.add_argument("--store-cpu", type=int,
                    help="the store (server, proxies) on this CPU alone, the node on the others")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--quick", action="store_true",
                    help="384 images, shards of 64, K = 1, 2 (a smoke test)")
    a = ap.parse_args()
    if a.trainer:
        return trainer(a)
    if a.write == "mds":
        return write_mds(a)
    if a.write == "litdata":
        return write_litdata(a)
    if a.quick:
        a.images, a.per_shard = 384, 64
    a.ks = a.ks or ("1,2" if a.quick else "1,4")
    ks = [int(x) for x in a.ks.split(",")]
    systems = a.systems.split(",")
    sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
    import s3server
    d = tempfile.mkdtemp(prefix="ldr-bench-store-", dir="/tmp")
    srv = None
    try:
        peers = [p for p in ("mosaic", "litdata") if p in systems]
        pythons, notes = peer_pythons(peers) if peers else ({}, {})
        t = time.time()
        samples, nshards = make_corpus(d, a.images, a.per_shard)
        wds = os.path.join(d, "wds")
        shard_bytes = sum(os.path.getsize(os.path.join(wds, f)) for f in os.listdir(wds))
        per = shard_bytes // nshards
        srv = s3server.S3Server(d).start()
        alice = srv.client("alice")
        nbytes = {"loaderd-s3": upload_tree(alice, wds, "wds", a.put_checksum), "loaderd-local": 0}
        for peer, fmt in (("mosaic", "mds"), ("litdata", "litdata")):
            if peer not in pythons or peer not in systems:
                continue
            out = os.path.join(d, fmt)
            w = subprocess.run([pythons[peer], __file__, "--write", fmt, "--samples",
                                os.path.join(d, "samples.json"), "--out", out,
                                "--shard-bytes", str(per)], cwd=d, stdout=subprocess.PIPE,
                               env=dict(os.environ, TRANSFORMERS_VERBOSITY="error"),
                               stderr=subprocess.STDOUT, text=True)
            if w.returncode != 0:
                notes[peer] = f"its writer failed: {w.stdout.strip()[-600:]}"
                del pythons[peer]
                continue
            nbytes[peer] = upload_tree(alice, out, fmt, a.put_checksum)
        hi = f"{nshards - 1:06d}"
        ctx = {"dir": d, "server": ("127.0.0.1", int(srv.endpoint.rsplit(":", 1)[1])),
               "server_pid": srv.proc.pid,
               "keys": s3server.IDENTITIES["alice"][:2], "pythons": pythons,
               "images": bench_images(), "bytes": nbytes, "cache_bytes": 2 * shard_bytes,
               "urls": {"loaderd-local": os.path.join(wds, "train-{000000.." + hi + "}.tar"),
                        "loaderd-s3": f"s3://{BUCKET}/wds/train-{{000000..{hi}}}.tar"}}
        bench_images().warm_page_cache(wds)
        global NODE_CPUS
        pinned = ""
        if a.store_cpu is not None:
            cpus = os.sched_getaffinity(0)
            if a.store_cpu not in cpus or len(cpus) < 2:
                raise SystemExit(f"--store-cpu {a.store_cpu}: not one of this process's CPUs {sorted(cpus)} "
                                 "(and another must be left)")
            NODE_CPUS = cpus - {a.store_cpu}
            subprocess.run(["taskset", "-a", "-p", "-c", str(a.store_cpu), str(srv.proc.pid)], check=True,
                           stdout=subprocess.DEVNULL)
            os.sched_setaffinity(0, {a.store_cpu})  # the proxies' threads, made later, inherit it
            pinned = (f"; the store and the proxies on CPU {a.store_cpu}, the daemon and the trainers on "
                      f"CPU {','.join(map(str, sorted(NODE_CPUS)))}")
        print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.1f}; {len(samples)} 256x256 JPEGs in {nshards} shards, "
              f"{shard_bytes / 2**20:.1f} MiB (cache_bytes {2 * shard_bytes / 2**20:.0f} MiB), "
              f"uploaded with x-amz-checksum: {a.put_checksum}; corpus made and uploaded in "
              f"{time.time() - t:.0f} s{pinned}")
        for peer, why in notes.items():
            print(f"# {peer} skipped: {why}")
        print("system          K  e1 img/s   e2 img/s  MiB fetched  x corpus  objects  "
              "max GETs  ranged  images  e1 CPU s: store (server+proxy)  daemon  "
              "machine/cores x wall")
        results = []
        for k in ks:
            for system in systems:
                if system in ("mosaic", "litdata") and system not in pythons:
                    continue
                r = run_scenario(a, system, k, ctx)
                results.append(r)
                print(fmt_row(r), flush=True)
        print()
        for line in verdicts(results):
            print(line)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"results": results, "notes": notes, "images": len(samples),
                           "put_checksum": a.put_checksum, "store_cpu": a.store_cpu,
                           "shards": nshards, "shard_bytes": shard_bytes}, f, indent=1)
    finally:
        if srv:
            srv.stop()
        if a.keep:
            print(f"kept {d}")
        else:
            subprocess.run(["rm", "-rf", d])
    return 0


if __name__ == "__main__":
    sys.exit(main())
