"""``twin_mismatches`` per recipe: what may differ between twins (the loop, its draws and
cost, results, paths and times) and what may not. Torch-free, on hand-written manifests."""

import copy
import json

import pytest

from loopeval.training.manifest import RECIPES, TWIN_RULES, read_manifest, twin_mismatches

TWIN = {
    "format": "loopeval-training/2", "recipe": "full", "role": "twin", "loop": None, "loop_draws": None,
    "base": "/a/base", "base_weights_sha256": "b" * 64, "parameters": {"base": 100, "final": 100},
    "data": {"path": "/a/data.jsonl", "sha256": "d" * 64, "rows": 16, "decontamination": {"against": ["gsm8k_boxed"]}},
    "heldout": None, "config": {"recipe": "full", "seed": 0, "steps": 10}, "batches_sha256": "c" * 64,
    "tokens": {"input": 500, "loss": 480}, "flops": {"forward": 1.0, "train": 3.0, "multiplier": 1.0},
    "loss_curve": [[10, 2.0]], "heldout_curve": [], "checkpoints": [], "adapters": None,
    "final_weights_sha256": "e" * 64, "train_time_s": 1.0, "runtime": {"processes": 1}, "finished_at": "t0",
}


def looped_of(twin, **changes):
    m = copy.deepcopy(twin)
    m.update(role="looped", loop={"loop": "1:3x2", "operator": "repeat", "beta": 0.0, "mix": None},
             flops={"forward": 1.3, "train": 3.9, "multiplier": 1.33}, loss_curve=[[10, 1.9]],
             final_weights_sha256="f" * 64, train_time_s=1.4, finished_at="t1", base="/b/base",
             data={**m["data"], "path": "/b/data.jsonl"}, **changes)
    return m


def keys(lines):
    return [line.split(":")[0] for line in lines]


def test_full_twins_differ_only_in_the_loop_and_what_it_changes():
    looped = looped_of(TWIN)
    assert twin_mismatches(TWIN, looped) == [] == twin_mismatches(looped, TWIN)
    for path, value in [("config.seed", 1), ("data.sha256", "0" * 64), ("tokens.input", 501),
                        ("data.decontamination.against", ["math500_boxed"]), ("runtime.processes", 2),
                        ("loop_draws", {"kind": "curriculum"})]:  # full draws nothing: draws are not a loop change here
        other = copy.deepcopy(looped)
        *parents, leaf = path.split(".")
        target = other
        for p in parents:
            target = target[p]
        target[leaf] = value
        assert keys(twin_mismatches(TWIN, other)) == [path]


def test_convert_twins_must_share_the_lora_initialisation():
    twin = {**copy.deepcopy(TWIN), "recipe": "convert", "lora": {"modules": 42, "trainable": 10, "init_sha256": "1" * 64}}
    twin["config"]["recipe"] = "convert"
    looped = looped_of(twin, loop_draws={"kind": "curriculum", "applied": [0, 1, 1]}, loss_terms={"kl": [[10, 0.1]]})
    assert twin_mismatches(twin, looped) == []
    looped["lora"]["init_sha256"] = "2" * 64
    assert keys(twin_mismatches(twin, looped)) == ["lora.init_sha256"]
    bare = {k: v for k, v in twin.items() if k != "lora"}
    assert twin_mismatches(bare, looped_of(bare, loop_draws=None)) == [
        "lora.init_sha256: missing from both manifests", "lora.modules: missing from both manifests"]


def test_cpt_twins_must_measure_the_same_heldout_rows():
    twin = {**copy.deepcopy(TWIN), "recipe": "cpt", "heldout": {"path": "/a/h.jsonl", "sha256": "h" * 64}}
    looped = looped_of(twin, loop_draws={"kind": "random_depth", "passes": [1, 3, 2]},
                       heldout={"path": "/b/h.jsonl", "sha256": "h" * 64},
                       heldout_curve=[{"step": 10, "tokens": 500, "loss": 2.0, "loss_by_passes": {"1": 2.1}}])
    assert twin_mismatches(twin, looped) == []
    looped["heldout"]["sha256"] = "x" * 64
    assert keys(twin_mismatches(twin, looped)) == ["heldout.sha256"]
    assert keys(twin_mismatches({**twin, "heldout": None}, {**looped, "heldout": None})) == ["heldout.sha256"]


def test_recipes_never_pair_and_format_1_reads_as_full(tmp_path):
    convert = {**copy.deepcopy(TWIN), "recipe": "convert"}
    assert twin_mismatches(TWIN, looped_of(convert)) == ["recipe: 'full' != 'convert'"]
    assert twin_mismatches({**TWIN, "recipe": "distill"}, {**TWIN, "recipe": "distill"}) == [
        "recipe: 'distill' is not one of full, convert, cpt, joint, loop-convert"]
    old = {k: v for k, v in TWIN.items() if k not in ("recipe", "parameters", "loop_draws", "heldout", "heldout_curve",
                                                       "checkpoints", "adapters")}
    old["format"] = "loopeval-training/1"
    (tmp_path / "training_manifest.json").write_text(json.dumps(old))
    assert twin_mismatches(read_manifest(tmp_path), looped_of(old)) == []
    (tmp_path / "training_manifest.json").write_text(json.dumps({**old, "format": "loopeval-training/9"}))
    with pytest.raises(ValueError, match="not a loopeval-training/2 training manifest"):
        read_manifest(tmp_path)
    assert set(TWIN_RULES) == set(RECIPES)
