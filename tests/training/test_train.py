"""Twin training (recipe full): the twins differ only by the loop, and the manifest proves it."""

import copy
import dataclasses
import gc
import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from loopeval import load_model, loop_config
from loopeval.cli import main
from loopeval.training.manifest import MANIFEST_NAME, read_manifest, twin_mismatches
from loopeval.training import TrainConfig, load_data, train_model, train_twins, weights_sha256
from support import LETTERS, letter_rows, write_jsonl

# 16 rows, 8 per batch, 40 steps: exactly 20 epochs, so every row is seen 20 times
CONFIG = TrainConfig(steps=40, batch_size=8, lr=3e-3, warmup=4, max_length=64, log_every=1)


@pytest.fixture(scope="module")
def work(make_work):
    """A tiny base checkpoint and a learnable data set: cyclic letter runs."""
    return make_work("train", data=letter_rows(16, 16, spread=3))


@pytest.fixture(scope="module")
def trained(work):
    """The twins of 1:3x2, and a model trained through the no-op loop 1:3x1."""
    twin, looped = train_twins(work / "base", work / "data.jsonl", loop="1:3x2", out=work / "pair", config=CONFIG, progress=False)
    noop = train_model(work / "base", work / "data.jsonl", loop="1:3x1", out=work / "noop", config=CONFIG, progress=False)
    return twin, looped, noop


def state(path):
    model, _ = load_model(path)
    return model.state_dict()


def test_twins_share_data_initial_weights_and_batches(work, trained):
    twin, looped, _ = trained
    a, b = twin.manifest, looped.manifest
    assert a["data"]["sha256"] == b["data"]["sha256"] == hashlib.sha256((work / "data.jsonl").read_bytes()).hexdigest()
    base, _ = load_model(work / "base")
    assert a["base_weights_sha256"] == b["base_weights_sha256"] == weights_sha256(base)
    assert a["batches_sha256"] == b["batches_sha256"]
    assert a["tokens"] == b["tokens"]
    assert a["loop"] is None and b["loop"] == {"loop": "1:3x2", "operator": "damped", "beta": 0.0, "mix": None}
    assert twin_mismatches(a, b) == []
    assert a["final_weights_sha256"] != a["base_weights_sha256"]


def test_a_no_op_loop_trains_bit_identically_to_the_twin_and_a_real_loop_does_not(trained):
    twin, looped, noop = trained
    t, n, lo = state(twin.path), state(noop.path), state(looped.path)
    assert all(torch.equal(t[k], n[k]) for k in t)
    assert noop.loss_curve == twin.loss_curve
    assert not all(torch.equal(t[k], lo[k]) for k in t)
    assert looped.loss_curve != twin.loss_curve
    assert twin_mismatches(twin.manifest, noop.manifest) == []


def test_loss_goes_down(trained):
    for result in trained:
        curve = [loss for _, loss in result.loss_curve]
        assert len(curve) == CONFIG.steps
        assert sum(curve[-5:]) / 5 < 0.5 * sum(curve[:5]) / 5


def test_micro_batches_change_only_rounding(tmp_path, work):
    config = dataclasses.replace(CONFIG, steps=3, warmup=0)
    whole = train_model(work / "base", work / "data.jsonl", out=tmp_path / "whole", config=config, progress=False)
    split = train_model(work / "base", work / "data.jsonl", out=tmp_path / "split", progress=False,
                        config=dataclasses.replace(config, micro_batch_size=3))  # chunks of 3, 3 and 2 rows
    assert [x for _, x in whole.loss_curve] == pytest.approx([x for _, x in split.loss_curve], rel=1e-5)
    # Adam divides each gradient element by its running RMS, so an element whose gradient
    # is near rounding level moves by a visible fraction of lr (3e-3) on either side: the
    # weights agree to 1/30 of lr, the losses above to 1e-5.
    a, b = state(whole.path), state(split.path)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-4)
    assert twin_mismatches(whole.manifest, split.manifest) == ["config.micro_batch_size: None != 3"]


def test_training_keeps_no_model_alive(tmp_path, work):
    """Twins train one after the other in one process, maybe with one accelerator; the
    first must not hold memory while the second trains."""
    from accelerate import Accelerator
    from transformers import PreTrainedModel

    def alive():
        gc.collect()
        return sum(isinstance(o, PreTrainedModel) for o in gc.get_objects())

    before = alive()
    accelerator = Accelerator()
    train_model(work / "base", work / "data.jsonl", out=tmp_path / "m", config=TrainConfig(steps=1, batch_size=2),
                accelerator=accelerator, progress=False)
    assert alive() == before


