# SPDX-License-Identifier: MIT
"""torch's sampler=, batch_sampler= and generator= (docs/python.md, "Samplers").

A torch sampler decides its order in the trainer, when an epoch starts (a
RandomSampler without a generator seeds itself from torch's global RNG then,
a DistributedSampler reads the epoch set_epoch() gave it). So a loader given
one attaches with client_order (a stream of its own, docs/protocol.md,
"Client order") and, at each epoch, iterates its batch sampler as torch's
DataLoader does and sends the batches (dataset indices) to the daemon, whose
workers build them.

Exactly as torch: the samplers are built by torch's rules
(BatchSampler(sampler, batch_size, drop_last), RandomSampler(dataset,
generator=) for shuffle), each iter() draws torch's base seed from the
generator (or the global RNG) after iter(batch_sampler), and the batch
sampler is pulled when torch's iterator would pull it: prefetch_factor *
num_workers batches at iter(), then one more as each batch is handed out
(num_workers=0: each batch at its next()). Drawing ahead of torch would
change the generator's state for what comes after a loop that breaks. The
samplers that draw all their randomness at their first pull (torch's own
but a RandomSampler with a generator) are sent ahead in chunks instead, so
the daemon builds ahead as for any other loader.
"""

import copy
import itertools

from . import pydataset

CHUNK = 1024        # batches sent ahead at once for the samplers that draw at their first pull


def _torch():
    import torch
    return torch


def samplers(dataset, sampler, batch_sampler, generator, shuffle, batch_size, drop_last):
    """torch's DataLoader construction: (sampler, batch_sampler, index
    sampler); batch_size None: no automatic batching, the sampler's indices
    one at a time."""
    data = _torch().utils.data
    if sampler is None:
        sampler = (data.RandomSampler(dataset, generator=generator) if shuffle
                   else data.SequentialSampler(dataset))
    if batch_sampler is None and batch_size is not None:
        batch_sampler = data.BatchSampler(sampler, batch_size, bool(drop_last))
    return sampler, batch_sampler, (batch_sampler if batch_size is not None or
                                    batch_sampler is not None else sampler)


def _generators(obj, depth=4, seen=None):
    """The torch.Generator objects @obj holds (attributes, containers)."""
    torch = _torch()
    seen = set() if seen is None else seen
    if id(obj) in seen or depth < 0:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Generator):
        return [obj]
    if isinstance(obj, dict):
        kids = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        kids = list(obj) if len(obj) <= 64 else []
    else:
        kids = list(getattr(obj, "__dict__", {}).values())
    return [g for k in kids for g in _generators(k, depth - 1, seen)]


def largest_batch(batch_sampler):
    """The largest batch of @batch_sampler: its batch_size attribute, else
    found by iterating a copy of it (its generators copied too) with the
    trainer's RNG states restored after, so torch's sequence stays as it was."""
    bs = getattr(batch_sampler, "batch_size", None)
    if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0:
        return bs
    torch = _torch()
    memo = {}
    for g in _generators(batch_sampler):
        clone = torch.Generator(device=g.device)
        clone.set_state(g.get_state())
        memo[id(g)] = clone
    try:
        with pydataset._SavedRNG():
            sizes = [len(b) for b in copy.deepcopy(batch_sampler, memo)]
    except Exception as e:
        raise ValueError(f"loaderd.DataLoader: cannot find the largest batch of the batch_sampler "
                         f"({type(batch_sampler).__name__}): it has no batch_size attribute and a "
                         f"copy of it could not be iterated ({type(e).__name__}: {e}); give it a "
                         "batch_size attribute that says its largest batch") from None
    return max(sizes, default=1)


def _draws_once(index_sampler):
    """Does @index_sampler draw all its randomness at its first pull (torch's
    own samplers, but a RandomSampler drawing from a generator as it goes)?"""
    data = _torch().utils.data
    s = index_sampler
    if type(s) is data.BatchSampler:
        s = s.sampler
    once = (data.SequentialSampler, data.SubsetRandomSampler, data.WeightedRandomSampler,
            data.distributed.DistributedSampler)
    if type(s) in once:
        return True
    return type(s) is data.RandomSampler and s.generator is None


class Feed:
    """One epoch of a loader's order: pulls its batch sampler when torch would
    and sends what it pulled to the daemon (_Attachment.order)."""

    def __init__(self, att, it, epoch, first, capacity, unbatched, ahead, eager):
        self.att, self.it, self.epoch = att, it, epoch
        self.capacity, self.unbatched = capacity, unbatched
        self.first = first          # the number of the first batch sent
        self.pulled = 0             # batches pulled (and sent)
        self.ended = False          # the sampler is exhausted (and the daemon told)
        self.ahead = ahead          # torch's prefetch: pulled at iter(), one more per batch
        self.eager = eager          # pull CHUNK ahead once the first pull was made

    def pull(self, target):
        """Pull (and send) batches up to @target in all (a sampler that drew
        everything at its first pull: CHUNK more at once)."""
        if self.ended or target <= self.pulled:
            return
        if self.eager:
            target = max(target, self.pulled + CHUNK)
        batches = []
        for b in itertools.islice(self.it, target - self.pulled):
            b = [int(b)] if self.unbatched else [int(i) for i in b]
            if len(b) > self.capacity:
                raise ValueError(
                    f"loaderd.DataLoader: batch {self.first + self.pulled + len(batches)} of epoch "
                    f"{self.epoch} has {len(b)} samples, more than the {self.capacity} the "
                    "loader's slots hold (the batch_sampler's batch_size attribute, or its largest "
                    "batch when the loader was made): give the batch_sampler a batch_size "
                    "attribute that is its largest batch")
            batches.append(b)
        self.ended = len(batches) < target - self.pulled
        if batches or self.ended:
            self.att.order(self.epoch, self.first + self.pulled, batches, self.ended)
        self.pulled += len(batches)

    def start(self):
        """iter(): torch's iterator primes its workers' prefetch."""
        self.pull(self.ahead)

    def beyond(self, k):
        """next() for batch @k (0-based in this feed): pulled now if torch
        pulls it now; True when the epoch ended before it."""
        self.pull(k + 1)
        if self.eager and self.pulled - k < CHUNK // 2:
            self.pull(self.pulled + 1)   # keep the daemon building ahead
        return k >= self.pulled

    def handed(self, k):
        """Batch @k is handed out: torch's iterator pulls one more first."""
        if self.ahead:
            self.pull(self.ahead + k + 1)
