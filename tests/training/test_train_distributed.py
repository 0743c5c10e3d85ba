"""Data parallelism: two CPU processes (torchrun, gloo) train what one process trains.

accelerate's own ``launch --num_processes 2 --cpu`` starts a single process on this
machine, so the runs use ``torchrun --standalone`` with ``ACCELERATE_USE_CPU=1``. Adam
amplifies rounding differences (the two processes pad and sum their halves of a batch
separately), so the first steps are compared tightly and the whole curve loosely.
"""

import os
import subprocess
import sys

import pytest

from loopeval.training.manifest import read_manifest, twin_mismatches
from support import letter_rows

RECIPES = {
    "full": ["--lr", "3e-3"],
    "convert": ["--lr", "5e-3", "--lora-rank", "4", "--curriculum", "0.5"],
    "cpt": ["--lr", "3e-3", "--passes", "1-3", "--save-every", "4"],
    "joint": ["--lr", "3e-3", "--teacher", "frozen-original", "--receiver", "both", "--stages", "loop:4,joint:8"],
}


@pytest.fixture(scope="module")
def work(make_work):
    return make_work("ddp", data=letter_rows(16, 10, spread=7), held=letter_rows(5, 9, stride=3, step=2))


def train(work, recipe, out, processes):
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"] if processes == 2 \
        else [sys.executable]
    cmd = [*launcher, "-m", "loopeval", "train", "--recipe", recipe, "--only", "looped", "--loop", "1:3x2",
           "--base", str(work / "base"), "--data", str(work / "data.jsonl"), "--heldout", str(work / "held.jsonl"),
           "--out", str(out), "--steps", "12", "--batch-size", "4", "--max-length", "16", "--log-every", "1",
           *RECIPES[recipe]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_manifest(out / "looped")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_two_processes_train_what_one_trains(work, tmp_path, recipe):
    one, two = train(work, recipe, tmp_path / "one", 1), train(work, recipe, tmp_path / "two", 2)
    assert two["runtime"]["processes"] == 2 and one["runtime"]["processes"] == 1
    # the same data, batches, draws and token counts: only the runtime and float rounding differ
    assert twin_mismatches(one, two) == ["runtime.processes: 1 != 2"]
    assert one["loop_draws"] == two["loop_draws"]
    a, b = [x for _, x in one["loss_curve"]], [x for _, x in two["loss_curve"]]
    assert a[:3] == pytest.approx(b[:3], rel=1e-5)
    assert a == pytest.approx(b, rel=2e-3)
    for p, q in zip(one["heldout_curve"], two["heldout_curve"]):
        assert p["tokens"] == q["tokens"] and p["loss"] == pytest.approx(q["loss"], rel=2e-3)
        assert p["loss_by_passes"] == pytest.approx(q["loss_by_passes"], rel=2e-3)
    if recipe in ("convert", "cpt"):
        assert one["loop_draws"] is not None
