"""The joint two-path recipe (companion paper 002) and the step accounting of every recipe:
the shared-prefix forward against separate forwards, the objective against HF's own
losses and the other recipes, blocks against the paper's arithmetic, stages against a
hand-written training loop with one optimiser, and bad input."""

import json

import pytest
import torch

from loopeval import loop_config
from loopeval.core.loop import apply_loop
from loopeval.core.loop_controls import loop_disabled
from loopeval.training.manifest import twin_mismatches
from loopeval.analysis.report.training import costs
from loopeval.tools.tiny import tiny_model
from loopeval.training import TrainConfig, batch_order, load_data, train_model, train_twins
from loopeval.training.data import collate
from loopeval.training.config import parse_stages
from loopeval.training.joint import matched_ce, two_path_logits
from support import letter_rows

LOOP = "2:6x2"  # 002's shape: 8 blocks, blocks 2-5 repeated
BASE = dict(recipe="joint", steps=4, batch_size=4, lr=1e-2, max_length=32, log_every=1, grad_clip=0.0,
            min_lr_ratio=1.0)


@pytest.fixture(scope="module")
def work(make_work):
    return make_work("joint", num_layers=8, data=letter_rows(8, 8, spread=5))


def _train(work, name, loop=LOOP, **options):
    return train_model(work / "base", work / "data.jsonl", out=work / name, loop=loop,
                       config=TrainConfig(**{**BASE, **options}), overwrite=True, progress=False)


def _batch(tokenizer, arch="qwen3"):
    rows = [tokenizer(t)["input_ids"] for t in ("a b c d e f g", "h i j a", "b c d e f g h i j")]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


# -- the shared-prefix forward ---------------------------------------------------------------


