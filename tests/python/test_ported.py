# SPDX-License-Identifier: MIT
"""Real training loops ported as a new user ports them: the loaders swapped
in, the loops as their authors wrote them.

- pytorch/examples mnist/main.py: train() (`for batch_idx, (data, target) in
  enumerate(train_loader)`, len(train_loader.dataset), --dry-run's break),
  test() (`for data, target in test_loader`), one loader per split;
- karpathy/nanoGPT train.py: get_batch(split) and estimate_loss(), the
  training loop fetching the next batch while the current one is in use,
  with a second loader of the train spec for estimate_loss;
- pytorch/examples imagenet/main.py train()/validate() with timm's Mixup
  (timm/data/mixup.py: mixup and CutMix in place on the batch).

Every batch a loop gets is compared with the contents computed here from
the files, and the order of batches with torch's epochs."""

import math
import os

import numpy as np
import pytest

import loaderd
from test_batch import image_folder, image_spec
from test_epochs import epoch_order

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


# ------------------------------------------------------ pytorch/examples mnist

class Net(nn.Module):  # mnist/main.py
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


class Args:
    log_interval = 2
    dry_run = False


def mnist_train(args, model, device, train_loader, optimizer, epoch, seen):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        seen.append((data.clone(), target.clone()))
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))
            if args.dry_run:
                break


def mnist_test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))
    return test_loss, correct


def mnist_like(d, split, n, seed):
    rng = np.random.default_rng(seed)
    target = rng.integers(0, 10, size=n).astype(np.int64)
    data = rng.normal(0, 0.3, size=(n, 1, 28, 28)).astype(np.float32)
    for i, t in enumerate(target):  # a learnable mark per class
        data[i, 0, 2 + 2 * t:4 + 2 * t, 4:24] += 1.0
    os.makedirs(os.path.join(d, split))
    paths = [os.path.join(d, split, "data.npy"), os.path.join(d, split, "target.npy")]
    np.save(paths[0], data)
    np.save(paths[1], target)
    return data, target, paths


def test_pytorch_examples_mnist(ld, workdir):
    torch.manual_seed(1)
    torch.set_num_threads(2)
    xtr, ytr, ptr = mnist_like(workdir, "train", 192, 0)
    xte, yte, pte = mnist_like(workdir, "test", 100, 1)
    train_kwargs = {'batch_size': 32, 'shuffle': True, 'seed': 1}
    test_kwargs = {'batch_size': 40}
    train_loader = loaderd.DataLoader({"name": "mnist-train",
                                       "source": {"kind": "npy", "paths": ptr}},
                                      socket=ld.socket, num_workers=1, **train_kwargs)
    test_loader = loaderd.DataLoader({"name": "mnist-test",
                                      "source": {"kind": "npy", "paths": pte}},
                                     socket=ld.socket, **test_kwargs)
    device = torch.device("cpu")
    model = Net().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    args = Args()
    assert len(train_loader.dataset) == 192 and len(train_loader) == 6
    results = []
    for epoch in range(1, 4):
        args.dry_run = epoch == 2  # a dry-run epoch: the loop breaks after its first batch
        seen = []
        mnist_train(args, model, device, train_loader, optimizer, epoch, seen)
        # torch: every train() call is a new epoch from its first batch
        order = epoch_order(192, 32, epoch - 1, seed=1)
        assert len(seen) == (1 if args.dry_run else 6)
        for (data, target), ids in zip(seen, order):
            assert torch.equal(data, torch.from_numpy(xtr[ids]))
            assert torch.equal(target, torch.from_numpy(ytr[ids]))
        results.append(mnist_test(model, device, test_loader))
    # test(): every test sample once per call, as a direct pass over the arrays
    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(xte))
    want = (out.argmax(1) == torch.from_numpy(yte)).sum().item()
    assert results[-1][1] == want
    assert math.isclose(results[-1][0], F.nll_loss(out, torch.from_numpy(yte), reduction='sum').item()
                        / 100, rel_tol=1e-5)
    assert want > 50  # it learned
    train_loader.close()
    test_loader.close()


# --------------------------------------------------------------- nanoGPT

class Bigram(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, vocab)

    def forward(self, idx, targets=None):
        logits = self.tok(idx)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)
        return logits, loss


