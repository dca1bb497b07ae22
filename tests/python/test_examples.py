# SPDX-License-Identifier: MIT
"""Every example runs (shortened by LOADERD_EXAMPLE_QUICK=1), against the
build under test, with its own private daemon, and prints the expected result."""

import os
import re

from conftest import BUILD_DIR, EXAMPLES, run_python


def run_example(name):
    env = {"LOADERD_EXAMPLE_QUICK": "1", "LOADERD_BUILD": BUILD_DIR}
    r = run_python([os.path.join(EXAMPLES, name)], env=env, timeout=120, cwd=EXAMPLES)
    assert r.returncode == 0, f"{name} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_example_train_npy():
    out = run_example("train_npy.py")
    acc = {m.group(1): float(m.group(2)) for m in re.finditer(r"(loaderd|torch)\s+accuracy (\S+)", out)}
    assert set(acc) == {"loaderd", "torch"}, out
    assert acc["loaderd"] > 0.6 and acc["torch"] > 0.6, out
    assert abs(acc["loaderd"] - acc["torch"]) < 0.05, out


def test_example_broadcast_sweep():
    out = run_example("broadcast_sweep.py")
    assert "both trials received the same stream: yes" in out, out
    assert len(re.findall(r"trial lr=\S+: accuracy", out)) == 2, out


def test_example_augment_sweep():
    out = run_example("augment_sweep.py")
    assert "the trials saw different crops: yes" in out, out
    assert "of the same samples in the same order: yes" in out, out
    assert len(re.findall(r"trial augment_seed=\d: image crc", out)) == 3, out
    # 60 images, 2 epochs: one decode each an epoch for the 3 trials' 360
    assert "images decoded: 120 for the 360 the trials read" in out, out


def test_example_torchrun_partition():
    out = run_example("torchrun_partition.py")
    assert out.count("ranks disjoint: yes, cover all 1000: yes") == 2, out
