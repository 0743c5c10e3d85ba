"""Conversion (paper A.3): LoRA through the loop, KL to the unmodified model, a curriculum,
merged adapters. Checked against a plain HF model, PEFT's own loading and the schedule."""

import json

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from loopeval import load_model, loop_config
from loopeval.core.loop import apply_loop
from loopeval.core.spec import LoopConfig
from loopeval.training.manifest import twin_mismatches
from loopeval.training import TrainConfig, batch_order, load_data, train_model, train_twins, weights_sha256
from loopeval.training.recipes import Convert, curriculum_probability
from support import letter_rows

CONFIG = TrainConfig(recipe="convert", steps=6, batch_size=4, lr=2e-2, max_length=32, log_every=1, lora_rank=4,
                     lora_alpha=8.0)


@pytest.fixture(scope="module")
def work(make_work):
    return make_work("convert", data=letter_rows(8, 12, spread=3))


@pytest.fixture(scope="module")
def pair(work):
    return train_twins(work / "base", work / "data.jsonl", loop="1:3x2", out=work / "pair", config=CONFIG,
                       progress=False, keep_adapters=True)


def test_step_0_is_the_base_model_so_kl_is_exactly_0(work, pair, tokenizer):
    """Step 0 draws the loop off (p = 0) and LoRA starts at B = 0: the student is the
    teacher, so the KL term is exactly 0 and the loss is 0.1 x the base model's NLL."""
    model, _ = load_model(work / "base")
    data = load_data(work / "data.jsonl", tokenizer, max_length=CONFIG.max_length)
    rows = batch_order(len(data), batch_size=CONFIG.batch_size, steps=CONFIG.steps, seed=CONFIG.data_seed)[0].tolist()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in rows:
            ids, _ = data.row(i)
            ids = torch.tensor(ids).unsqueeze(0)
            total += model(ids, labels=ids).loss.item() * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
    for result in pair:
        terms = result.manifest["loss_terms"]
        assert terms["kl"][0] == [1, 0.0]
        assert terms["nll"][0][1] == pytest.approx(total / count, rel=1e-5)
        assert result.manifest["loss_curve"][0][1] == pytest.approx(0.1 * total / count, rel=1e-5)
        assert max(kl for _, kl in terms["kl"][1:]) > 0  # the adapters move the student away from the teacher
        assert result.manifest["loss_curve"][-1][1] < result.manifest["loss_curve"][0][1]