def test_training_flops_count_every_position_of_every_row(work, trained, tokenizer):
    twin, looped, _ = trained
    # independent of the batch order: 20 epochs see every row 20 times
    lengths = [len(tokenizer(json.loads(line)["text"]).input_ids) for line in (work / "data.jsonl").read_text().splitlines()]
    epochs = CONFIG.steps * CONFIG.batch_size // len(lengths)
    assert twin.manifest["tokens"] == {"input": epochs * sum(lengths), "loss": epochs * sum(n - 1 for n in lengths)}
    model, _ = load_model(work / "base")
    cfg = model.config
    layer_params = sum(p.numel() for p in model.model.layers[0].parameters())
    head_params = model.lm_head.weight.numel()
    attention = 4 * cfg.num_attention_heads * cfg.head_dim  # per layer pass, per unit of context
    for result, passes in ((twin, 6), (looped, 8)):
        per_row = [passes * (2 * layer_params * n + attention * n * (n + 1) / 2) + 2 * head_params * n for n in lengths]
        flops = result.manifest["flops"]
        assert flops["forward"] == pytest.approx(epochs * sum(per_row), rel=1e-9)
        assert flops["train"] == 3 * flops["forward"]


def test_saved_checkpoints_reload_with_their_loop(trained):
    twin, looped, _ = trained
    model, _ = load_model(looped.path)
    assert str(loop_config(model).spec) == "1:3x2"
    assert weights_sha256(model) == looped.manifest["final_weights_sha256"]
    plain, _ = load_model(twin.path)
    assert loop_config(plain) is None
    assert weights_sha256(plain) == twin.manifest["final_weights_sha256"]
    assert read_manifest(looped.path) == looped.manifest == read_manifest(looped.path / "training_manifest.json")


def test_twin_mismatches_report_everything_but_the_loop(work, trained):
    twin, looped, _ = trained
    other = copy.deepcopy(looped.manifest)
    other["loop"] = {"loop": "2:4x3", "operator": "damped", "beta": 0.5, "mix": 1.0}
    other["flops"]["train"] *= 2
    other["loss_curve"] = [[1, 0.0]]
    other["train_time_s"] += 100
    assert twin_mismatches(twin.manifest, other) == []
    other["data"]["sha256"] = "0" * 64
    other["config"]["seed"] = 7
    other["config"]["steps"] = 41
    del other["batches_sha256"]
    lines = twin_mismatches(twin.manifest, other)
    assert [line.split(":")[0] for line in lines] == ["batches_sha256", "config.seed", "config.steps", "data.sha256"]
    assert "<missing>" in lines[0]

    # a real run with another batch order: same data, different batches
    config = dataclasses.replace(CONFIG, steps=2, warmup=0, data_seed=1)
    shuffled = train_model(work / "base", work / "data.jsonl", out=work / "shuffled", config=config, progress=False)
    keys = {line.split(":")[0] for line in twin_mismatches(twin.manifest, shuffled.manifest)}
    assert {"config.data_seed", "config.steps", "batches_sha256"} <= keys
    assert "data.sha256" not in keys and "base_weights_sha256" not in keys


