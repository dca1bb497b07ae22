# SPDX-License-Identifier: MIT
"""Any sample and any collate_fn output, checked against torch's own
DataLoader and loaderd's (issue 26, class 5): strings collated as torch's
default_collate does, a tokenizer's per-batch padding, a detection
dataset's tuple(zip(*batch)), a dataclass, a custom batch class and its
pin_memory(), None and ragged tensors raising torch's exception types, and
loaderd's object part (what travels pickled with the batch): its tensors
are views of the slot, its capacity is object_bytes=.

The Datasets and collate functions are module-level: loaderd's workers
import them."""

import collections
import dataclasses

import pytest

torch = pytest.importorskip("torch")

import loaderd  # noqa: E402
from test_torch_contract import L  # noqa: E402,F401 (the fixture)

TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def daemon(L):
    """loaderd with the daemon's workers (not num_workers=0's torch loading)."""
    return L.cls is loaderd.DataLoader and not L.in_trainer


def only_loaderd(L, **kw):
    """Keywords for loaderd's loader only (torch's takes no such keyword)."""
    return kw if daemon(L) else {}


def in_slot(L, dl, t):
    """True for torch's loader; for loaderd's: @t's memory is in the slab."""
    if not daemon(L):
        return True
    base, size = dl.slab
    return base <= t.data_ptr() < base + size


# ---------------------------------------------------------------- datasets

class Texts(torch.utils.data.Dataset):
    """(a caption, a label): default_collate makes a list of str."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        return f"caption {i}" + "!" * i, i % 3


WORDS = ["a", "bb", "ccc", "dddd", "e", "ff", "ggg"]


class Sentences(torch.utils.data.Dataset):
    """A text of i % 4 + 1 words and its label."""

    def __len__(self):
        return 7

    def __getitem__(self, i):
        return {"text": " ".join(WORDS[:i % 4 + 1]), "label": i % 2}


def pad_collate(batch):
    """A tokenizer's padding=True: ids padded to the batch's longest text,
    an attention mask, the labels and the texts themselves."""
    ids = [[len(w) for w in s["text"].split()] for s in batch]
    n = max(len(x) for x in ids)
    return {"input_ids": torch.tensor([x + [0] * (n - len(x)) for x in ids]),
            "attention_mask": torch.tensor([[1] * len(x) + [0] * (n - len(x)) for x in ids]),
            "labels": torch.tensor([s["label"] for s in batch]),
            "texts": [s["text"] for s in batch]}


class Detection(torch.utils.data.Dataset):
    """An image of its own size and a target dict with i % 3 + 1 boxes."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        img = torch.arange(3 * (4 + i) * (5 + 2 * i), dtype=torch.float32).reshape(3, 4 + i,
                                                                                  5 + 2 * i)
        k = i % 3 + 1
        return img, {"boxes": torch.arange(4 * k, dtype=torch.float32).reshape(k, 4) + i,
                     "labels": torch.arange(k) + 10 * i, "image_id": i}


def tuple_collate(batch):
    return tuple(zip(*batch))


@dataclasses.dataclass
class XBatch:
    x: torch.Tensor
    ids: list
    note: str


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.tensor([i, i * i])


def dataclass_collate(batch):
    return XBatch(torch.stack(batch), [int(b[0]) for b in batch], "n=%d" % len(batch))


class CustomBatch:
    """torch's own SimpleCustomBatch pattern: pin_memory() returns self."""

    def __init__(self, batch):
        self.inp = torch.stack(batch)
        self.pinned = 0

    def pin_memory(self):
        self.pinned += 1
        return self


def custom_collate(batch):
    return CustomBatch(batch)


class WithNone(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor([i]), None


class Ragged(torch.utils.data.Dataset):
    """Sample i: i % 2 + 1 values (sample 0 is numeric: no object part by
    default)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.arange(i % 2 + 1) + i


class Notes(torch.utils.data.Dataset):
    """A short note, but sample 3's is 200 000 characters."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"x": torch.tensor(i), "note": "n" * (200000 if i == 3 else i + 1)}


# -------------------------------------------------------------------- tests

def test_strings_collate_into_lists(L):
    dl = L.make(Texts(), batch_size=2)
    got = [[b[0], b[1].tolist()] for b in dl]
    # a str in a tuple sample: the tuple default_collate's zip gives
    assert got == [[("caption 0", "caption 1!"), [0, 1]],
                   [("caption 2!!", "caption 3!!!"), [2, 0]],
                   [("caption 4!!!!",), [1]]]
    dl = L.make(Texts(), batch_size=None)   # default_convert: the str itself
    assert [tuple(s) for s in dl][4] == ("caption 4!!!!", 1)


def test_tokenizer_padding_per_batch(L):
    dl = L.make(Sentences(), batch_size=3, collate_fn=pad_collate)
    got = []
    for b in dl:
        assert sorted(b) == ["attention_mask", "input_ids", "labels", "texts"]
        assert in_slot(L, dl, b["input_ids"])  # zero-copy even as a pickled object
        got.append({k: v if k == "texts" else v.tolist() for k, v in b.items()})
    assert got == [
        {"input_ids": [[1, 0, 0], [1, 2, 0], [1, 2, 3]],
         "attention_mask": [[1, 0, 0], [1, 1, 0], [1, 1, 1]], "labels": [0, 1, 0],
         "texts": ["a", "a bb", "a bb ccc"]},
        {"input_ids": [[1, 2, 3, 4], [1, 0, 0, 0], [1, 2, 0, 0]],
         "attention_mask": [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], "labels": [1, 0, 1],
         "texts": ["a bb ccc dddd", "a", "a bb"]},
        {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1]], "labels": [0],
         "texts": ["a bb ccc"]}]