def test_merged_checkpoint_equals_the_unmerged_looped_model_and_has_the_base_parameters(work, pair):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    twin, looped = pair
    base = AutoModelForCausalLM.from_pretrained(work / "base")
    n_base = sum(p.numel() for p in base.parameters())
    ids = torch.randint(3, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    for result, loop in ((twin, None), (looped, "1:3x2")):
        merged, _ = load_model(result.path)
        assert sum(p.numel() for p in merged.parameters()) == n_base == result.manifest["parameters"]["final"]
        assert str(loop_config(merged).spec) == loop if loop else loop_config(merged) is None
        unmerged = AutoModelForCausalLM.from_pretrained(work / "base")
        if loop:
            apply_loop(unmerged, loop_config(merged))  # the loop the checkpoint was trained and saved with
        unmerged = PeftModel.from_pretrained(unmerged, result.path / "adapter").eval()
        assert result.manifest["adapters"] == "adapter"
        with torch.no_grad():
            a, b, c = merged(ids).logits, unmerged(ids).logits, base(ids).logits
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        assert (a - c).abs().max() > 1e-3  # the adapters changed the model
    assert weights_sha256(merged) == looped.manifest["final_weights_sha256"]


def test_twins_share_data_lora_initialisation_and_teacher_and_differ_only_in_the_loop(work, pair):
    twin, looped = pair
    a, b = twin.manifest, looped.manifest
    assert twin_mismatches(a, b) == []
    assert a["lora"] == b["lora"] and a["lora"]["modules"] == 6 * 7  # q, k, v, o, gate, up, down in 6 layers
    assert a["loop"] is None and a["loop_draws"] is None
    assert b["loop_draws"]["applied"] == [int(Convert(CONFIG, LoopConfig("1:3x2")).depth(s) is None) for s in range(6)]
    assert a["base_weights_sha256"] == b["base_weights_sha256"] and a["batches_sha256"] == b["batches_sha256"]
    assert a["flops"]["teacher_forward"] == b["flops"]["teacher_forward"] > 0
    # another seed draws another LoRA initialisation, and the manifests say so
    other = json.loads(json.dumps(b))
    other["lora"]["init_sha256"] = "0" * 64
    assert [line.split(":")[0] for line in twin_mismatches(a, other)] == ["lora.init_sha256"]


def test_curriculum_draws_follow_the_schedule():
    """p(step) rises linearly from 0 to 1 over the first third of training ("the
    probability of applying it rises from 0 to 1 over the first third of training")."""
    steps = 3000
    recipe = Convert(TrainConfig(recipe="convert", steps=steps), LoopConfig("1:3x2"))
    applied = np.array([recipe.depth(s) is None for s in range(steps)])
    assert not applied[0] and applied[1000:].all()
    for lo in range(0, 1000, 100):  # ten bins of the ramp: binomial with the bin's mean p
        p = np.mean([s / 1000 for s in range(lo, lo + 100)])
        assert binomtest(int(applied[lo:lo + 100].sum()), 100, p).pvalue > 1e-3
    # a function of the seed and step only: the same on every process, and another seed differs
    again = Convert(TrainConfig(recipe="convert", steps=steps), LoopConfig("1:3x2"))
    assert [again.depth(s) for s in range(500)] == [recipe.depth(s) for s in range(500)]
    other = Convert(TrainConfig(recipe="convert", steps=steps, seed=1), LoopConfig("1:3x2"))
    assert [other.depth(s) for s in range(500)] != [recipe.depth(s) for s in range(500)]
    assert curriculum_probability(5, steps=10, curriculum=0.0) == 1.0
    assert curriculum_probability(2, steps=12, curriculum=0.5) == pytest.approx(2 / 6)


def test_the_runner_switches_the_loop_off_exactly_when_drawn(work, monkeypatch):
    import loopeval.training.runner as runner

    seen = []
    real = runner.loop_passes

    def spy(model, passes):
        seen.append(passes)
        return real(model, passes)

    monkeypatch.setattr(runner, "loop_passes", spy)
    config = TrainConfig(recipe="convert", steps=6, batch_size=4, max_length=32, lora_rank=2, curriculum=1.0)
    result = train_model(work / "base", work / "data.jsonl", loop="1:3x2", out=work / "spy", config=config, progress=False)
    applied = result.manifest["loop_draws"]["applied"]
    assert seen == [1 for a in applied if not a] and applied[0] == 0 and 0 < sum(applied) < 6


def test_bad_conversion_options_fail_before_weights_load(work, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    def boom(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)
    run = dict(loop="1:3x2", out=tmp_path / "x", progress=False)
    for targets in (("qkv_proj",), r".*\.attention\.wq"):
        with pytest.raises(ValueError, match="match no module .* named down_proj, gate_proj, k_proj, lm_head"):
            train_twins(work / "base", work / "data.jsonl", config=TrainConfig(recipe="convert", lora_targets=targets), **run)
    with pytest.raises(ValueError, match=r"kl_weight \+ nll_weight must be > 0"):
        TrainConfig(recipe="convert", kl_weight=0, nll_weight=0)
    with pytest.raises(ValueError, match="kl_weight must be >= 0"):
        TrainConfig(recipe="convert", kl_weight=-0.5, nll_weight=1)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"curriculum must be a fraction of the steps in \[0, 1\]"):
            TrainConfig(recipe="convert", curriculum=bad)
    with pytest.raises(ValueError, match="lora_rank belongs to recipe 'convert', not 'full'"):
        TrainConfig(lora_rank=8)
    with pytest.raises(ValueError, match="save_every: convert merges its adapters once"):
        TrainConfig(recipe="convert", save_every=10)
    with pytest.raises(ValueError, match="keep_adapters: recipe 'full' trains no adapters"):
        train_twins(work / "base", work / "data.jsonl", config=TrainConfig(), keep_adapters=True, **run)
    # the default and explicit names resolve on the meta device, without loading weights
    from loopeval.training.recipes import lora_modules

    assert lora_modules(work / "base", ("q_proj", "v_proj")) == tuple(
        f"model.layers.{i}.self_attn.{n}" for i in range(6) for n in ("q_proj", "v_proj"))
    assert "lm_head" not in lora_modules(work / "base", "all-linear")
    from loopeval.training.manifest import RECIPES
    from loopeval.training.registry import recipe_classes

    assert tuple(recipe_classes()) == RECIPES


def test_cli_converts_with_the_same_code_path(work, tmp_path, capsys):
    from loopeval.cli import main

    args = ["train", "--recipe", "convert", "--base", str(work / "base"), "--data", str(work / "data.jsonl"),
            "--loop", "1:3x2", "--out", str(tmp_path), "--steps", "6", "--batch-size", "4", "--lr", "2e-2",
            "--max-length", "32", "--log-every", "1", "--lora-rank", "4", "--lora-alpha", "8"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "twins: identical apart from the loop" in out and "convert: loss" in out
    from loopeval.training.manifest import read_manifest

    assert read_manifest(tmp_path / "looped")["final_weights_sha256"] == read_manifest(work / "pair" / "looped")["final_weights_sha256"]
    assert main(args) == 2  # the output folders hold checkpoints now
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(args + ["--overwrite", "--lora-targets", "nothing_here"]) == 2
    assert "match no module" in capsys.readouterr().err


def test_the_progress_bar_shows_kl_and_nll_live(work, tmp_path, capsys):
    config = TrainConfig(recipe="convert", steps=2, batch_size=4, max_length=32, lora_rank=2, log_every=1)
    train_model(work / "base", work / "data.jsonl", loop="1:3x2", out=tmp_path / "bar", config=config,
                progress=True)
    err = capsys.readouterr().err
    manifest = json.loads((tmp_path / "bar" / "training_manifest.json").read_text())
    kl, nll = manifest["loss_terms"]["kl"][-1][1], manifest["loss_terms"]["nll"][-1][1]
    assert f"kl={kl:.4f}" in err and f"nll={nll:.4f}" in err  # the manifest's last values, shown while training
