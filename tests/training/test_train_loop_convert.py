"""Recipe loop-convert (paper 004): learned input mixing, the exit gate and its survival
construction, the smoothed exit loss, the collapse monitor, fixed-exit evaluation and
the scale-aware cache check, each against a hand computation or an independent path."""

import json
import math
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from loopeval import apply_loop, check_cache, load_model, loop_config, save_model
from loopeval.core.exit_gate import EXIT_GATE_NAME, ExitGate, exit_gate, exit_log_distribution, exit_loss_sums
from loopeval.training.exit_monitor import CollapseMonitor, collapse_episodes, collapse_notes
from loopeval.core.loop_controls import loop_passes, record_iterates
from loopeval.core.spec import LoopConfig
from loopeval.training.manifest import twin_mismatches
from loopeval.tools.tiny import tiny_model
from loopeval.training import TrainConfig, train_model, train_twins
from loopeval.training.loop_convert import LoopConvertModel
from loopeval.core.unroll import unrolled_copy
from support import letter_rows

CONFIG = TrainConfig(recipe="loop-convert", steps=6, batch_size=8, lr=3e-3, max_length=64, log_every=1)


@pytest.fixture(scope="module")
def work(make_work):
    return make_work("loop_convert", data=letter_rows(16, 16, spread=3))


@pytest.fixture(scope="module")
def pair(work):
    return train_twins(work / "base", work / "data.jsonl", loop="0:6x3", out=work / "pair", config=CONFIG, progress=False)


def _ids(tokenizer, text="Tom has 3 apples and buys 4 more."):
    return tokenizer(text, return_tensors="pt").input_ids


# -- the exit distribution and the loss ------------------------------------------------


def test_survival_construction_matches_a_hand_computation():
    z = torch.tensor([[0.3, -1.2, 2.0, 0.7], [-4.0, 5.0, 0.0, -30.0]], dtype=torch.float64)
    lam = torch.sigmoid(z)
    for row in range(2):
        l0, l1, l2 = lam[row, :3].tolist()
        expected = [l0, l1 * (1 - l0), l2 * (1 - l0) * (1 - l1), (1 - l0) * (1 - l1) * (1 - l2)]  # Eq. 5
        p = exit_log_distribution(z[row]).exp()
        assert p.tolist() == pytest.approx(expected, rel=1e-6)
        assert float(p.sum()) == pytest.approx(1.0, abs=1e-6)
    extreme = exit_log_distribution(torch.tensor([80.0, -80.0, 80.0]))
    assert torch.isfinite(extreme).all() and float(extreme.exp().sum()) == pytest.approx(1.0)


def test_exit_loss_is_eq_6_with_eq_2_smoothing():
    torch.manual_seed(0)
    nll = torch.rand(5, 3) * 4
    halt = torch.randn(5, 3)
    p = exit_log_distribution(halt).exp()
    entropy = -(p * p.log()).sum()
    got = exit_loss_sums(nll, halt, beta=0.15, smoothing=0.0)
    assert float(got["loss"]) == pytest.approx(float((p * nll).sum() - 0.15 * entropy), rel=1e-6)
    smooth = exit_loss_sums(nll, halt, beta=0.15, smoothing=0.05)
    lm = 0.95 * (p * nll).sum() + 0.05 / 3 * nll.sum()
    assert float(smooth["lm"]) == pytest.approx(float(lm), rel=1e-6)
    assert float(smooth["entropy"]) == pytest.approx(float(entropy), rel=1e-6)  # regularised on the original p


def test_smoothing_keeps_every_step_training_even_under_collapse():
    """004: "With eps = 0.05 and T = 3, every step retains at least 0.0167 LM weight"."""
    halt = torch.tensor([[40.0, 0.0, 0.0], [-40.0, 40.0, 0.0], [0.0, -40.0, 0.0]])
    nll = torch.ones(3, 3, requires_grad=True)
    exit_loss_sums(nll, halt, beta=0.15, smoothing=0.05)["lm"].backward()
    weights = nll.grad  # d loss / d L_t: the LM weight of each step
    assert (weights >= 0.05 / 3 - 1e-7).all()
    assert float(weights[0, 1]) == pytest.approx(0.05 / 3, abs=1e-6)  # p_1 = 0 exactly under collapse
    assert weights.sum(1).tolist() == pytest.approx([1.0, 1.0, 1.0])


