# SPDX-License-Identifier: MIT
"""torch's DataLoader contract, second part (issue 26): num_workers=0 (the
Dataset runs in the trainer), state_dict()/load_state_dict() in torchdata's
StatefulDataLoader shape and set_epoch() after a restore, the seeds a
Dataset sees, and worker_init_fn's seeding. Each test runs against torch's
DataLoader (torchdata's StatefulDataLoader for the state, where it is
installed) and loaderd's: the `L` fixture of test_torch_contract.py.

The Datasets are module-level classes: loaderd's workers import them."""

import os

import pytest

torch = pytest.importorskip("torch")

import loaderd  # noqa: E402
from test_torch_contract import L, Loaders  # noqa: E402,F401  (the both-loaders fixture)

M63 = (1 << 63) - 1


def is_torch(L):
    return L.cls is not loaderd.DataLoader


# ------------------------------------------------------------------- seeds

class Seeds(torch.utils.data.Dataset):
    """Per sample: torch.initial_seed() as a tensor (an int64, as torch's
    own seeds always are) and the worker's get_worker_info().seed."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()  # None: dataset[0] learnt in the trainer
        return torch.tensor(torch.initial_seed()), torch.tensor(info.seed if info else 0)


@pytest.mark.parametrize("workers", [1, 3])
def test_seeds_are_torchs_int64(L, workers):
    # sample seeds above 2^63 made torch.tensor(torch.initial_seed()) raise
    # "Overflow when unpacking long" inside __getitem__
    dl = L.make(Seeds(), batch_size=4, num_workers=workers)
    seeds, wseeds = [], []
    for s, w in dl:
        seeds += s.tolist()
        wseeds += w.tolist()
    assert len(seeds) == 16 and all(0 <= s <= M63 for s in seeds + wseeds)
    if not is_torch(L):  # per sample: the same seeds whatever the worker count
        from loaderd import pydataset as P
        assert seeds == [P.sample_seed(0, 0, i) for i in range(16)]