@pytest.mark.parametrize("arch,loop,options,checkpointing", [
    ("qwen3", "2:6x2", {}, False),
    ("llama", "1:3x2+4:6x3", {"operator": "damped", "beta": 0.25, "mix": 1.0}, False),
    ("llama", "1:3x2+4:6x3", {}, True),
    ("qwen3_5", "0:4x2+0:1x3/mlp", {}, False),
])
def test_shared_prefix_forward_equals_two_separate_forwards(tokenizer, arch, loop, options, checkpointing):
    """Logits (atol 1e-5) and the gradients of both losses against a loop_disabled forward
    and a looped forward run separately, on a right-padded batch (the shared forward also
    under activation checkpointing, whose backward re-runs the layers)."""
    ids, mask = _batch(tokenizer)
    labels = ids.masked_fill(mask == 0, -100)
    grads = []
    for shared in (True, False):
        model = apply_loop(tiny_model(arch, vocab_size=len(tokenizer), num_layers=6), loop, **options)
        if checkpointing and shared:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        model.train()
        if shared:
            single, looped = two_path_logits(model, ids, mask)
        else:
            with loop_disabled(model):
                single = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            looped = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        loss = sum(torch.nn.functional.cross_entropy(x[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
                   * w for x, w in ((single, 0.3), (looped, 0.7)))
        loss.backward()
        grads.append(({n: p.grad.clone() for n, p in model.named_parameters()}, single.detach(), looped.detach()))
    (g_shared, s_shared, l_shared), (g_sep, s_sep, l_sep) = grads
    keep = mask.bool()
    torch.testing.assert_close(s_shared[keep], s_sep[keep], atol=1e-5, rtol=0)
    torch.testing.assert_close(l_shared[keep], l_sep[keep], atol=1e-5, rtol=0)
    assert (s_sep - l_sep)[keep].abs().max() > 1e-3  # the two paths really differ
    for name, g in g_sep.items():
        torch.testing.assert_close(g_shared[name], g, atol=1e-5, rtol=1e-4, msg=name)


# -- the objective -------------------------------------------------------------------------


def _hf_loss(model, batch):
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss


def test_joint_loss_reduces_to_looped_only_and_to_plain_fine_tune(work, tokenizer):
    """w_single = 0: the loss is the looped model's mean NLL; w_loop = 0: the unlooped
    model's (HF's own loss, a model never looped); trained, the curves are those of the
    ``full`` recipe through the loop and without it."""
    from loopeval.training.joint import Joint

    data = load_data(work / "data.jsonl", tokenizer, max_length=32)
    batch = collate(data, list(range(4)), 0, "cpu")
    n = int((batch["labels"][:, 1:] != -100).sum())
    plain = tiny_model("qwen3", vocab_size=len(tokenizer), num_layers=8)
    looped = apply_loop(tiny_model("qwen3", vocab_size=len(tokenizer), num_layers=8), LOOP, operator="repeat")
    for weights, reference in (((0.0, 1.0), _hf_loss(looped, batch)), ((1.0, 0.0), _hf_loss(plain, batch))):
        config = TrainConfig(**{**BASE, "single_weight": weights[0], "loop_weight": weights[1]})
        recipe = Joint(config, loop_config(looped))
        recipe.prepare(looped)
        recipe.plan(0, None)
        loss, _ = recipe.losses(looped, batch)
        assert loss.item() / n == pytest.approx(reference.item(), rel=1e-6)

    loop_only = _train(work, "w_single_0", single_weight=0.0, loop_weight=1.0).manifest
    full_looped = _train(work, "full_looped", recipe="full").manifest
    single_only = _train(work, "w_loop_0", single_weight=1.0, loop_weight=0.0).manifest
    full_twin = _train(work, "full_twin", loop=None, recipe="full").manifest
    for a, b in ((loop_only, full_looped), (single_only, full_twin)):
        assert [x for _, x in a["loss_curve"]] == pytest.approx([x for _, x in b["loss_curve"]], rel=1e-5)


def test_frozen_original_kd_is_zero_on_the_single_pass_at_step_0(work):
    m = _train(work, "kd_orig", teacher="frozen-original", receiver="both").manifest
    assert m["loss_terms"]["kl_single"][0] == [1, 0.0]
    assert m["loss_terms"]["kl_loop"][0][1] > 0  # the original single pass is not the looped output
    assert m["loss_terms"]["kl_single"][-1][1] > 0  # the student moves away from its frozen copy


def test_matched_ce_moves_each_receivers_kl_weight_to_its_label_weight():
    """002 Table 34, total KL weight 0.1 over label weights (0.1, 0.9): "Matched CE
    (L_s, L_c)" is (0.2, 0.9) for the single receiver, (0.1, 1.0) for the looped output,
    (0.15, 0.95) for both."""
    for receiver, expected in (("single", (0.2, 0.9)), ("loop", (0.1, 1.0)), ("both", (0.15, 0.95))):
        control = matched_ce(TrainConfig(recipe="joint", teacher="frozen-original", receiver=receiver))
        assert (control.single_weight, control.loop_weight) == pytest.approx(expected)
        assert control.teacher is None and control.receiver is None
        assert control.matched_from == f"frozen-original/{receiver}/0.1"


# -- blocks, FLOPs and budgets ----------------------------------------------------------------


def test_blocks_per_step_follow_the_papers_arithmetic(work):
    """002's 8-block model looped over blocks 2-5: 8 blocks per ordinary update, 12
    loop-only, 14 joint (6 shared + 2 + 6), 22 with the frozen single-pass teacher, 26
    with the frozen looped one, online KD 14 (no teacher forward)."""
    cases = {"twin": (None, {}, 8), "loop_stage": (LOOP, {"stages": "loop:4"}, 12), "joint": (LOOP, {}, 14),
             "kd_original": (LOOP, {"teacher": "frozen-original", "receiver": "single"}, 22),
             "kd_looped": (LOOP, {"teacher": "frozen-looped", "receiver": "single"}, 26),
             "kd_online": (LOOP, {"teacher": "online", "receiver": "single"}, 14)}
    manifests = {}
    for name, (loop, options, blocks) in cases.items():
        m = manifests[name] = _train(work, f"blocks_{name}", loop=loop, **options).manifest
        assert m["blocks"]["per_step"] == [blocks] * 4 and m["blocks"]["total"] == 4 * blocks, name
    assert manifests["kd_original"]["blocks"]["teacher"] == 4 * 8
    # FLOPs: every layer of the tiny model costs the same, l per token, so with F_b = 8l + H
    # (twin) and F_l = 12l + H (loop-only) the joint step is 14l + 2H = F_l + F_b - 6l
    f_b, f_l = manifests["twin"]["flops"]["forward"], manifests["loop_stage"]["flops"]["forward"]
    layer = (f_l - f_b) / 4
    assert manifests["joint"]["flops"]["forward"] == pytest.approx(f_l + f_b - 6 * layer, rel=1e-9)
    assert manifests["kd_original"]["flops"]["teacher_forward"] == pytest.approx(f_b, rel=1e-12)
    assert manifests["kd_looped"]["flops"]["teacher_forward"] == pytest.approx(f_l, rel=1e-12)


def test_max_blocks_stops_each_side_at_its_own_budget_and_twins_still_match(work):
    """50 blocks: the joint model (14 per step) runs 3 steps, its twin (8) 6 of the 8;
    the manifests say why they stopped and the twin rule accepts equal budgets."""
    twin, looped = train_twins(work / "base", work / "data.jsonl", loop=LOOP, out=work / "capped",
                               config=TrainConfig(**{**BASE, "steps": 8, "max_blocks": 50}), overwrite=True,
                               progress=False)
    assert looped.manifest["budget"] == {"steps_run": 3, "stopped_by": "max_blocks"}
    assert twin.manifest["budget"] == {"steps_run": 6, "stopped_by": "max_blocks"}
    assert len(looped.manifest["step_seconds"]) == 3 and looped.manifest["loss_curve"][-1][0] == 3
    assert twin_mismatches(twin.manifest, looped.manifest) == []
    rows = costs([("capped", twin.manifest, looped.manifest)], [])
    assert [(r["method"], r["steps"], r["blocks"], r["stopped_by"]) for r in rows] == [
        ("joint (twin)", 6, 48.0, "max_blocks"), ("joint CE 0.1/0.9", 3, 42.0, "max_blocks")]
    other = dict(twin.manifest, data={**twin.manifest["data"], "sha256": "0" * 64})
    assert twin_mismatches(other, looped.manifest)


def test_max_seconds_stops_after_the_step_that_reaches_it(work):
    m = _train(work, "timed", steps=50, max_seconds=1e-9).manifest
    assert m["budget"] == {"steps_run": 1, "stopped_by": "max_seconds"}


# -- stages ---------------------------------------------------------------------------------------


def test_staged_schedule_keeps_the_optimiser_state(work, tokenizer):
    """loop:2,joint:2 equals a hand-written loop with one AdamW over HF's own losses (the
    looped output's, then 0.1 x the single pass's + 0.9 x the looped output's); an
    optimiser reset at the switch gives other weights."""
    from safetensors.torch import load_file

    trained = load_file(str(_train(work, "staged", stages="loop:2,joint:2").path / "model.safetensors"))
    data = load_data(work / "data.jsonl", tokenizer, max_length=32)
    order = batch_order(len(data), batch_size=4, steps=4, seed=0)

    def by_hand(reset: bool):
        model = apply_loop(tiny_model("qwen3", vocab_size=len(tokenizer), num_layers=8), LOOP).train()
        from loopeval import load_model

        model.load_state_dict(load_model(work / "base")[0].state_dict())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0)
        for step in range(4):
            if reset and step == 2:
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0)
            batch = collate(data, order[step].tolist(), tokenizer.pad_token_id, "cpu")
            loss = _hf_loss(model, batch)
            if step >= 2:
                with loop_disabled(model):
                    loss = 0.1 * _hf_loss(model, batch) + 0.9 * loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return model.state_dict()

    kept, reset = by_hand(False), by_hand(True)
    for name, value in trained.items():
        torch.testing.assert_close(value, kept[name], atol=2e-5, rtol=1e-4, msg=name)
    assert max((trained[n] - reset[n]).abs().max().item() for n in trained) > 1e-3


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("options,message", [
    ({"teacher": "frozen-original"}, "guides no output; give receiver"),
    ({"receiver": "single"}, "without a teacher"),
    ({"teacher": "online", "receiver": "both"}, "can only guide the single pass"),
    ({"teacher": "frozen", "receiver": "single"}, "teacher 'frozen': choose one of"),
    ({"single_weight": -0.1}, "single_weight must be >= 0"),
    ({"kd_weight": -1.0, "teacher": "online", "receiver": "single"}, "kd_weight must be >= 0"),
    ({"single_weight": 0.0, "loop_weight": 0.0}, "nothing to optimise"),
    ({"stages": "loop:2,distill:2"}, "unknown stage 'distill'"),
    ({"stages": "loop:2,joint:1"}, "add up to 3 steps, not steps=4"),
    ({"stages": "loop:two"}, "expected NAME:STEPS"),
    ({"max_blocks": 0}, "max_blocks must be > 0"),
])
def test_bad_joint_configs_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{**BASE, **options})