def test_nanogpt_get_batch_and_estimate_loss(ld, workdir):
    """nanoGPT's loop: X, Y = get_batch('train') before the loop and again
    inside it while the current X, Y are in use; estimate_loss() every
    eval_interval iterations reads eval_iters batches of each split from
    its own loaders (the train split's over the same spec as training: two
    loaders of one spec interleaved). 50 iterations; every batch checked."""
    vocab, block_size, batch_size = 64, 16, 4
    data = {}
    specs = {}
    for split, ntok, seed in (("train", 9000, 0), ("val", 1200, 1)):
        t = np.random.default_rng(seed).integers(0, vocab, size=ntok).astype(np.uint16)
        path = os.path.join(workdir, f"{split}.bin")
        t.tofile(path)
        data[split] = t
        specs[split] = {"name": f"owt-{split}", "source": {"kind": "tokens", "path": path,
                                                            "seq_len": block_size},
                        "batch_size": batch_size, "shuffle": True, "seed": 1337}
    kw = dict(socket=ld.socket, timeout=20)
    train_loaders = {"train": loaderd.DataLoader(specs["train"], **kw)}
    eval_loaders = {s: loaderd.DataLoader(specs[s], **kw) for s in ("train", "val")}
    iters = {}
    log = []

    def get_batch(split, loaders=train_loaders):
        # was: ix = torch.randint(len(data) - block_size, (batch_size,)); x = torch.stack(...)
        loader = loaders[split]
        key = id(loader)
        while True:
            if key not in iters:
                iters[key] = iter(loader)
            try:
                b = next(iters[key])
                break
            except StopIteration:  # the epoch is over: the next `for` is the next epoch
                del iters[key]
        log.append((split, key, b.epoch, b.index, b["input"].clone(), b["target"].clone()))
        x, y = b
        x, y = x.to("cpu"), y.to("cpu")  # device_type == 'cpu'
        return x, y

    model = Bigram(vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    eval_iters, eval_interval, gradient_accumulation_steps = 3, 10, 2

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ['train', 'val']:
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(split, eval_loaders)
                logits, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean()
        model.train()
        return out

    X, Y = get_batch('train')  # fetch the very first batch
    iter_num = 0
    losses = None
    while True:
        if iter_num % eval_interval == 0:
            losses = estimate_loss()
        for micro_step in range(gradient_accumulation_steps):
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch('train')  # prefetch the next batch while this one is used
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if iter_num >= 50:
            break
    assert losses["train"] > 0 and losses["val"] > 0
    # every batch: the expected tokens, and each loader's batches in epoch order
    by_loader = {}
    for split, key, epoch, index, x, y in log:
        t = data[split]
        n = (len(t) - 1) // block_size
        ids = epoch_order(n, batch_size, epoch, seed=1337)[index]
        want_x = np.stack([t[i * block_size:(i + 1) * block_size] for i in ids]).astype(np.int64)
        want_y = np.stack([t[i * block_size + 1:(i + 1) * block_size + 1] for i in ids]).astype(np.int64)
        assert torch.equal(x, torch.from_numpy(want_x)) and torch.equal(y, torch.from_numpy(want_y))
        by_loader.setdefault(key, []).append((epoch, index))
    for key, seq in by_loader.items():
        nb = len([l for l in list(train_loaders.values()) + list(eval_loaders.values())
                  if id(l) == key][0])
        assert seq == [divmod(k, nb) for k in range(len(seq))]
    assert len(by_loader[id(train_loaders["train"])]) == 1 + 50 * gradient_accumulation_steps
    assert len(by_loader[id(eval_loaders["train"])]) == 5 * eval_iters
    for l in list(train_loaders.values()) + list(eval_loaders.values()):
        l.close()


# ------------------------------------------------ imagenet + timm's Mixup

def rand_bbox(img_shape, lam, rng, margin=0., count=None):  # timm/data/mixup.py
    ratio = np.sqrt(1 - lam)
    img_h, img_w = img_shape[-2:]
    cut_h, cut_w = int(img_h * ratio), int(img_w * ratio)
    margin_y, margin_x = int(margin * cut_h), int(margin * cut_w)
    cy = rng.randint(0 + margin_y, img_h - margin_y, size=count)
    cx = rng.randint(0 + margin_x, img_w - margin_x, size=count)
    yl = np.clip(cy - cut_h // 2, 0, img_h)
    yh = np.clip(cy + cut_h // 2, 0, img_h)
    xl = np.clip(cx - cut_w // 2, 0, img_w)
    xh = np.clip(cx + cut_w // 2, 0, img_w)
    return yl, yh, xl, xh


def cutmix_bbox_and_lam(img_shape, lam, rng, correct_lam=True):
    yl, yu, xl, xu = rand_bbox(img_shape, lam, rng)
    if correct_lam:
        bbox_area = (yu - yl) * (xu - xl)
        lam = 1. - bbox_area / float(img_shape[-2] * img_shape[-1])
    return (yl, yu, xl, xu), lam


def one_hot(x, num_classes, on_value=1., off_value=0.):
    x = x.long().view(-1, 1)
    return torch.full((x.size()[0], num_classes), off_value).scatter_(1, x, on_value)


def mixup_target(target, num_classes, lam=1., smoothing=0.0):
    off_value = smoothing / num_classes
    on_value = 1. - smoothing + off_value
    y1 = one_hot(target, num_classes, on_value=on_value, off_value=off_value)
    y2 = one_hot(target.flip(0), num_classes, on_value=on_value, off_value=off_value)
    return y1 * lam + y2 * (1. - lam)


class Mixup:
    """timm.data.Mixup, mode 'batch', with its own RandomState (timm uses
    np.random's global one) so that a test can replay it."""

    def __init__(self, mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5,
                 label_smoothing=0.1, num_classes=1000, seed=0):
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.mix_prob, self.switch_prob = prob, switch_prob
        self.label_smoothing, self.num_classes = label_smoothing, num_classes
        self.rng = np.random.RandomState(seed)

    def _params_per_batch(self):
        lam = 1.
        use_cutmix = False
        if self.rng.rand() < self.mix_prob:
            use_cutmix = self.rng.rand() < self.switch_prob
            lam_mix = self.rng.beta(self.cutmix_alpha, self.cutmix_alpha) if use_cutmix else \
                self.rng.beta(self.mixup_alpha, self.mixup_alpha)
            lam = float(lam_mix)
        return lam, use_cutmix

    def _mix_batch(self, x):
        lam, use_cutmix = self._params_per_batch()
        if lam == 1.:
            return 1.
        if use_cutmix:
            (yl, yh, xl, xh), lam = cutmix_bbox_and_lam(x.shape, lam, self.rng)
            x[:, :, yl:yh, xl:xh] = x.flip(0)[:, :, yl:yh, xl:xh]
        else:
            x_flipped = x.flip(0).mul_(1. - lam)
            x.mul_(lam).add_(x_flipped)
        return lam

    def __call__(self, x, target):
        assert len(x) % 2 == 0, 'Batch size should be even when using this'
        lam = self._mix_batch(x)
        target = mixup_target(target, self.num_classes, lam, self.label_smoothing)
        return x, target


def test_imagenet_train_with_timm_mixup(ld, workdir):
    """imagenet/main.py's train() with timm's Mixup applied to the batch in
    place (as timm's train script does), then validate(): the model gets
    exactly what a replayed Mixup gives on a copy of the expected batch, and
    the next epochs read the files' pixels again."""
    root = os.path.join(workdir, "train")
    samples = image_folder(root, classes=("a", "b", "c"), per_class=8, hw=16)
    n, B = len(samples), 4
    train_loader = loaderd.DataLoader(image_spec(root, name="in-train", shuffle=True, seed=3,
                                                 batch_size=B, prefetch=4, hw=16),
                                      socket=ld.socket, timeout=20)
    val_loader = loaderd.DataLoader(image_spec(root, name="in-val", batch_size=6, hw=16),
                                    socket=ld.socket, timeout=20)
    assert train_loader.writable
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mixup_fn = Mixup(num_classes=3, seed=11)
    replay = Mixup(num_classes=3, seed=11)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)

    def soft_ce(x, target):  # timm.loss.SoftTargetCrossEntropy
        return torch.sum(-target * F.log_softmax(x, dim=-1), dim=-1).mean()

    def pixels(ids):
        x = np.stack([samples[i][0].transpose(2, 0, 1) for i in ids]).astype(np.float32)
        return torch.from_numpy(x / np.float32(255)), torch.tensor([samples[i][1] for i in ids])

    def train(train_loader, model, optimizer, epoch):
        model.train()
        order = epoch_order(n, B, epoch, seed=3)
        for i, (images, target) in enumerate(train_loader):
            want_x, want_t = pixels(order[i])
            assert torch.equal(images, want_x) and torch.equal(target, want_t)
            images = images.to("cpu", non_blocking=True)
            target = target.to("cpu", non_blocking=True)
            images.sub_(mean).div_(std)          # normalisation on the device, in place
            images, target = mixup_fn(images, target)
            ref_x, ref_t = replay(want_x.sub_(mean).div_(std), want_t)
            assert torch.equal(images, ref_x) and torch.equal(target, ref_t)
            output = model(images)
            loss = soft_ce(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    def validate(val_loader, model):
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for i, (images, target) in enumerate(val_loader):
                want_x, want_t = pixels(range(6 * i, 6 * i + len(target)))
                assert torch.equal(images, want_x) and torch.equal(target, want_t)
                output = model(images.sub_(mean).div_(std))
                correct += (output.argmax(1) == target).sum().item()
                total += len(target)
        return correct, total

    for epoch in range(0, 4):
        train(train_loader, model, optimizer, epoch)
        correct, total = validate(val_loader, model)
        assert total == n
    train_loader.close()
    val_loader.close()