# -- the loop: per-pass iterates, embedding mixing, the learned logit -------------------


def test_record_iterates_equals_the_unrolled_copy(tokenizer):
    base = tiny_model("qwen3", vocab_size=len(tokenizer))
    unrolled = unrolled_copy(base, "1:4x3")
    model = apply_loop(base, "1:4x3", operator="repeat")
    ids = _ids(tokenizer)
    with torch.no_grad(), record_iterates(model) as recorded:
        model(ids)
        reference = unrolled(ids, output_hidden_states=True).hidden_states
    ((window, iterates),) = recorded
    assert str(window) == "1:4x3" and len(iterates) == 3
    # call sites 0 1 2 3 | 1 2 3 | 1 2 3 | 4 5: pass t ends after call site 3t
    for t, h in enumerate(iterates, 1):
        torch.testing.assert_close(h, reference[3 * t + 1], rtol=0, atol=1e-5)


def test_embedding_source_mixing_equals_a_hand_computation(tokenizer):
    from support import manual_loop

    model = tiny_model("qwen3", vocab_size=len(tokenizer))
    ids = _ids(tokenizer)
    w = 1 / (1 + math.exp(-1.5))
    with torch.no_grad():
        e = model.model.embed_tokens(ids)

        def step(g, x0):
            h = g(x0)
            for _ in range(2):
                h = g(w * e + (1 - w) * h)  # 004 Eq. 1: z_t = w e + (1 - w) h_{t-1}
            return h

        expected = manual_loop(model, ids, (2, 4), step)
        apply_loop(model, "2:4x3", mix=1.5, mix_source="embedding", operator="repeat")
        got = model(ids).logits
        window_mixed = apply_loop(tiny_model("qwen3", vocab_size=len(tokenizer)), "2:4x3", mix=1.5, operator="repeat")(ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert (got - window_mixed).abs().max() > 1e-3  # the window's input is not the embedding
    assert check_cache(model, tokenizer, max_new_tokens=12).ok


def test_step_losses_are_the_loss_at_each_depth(tokenizer):
    """LoopConvertModel's per-step NLL at step t is the NLL of the same loop run t times."""
    model = apply_loop(tiny_model("qwen3", vocab_size=len(tokenizer)), LoopConfig("0:6x3", operator="repeat", mix=4.6, mix_source="embedding"))
    module = LoopConvertModel(model, mix_init=4.6, seed=0)
    ids = _ids(tokenizer)
    out = module(ids, labels=ids)
    for t in (1, 2, 3):
        with torch.no_grad(), loop_passes(model, t):
            logits = model(ids).logits[0, :-1]
        torch.testing.assert_close(out["step_nll"][:, t - 1], F.cross_entropy(logits, ids[0, 1:], reduction="none"),
                                   rtol=0, atol=1e-5)
    assert out["halt"].shape == (ids.shape[1] - 1, 3)


def test_learned_mix_gets_a_gradient_and_round_trips(tokenizer, tmp_path):
    model = apply_loop(tiny_model("qwen3", vocab_size=len(tokenizer)), LoopConfig("0:6x3", operator="repeat", mix=4.6, mix_source="embedding"))
    module = LoopConvertModel(model, mix_init=4.6, seed=0)
    assert not any(p is module.mix or p is module.gate.linear.weight for p in model.parameters())  # kept outside
    ids = _ids(tokenizer)
    out = module(ids, labels=ids)
    exit_loss_sums(out["step_nll"], out["halt"], beta=0.15, smoothing=0.05)["loss"].backward()
    assert module.mix.grad is not None and float(module.mix.grad.abs()) > 0
    assert float(module.gate.linear.weight.grad.abs().sum()) > 0
    with torch.no_grad():
        module.mix.add_(0.123456789)
        module.gate.linear.bias.fill_(-0.5)
    trained = float(module.mix.detach())
    final = module.finish()
    assert loop_config(final).mix == trained
    with torch.no_grad():
        before = final(ids).logits
    save_model(final, tokenizer, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / EXIT_GATE_NAME).is_file()
    loaded, _ = load_model(tmp_path / "ckpt")
    assert loop_config(loaded) == loop_config(final)  # the float exactly, the source too
    torch.testing.assert_close(exit_gate(loaded).state_dict(), exit_gate(final).state_dict(), rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, before, rtol=0, atol=1e-6)
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in tiny_model("qwen3", vocab_size=len(tokenizer)).parameters())


