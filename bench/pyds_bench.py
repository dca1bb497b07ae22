# SPDX-License-Identifier: MIT
"""The Datasets of bench/pydataset_compare.py: a user's own map-style
torch Datasets, importable by torch's and loaderd's worker processes (this
directory is on sys.path in the trainer, and both send it to their workers).

JpegCrops: JPEG files in a directory (an ImageFolder-like training set).
  __getitem__ opens and decodes the file with PIL and applies torchvision's
  RandomResizedCrop(160) + RandomHorizontalFlip + ToTensor + Normalize;
  returns (float32 [3, 160, 160], label int). An epoch visits every file
  `repeat` times (other crops each time), so that an epoch lasts longer than
  the measuring window on both sides.
Rows: a float32 [rows, dim] .npy file, memory-mapped; __getitem__ returns
  (the row as a numpy array, label int): next to no work per sample, so the
  per-sample and per-batch overhead of each loader shows.
"""

import os

import numpy as np

IMG_SIZE = 256
CROP = 160
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def make_jpegs(d, n, seed=0):
    """@n seeded IMG_SIZE x IMG_SIZE JPEGs (smooth gradients + noise + shapes,
    about the entropy of a photo) into @d; returns the file names."""
    from PIL import Image, ImageDraw
    rng = np.random.default_rng(seed)
    os.makedirs(d, exist_ok=True)
    names = []
    yy, xx = np.mgrid[0:IMG_SIZE, 0:IMG_SIZE].astype(np.float32) / IMG_SIZE
    for i in range(n):
        c0, c1, c2 = rng.uniform(0, 255, (3, 3))
        img = (c0[None, None, :] * (1 - yy[..., None]) + c1[None, None, :] * xx[..., None]
               + c2[None, None, :] * (yy * xx)[..., None]) / 2
        img += rng.normal(0, 18, img.shape)
        im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")
        dr = ImageDraw.Draw(im)
        for _ in range(6):
            x0, y0 = rng.integers(0, IMG_SIZE - 32, 2)
            w, h = rng.integers(16, 128, 2)
            dr.ellipse([int(x0), int(y0), int(x0 + w), int(y0 + h)],
                       fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        name = f"{i:05d}_{i % 100}.jpg"
        im.save(os.path.join(d, name), quality=90)
        names.append(name)
    return names


class JpegCrops:
    """A map-style Dataset (torch's only asks for __getitem__ and __len__)."""

    def __init__(self, root, names, repeat=1):
        self.root = root
        self.names = list(names)
        self.repeat = repeat
        self._tf = None

    def __getstate__(self):
        return {"root": self.root, "names": self.names, "repeat": self.repeat, "_tf": None}

    def __len__(self):
        return len(self.names) * self.repeat

    def _transform(self):
        if self._tf is None:
            import torchvision.transforms as T
            self._tf = T.Compose([T.RandomResizedCrop(CROP), T.RandomHorizontalFlip(),
                                  T.ToTensor(), T.Normalize(MEAN, STD)])
        return self._tf

    def __getitem__(self, i):
        from PIL import Image
        name = self.names[i % len(self.names)]
        with Image.open(os.path.join(self.root, name)) as im:
            im = im.convert("RGB")
        return self._transform()(im), int(name.split("_")[1].split(".")[0])


def make_rows(path, rows, dim, seed=0):
    rng = np.random.default_rng(seed)
    np.save(path, rng.standard_normal((rows, dim), dtype=np.float32))


class Rows:
    """Rows of a float32 .npy file (memory-mapped once per process)."""

    def __init__(self, path):
        self.path = path
        self._x = None
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            shape, _, _ = np.lib.format._read_array_header(f, version)
        self.n = shape[0]

    def __getstate__(self):
        return {"path": self.path, "_x": None, "n": self.n}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self._x is None:
            self._x = np.load(self.path, mmap_mode="r")
        return self._x[i], i % 1000
