# SPDX-License-Identifier: MIT
"""Public training scripts' data paths and loops, ported to loaderd as a
user ports them: `torch.utils.data.DataLoader` swapped for
`loaderd.DataLoader` (the socket from $LOADERD_SOCKET), everything else as
the authors wrote it (issue 26). Each script runs once with torch's
DataLoader and once with loaderd's (with the worker processes the scripts
give it), and the loaderd run must give exactly what torch's gives: every
batch, in order, and the losses of a tiny model after torch.manual_seed.

- torchvision references/detection/train.py: create_aspect_ratio_groups
  and GroupedBatchSampler (group_by_aspect_ratio.py) over a RandomSampler,
  utils.collate_fn = tuple(zip(*batch)) of images of two aspect ratios and
  target dicts with 0-3 boxes, train_one_epoch and the test loader;
- a Hugging Face-style text classifier (run_glue_no_trainer.py's loop):
  a tokenizer called in __getitem__, DataCollatorWithPadding (a callable
  object: padding=True to each batch's longest), shuffle=True with a
  generator; an eval loader of raw (text, label) collated by torch into
  a list of str, tokenized in the loop;
- the WeightedRandomSampler class-balancing recipe (TensorDataset, weights
  1 / class count), two epochs;
- DDP ranks under torch.multiprocessing.spawn (a script; its Dataset class
  lives in __mp_main__ in the ranks), gloo, DistributedSampler(shuffle=True,
  seed) with set_epoch each epoch, and a mid-epoch checkpoint of
  loader.state_dict() resumed with load_state_dict() in a fresh loader;
  the same loop stopped by a time limit, its checkpoint written after the
  loop (state_dict() is the rest of the broken loop, as torchdata's
  StatefulDataLoader has it).

The Datasets here are deterministic: random transforms in workers are
seeded per sample by loaderd (docs/python.md, "Seeding"), not as torch's."""

import bisect
import json
import math
import os
from collections import defaultdict
from itertools import chain, repeat

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import loaderd  # noqa: E402
from conftest import needs_forked_host, run_python  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import BatchSampler, Sampler  # noqa: E402

F = nn.functional


@pytest.fixture
def loaders(ld, monkeypatch):
    """The two DataLoader classes a script is run with: torch's, then
    loaderd's (found through $LOADERD_SOCKET, as a user's would be). The
    loaderd loaders are closed at the end."""
    monkeypatch.setenv("LOADERD_SOCKET", ld.socket)
    made = []

    class DataLoader(loaderd.DataLoader):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    yield {"torch": torch.utils.data.DataLoader, "loaderd": DataLoader}
    for dl in made:
        dl.close()


def run_both(loaders, script):
    """script(DataLoader) under each loader, from the same global RNG state;
    loaderd's result must be torch's."""
    got = {}
    for kind, cls in loaders.items():
        torch.manual_seed(0)
        got[kind] = script(cls)
    assert got["loaderd"] == got["torch"]
    return got["torch"]


# ------------------------------------------- torchvision detection reference

def _repeat_to_at_least(iterable, n):  # group_by_aspect_ratio.py
    repeat_times = math.ceil(n / len(iterable))
    return list(chain.from_iterable(repeat(iterable, repeat_times)))


class GroupedBatchSampler(BatchSampler):
    """group_by_aspect_ratio.py's: batches of one group each, in the order
    the sampler fills them; at the end, the fullest groups' leftovers are
    completed with repeats of that group's samples up to len(self) batches."""

    def __init__(self, sampler, group_ids, batch_size):
        if not isinstance(sampler, Sampler):
            raise ValueError(f"sampler should be an instance of torch.utils.data.Sampler, "
                             f"but got sampler={sampler}")
        self.sampler, self.group_ids, self.batch_size = sampler, group_ids, batch_size

    def __iter__(self):
        buffer_per_group, samples_per_group = defaultdict(list), defaultdict(list)
        num_batches = 0
        for idx in self.sampler:
            group_id = self.group_ids[idx]
            buffer_per_group[group_id].append(idx)
            samples_per_group[group_id].append(idx)
            if len(buffer_per_group[group_id]) == self.batch_size:
                yield buffer_per_group[group_id]
                num_batches += 1
                del buffer_per_group[group_id]
        num_remaining = len(self) - num_batches
        if num_remaining > 0:
            for group_id, _ in sorted(buffer_per_group.items(), key=lambda x: len(x[1]),
                                      reverse=True):
                remaining = self.batch_size - len(buffer_per_group[group_id])
                extra = _repeat_to_at_least(samples_per_group[group_id], remaining)
                buffer_per_group[group_id].extend(extra[:remaining])
                yield buffer_per_group[group_id]
                num_remaining -= 1
                if num_remaining == 0:
                    break

    def __len__(self):
        return len(self.sampler) // self.batch_size