def test_chat_rows_train_on_the_completion_and_eos_only(tmp_path, work, tokenizer):
    rows = [{"prompt": f"{a} + {b} =", "completion": f"{a + b}"} for a, b in [(3, 4), (1, 1), (9, 9), (2, 7)]]
    rows += [{"text": "The quick brown fox."}, {"text": "Tom has 3 apples."}]
    data = load_data(write_jsonl(tmp_path / "chat.jsonl", rows), tokenizer, max_length=64)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "3 + 4 ="}], add_generation_prompt=True, return_dict=False)
    ids, start = data.row(0)
    assert ids.tolist() == prompt + tokenizer("7", add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    assert start == len(prompt)
    assert (data.chat_rows, data.text_rows, data.truncated) == (4, 2, 0)

    # the first step's loss (all rows in one batch, two padded micro-batches) is the
    # base model's mean next-token loss over exactly those target tokens
    config = TrainConfig(steps=1, batch_size=6, micro_batch_size=4, max_length=64, log_every=1)
    result = train_model(work / "base", tmp_path / "chat.jsonl", out=tmp_path / "out", config=config, progress=False)
    model, _ = load_model(work / "base")
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(len(data)):
            ids, start = data.row(i)
            ids = torch.tensor(ids).unsqueeze(0)
            labels = ids.clone()
            labels[:, :start] = -100
            n = int((labels[:, 1:] != -100).sum())
            total += model(ids, labels=labels).loss.item() * n
            count += n
    assert result.manifest["tokens"]["loss"] == count
    assert result.loss_curve[0][1] == pytest.approx(total / count, rel=1e-5)


def test_long_rows_are_cut_and_rows_left_without_targets_are_errors(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "a b c d e f g h i j"}, {"prompt": "x y z", "completion": "a b c"}])
    prompt = len(tokenizer.apply_chat_template([{"role": "user", "content": "x y z"}], add_generation_prompt=True, return_dict=False))
    with pytest.raises(ValueError, match=r"d\.jsonl:2: no token left to train on"):
        load_data(path, tokenizer, max_length=prompt)
    data = load_data(path, tokenizer, max_length=prompt + 1)
    assert data.lengths.tolist()[1] == prompt + 1 and data.targets.tolist()[1] == 1
    assert data.lengths.tolist()[0] == len(tokenizer("a b c d e f g h i j").input_ids) < prompt + 1
    assert data.truncated == 1


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ('{"prompt": "hi"}', "expected an object with 'prompt' and 'completion'"),
        ('{"text": "hi", "prompt": "a", "completion": "b"}', "expected an object"),
        ('{"text": 3}', "'text' must be a string"),
        ('{"prompt": "a", "completion": null}', "must be strings"),
        ('["text"]', "expected an object"),
        ('{"text": ""}', "no token left to train on"),
    ],
)
def test_bad_rows_fail_before_weights_load(tmp_path, work, monkeypatch, line, message):
    from transformers import AutoModelForCausalLM

    def boom(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a b c"}\n\n' + line + "\n")
    with pytest.raises(ValueError, match=message) as info:
        train_twins(work / "base", path, loop="1:3x2", out=tmp_path / "out", config=CONFIG)
    assert f"{path}:3" in str(info.value)


def test_bad_inputs_fail_before_weights_load(tmp_path, work, monkeypatch):
    from transformers import AutoModelForCausalLM

    def boom(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)
    data = work / "data.jsonl"
    with pytest.raises(FileNotFoundError, match="missing.jsonl: no such file"):
        train_twins(work / "base", tmp_path / "missing.jsonl", loop="1:3x2", out=tmp_path / "a", config=CONFIG)
    with pytest.raises(ValueError, match="past the last layer"):
        train_twins(work / "base", data, loop="4:9x2", out=tmp_path / "b", config=CONFIG)
    with pytest.raises(ValueError, match="cannot parse"):
        train_model(work / "base", data, loop="four", out=tmp_path / "c", config=CONFIG)
    (tmp_path / "d" / "looped").mkdir(parents=True)
    (tmp_path / "d" / "looped" / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        train_twins(work / "base", data, loop="1:3x2", out=tmp_path / "d", config=CONFIG)
    (work / "pair" / "looped").rename(tmp_path / "looped_copy")  # a looped checkpoint as base
    try:
        with pytest.raises(ValueError, match="is looped"):
            train_model(tmp_path / "looped_copy", data, out=tmp_path / "e", config=CONFIG)
    finally:
        (tmp_path / "looped_copy").rename(work / "pair" / "looped")
    with pytest.raises(ValueError, match="warmup"):
        TrainConfig(steps=10, warmup=11)
    with pytest.raises(FileNotFoundError, match="no training manifest"):
        read_manifest(work / "base")


@pytest.mark.slow
def test_parallel_twins_equal_sequential_ones(tmp_path, work):
    """Two spawned one-thread processes train bit-identically what one process trains at one thread."""
    calls = {"seq": [], "par": []}

    def on_trained(mode):  # each side is reported once it is saved, the twin first
        return lambda result: calls[mode].append((result.manifest["role"], (result.path / MANIFEST_NAME).is_file()))

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sequential = train_twins(work / "base", work / "data.jsonl", loop="1:3x2", out=tmp_path / "seq", config=CONFIG,
                                 progress=False, on_trained=on_trained("seq"))
    finally:
        torch.set_num_threads(saved)
    parallel = train_twins(work / "base", work / "data.jsonl", loop="1:3x2", out=tmp_path / "par", config=CONFIG,
                           progress=False, parallel=True, threads=1, on_trained=on_trained("par"))
    assert calls["seq"] == calls["par"] == [("twin", True), ("looped", True)]
    for one, other in zip(sequential, parallel):
        assert one.manifest["final_weights_sha256"] == other.manifest["final_weights_sha256"]
        assert one.manifest["loss_curve"] == other.manifest["loss_curve"]
    assert twin_mismatches(parallel[0].manifest, parallel[1].manifest) == []


def test_a_failing_on_trained_stops_the_training(tmp_path, work):
    def fail(result):
        raise RuntimeError(f"evaluating the {result.manifest['role']} failed")

    with pytest.raises(RuntimeError, match="evaluating the twin failed"):
        train_twins(work / "base", work / "data.jsonl", loop="1:3x2", out=tmp_path / "seq", config=CONFIG,
                    progress=False, on_trained=fail)
    assert (tmp_path / "seq" / "twin" / MANIFEST_NAME).is_file()
    assert not (tmp_path / "seq" / "looped" / MANIFEST_NAME).exists()  # not trained after the failure


def test_parallel_options_are_checked(tmp_path, work):
    with pytest.raises(ValueError, match="pass no accelerator"):
        train_twins(work / "base", work / "data.jsonl", loop="1:3x2", out=tmp_path / "a", config=CONFIG,
                    parallel=True, accelerator=object())
    with pytest.raises(ValueError, match="threads=2"):
        train_twins(work / "base", work / "data.jsonl", loop="1:3x2", out=tmp_path / "b", config=CONFIG, threads=2)
    for bad in (0, 2.5, True, "two", 100000):
        with pytest.raises(ValueError, match=f"threads={bad!r}: expected a whole number"):
            train_twins(work / "base", work / "data.jsonl", loop="1:3x2", out=tmp_path / "c", config=CONFIG,
                        parallel=True, threads=bad)


def test_parallel_twins_refuse_a_bad_environment_count(tmp_path, work, monkeypatch):
    monkeypatch.setenv("LOOPEVAL_THREADS", "0")
    with pytest.raises(ValueError, match="LOOPEVAL_THREADS='0'"):
        train_twins(work / "base", work / "data.jsonl", loop="1:3x2", out=tmp_path / "c", config=CONFIG, parallel=True)


@pytest.mark.slow
def test_cli_trains_both_twins(tmp_path, work):
    out = tmp_path / "cli"
    cmd = [sys.executable, "-m", "loopeval", "train", "--base", str(work / "base"), "--data", str(work / "data.jsonl"),
           "--loop", "1:3x2", "--out", str(out), "--steps", "2", "--batch-size", "4", "--max-length", "32", "--seed", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert str(out / "twin") in proc.stdout and str(out / "looped") in proc.stdout
    assert "identical apart from the loop" in proc.stdout
    twin, looped = read_manifest(out / "twin"), read_manifest(out / "looped")
    assert twin["config"]["seed"] == 3 and twin["config"]["steps"] == 2 and twin["config"]["lr"] == TrainConfig().lr
    assert looped["loop"]["loop"] == "1:3x2"


def test_cli_only_and_errors(tmp_path, work, capsys):
    assert main(["train", "--base", str(work / "base"), "--data", str(work / "data.jsonl"), "--out", str(tmp_path),
                 "--only", "twin", "--steps", "1", "--batch-size", "2"]) == 0
    assert read_manifest(tmp_path / "twin")["loop"] is None and not (tmp_path / "looped").exists()
    assert main(["train", "--base", str(work / "base"), "--data", str(work / "data.jsonl"), "--out", str(tmp_path),
                 "--only", "looped"]) == 2
    assert "--loop is required" in capsys.readouterr().err
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"txt": "a"}])
    assert main(["train", "--base", str(work / "base"), "--data", str(bad), "--loop", "1:3x2",
                 "--out", str(tmp_path / "x")]) == 2
    assert f"{bad}:1" in capsys.readouterr().err


