"""Issue 23's listed cases as regression tests, where no other test file holds them
(cases 1-7 and 9-11: test_study, test_identity, test_adapter_plans, test_outputs, test_faults)."""

import json
import math

import numpy as np
import pytest
import yaml

from loopeval.tools.study import load_study


def test_power_on_a_zero_variance_pilot_is_refused_not_an_mde_of_0():  # case 8
    from loopeval.analysis.stats import power

    with pytest.raises(ValueError, match="cannot estimate the variance"):
        power(np.ones(20), np.ones(20))
    with pytest.raises(ValueError, match="cannot estimate the variance"):
        power(np.zeros(20), np.ones(20))  # every item +1: zero variance as well
    assert power(np.r_[np.ones(10), np.zeros(10)], np.ones(20)).mde > 0


def test_decontamination_warns_per_task_about_documents_shorter_than_n(tmp_path, monkeypatch):  # case 10
    from loopeval.training import decontamination as d

    docs = [d.EvalDocument("short_task", 0, ("What is two plus two?",)),
            d.EvalDocument("long_task", 0, (" ".join(f"w{i}" for i in range(20)),))]
    monkeypatch.setattr(d, "eval_documents", lambda against, include_path=None: docs)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"text": "Q: What is two plus two? A: 4"}) + "\n")
    with pytest.warns(UserWarning, match=r"task short_task: 1 of 1 test documents have no text of 13 words") as seen:
        d.decontaminate(data, out=tmp_path / "out.jsonl", against=["short_task", "long_task"])
    assert not any("long_task" in str(w.message) for w in seen)
    # the verbatim question is found at a small enough n
    d.decontaminate(data, out=tmp_path / "out4.jsonl", against=["short_task"], n=4)
    assert (tmp_path / "out4.jsonl").read_text() == ""


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_convert_with_a_non_finite_lora_alpha_is_refused(value):  # case 10
    from loopeval.training.config import TrainConfig

    with pytest.raises(ValueError, match="lora_alpha must be a finite number"):
        TrainConfig(recipe="convert", lora_alpha=value)


def _study(tmp_path, text: str):
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


BASE = {"name": "s", "output": "out", "tasks": ["t"],
        "models": [{"name": "twin", "role": "twin", "path": "a"}, {"name": "looped", "role": "looped", "path": "b"}]}


@pytest.mark.parametrize(("change", "message"), [
    ({"report": {"strict": "no"}}, None),
    ({"report": {"latex": "false"}}, None),
    ({"report": {"strict": "maybe"}}, r"report.strict: strict='maybe': expected a boolean"),
    ({"statistics": {"cost": "flop"}}, r"statistics.cost: cost='flop': choose one of passes, flops"),
    ({"statistics": {"n_resamples": "1e4"}}, r"statistics.n_resamples: .*expected a whole number"),
    ({"lm_eval": {"apply_chat_template": "no"}}, None),
    ({"lm_eval": {"model_args": {"loop": "1:3x2"}}}, r"lm_eval.model_args.loop: a shared loop setting would loop the twin"),
    ({"models": [{"name": "a/b", "role": "twin", "path": "a"}]}, r"models\[0\].name: 'a/b' cannot name a folder"),
    ({"models": [{"name": "..", "role": "twin", "path": "a"}]}, r"models\[0\].name: '..' cannot name a folder"),
    ({"models": [{"name": "x__y", "role": "twin", "path": "a"}]}, r"models\[0\].name: 'x__y' cannot name a folder"),
    ({"decoding": [{"name": "bf__1"}]}, r"decoding\[0\].name: 'bf__1' cannot name a folder"),
    # the fresh sweep (docs/reliability.md)
    ({"statistics": {"alpha": 1.5}}, r"statistics.alpha: alpha=1.5: expected a fraction in \(0, 1\)"),
    ({"statistics": {"margin": 2}}, r"statistics.margin: margin=2: expected a fraction in \(0, 1\) \(fractions, not points"),
    ({"statistics": {"margins": {"nll_per_byte": 0.005}}}, None),
    ({"statistics": {"margins": {"nll_per_byte": -1}}}, r"statistics.margins: margins.nll_per_byte=-1: expected a positive margin"),
    ({"statistics": {"margins": 0.005}}, r"statistics.margins: margins=0.005: expected a mapping of metric name to margin"),
    ({"lm_eval": {"batch_size": 0}}, r"lm_eval.batch_size: batch_size=0: must be >= 1"),
    ({"lm_eval": {"num_fewshot": "five"}}, r"lm_eval.num_fewshot: num_fewshot='five': expected a whole number"),
    ({"output": "study.yaml"}, r"output: .*study.yaml is a file"),
])
def test_study_values_go_through_the_strict_parsers(tmp_path, change, message):  # cases 10, 12
    path = _study(tmp_path, yaml.safe_dump({**BASE, **change}))
    if message is None:
        study = load_study(path)
        assert study.report.get("strict", False) is False and study.report.get("latex", False) is False
        assert study.lm_eval.get("apply_chat_template", False) is False
    else:
        with pytest.raises(ValueError, match=message):
            load_study(path)


