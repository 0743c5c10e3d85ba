"""Continued pretraining (paper A.3, C.1): packed text, random depth, intermediate
checkpoints and held-out loss per pass count, checked against unrolled copies."""

import json
from collections import Counter

import numpy as np
import pytest
import torch

from loopeval import load_model, loop_config
from loopeval.core.cost import loop_cost
from loopeval.core.loop import remove_loop
from loopeval.core.spec import LoopConfig
from loopeval.training.manifest import twin_mismatches
from loopeval.training import TrainConfig, batch_order, load_data, train_model, train_twins
from loopeval.training.config import parse_passes
from loopeval.training.recipes import ContinuedPretraining
from loopeval.core.unroll import unrolled_copy
from support import letter_rows, write_jsonl

CONFIG = TrainConfig(recipe="cpt", steps=6, batch_size=4, lr=3e-3, max_length=16, log_every=1, passes=(1, 3),
                     save_every=3)


@pytest.fixture(scope="module")
def work(make_work):
    return make_work("cpt", data=letter_rows(12, 12, spread=5), held=letter_rows(3, 9, stride=3, step=2))


@pytest.fixture(scope="module")
def pair(work):
    """Trained with ``repeat``, whose every depth has an unrolled copy to check against."""
    return train_twins(work / "base", work / "data.jsonl", loop="1:3x2", out=work / "pair", config=CONFIG,
                       heldout=work / "held.jsonl", progress=False, operator="repeat")