def create_aspect_ratio_groups(dataset, k=0):  # group_by_aspect_ratio.py
    aspect_ratios = []
    for i in range(len(dataset)):
        height, width = dataset.get_height_and_width(i)
        aspect_ratios.append(float(width) / float(height))
    bins = (2 ** np.linspace(-1, 1, 2 * k + 1)).tolist() if k > 0 else [1.0]
    bins = sorted(bins)
    return [bisect.bisect_right(bins, y) for y in aspect_ratios]


def collate_fn(batch):  # references/detection/utils.py
    return tuple(zip(*batch))


class ShapesDetection(torch.utils.data.Dataset):
    """Images 3x16x24 (landscape) or 3x24x16 (portrait), target dicts as
    torchvision's detection datasets give them: boxes [n, 4] (n = 0..3),
    labels, image_id, area, iscrowd."""

    def __init__(self, n):
        self.n = n

    def get_height_and_width(self, i):
        return (16, 24) if i % 3 else (24, 16)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        h, w = self.get_height_and_width(i)
        img = torch.arange(3 * h * w, dtype=torch.float32).reshape(3, h, w) % (i + 7) / (i + 7)
        nb = i % 4
        boxes = torch.tensor([[j, j, j + 4 + i % 5, j + 6] for j in range(nb)],
                             dtype=torch.float32).reshape(nb, 4)
        target = {"boxes": boxes, "labels": torch.ones(nb, dtype=torch.int64) + i % 2,
                  "image_id": i, "area": (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 2] - boxes[:, 0]),
                  "iscrowd": torch.zeros(nb, dtype=torch.int64)}
        return img, target