def test_a_duplicated_study_key_is_refused_with_its_line(tmp_path):  # case 10
    path = _study(tmp_path, yaml.safe_dump(BASE) + "report:\n  strict: true\nreport:\n  strict: false\n")
    with pytest.raises(ValueError, match=r"study.yaml:\d+: not valid YAML \(duplicate key 'report' \(first on line \d+\)\)"):
        load_study(path)


def test_a_study_file_that_is_not_utf8(tmp_path):  # case 12
    path = tmp_path / "study.yaml"
    path.write_bytes(b"name: \xff\n")
    with pytest.raises(ValueError, match="study.yaml: not UTF-8 text"):
        load_study(path)


def test_a_loop_config_that_does_not_fit_is_refused_before_weights_load(tmp_path, monkeypatch):  # case 12
    import transformers

    from loopeval import save_model
    from loopeval.model_adapters.looped import LoopedLM
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    save_model(tiny_model("qwen3", vocab_size=len(tok), num_layers=4), tok, tmp_path / "m")
    (tmp_path / "m" / "loop_config.json").write_text(json.dumps({"loop": "2:9x2"}))

    def no_weights(*a, **k):
        raise AssertionError("weights loaded before the loop was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    with pytest.raises(ValueError, match=r"m/loop_config.json: loop spec '2:9x2': window 2:9x2 reaches past the last layer"):
        LoopedLM(pretrained=str(tmp_path / "m"), device="cpu")


def test_sweep_results_versions_a_list_and_a_store_that_is_a_folder(tmp_path):
    import shutil
    from pathlib import Path

    from loopeval.evaluation.responses import ResponseStore
    from loopeval.analysis.runs import load_run

    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "runs" / "twin", tmp_path / "twin")
    (results,) = (tmp_path / "twin").rglob("results_*.json")
    data = json.loads(results.read_text())
    data["versions"] = [1, 2]
    results.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"results_.*json: field 'versions' is a list"):
        load_run(results)
    (tmp_path / "store" / "loopeval_responses.jsonl").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"loopeval_responses.jsonl is not a file"):
        ResponseStore(tmp_path / "store")


def test_sigterm_reaches_the_worker_pool_as_an_interrupt():  # case 12: no orphan workers
    import os
    import signal

    from loopeval.tools.study.execute import _stop_on_sigterm

    previous = _stop_on_sigterm()
    try:
        with pytest.raises(KeyboardInterrupt, match="signal 15"):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_budget_past_max_length_is_refused_before_compute_naming_budget_scale(tmp_path):  # case 12
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from support import write_generate_task

    from loopeval import save_model
    from loopeval.tools.study.plan import check_before_compute, expand
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    save_model(tiny_model("qwen3", vocab_size=len(tok), num_layers=2), tok, tmp_path / "m")
    write_generate_task(tmp_path / "tasks", "tiny_long", [{"question": "1+1?", "answer": "2"}], max_gen_toks=40)
    study = {**BASE, "tasks": ["tiny_long"], "include_path": [str(tmp_path / "tasks")], "budgets": [1, 2],
             "lm_eval": {"model_args": {"max_length": 64}},
             "models": [{"name": "twin", "role": "twin", "path": str(tmp_path / "m")},
                        {"name": "looped", "role": "looped", "base": str(tmp_path / "m"), "loop": "0:2x2"}]}
    path = _study(tmp_path, yaml.safe_dump(study))
    loaded = load_study(path)
    with pytest.raises(ValueError, match=r"model twin at budget 2x \(budget_scale\) on task tiny_long: max_gen_toks 80 "
                                         r"leaves no room for a prompt within max_length 64"):
        check_before_compute(loaded, expand(loaded))