def numeric_pad_collate(batch):
    """pad_collate without the texts: numbers only, padded per batch."""
    out = pad_collate(batch)
    del out["texts"]
    return out


def test_numeric_padding_per_batch(L):
    # collate_fn([dataset[0]]) is all numbers ([1, 1] ids): later batches'
    # longer ids travel as objects, the labels stay a field
    dl = L.make(Sentences(), batch_size=3, collate_fn=numeric_pad_collate)
    got = []
    for b in dl:
        assert in_slot(L, dl, b["input_ids"]) and in_slot(L, dl, b["labels"])
        got.append({k: v.tolist() for k, v in b.items()})
    assert got == [
        {"input_ids": [[1, 0, 0], [1, 2, 0], [1, 2, 3]],
         "attention_mask": [[1, 0, 0], [1, 1, 0], [1, 1, 1]], "labels": [0, 1, 0]},
        {"input_ids": [[1, 2, 3, 4], [1, 0, 0, 0], [1, 2, 0, 0]],
         "attention_mask": [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], "labels": [1, 0, 1]},
        {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1]], "labels": [0]}]


def test_detection_tuple_of_images_and_targets(L):
    ds = Detection()
    dl = L.make(ds, batch_size=2, shuffle=False, collate_fn=tuple_collate)
    n = 0
    for images, targets in dl:
        assert type(images) is tuple and type(targets) is tuple
        for img, tgt in zip(images, targets):
            want_img, want_tgt = ds[n]
            assert torch.equal(img, want_img) and in_slot(L, dl, img)
            assert sorted(tgt) == ["boxes", "image_id", "labels"]
            assert torch.equal(tgt["boxes"], want_tgt["boxes"])
            assert torch.equal(tgt["labels"], want_tgt["labels"])
            assert tgt["image_id"] == n and type(tgt["image_id"]) is int
            n += 1
    assert n == 5


def test_dataclass_batch(L):
    got = list(L.make(Squares(), batch_size=4, collate_fn=dataclass_collate))
    assert [type(b) for b in got] == [XBatch, XBatch]
    assert [(b.x.tolist(), b.ids, b.note) for b in got] == [
        ([[0, 0], [1, 1], [2, 4], [3, 9]], [0, 1, 2, 3], "n=4"), ([[4, 16], [5, 25]], [4, 5], "n=2")]


def torch_pins():
    """Does torch's DataLoader call pin_memory() here, with pin_memory=True
    and pin_memory_device="cuda": torch 1.13 (and 2.x before
    torch.accelerator) does with that device given; later torch only with an
    accelerator."""
    acc = getattr(torch, "accelerator", None)
    return acc.is_available() if acc is not None else True


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_custom_batch_pin_memory(L):
    dl = L.make(Squares(), batch_size=3, collate_fn=custom_collate, pin_memory=True,
                pin_memory_device="cuda")
    got = list(dl)
    assert [type(b) for b in got] == [CustomBatch, CustomBatch]
    assert [b.inp.tolist() for b in got] == [[[0, 0], [1, 1], [2, 4]], [[3, 9], [4, 16], [5, 25]]]
    assert [b.pinned for b in got] == [int(torch_pins())] * 2
    got = list(L.make(Squares(), batch_size=3, collate_fn=custom_collate))
    assert [b.pinned for b in got] == [0, 0]


def test_none_raises_as_torch(L):
    it = iter(L.make(WithNone(), batch_size=2))
    with pytest.raises(TypeError) as e:
        next(it)
    assert "default_collate: batch must contain tensors" in str(e.value)
    assert "found <class 'NoneType'>" in str(e.value)
    with pytest.raises(TypeError, match="found <class 'NoneType'>"):
        next(it)   # the iterator goes on after the failed batch: the second one
    with pytest.raises(StopIteration):
        next(it)


def test_ragged_tensors_as_torch(L):
    # with an object part, a sample whose tensor has another shape than
    # dataset[0]'s travels as an object, and default_collate decides
    dl = L.make(Ragged(), batch_size=2, **only_loaderd(L, object_bytes=4096))
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        next(iter(dl))
    dl = L.make(Ragged(), batch_size=1, **only_loaderd(L, object_bytes=4096))
    assert [b.tolist() for b in dl] == [[[0]], [[1, 2]], [[2]], [[3, 4]]]