def test_old_loop_configs_still_load(tmp_path):
    config = LoopConfig.from_dict({"loop": "1:3x2", "operator": "repeat", "beta": 0.0, "mix": 2.0})
    assert config.mix_source == "window" and "mix_source" not in config.to_dict()
    embedding = LoopConfig("1:3x2", "repeat", mix=2.0, mix_source="embedding")
    assert LoopConfig.from_dict(embedding.to_dict()) == embedding


# -- training ---------------------------------------------------------------------------


def test_recipe_trains_and_records(pair, work):
    twin, looped = pair
    m = looped.manifest
    assert m["recipe"] == "loop-convert"
    assert m["loop"] == {"loop": "0:6x3", "operator": "repeat", "beta": 0.0, "mix": 4.6, "mix_source": "embedding"}
    assert m["parameters"]["added"] == 64 + 1 + 1  # gate weights and bias, the mix logit
    assert twin.manifest["parameters"]["added"] == 0
    assert m["parameters"]["final"] == m["parameters"]["base"]
    p = m["exit"]["p"]
    assert len(p) == CONFIG.steps and all(len(row) == 3 and sum(row) == pytest.approx(1.0, abs=1e-5) for row in p)
    assert m["exit"]["collapses"] == []
    stored = json.loads((looped.path / "loop_config.json").read_text())
    assert stored["mix"] == m["mix"]["trained"] != 4.6
    assert (looped.path / EXIT_GATE_NAME).is_file() and not (twin.path / EXIT_GATE_NAME).exists()
    assert twin_mismatches(twin.manifest, m) == []


def test_twin_is_the_plain_fine_tune(pair, work):
    """004's twin is the base "continued on exactly the same data for the same number of
    steps": the loop-convert twin trains exactly as recipe full does."""
    twin, _ = pair
    full = train_model(work / "base", work / "data.jsonl", out=work / "full",
                       config=TrainConfig(steps=6, batch_size=8, lr=3e-3, max_length=64, log_every=1), progress=False)
    assert twin.manifest["loss_curve"] == full.manifest["loss_curve"]
    assert twin.manifest["final_weights_sha256"] == full.manifest["final_weights_sha256"]


def test_planted_collapse_triggers_the_monitor(work, monkeypatch):
    class Collapsed(ExitGate):
        def __init__(self, hidden_size):
            super().__init__(hidden_size)
            torch.nn.init.constant_(self.linear.bias, 30.0)  # lambda_0 = 1: every token exits at step 0

    monkeypatch.setattr("loopeval.training.loop_convert.ExitGate", Collapsed)
    config = TrainConfig(recipe="loop-convert", steps=5, batch_size=8, lr=1e-3, max_length=64, collapse_patience=2)
    with pytest.warns(UserWarning, match="exit-gate collapse.*3 consecutive steps"):
        result = train_model(work / "base", work / "data.jsonl", loop="0:6x3", out=work / "collapsed", config=config,
                             progress=False)
    m = result.manifest
    assert all(row[0] > 0.99 for row in m["exit"]["p"])
    assert m["exit"]["collapses"] == [[1, 5]]
    (note,) = collapse_notes(m, "collapsed")
    assert "steps 1-5" in note
    from loopeval.analysis.report.training import loop_conversion

    notes = loop_conversion([types.SimpleNamespace(where=Path("collapsed"), manifest=m)])
    assert any("added 66 parameters" in n for n in notes) and any("collapse" in n for n in notes)


def test_collapse_episodes_and_monitor():
    p0 = [0.5, 0.99, 0.99, 0.99, 0.2, 0.97, 0.98, 0.99, 0.99]
    assert collapse_episodes(p0, threshold=0.95, patience=2) == [(2, 4), (6, 9)]
    assert collapse_episodes(p0, threshold=0.95, patience=3) == [(6, 9)]
    monitor = CollapseMonitor(threshold=0.95, patience=2)
    fired = [step for step, p in enumerate(p0) if monitor.update(step, p)]
    assert fired == [3, 7]  # once per episode, on its third step


# -- fixed-exit evaluation ----------------------------------------------------------------


