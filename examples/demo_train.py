#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""One trainer of scripts/demo: a tiny CNN learns the four classes of the
demo's generated JPEGs for a few epochs, fed either by loaderd (one shared
pipeline, decoded once for every trainer) or by torch's own DataLoader (its
own worker processes decoding the same files again).

    demo_train.py --loader loaderd --socket SOCK --spec SPEC.json --lr 0.05 --name A
    demo_train.py --loader torch --data DIR --epochs 3 --lr 0.05 --name A

Prints a line per epoch and, last, one JSON line: images, seconds, images/s,
the last batch's loss and the last epoch's accuracy on its batches.
"""

import argparse
import json
import sys
import time


def model(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))


def torch_loader(args):
    import torch
    import torchvision.datasets as datasets
    import torchvision.transforms as T
    tf = T.Compose([T.RandomResizedCrop(args.size, scale=(0.5, 1.0)), T.RandomHorizontalFlip(),
                    T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = datasets.ImageFolder(args.data, transform=tf)
    return torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True,
                                       num_workers=args.workers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loader", choices=("loaderd", "torch"), required=True)
    ap.add_argument("--socket", help="loaderd: the daemon's socket")
    ap.add_argument("--spec", help="loaderd: the pipeline spec (a JSON file)")
    ap.add_argument("--data", help="torch: the image folder")
    ap.add_argument("--epochs", type=int, default=3, help="torch: epochs (loaderd: the spec's)")
    ap.add_argument("--batch", type=int, default=32, help="torch: batch size")
    ap.add_argument("--size", type=int, default=64, help="torch: crop size")
    ap.add_argument("--workers", type=int, default=1, help="torch: DataLoader num_workers")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--name", default="trainer")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(1)      # the data path gets the other cores
    torch.manual_seed(0)
    net = model(torch)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    lossf = torch.nn.CrossEntropyLoss()

    if args.loader == "loaderd":
        import loaderd
        with open(args.spec) as f:
            spec = json.load(f)
        # mode broadcast: every trainer of this spec reads the same stream,
        # decoded once (the first one creates the pipeline, the others find it)
        loader = loaderd.DataLoader(spec, socket=args.socket, mode="broadcast",
                                    name=f"demo trainer {args.name}")
        epochs = spec["epochs"]
    else:
        loader = torch_loader(args)
        epochs = args.epochs

    images, t0 = 0, time.monotonic()
    loss = acc = 0.0
    for epoch in range(epochs):
        seen = correct = 0
        for x, y in loader:
            opt.zero_grad()
            out = net(x)
            lv = lossf(out, y)
            lv.backward()
            opt.step()
            seen += len(y)
            correct += int((out.argmax(1) == y).sum())
            loss = float(lv)
        images += seen
        acc = correct / max(seen, 1)
        print(f"  [{args.loader} {args.name}] epoch {epoch + 1}/{epochs}: {seen} images, "
              f"loss {loss:.3f}, accuracy {acc:.2f}", flush=True)
    secs = time.monotonic() - t0
    print(json.dumps({"name": args.name, "loader": args.loader, "images": images,
                      "seconds": round(secs, 2), "images_per_s": round(images / secs, 1),
                      "loss": round(loss, 3), "accuracy": round(acc, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