def test_ragged_without_object_part_says_what_to_do(L):
    it = iter(L.make(Ragged(), batch_size=1))
    if not daemon(L):
        assert [b.tolist() for b in it] == [[[0]], [[1, 2]], [[2]], [[3, 4]]]
        return
    assert next(it).tolist() == [[0]]
    with pytest.raises(loaderd.Error) as e:
        next(it)
    assert "field 'sample' has shape (2,), the pipeline's is (1,)" in str(e.value)
    assert "object_bytes=" in str(e.value)


def test_object_part_over_capacity(L):
    if not daemon(L):
        got = [b["note"] for b in L.make(Notes(), batch_size=2)]
        assert [len(n) for b in got for n in b] == [1, 2, 3, 200000]
        return
    it = iter(L.make(Notes(), batch_size=2))
    assert next(it)["note"] == ["n", "nn"]
    with pytest.raises(loaderd.Error) as e:
        next(it)
    text = str(e.value)
    assert "dataset[3]: what travels pickled with the batch (leaf 'note': " in text, text
    assert "more than the 65536 bytes its row has for it" in text, text
    assert "pass object_bytes=200128 or more to loaderd.DataLoader" in text, text
    got = [b["note"] for b in L.make(Notes(), batch_size=2, object_bytes=200128)]
    assert [len(n) for b in got for n in b] == [1, 2, 3, 200000]


class Sequences(torch.utils.data.Dataset):
    """A sequence of i % 3 + 1 steps of 2 features."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.arange(2 * (i % 3 + 1), dtype=torch.float32).reshape(-1, 2) + i


def packed_collate(batch):
    return torch.nn.utils.rnn.pack_sequence(batch, enforce_sorted=False)


def test_packed_sequence_batch(L):
    ds = Sequences()
    got = list(L.make(ds, batch_size=3, collate_fn=packed_collate))
    assert [type(b) for b in got] == [torch.nn.utils.rnn.PackedSequence] * 2
    for k, b in enumerate(got):
        want = packed_collate([ds[i] for i in range(3 * k, 3 * k + 3)])
        for name in ("data", "batch_sizes", "sorted_indices", "unsorted_indices"):
            assert torch.equal(getattr(b, name), getattr(want, name)), name
        padded, lengths = torch.nn.utils.rnn.pad_packed_sequence(b, batch_first=True)
        assert lengths.tolist() == [1, 2, 3]


class Encoding(collections.UserDict):
    """A BatchEncoding-like mapping (a UserDict with a method)."""

    def to(self, device):
        return Encoding({k: v.to(device) if isinstance(v, torch.Tensor) else v
                         for k, v in self.items()})


def encoding_collate(batch):
    enc = pad_collate(batch)
    enc["offsets"] = [[(0, len(w)) for w in s["text"].split()] for s in batch]
    return Encoding(enc)


def test_batch_encoding_like_mapping(L):
    dl = L.make(Sentences(), batch_size=4, collate_fn=encoding_collate)
    got = [b.to("cpu") for b in dl]
    assert [type(b) for b in got] == [Encoding, Encoding]
    assert got[1]["input_ids"].tolist() == [[1, 0, 0], [1, 2, 0], [1, 2, 3]]
    assert got[1]["offsets"] == [[(0, 1)], [(0, 1), (0, 2)], [(0, 1), (0, 2), (0, 3)]]
    assert got[0]["texts"] == ["a", "a bb", "a bb ccc", "a bb ccc dddd"]
    assert in_slot(L, dl, next(iter(dl))["input_ids"])


def test_as_numpy_objects_are_lists_and_stacked_arrays(ld):
    """loaderd's as_numpy=True (torch has none): object leaves are lists,
    arrays that did not fit their field np.stack-ed (ValueError when
    their shapes differ, as np.stack says)."""
    import numpy as np
    dl = loaderd.DataLoader(Texts(), batch_size=2, as_numpy=True, socket=ld.socket,
                            num_workers=1)
    got = [[b[0], b[1].tolist()] for b in dl]
    assert got[0] == [["caption 0", "caption 1!"], [0, 1]]
    dl.close()
    dl = loaderd.DataLoader(Ragged(), batch_size=2, as_numpy=True, object_bytes=4096,
                            socket=ld.socket, num_workers=1)
    with pytest.raises(ValueError, match="same shape"):
        next(iter(dl))
    dl.close()
    dl = loaderd.DataLoader(Ragged(), batch_size=1, as_numpy=True, object_bytes=4096,
                            socket=ld.socket, num_workers=1)
    got = list(dl)
    assert [type(b) for b in got] == [np.ndarray] * 4
    assert [b.tolist() for b in got] == [[[0]], [[1, 2]], [[2]], [[3, 4]]]
    dl.close()


def test_object_part_to_a_gpu_refused_before_anything_is_created(ld):
    with pytest.raises(ValueError) as e:
        loaderd.DataLoader(Texts(), batch_size=2, device="cuda:0", as_numpy=True, num_workers=1,
                           socket=ld.socket)
    assert "device='cuda:0' cannot deliver (not supported yet" in str(e.value)
    assert "use device='cpu'" in str(e.value)
    with loaderd.Client(ld.socket) as c:
        assert c.pipelines() == []
