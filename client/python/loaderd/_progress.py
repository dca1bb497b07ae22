# SPDX-License-Identifier: MIT
"""progress=True: tqdm when it is importable, else a plain bar on stderr.

Both are returned as iterators (a tqdm object is only an iterable: the
DataLoader's __iter__ must return an iterator, so iter(tqdm(...)))."""

import sys
import time


def progress(iterable, total, desc):
    try:
        from tqdm import tqdm
    except Exception:
        return _plain(iterable, total, desc)
    return iter(tqdm(iterable, total=total or None, desc=desc, unit="batch"))


def _plain(iterable, total, desc, width=30, interval=0.2):
    out = sys.stderr
    start = last = time.monotonic()
    n = 0

    def draw(final=False):
        el = max(time.monotonic() - start, 1e-9)
        if total:
            done = int(width * min(n, total) / total)
            bar = "#" * done + "." * (width - done)
            text = f"\r{desc} [{bar}] {n}/{total} {n / el:.1f} batch/s"
        else:
            text = f"\r{desc} {n} batches {n / el:.1f} batch/s"
        out.write(text + ("\n" if final else ""))
        out.flush()

    try:
        for item in iterable:
            n += 1
            now = time.monotonic()
            if now - last >= interval:
                last = now
                draw()
            box, item = [item], None  # no reference kept while the loop body runs
            yield box.pop()
    finally:
        draw(final=True)