def test_joint_options_belong_to_joint_and_matched_ce_needs_a_teacher():
    with pytest.raises(ValueError, match="teacher belongs to recipe 'joint', not 'full'"):
        TrainConfig(recipe="full", teacher="online")
    with pytest.raises(ValueError, match="matched-ce: the control is made from a joint KD config"):
        matched_ce(TrainConfig(recipe="joint"))
    assert parse_stages("loop:100, joint:200") == (("loop", 100), ("joint", 200))


def test_a_block_cap_below_one_step_is_refused_before_weights_load(work, monkeypatch):
    import loopeval.training.runner as runner

    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ValueError, match="max_blocks 20: one joint step of the looped model costs 22 forward blocks"):
        train_twins(work / "base", work / "data.jsonl", loop=LOOP, out=work / "refused",
                    config=TrainConfig(**{**BASE, "max_blocks": 20, "teacher": "frozen-original", "receiver": "single"}),
                    overwrite=True, progress=False)


def test_the_cli_trains_the_matched_control_of_a_kd_config(work, tmp_path, capsys):
    from loopeval.cli import main

    args = ["train", "--recipe", "joint", "--base", str(work / "base"), "--data", str(work / "data.jsonl"),
            "--loop", LOOP, "--out", str(tmp_path), "--steps", "2", "--batch-size", "4", "--max-length", "32",
            "--teacher", "frozen-original", "--receiver", "single", "--matched-ce", "--max-blocks", "20"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "14 forward blocks" in out and "stopped by max_blocks after 1 step(s)" in out  # no teacher: 14, not 22
    config = json.loads((tmp_path / "looped" / "training_manifest.json").read_text())["config"]
    assert (config["single_weight"], config["loop_weight"], config["teacher"]) == (pytest.approx(0.2), 0.9, None)
    assert config["matched_from"] == "frozen-original/single/0.1"
    assert main([*args[:-7], "--stages", "loop:1,distill:1", "--overwrite"]) == 2
    assert "unknown stage 'distill'" in capsys.readouterr().err


def test_a_finished_joint_recipe_holds_neither_its_model_nor_its_teacher(work, tokenizer):
    """train_twins keeps the twin's recipe while the looped model trains: a finished joint
    recipe must not keep the twin (or a frozen teacher) in memory."""
    import gc

    from transformers import PreTrainedModel

    from loopeval.core.loop import resolve_loop
    from loopeval.training.registry import make_recipe
    from loopeval.training.runner import train_one

    gc.collect()
    before = {id(o) for o in gc.get_objects() if isinstance(o, PreTrainedModel)}  # other tests' fixtures
    config = TrainConfig(**{**BASE, "steps": 1, "teacher": "frozen-looped", "receiver": "loop"})
    loop = resolve_loop(work / "base", LOOP)
    recipe = make_recipe(config, loop)
    train_one(work / "base", load_data(work / "data.jsonl", tokenizer, max_length=32), None, loop, work / "alive", config,
              recipe, progress=False)
    gc.collect()
    assert not any(isinstance(o, PreTrainedModel) and id(o) not in before for o in gc.get_objects())
