# SPDX-License-Identifier: MIT
"""The data loaders bench/peers compares loaderd with, one run each.

    python bench/peer_loaders.py PEER ROOT --epochs E --workers N [--batch 64]

PEER is torch, dali, spdl or grain; ROOT an image folder (class folders of
JPEGs, as bench/images writes them). Each loader reads every file of ROOT
once an epoch in a shuffled order for E epochs with the image pipeline of
bench/images: a random resized crop to 224 (scale 0.08-1, ratio 3/4-4/3), a
horizontal flip with p 0.5, normalize with ImageNet's mean and std, float32
NCHW batches of --batch, with N worker processes or threads. The first
epoch is the warm-up (worker start, the first touch of every buffer): it
prints one JSON line with the images per second of epochs 2..E, as bench-
client --skip-epochs 1 does for loaderd. What differs between the loaders
is where each cannot do exactly the same (docs/benchmarks.md, "Against
other data loaders"):

  torch  torchvision ImageFolder, RandomResizedCrop, RandomHorizontalFlip,
         ToTensor, Normalize; DataLoader(num_workers=N, persistent_workers)
         (bench/images' torch_rate)
  dali   NVIDIA DALI on the CPU only (device_id None): fn.readers.file
         (shuffle_after_epoch: a full shuffle an epoch), fn.decoders.image
         (device "cpu"), fn.random_resized_crop (linear, antialiased),
         fn.crop_mirror_normalize (mirror = fn.random.coin_flip, float CHW);
         num_threads N. The flip is crop_mirror_normalize's own (one pass):
         a separate fn.flip only adds a copy.
  spdl   Meta's SPDL: a PipelineBuilder whose decode stage (concurrency N,
         threads: SPDL releases the GIL) demuxes and decodes each JPEG with
         FFmpeg, the crop, the resize (swscale, bilinear: not antialiased)
         and the flip in FFmpeg's filter graph; batches of RGB uint8 from
         spdl.io.convert_frames normalized to float32 NCHW with torch
  grain  Google's Grain: MapDataset.source(files).repeat(E).shuffle
         .random_map(torchvision's transforms, seeded from Grain's rng)
         .batch(B).to_iter_dataset().mp_prefetch(num_workers=N); epochs are
         repeats of one shuffled dataset (Grain's own way to run epochs)
"""

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
SIZE = 224


def image_files(root):
    """(path, class index) of every file under ROOT's class folders, sorted."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    out = []
    for c, d in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, d))):
            out.append((os.path.join(root, d, f), c))
    return out


def rrc_params(w, h, rng):
    """torchvision's RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3,
    10 tries, then the centre crop of the clamped ratio) with numpy's rng:
    (left, top, width, height)."""
    area = w * h
    lr = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        ta = area * rng.uniform(0.08, 1.0)
        ar = math.exp(rng.uniform(*lr))
        cw = int(round(math.sqrt(ta * ar)))
        ch = int(round(math.sqrt(ta / ar)))
        if 0 < cw <= w and 0 < ch <= h:
            return int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1)), cw, ch
    r = w / h
    if r < 3 / 4:
        cw, ch = w, int(round(w / (3 / 4)))
    elif r > 4 / 3:
        ch, cw = h, int(round(h * (4 / 3)))
    else:
        cw, ch = w, h
    return (w - cw) // 2, (h - ch) // 2, cw, ch


class Counter:
    """Images of the batches after the first epoch's, and their time (from the
    arrival of the first epoch's last batch)."""

    def __init__(self, nimg, batch):
        self.warm = math.ceil(nimg / batch)  # batches in the first epoch
        self.batches = self.images = 0
        self.t_start = time.monotonic()
        self.t0 = None

    def add(self, rows):
        self.batches += 1
        if self.batches == self.warm:
            self.t0 = time.monotonic()
            self.first = self.t0 - self.t_start
        elif self.batches > self.warm:
            self.images += rows

    def result(self, peer, workers):
        dt = time.monotonic() - self.t0
        return {"bench": peer, "workers": workers, "images": self.images,
                "seconds": round(dt, 3), "samples_per_s": round(self.images / dt, 1),
                "first_epoch_s": round(self.first, 3)}