def test_heldout_loss_and_intermediate_checkpoints(tmp_path, work, tokenizer):
    held = write_jsonl(tmp_path / "held.jsonl", [{"text": " ".join(LETTERS[(7 * i + 3 * k) % 10] for k in range(11))}
                                                 for i in range(3)])
    config = dataclasses.replace(CONFIG, steps=4, warmup=0, save_every=2)
    result = train_model(work / "base", work / "data.jsonl", loop="1:3x2", out=tmp_path / "m", config=config,
                         heldout=held, progress=False)
    curve = result.manifest["heldout_curve"]
    assert [p["step"] for p in curve] == [2, 4] and result.manifest["checkpoints"][0]["path"] == "checkpoint-2"
    from loopeval.common.outputs import WRITTEN_NAME  # recorded before writing: --overwrite removes it, even if cut

    assert (result.path / WRITTEN_NAME).read_text() == '"checkpoint-2"\n'
    data = load_data(held, tokenizer, max_length=64)

    def mean_nll(model):
        total = count = 0
        with torch.no_grad():
            for i in range(len(data)):
                ids = torch.tensor(data.row(i)[0]).unsqueeze(0)
                total += model(ids, labels=ids).loss.item() * (ids.shape[1] - 1)
                count += ids.shape[1] - 1
        return total / count

    for point, path in zip(curve, [result.path / "checkpoint-2", result.path]):
        model, _ = load_model(path)
        assert str(loop_config(model).spec) == "1:3x2"
        assert point["loss"] == pytest.approx(mean_nll(model), rel=1e-5) == point["loss_by_passes"]["2"]
        from loopeval import remove_loop

        assert point["loss_by_passes"]["1"] == pytest.approx(mean_nll(remove_loop(model)), rel=1e-5)
    assert result.manifest["heldout"]["rows"] == 3 and result.manifest["recipe"] == "full"