def test_exit_after_equals_the_loop_run_k_steps(pair, tokenizer):
    from loopeval.model_adapters.looped import LoopedLM

    _, looped = pair
    lm = LoopedLM(pretrained=str(looped.path), exit_after=2, device="cpu", batch_size=2)
    stored = loop_config(load_model(looped.path)[0])
    assert lm.session.loop == LoopConfig("0:6x2", operator="repeat", mix=stored.mix, mix_source="embedding")
    reference, _ = load_model(looped.path)  # 0:6x3: read its second step's output
    ids = _ids(tokenizer)
    with torch.no_grad(), record_iterates(reference) as recorded:
        reference(ids)
        ((_, iterates),) = recorded
        expected = reference.lm_head(reference.model.norm(iterates[1]))
        got = lm.model(ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert check_cache(lm.model, tokenizer, max_new_tokens=12).ok
    assert lm.cost.passes == 12 and lm.cost.multiplier == 2.0
    header = lm.session.trace_header()
    assert header.exit_after == 2 and header.loop["loop"] == "0:6x2" and header.multiplier == 2.0


def test_exit_after_bad_input(pair, work):
    from loopeval.model_adapters.looped import LoopedLM

    _, looped = pair
    with pytest.raises(ValueError, match=r"exit_after=4: larger than the loop's step count; window 0:6x3"):
        LoopedLM(pretrained=str(looped.path), exit_after=4, device="cpu")
    with pytest.raises(ValueError, match="exit_after=1 given for a model without a loop"):
        LoopedLM(pretrained=str(work / "base"), exit_after=1, device="cpu")
    with pytest.raises(ValueError, match="exit_after"):
        LoopedLM(pretrained=str(looped.path), exit_after=0, device="cpu")


# -- bad input, before any weights load ------------------------------------------------


@pytest.mark.parametrize("loop, options, message", [
    ("2:4x2", {}, r"re-applies only layers 2..3 of 6; 004's conversion loops the whole decoder.*0:6xK"),
    ("0:6x2+0:1x3/mlp", {}, "has 2 windows"),
    ("0:6x2/mlp", {}, "only the mlp blocks"),
    ("0:6x1", {}, "K >= 2"),
    ("0:6x2", {"operator": "damped", "beta": 0.5}, "operator 'damped'"),
    ("0:6x2", {"mix": 3.0}, "learns the mix logit.*mix_init"),
])
def test_bad_loops_are_refused_before_training(work, monkeypatch, loop, options, message):
    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded before the loop was checked")

    monkeypatch.setattr("loopeval.training.runner.load_model", no_weights)
    with pytest.raises(ValueError, match=message):
        train_model(work / "base", work / "data.jsonl", loop=loop, out=work / "bad", config=CONFIG, progress=False,
                    **options)


@pytest.mark.parametrize("field, value, message", [
    ("exit_beta", -0.1, "exit_beta must be >= 0"),
    ("exit_smoothing", 1.5, r"exit_smoothing must lie in \[0, 1\]"),
    ("mix_init", math.inf, "mix_init must be a finite logit"),
    ("collapse_threshold", 1.0, r"collapse_threshold must lie in \(0, 1\)"),
    ("collapse_patience", -1, "collapse_patience must be an integer >= 0"),
])
def test_bad_options(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(recipe="loop-convert", **{field: value})
    if field != "collapse_threshold":
        with pytest.raises(ValueError, match=f"{field} belongs to recipe 'loop-convert'"):
            TrainConfig(recipe="full", **{field: 0.3 if field != "collapse_patience" else 3})


def test_mix_source_bad_input():
    with pytest.raises(ValueError, match="loop mix_source 'tokens': unknown"):
        LoopConfig("1:3x2", mix=1.0, mix_source="tokens")
    with pytest.raises(ValueError, match="mix_source 'embedding' given without mix"):
        LoopConfig("1:3x2", mix_source="embedding")
    with pytest.raises(ValueError, match="record_iterates: loop operator 'damped'"):
        with record_iterates(apply_loop(tiny_model("qwen3"), "1:3x2", operator="damped", beta=0.5)):
            raise AssertionError("record_iterates entered for a damped loop")


# -- the scale-aware cache check ---------------------------------------------------------


def _float32_rounding(model, relative: float):
    """Make the cached steps of ``model`` round ``relative`` of their largest |logit| away
    from recomputation, in float32 only: a kernel's rounding, arranged rather than assumed
    (how far real kernels round apart depends on the CPU's instruction set). The shift is
    the same for every logit of a step, so no greedy token changes; float64 runs are exact."""

    def shift(module, args, kwargs, output):
        logits = output.logits
        if logits.dtype == torch.float32 and logits.shape[1] == 1:  # a cached decode step
            logits.add_(relative * logits.abs().amax(-1, keepdim=True))

    return model.register_forward_hook(shift, with_kwargs=True)


def test_cache_check_accepts_a_correct_loop_that_drifts(tokenizer):
    """Large logits (as a trained model has): a float32 gap of 1e-5 of the logits is past
    the old absolute 1e-3 but a tiny fraction of the logits, so the check passes."""
    model = tiny_model("qwen3", vocab_size=len(tokenizer))
    with torch.no_grad():
        model.lm_head.weight.mul_(20000.0)
    apply_loop(model, "0:6x3", mix=4.6, mix_source="embedding", operator="repeat")
    _float32_rounding(model, 1e-5)
    absolute = check_cache(model, tokenizer, max_new_tokens=12, rtol=0.0)
    assert not absolute.ok and absolute.max_abs_diff > 1e-3, absolute  # the old criterion rejects it
    result = check_cache(model, tokenizer, max_new_tokens=12)
    assert result.ok and result.decided_in is None and 0.5e-5 < result.max_rel_diff < 2e-4, result


def _sharp(tokenizer):
    """Trained-like weights: sharp attention (q/k norms x30) and large logits (head x100)."""
    model = tiny_model("qwen3", vocab_size=len(tokenizer))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.mul_(30.0)
            layer.self_attn.k_norm.weight.mul_(30.0)
        model.lm_head.weight.mul_(100.0)
    return model


def test_a_correct_sharp_loop_passes_the_cache_check_on_any_cpu(tokenizer):
    """Issue 32's loop (mix from the embedding, fixed exit) on trained-like weights: on some
    CPUs float32 rounding exceeds the fast rule (2.5e-4 of the logits measured on AVX2), on
    others it does not (1.3e-5 on AVX-512); either way a correct cache passes."""
    model = apply_loop(_sharp(tokenizer), LoopConfig("0:6x3", operator="repeat", mix=4.6, mix_source="embedding")
                       .exit_after(2))
    result = check_cache(model, tokenizer, max_new_tokens=12)
    assert result.ok, result


def test_cache_check_decides_in_float64_where_float32_rounding_exceeds_its_rule(tokenizer):
    """A float32 gap of 5e-4 of the logits fails the fast rule (2e-4); the check runs again
    in float64, where the cache is exact, passes, and keeps the float32 gap beside it. The
    model's weights come back bit for bit."""
    model = apply_loop(_sharp(tokenizer), LoopConfig("0:6x3", operator="repeat", mix=4.6, mix_source="embedding")
                       .exit_after(2))
    _float32_rounding(model, 5e-4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    float32 = check_cache(model, tokenizer, max_new_tokens=12, atol=1e-3, rtol=2e-4)  # given tolerances: no retry
    assert not float32.ok and float32.decided_in is None and float32.max_rel_diff > 2e-4, float32
    result = check_cache(model, tokenizer, max_new_tokens=12)
    assert result.ok and result.decided_in == "float64", result
    assert result.max_rel_diff <= result.rtol and result.rounding_gap == pytest.approx(float32.max_abs_diff, rel=1e-2)
    assert "decided in float64" in str(result)
    after = model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32


def test_cache_check_still_fails_the_naive_shared_slot_loop(tokenizer):
    from support import naive_loop

    model = naive_loop(tiny_model("qwen3", vocab_size=len(tokenizer)), "0:6x3")
    result = check_cache(model, tokenizer, max_new_tokens=12)
    assert not result.ok


def test_cache_check_fails_swapped_cache_slots_in_float64_too(tokenizer):
    """Two layers' second-pass cache slots swapped at every forward (each step reads the other
    layer's history): wrong by a sizeable fraction of the logits in float64, where rounding
    cannot explain it."""
    model = apply_loop(_sharp(tokenizer), "0:6x3", operator="repeat", mix=4.6, mix_source="embedding")
    slots = next(iter(model._loopeval.slot_maps.values()))[2]

    def swap(module, args, kwargs):
        slots[0], slots[1] = slots[1], slots[0]

    model.model.register_forward_pre_hook(swap, with_kwargs=True)
    result = check_cache(model, tokenizer, max_new_tokens=12)
    assert not result.ok and result.decided_in == "float64" and result.max_rel_diff > 1e-3, result


def test_cli_runs_the_same_code_path(work, tmp_path, capsys):
    from loopeval.cli import main

    common = ["train", "--base", str(work / "base"), "--data", str(work / "data.jsonl"), "--recipe", "loop-convert",
              "--steps", "2", "--batch-size", "8", "--max-length", "64", "--only", "looped"]
    assert main([*common, "--loop", "0:6x2", "--out", str(tmp_path / "a"), "--exit-beta", "0.5",
                 "--exit-smoothing", "0", "--mix-init", "3.0"]) == 0
    printed = capsys.readouterr().out
    assert "exit distribution at the last step: p = [" in printed and "66 parameters added" in printed
    m = json.loads((tmp_path / "a" / "looped" / "training_manifest.json").read_text())
    assert (m["config"]["exit_beta"], m["config"]["exit_smoothing"], m["mix"]["init"]) == (0.5, 0.0, 3.0)
    assert main([*common, "--loop", "2:4x2", "--out", str(tmp_path / "b")]) == 2
    assert "re-applies only layers 2..3 of 6" in capsys.readouterr().err
    assert not (tmp_path / "b" / "looped").exists()


def test_heldout_and_intermediate_checkpoints(work, tokenizer):
    (work / "heldout.jsonl").write_text("".join(json.dumps({"text": "j i h g f e d c b a " * (i + 1)}) + "\n"
                                                for i in range(3)))
    config = TrainConfig(recipe="loop-convert", steps=3, batch_size=8, lr=3e-3, max_length=64, save_every=2)
    result = train_model(work / "base", work / "data.jsonl", heldout=work / "heldout.jsonl", loop="0:6x3",
                         out=work / "held", config=config, progress=False)
    curve = result.manifest["heldout_curve"]
    assert [p["step"] for p in curve] == [2, 3] and set(curve[-1]["loss_by_passes"]) == {"1", "2", "3"}
    assert curve[-1]["loss_by_passes"]["3"] == pytest.approx(curve[-1]["loss"])
    middle, _ = load_model(result.path / "checkpoint-2")
    final, _ = load_model(result.path)
    assert exit_gate(middle) is not None
    assert loop_config(middle).mix != loop_config(final).mix == result.manifest["mix"]["trained"]


@pytest.mark.slow
def test_lm_eval_cli_exit_after_equals_the_loop_saved_at_k(pair, tmp_path):
    from support import write_generate_task
    from support import read_samples, run_lm_eval

    from loopeval import remove_loop
    from loopeval.evaluation.trace import find_traces

    _, looped = pair
    model, tok = load_model(looped.path)
    stored = loop_config(model)
    save_model(apply_loop(remove_loop(model), LoopConfig("0:6x2", operator="repeat", mix=stored.mix, mix_source="embedding")), tok,
               tmp_path / "x2")
    rows = [{"question": q, "answer": "7"} for q in ("What is 3 + 4?", "2 + 2 =", "A box holds 8 eggs; 3 boxes?")]
    write_generate_task(tmp_path / "tasks", "tiny_gen", rows, max_gen_toks=12)
    common = ["--tasks", "tiny_gen", "--include_path", str(tmp_path / "tasks")]
    for name, args in (("a", f"pretrained={looped.path},exit_after=2"), ("b", f"pretrained={tmp_path / 'x2'}")):
        run = run_lm_eval("--model", "looped", "--model_args", f"{args},trace={tmp_path / name}",
                       "--output_path", str(tmp_path / name), *common, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-3000:]
    a, b = read_samples(tmp_path / "a", "tiny_gen"), read_samples(tmp_path / "b", "tiny_gen")
    assert {d: s["resps"] for d, s in a.items()} == {d: s["resps"] for d, s in b.items()}
    (trace,) = find_traces(tmp_path / "a")
    assert trace.header.exit_after == 2 and trace.header.loop["loop"] == "0:6x2"
    assert trace.header.multiplier == 2.0 and trace.header.cache_check["ok"] is True
    assert all(item.passes_per_token == 12 for item in trace.items)