def run_torch(root, epochs, workers, batch):
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("bench_images", os.path.join(HERE, "images"))
    spec = importlib.util.spec_from_loader("bench_images", loader)
    images = importlib.util.module_from_spec(spec)
    loader.exec_module(images)
    assert batch == 64, "bench/images' torch_rate takes batches of 64"
    r = images.torch_rate(root, epochs, workers)
    r["bench"] = "torch"
    return r


def run_dali(root, epochs, workers, batch):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=workers, device_id=None, seed=1,
                  prefetch_queue_depth=2)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, shuffle_after_epoch=True, name="files")
        img = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        img = fn.random_resized_crop(img, size=SIZE)
        img = fn.crop_mirror_normalize(img, dtype=types.FLOAT, output_layout="CHW",
                                       mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                       mirror=fn.random.coin_flip(probability=0.5))
        return img, labels

    p = pipe()
    p.build()
    nimg = p.epoch_size("files")
    count = Counter(nimg, batch)
    for _ in range(epochs * count.warm):
        x, _ = p.run()
        t = x.as_tensor()  # one dense [B, 3, 224, 224] batch, as a trainer takes it
        count.add(t.shape()[0])
    return count.result("dali", workers)


def run_spdl(root, epochs, workers, batch):
    import numpy as np
    import spdl.io
    import torch
    from spdl.pipeline import PipelineBuilder
    torch.set_num_threads(1)
    files = [p for p, _ in image_files(root)]
    mean = torch.tensor(MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD).view(1, 3, 1, 1) * 255

    def source():
        rng = np.random.default_rng(1)
        for _ in range(epochs):
            yield from (files[i] for i in rng.permutation(len(files)))

    def decode(path):
        rng = np.random.default_rng()
        packets = spdl.io.demux_image(path)
        left, top, cw, ch = rrc_params(packets.width, packets.height, rng)
        flt = f"crop={cw}:{ch}:{left}:{top},scale={SIZE}:{SIZE}:flags=bilinear"
        if rng.random() < 0.5:
            flt += ",hflip"
        return spdl.io.decode_packets(packets, filter_desc=flt + ",format=rgb24")

    def collate(frames):
        x = spdl.io.to_torch(spdl.io.convert_frames(frames))  # [B, H, W, 3] uint8
        return x.permute(0, 3, 1, 2).float().sub_(mean).div_(std).contiguous()

    pipeline = (PipelineBuilder().add_source(source())
                .pipe(decode, concurrency=workers, output_order="completion")
                .aggregate(batch).pipe(collate).add_sink(4).build(num_threads=workers))
    count = Counter(len(files), batch)
    with pipeline.auto_stop():
        for x in pipeline:
            count.add(x.shape[0])
    return count.result("spdl", workers)


def grain_transform(item, rng):
    """Grain's random_map: torchvision's transforms (the torch row's) drawn from
    a seed of Grain's per-element rng."""
    import torch
    from PIL import Image
    import torchvision.transforms as T
    global _TF
    try:
        tf = _TF
    except NameError:
        torch.set_num_threads(1)
        tf = _TF = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(),
                              T.Normalize(MEAN, STD)])
    path, label = item
    torch.manual_seed(int(rng.integers(1 << 62)))
    with Image.open(path) as im:
        x = tf(im.convert("RGB"))
    return {"image": x.numpy(), "label": label}


def run_grain(root, epochs, workers, batch):
    import grain
    files = image_files(root)
    ds = (grain.MapDataset.source(files).repeat(epochs).shuffle(seed=1)
          .random_map(grain_transform, seed=1).batch(batch).to_iter_dataset()
          .mp_prefetch(grain.MultiprocessingOptions(num_workers=workers)))
    count = Counter(len(files), batch)
    for b in ds:
        count.add(b["image"].shape[0])
    return count.result("grain", workers)


def version(peer):
    import importlib.metadata
    if peer == "torch":
        import torch
        import torchvision
        return f"{torch.__version__}, torchvision {torchvision.__version__}"
    return importlib.metadata.version({"dali": "nvidia-dali-cuda120"}.get(peer, peer))


PEERS = {"torch": run_torch, "dali": run_dali, "spdl": run_spdl, "grain": run_grain}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("peer", choices=sorted(PEERS))
    ap.add_argument("root")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    if a.epochs < 2:
        ap.error("--epochs must be 2 or more: the first is the warm-up")
    r = PEERS[a.peer](a.root, a.epochs, a.workers, a.batch)
    r["version"] = version(a.peer)
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