def test_plain_text_is_packed_into_rows_of_max_length(work, tokenizer):
    data = load_data(work / "data.jsonl", tokenizer, max_length=16, pack=True)
    texts = [json.loads(line)["text"] for line in (work / "data.jsonl").read_text().splitlines()]
    stream = [t for text in texts for t in tokenizer(text).input_ids + [tokenizer.eos_token_id]]
    assert data.tokens.tolist() == stream
    assert data.lengths.tolist() == [16] * (len(stream) // 16) + ([len(stream) % 16] if len(stream) % 16 > 1 else [])
    assert data.starts.tolist() == [1] * len(data) and data.packed
    path = write_jsonl(work / "chat.jsonl", [{"text": "a b"}, {"prompt": "x", "completion": "y"}])
    with pytest.raises(ValueError, match=r"chat\.jsonl:2: continued pretraining packs plain text"):
        load_data(path, tokenizer, max_length=16, pack=True)


def test_random_depth_draws_are_seeded_uniform_and_counted(work, pair):
    twin, looped = pair
    draws = looped.manifest["loop_draws"]
    recipe = ContinuedPretraining(CONFIG, LoopConfig("1:3x2"))
    assert draws == {"kind": "random_depth", "range": [1, 3], "passes": [recipe.depth(s) for s in range(6)]}
    many = Counter(ContinuedPretraining(TrainConfig(recipe="cpt", passes=(1, 3)), None).depth(s) for s in range(3000))
    assert set(many) == {1, 2, 3} and all(abs(n / 3000 - 1 / 3) < 0.04 for n in many.values())
    assert ContinuedPretraining(TrainConfig(recipe="cpt"), None).depth(0) is None  # no range: the loop's own depth

    # the training FLOPs follow the draws: each step's rows at that step's depth
    model, tokenizer = load_model(work / "base")
    data = load_data(work / "data.jsonl", tokenizer, max_length=16, pack=True)
    order = batch_order(len(data), batch_size=4, steps=6, seed=0)
    expected = 0.0
    for step, k in enumerate(draws["passes"]):
        cost = loop_cost(model, f"1:3x{k}")
        expected += sum(cost.flops_per_token(np.arange(1, n + 1)).sum() for n in data.lengths[order[step].tolist()])
    assert looped.manifest["flops"]["forward"] == pytest.approx(expected, rel=1e-12)
    assert twin.manifest["loop_draws"] is None and twin_mismatches(twin.manifest, looped.manifest) == []


def _heldout_loss(model, data):
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(len(data)):
            ids = torch.tensor(data.row(i)[0]).unsqueeze(0)
            total += model(ids, labels=ids).loss.item() * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
    return total / count


def test_heldout_loss_per_pass_count_matches_unrolled_copies_of_each_checkpoint(work, pair, tokenizer):
    twin, looped = pair
    held = load_data(work / "held.jsonl", tokenizer, max_length=16, pack=True)
    for result, is_looped in ((twin, False), (looped, True)):
        m = result.manifest
        assert [c["path"] for c in m["checkpoints"]] == ["checkpoint-3"]
        assert [p["step"] for p in m["heldout_curve"]] == [3, 6]
        assert [p["tokens"] for p in m["heldout_curve"]] == [m["checkpoints"][0]["tokens"], m["tokens"]["input"]]
        for point, path in zip(m["heldout_curve"], [result.path / "checkpoint-3", result.path]):
            model, _ = load_model(path)
            assert (loop_config(model) is not None) == is_looped
            remove_loop(model)
            if not is_looped:
                assert point["loss"] == pytest.approx(_heldout_loss(model, held), rel=1e-5) and "loss_by_passes" not in point
                continue
            assert set(point["loss_by_passes"]) == {"1", "2", "3"}
            assert point["loss_by_passes"]["1"] == pytest.approx(_heldout_loss(model, held), rel=1e-5)
            for k in (2, 3):
                reference = _heldout_loss(unrolled_copy(model, f"1:3x{k}"), held)
                assert point["loss_by_passes"][str(k)] == pytest.approx(reference, rel=1e-5)
            assert point["loss"] == point["loss_by_passes"]["2"]  # the loop's own depth
    # the report's plot data reads these manifests, torch-free
    from loopeval.training.exchange import training_curves

    curves = training_curves(twin.manifest, looped.manifest)
    assert curves.looped.tokens == curves.twin.tokens == tuple(float(p["tokens"]) for p in looped.manifest["heldout_curve"])
    assert sorted(curves.looped_by_passes) == [1, 2, 3] and curves.exchange.costs["layers"] == 8 / 6


def test_bad_cpt_inputs_fail_before_weights_load(work, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    def boom(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)
    for bad, message in (((0, 3), "starts below 1"), ((2, 1), "is empty"), ((1.5, 2), "integers")):
        with pytest.raises(ValueError, match=message):
            TrainConfig(recipe="cpt", passes=bad)
    with pytest.raises(ValueError, match="starts below 1"):
        parse_passes("0-2")
    with pytest.raises(ValueError, match="expected a range"):
        parse_passes("one")
    assert parse_passes("1-3") == (1, 3) and parse_passes("2") == (2, 2)
    with pytest.raises(ValueError, match="passes belongs to recipe 'cpt', not 'full'"):
        TrainConfig(passes=(1, 2))
    run = dict(out=tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="recipe cpt measures held-out loss"):
        train_model(work / "base", work / "data.jsonl", loop="1:3x2", config=CONFIG, **run)
    with pytest.raises(ValueError, match="window 0:1x1 of the loop has K = 1"):
        train_model(work / "base", work / "data.jsonl", loop="0:1x1+1:3x2", config=CONFIG, heldout=work / "held.jsonl", **run)
    leaky = write_jsonl(tmp_path / "leaky.jsonl", [{"text": "new row"}, json.loads((work / "data.jsonl").read_text().split("\n")[4])])
    with pytest.raises(ValueError, match=r"1 row\(s\) also in the training data .* \(first at line 2\)"):
        train_model(work / "base", work / "data.jsonl", loop="1:3x2", config=CONFIG, heldout=leaky, **run)


def test_cpt_from_the_cli(work, pair, tmp_path, capsys):
    from loopeval.cli import main

    args = ["train", "--recipe", "cpt", "--base", str(work / "base"), "--data", str(work / "data.jsonl"),
            "--heldout", str(work / "held.jsonl"), "--loop", "1:3x2", "--out", str(tmp_path), "--steps", "6",
            "--batch-size", "4", "--lr", "3e-3", "--max-length", "16", "--log-every", "1", "--passes", "1-3",
            "--save-every", "3", "--operator", "repeat"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "held-out loss at step 3" in out and "(by passes 1: " in out and "twins: identical apart from the loop" in out
    from loopeval.training.manifest import read_manifest

    assert read_manifest(tmp_path / "looped")["heldout_curve"] == read_manifest(work / "pair" / "looped")["heldout_curve"]
    with pytest.raises(SystemExit) as info:  # argparse refuses it
        main(args[:-6] + ["--passes", "0-2", "--overwrite"])
    assert info.value.code == 2 and "--passes: passes range '0-2' starts below 1" in capsys.readouterr().err