class TinyDetector(nn.Module):
    """A loss per image as a detection model's loss_dict: a box count and
    the mean box area regressed from the image."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 2)

    def forward(self, images, targets=None):
        out = [self.head(self.conv(img[None]).mean((2, 3)))[0] for img in images]
        if targets is None:
            return [{"scores": o} for o in out]
        count = sum(F.mse_loss(o[0], torch.tensor(float(len(t["boxes"]))))
                    for o, t in zip(out, targets))
        area = sum(F.mse_loss(o[1], t["area"].sum() / 100) for o, t in zip(out, targets))
        return {"loss_count": count, "loss_area": area}


def detection_train(DataLoader, workers=2, epochs=2):
    """references/detection/train.py main() (no --distributed), its
    train_one_epoch (engine.py) and the test loader, on ShapesDetection."""
    dataset, dataset_test = ShapesDetection(26), ShapesDetection(7)
    train_sampler = torch.utils.data.RandomSampler(dataset)
    test_sampler = torch.utils.data.SequentialSampler(dataset_test)
    group_ids = create_aspect_ratio_groups(dataset, k=3)
    train_batch_sampler = GroupedBatchSampler(train_sampler, group_ids, 2)
    data_loader = DataLoader(dataset, batch_sampler=train_batch_sampler, num_workers=workers,
                             collate_fn=collate_fn)
    data_loader_test = DataLoader(dataset_test, batch_size=1, sampler=test_sampler,
                                  num_workers=workers, collate_fn=collate_fn)
    model = TinyDetector()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9, weight_decay=1e-4)
    seen, losses, evals = [], [], []
    for epoch in range(epochs):
        model.train()
        for images, targets in data_loader:  # train_one_epoch
            images = list(image for image in images)
            targets = [{k: v for k, v in t.items()} for t in targets]
            loss_dict = model(images, targets)
            loss = sum(loss for loss in loss_dict.values())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append([(t["image_id"], tuple(img.shape), t["boxes"].tolist(),
                          t["labels"].tolist()) for img, t in zip(images, targets)])
            losses.append(loss.item())
        model.eval()
        with torch.no_grad():
            for images, targets in data_loader_test:  # evaluate
                outputs = model(list(images))
                evals.append([(t["image_id"], o["scores"].tolist())
                              for t, o in zip(targets, outputs)])
    return seen, losses, evals


def test_torchvision_detection_reference(loaders):
    seen, losses, evals = run_both(loaders, detection_train)
    assert len(seen) == 2 * 13 and len(evals) == 2 * 7
    for batch in seen:  # one aspect ratio per batch, boxes of 0-3 per image
        assert len(batch) == 2 and batch[0][1] == batch[1][1]
    assert {len(img[2]) for batch in seen for img in batch} == {0, 1, 2, 3}
    ids = [[img[0] for img in b] for b in seen]
    assert ids[:13] != ids[13:]  # the RandomSampler's two epochs
    assert all(math.isfinite(x) for x in losses)


# ------------------------------------------------- Hugging Face text classifier

WORDS = ["the", "movie", "was", "good", "bad", "plot", "very", "acting", "not", "great",
         "boring", "fun", "and", "a", "story"]


def review(i):
    n = 3 + (i * 7) % 11
    return " ".join(WORDS[(i * 5 + 3 * j + j * j) % len(WORDS)] for j in range(n))


class WordTokenizer:
    """What the script uses of a PreTrainedTokenizer: __call__ on a text or
    a list of texts (truncation, padding=True), pad() of features."""

    pad_token_id = 0

    def __init__(self, words):
        self.vocab = {"[PAD]": 0, "[CLS]": 1, "[UNK]": 2}
        self.vocab.update({w: i + 3 for i, w in enumerate(words)})

    def __call__(self, text, truncation=False, max_length=None, padding=False,
                 return_tensors=None):
        if not isinstance(text, str):
            return self.pad([self(t, truncation, max_length) for t in text], padding,
                            return_tensors)
        ids = [1] + [self.vocab.get(w, 2) for w in text.split()]
        if truncation and max_length:
            ids = ids[:max_length]
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def pad(self, features, padding=True, return_tensors=None):
        longest = max(len(f["input_ids"]) for f in features)
        batch = defaultdict(list)
        for f in features:
            for k, v in f.items():
                if k in ("input_ids", "attention_mask"):
                    v = v + [0] * (longest - len(v))
                batch[k].append(v)
        return {k: torch.tensor(v) for k, v in batch.items()} if return_tensors == "pt" \
            else dict(batch)


class DataCollatorWithPadding:  # transformers/data/data_collator.py
    def __init__(self, tokenizer, padding=True, return_tensors="pt"):
        self.tokenizer, self.padding, self.return_tensors = tokenizer, padding, return_tensors

    def __call__(self, features):
        batch = self.tokenizer.pad(features, padding=self.padding,
                                   return_tensors=self.return_tensors)
        if "label" in batch:
            batch["labels"] = batch.pop("label")
        return batch


class ReviewDataset(torch.utils.data.Dataset):
    """Tokenized in __getitem__ (the usual tutorial Dataset); raw=True gives
    (text, label) as read from a csv."""

    def __init__(self, n, tokenizer, raw=False):
        self.texts = [review(i) for i in range(n)]
        self.labels = [int("good" in t or "great" in t) for t in self.texts]
        self.tokenizer, self.raw = tokenizer, raw

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        if self.raw:
            return self.texts[i], self.labels[i]
        enc = self.tokenizer(self.texts[i], truncation=True, max_length=12)
        return {**enc, "label": self.labels[i]}


class Output:
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class BagClassifier(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 8, padding_idx=0)
        self.classifier = nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask, labels=None):
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1)
        logits = self.classifier(pooled)
        return Output(None if labels is None else F.cross_entropy(logits, labels), logits)


def text_classifier_train(DataLoader, workers=2, epochs=2):
    """run_glue_no_trainer.py's data path and loop, minus accelerate."""
    tokenizer = WordTokenizer(WORDS[:-2])  # "a", "story" are [UNK]
    train_dataset = ReviewDataset(30, tokenizer)
    eval_dataset = ReviewDataset(10, tokenizer, raw=True)
    data_collator = DataCollatorWithPadding(tokenizer)
    train_dataloader = DataLoader(train_dataset, shuffle=True, collate_fn=data_collator,
                                  batch_size=4, num_workers=workers,
                                  generator=torch.Generator().manual_seed(42))
    eval_dataloader = DataLoader(eval_dataset, batch_size=4, num_workers=workers)
    model = BagClassifier(len(tokenizer.vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-2)
    batches, losses, predictions = [], [], []
    for epoch in range(epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            batches.append({k: v.tolist() for k, v in batch.items()})
            losses.append(loss.item())
        model.eval()
        for texts, labels in eval_dataloader:
            inputs = tokenizer(texts, padding=True, return_tensors="pt")
            with torch.no_grad():
                logits = model(**inputs).logits
            predictions.append((list(texts), labels.tolist(), logits.argmax(-1).tolist()))
    return batches, losses, predictions


def test_hf_text_classifier(loaders):
    batches, losses, predictions = run_both(loaders, text_classifier_train)
    assert len(batches) == 2 * 8 and [len(b["labels"]) for b in batches[:8]] == [4] * 7 + [2]
    widths = {len(b["input_ids"][0]) for b in batches}
    assert len(widths) > 2 and max(widths) <= 12  # padded per batch, not to a fixed length
    for b in batches:
        assert all(len(row) == len(b["input_ids"][0]) for row in b["input_ids"])
        assert max(sum(m) for m in b["attention_mask"]) == len(b["attention_mask"][0])
    assert predictions[0][0] == [review(i) for i in range(4)]  # a list of str
    assert sorted(sum((b["labels"] for b in batches[:8]), [])) == \
        sorted(ReviewDataset(30, None).labels)


# ------------------------------------------------------ WeightedRandomSampler

def weighted_train(DataLoader, epochs=2):
    """The class-balancing recipe: weights 1 / class count per sample."""
    numDataPoints, data_dim, bs = 60, 5, 8
    data = torch.arange(numDataPoints * data_dim, dtype=torch.float32) \
        .reshape(numDataPoints, data_dim) / 100
    target = np.hstack((np.zeros(int(numDataPoints * 0.85), dtype=np.int32),
                        np.ones(int(numDataPoints * 0.15), dtype=np.int32)))
    class_sample_count = np.array([len(np.where(target == t)[0]) for t in np.unique(target)])
    weight = 1. / class_sample_count
    samples_weight = torch.from_numpy(np.array([weight[t] for t in target]))
    sampler = torch.utils.data.WeightedRandomSampler(samples_weight.type("torch.DoubleTensor"),
                                                     len(samples_weight))
    target = torch.from_numpy(target).long()
    train_dataset = torch.utils.data.TensorDataset(data, target)
    train_loader = DataLoader(train_dataset, batch_size=bs, num_workers=1, sampler=sampler)
    model = nn.Linear(data_dim, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen, losses = [], []
    for epoch in range(epochs):
        for i, (x, y) in enumerate(train_loader):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append((x.tolist(), y.tolist()))
            losses.append(loss.item())
    return seen, losses


def test_weighted_random_sampler(loaders):
    seen, losses = run_both(loaders, weighted_train)
    assert len(seen) == 2 * 8 and [len(y) for _, y in seen[:8]] == [8] * 7 + [4]
    ones = sum(sum(y) for _, y in seen)
    assert 30 <= ones <= 90  # balanced: about half of 120, not 15% of it
    assert seen[:8] != seen[8:]


# ------------------------------------------- DDP under mp.spawn, mid-epoch resume

class Squares(torch.utils.data.Dataset):  # as DDP_SCRIPT's, for the preemptible loop
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.tensor([i / 25.0])
        return x, x * x, i


DDP_SCRIPT = r'''
import json, os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset, DistributedSampler
if sys.argv[1] == "loaderd":
    from loaderd import DataLoader
else:
    from torch.utils.data import DataLoader

OUT = sys.argv[2]


class Squares(Dataset):
    def __len__(self):
        return 25

    def __getitem__(self, i):
        x = torch.tensor([i / 25.0])
        return x, x * x, i


def main_worker(rank, world_size):
    dist.init_process_group("gloo", init_method="file://" + os.path.join(OUT, "store"),
                            rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    dataset = Squares()
    sampler = DistributedSampler(dataset, shuffle=True, seed=7)
    loader = DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=2)
    log = []

    ckpt = os.path.join(OUT, f"ckpt{rank}.pt")

    def train(loader, epoch, save_at=None):
        for step, (x, y, idx) in enumerate(loader):
            loss = F.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            log.append([epoch, idx.tolist(), loss.item()])
            if step + 1 == save_at:  # checkpoint in the loop, then preempted
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "loader": loader.state_dict()}, ckpt)
                return

    for epoch in range(2):
        sampler.set_epoch(epoch)
        if sys.argv[1] == "loaderd" and epoch == 1:
            # two steps into epoch 1: a checkpoint, then the job restarted
            train(loader, epoch, save_at=2)
            state = torch.load(ckpt)
            log.append(["state", state["loader"]["epoch"], state["loader"]["batch"]])
            sampler = DistributedSampler(dataset, shuffle=True, seed=7)
            loader = DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=2)
            loader.load_state_dict(state["loader"])
            sampler.set_epoch(epoch)
        train(loader, epoch)
        if sys.argv[1] == "loaderd":
            log.append(["pipeline", epoch, loader.pipeline])
    with open(os.path.join(OUT, f"rank{rank}.json"), "w") as f:
        json.dump(log, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main_worker, args=(2,), nprocs=2)
'''


@needs_forked_host
def test_ddp_spawn_distributed_sampler_resume(ld, workdir):
    script = os.path.join(workdir, "ddp_train.py")
    with open(script, "w") as f:
        f.write(DDP_SCRIPT)
    logs = {}
    for kind in ("torch", "loaderd"):
        out = os.path.join(workdir, kind)
        os.mkdir(out)
        r = run_python([script, kind, out], env={"LOADERD_SOCKET": ld.socket}, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        logs[kind] = []
        for rank in range(2):
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                logs[kind].append(json.load(f))
    # the ranks' DistributedSamplers share one pipeline (its workers), also
    # after the restart
    names = [[e[2] for e in logs["loaderd"][r] if e[0] == "pipeline"] for r in range(2)]
    assert names[0] == names[1] and len(set(names[0])) == 1 and len(names[0]) == 2, names
    assert names[0][0].startswith(f"py-{os.geteuid()}-squares-"), names
    for rank in range(2):
        got = [e for e in logs["loaderd"][rank] if e[0] != "pipeline"]
        assert ["state", 1, 2] in got, repr(got)  # the checkpoint two batches into epoch 1
        got.remove(["state", 1, 2])
        assert got == logs["torch"][rank], rank
    for epoch in (0, 1):  # each rank its share: 13 of 25 (one repeated to even them)
        shares = [sum((e[1] for e in logs["torch"][r] if e[0] == epoch), []) for r in range(2)]
        assert [len(s) for s in shares] == [13, 13]
        assert set(shares[0]) | set(shares[1]) == set(range(25))
    assert [e[1] for e in logs["torch"][0] if e[0] == 0] != \
        [e[1] for e in logs["torch"][0] if e[0] == 1]  # set_epoch: another order


def preemptible_train(DataLoader, dataset, stop_after=None, state=None):
    """A SLURM-style loop: stopped after @stop_after steps (a time limit),
    the checkpoint written after the loop; a restarted job loads it."""
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=0, seed=7)
    loader = DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=2)
    if state is not None:
        loader.load_state_dict(state)
    seen = []
    for step, (x, y, idx) in enumerate(loader):
        seen.append(idx.tolist())
        if step + 1 == stop_after:
            break
    return seen, (loader.state_dict() if stop_after else None)


def test_checkpoint_after_a_broken_loop(loaders):
    dataset = Squares(25)
    ref, _ = preemptible_train(loaders["torch"], dataset)
    head, state = preemptible_train(loaders["loaderd"], dataset, stop_after=2)
    rest, _ = preemptible_train(loaders["loaderd"], dataset, state=state)
    assert head == ref[:2]
    assert head + rest == ref
