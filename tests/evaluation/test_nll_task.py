"""gsm8k_nll against a hand computation with the model's forward; its direction in the
paired tests; the local-data task overrides of ``loopeval local-tasks``."""

import json
import shutil
import sys
from pathlib import Path

import lm_eval
import numpy as np
import pytest
import torch
import yaml
from lm_eval.loggers import EvaluationTracker
from lm_eval.tasks import TaskManager
from support import rows, write_jsonl

from loopeval import save_model
from loopeval.evaluation.local_data import expected_files, task_sources, write_local_tasks
from loopeval.common.paths import tasks_path
from loopeval.analysis.protocol import compare
from loopeval.analysis.runs import load_run, pair_runs
from loopeval.evaluation.scoring import gsm8k_solution, user_prompt
from loopeval.tools.tiny import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tasks" / "gsm8k.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def test_the_scored_solution_drops_calculator_annotations_and_boxes_the_answer():
    # GSM8K test item 0 (train item "Natalia"): the OpenAI release's text, rewritten by hand.
    assert gsm8k_solution(ROWS[0]["answer"]) == (
        "Natalia sold 48/2 = 24 clips in May.\n"
        "Natalia sold 48+24 = 72 clips altogether in April and May.\n"
        "The final answer is \\boxed{72}.")
    assert gsm8k_solution("Total: 1,000 + 200\n#### 1,200").endswith("\\boxed{1200}.")
    with pytest.raises(ValueError, match="no '#### <number>' line"):
        gsm8k_solution("no answer line")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("nll")
    tokenizer = tiny_tokenizer()
    for seed in (0, 1):
        save_model(tiny_model("qwen3", seed=seed, vocab_size=len(tokenizer), num_layers=2), tokenizer, root / f"m{seed}")
    data = root / "data" / "gsm8k" / "main"
    data.mkdir(parents=True)
    shutil.copyfile(FIXTURE, data / "test.jsonl")
    written = write_local_tasks(root / "data", root / "tasks", tasks=["gsm8k_nll", "gsm8k_boxed"])
    return root, written


def run(root: Path, model: str, out: str | None = None) -> dict:
    manager = TaskManager(include_path=[str(root / "tasks")], include_defaults=False)
    results = lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(root / model), "dtype": "float32", "device": "cpu"},
        tasks=["gsm8k_nll"], task_manager=manager, apply_chat_template=True, bootstrap_iters=0, log_samples=True)
    if out is not None:
        tracker = EvaluationTracker(output_path=str(root / out))
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        tracker.save_results_samples(task_name="gsm8k_nll", samples=samples["gsm8k_nll"])
    return results


def hand_nll(folder: Path, doc: dict) -> float:
    """-log p(solution | chat prompt) / bytes, from the model's own forward, token by token.
    lm-eval scores the prompt's trailing whitespace (the newline after the assistant
    header) with the solution, as documented in docs/tasks.md."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    context = tok.apply_chat_template([{"role": "user", "content": user_prompt(doc["question"])}],
                                      tokenize=False, add_generation_prompt=True)
    solution = gsm8k_solution(doc["answer"])
    context, solution_text = context.rstrip(), context[len(context.rstrip()):] + solution
    ctx = tok(context, add_special_tokens=False).input_ids
    whole = tok(context + solution_text, add_special_tokens=False).input_ids
    assert whole[:len(ctx)] == ctx
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([whole])).logits[0].double(), -1)
    total = sum(logprobs[i - 1, whole[i]].item() for i in range(len(ctx), len(whole)))
    return -total / len(solution.encode("utf-8"))


def test_per_item_nll_equals_the_models_own_log_likelihood(setup):
    root, _ = setup
    results = run(root, "m0")
    samples = sorted(results["samples"]["gsm8k_nll"], key=lambda s: s["doc_id"])
    assert len(samples) == len(ROWS)
    for s, row in zip(samples, ROWS):
        assert s["nll_per_byte"] == pytest.approx(hand_nll(root / "m0", row), rel=1e-5)
        assert s["solution_bytes"] == len(gsm8k_solution(row["answer"]).encode())
    assert results["results"]["gsm8k_nll"]["nll_per_byte,none"] == pytest.approx(
        np.mean([s["nll_per_byte"] for s in samples]))
    assert results["higher_is_better"]["gsm8k_nll"]["nll_per_byte"] is False


def test_lower_nll_is_better_in_the_paired_tests(setup):
    root, _ = setup
    run(root, "m0", "out0")
    run(root, "m1", "out1")
    with pytest.raises(ValueError, match="task gsm8k_nll: its data holds 4 of the task's 1319 test items"):
        load_run(root / "out0")  # 4 items of GSM8K's 1,319: a pilot, whatever the data file held
    a, b = load_run(root / "out0", allow_subset=True), load_run(root / "out1", allow_subset=True)
    assert a.tasks["gsm8k_nll"].higher_is_better is False
    raw_a, raw_b = a.tasks["gsm8k_nll"].scores, b.tasks["gsm8k_nll"].scores
    paired = pair_runs({"a": a, "b": b})
    result = compare(paired, "a", "b")
    # candidate - baseline on the oriented score: positive when b's NLL is lower.
    assert result.macro.delta == pytest.approx(raw_a.mean() - raw_b.mean())
    assert np.sign(result.macro.delta) == np.sign(raw_a.mean() - raw_b.mean()) != 0
    assert not paired.binary("gsm8k_nll")
    assert all(np.isfinite(paired.scores["a"]["gsm8k_nll"]).ravel())


def test_local_tasks_read_the_local_files_under_the_same_names(setup):
    root, written = setup
    assert sorted(written.tasks) == ["gsm8k_boxed", "gsm8k_nll"]
    for task in written.tasks:
        text = yaml.safe_load((root / "tasks" / f"{task}.yaml").read_text())
        assert text["include"] == str(tasks_path() / f"{task}.yaml") and text["task"] == task
        assert text["dataset_path"] == "json" and text["dataset_name"] is None
        assert text["dataset_kwargs"]["data_files"] == {"test": [str((root / "data/gsm8k/main/test.jsonl").resolve())]}


HUB_FIXTURES = {"openai/gsm8k": "gsm8k.jsonl", "HuggingFaceH4/MATH-500": "math500.jsonl",
                "Maxwell-Jia/AIME_2024": "aime24.jsonl", "math-ai/aime25": "aime25.jsonl",
                "Idavidrein/gpqa": "gpqa_diamond.jsonl", "allenai/ai2_arc": "arc_challenge.jsonl",
                "tau/commonsense_qa": "commonsenseqa.jsonl"}


def test_every_task_has_a_local_layout_and_groups_follow_their_tasks(tmp_path):
    sources = task_sources()
    assert "gsm8k_nll" in sources and expected_files("gsm8k_nll") == "gsm8k/main/test.<jsonl|json|parquet|csv>"
    mmlu_pro = [{"question_id": i, "question": f"q{i}", "options": ["a", "b"], "answer_index": 0} for i in range(2000)]
    for task, source in sources.items():
        pattern = tmp_path / "data" / expected_files(task).replace("<jsonl|json|parquet|csv>", "jsonl")
        pattern.parent.mkdir(parents=True, exist_ok=True)
        records = mmlu_pro if source["dataset_path"] == "TIGER-Lab/MMLU-Pro" else rows(HUB_FIXTURES[source["dataset_path"]])
        write_jsonl(pattern, records)  # records the task's own process_docs reads (local-tasks checks them)
    written = write_local_tasks(tmp_path / "data", tmp_path / "tasks")
    assert set(written.tasks) == set(sources) and not written.skipped
    groups = [f.stem for f in tasks_path().glob("loop_*.yaml")]
    assert sorted(written.groups) == sorted(g for g in groups if g)
    manager = TaskManager(include_path=[str(tmp_path / "tasks")], include_defaults=False)
    assert set(sources) <= set(manager.all_subtasks)


def test_local_tasks_refusals(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        write_local_tasks(tmp_path / "absent", tmp_path / "out")
    (tmp_path / "data").mkdir()
    with pytest.raises(ValueError, match="holds no task's files; e.g. GSM8K is DATA/gsm8k/main/test"):
        write_local_tasks(tmp_path / "data", tmp_path / "out")
    with pytest.raises(ValueError, match="task 'nope': not a loopeval task"):
        write_local_tasks(tmp_path / "data", tmp_path / "out", tasks=["nope"])
    with pytest.raises(ValueError, match=r"task gsm8k_nll: no .*gsm8k/main/test"):
        write_local_tasks(tmp_path / "data", tmp_path / "out", tasks=["gsm8k_nll"])
    folder = tmp_path / "data" / "gsm8k" / "main"
    folder.mkdir(parents=True)
    (folder / "test.jsonl").write_text("{}\n")
    (folder / "test-00000-of-00001.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match="is there as jsonl and parquet; keep one format"):
        write_local_tasks(tmp_path / "data", tmp_path / "out", tasks=["gsm8k_nll"])
    assert not (tmp_path / "out").exists()


def test_the_cli_writes_the_overrides_and_names_what_it_skipped(tmp_path, capsys):
    from loopeval.cli import main

    folder = tmp_path / "data" / "gsm8k" / "main"
    folder.mkdir(parents=True)
    shutil.copyfile(FIXTURE, folder / "test.jsonl")
    assert main(["local-tasks", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "tasks")]) == 0
    out = capsys.readouterr().out
    assert f"gsm8k_nll: {(folder / 'test.jsonl').resolve()}" in out
    assert "skipped math500_boxed: no " in out and "MATH-500/test.<jsonl|json|parquet|csv>" in out
    assert sorted(p.name for p in (tmp_path / "tasks").glob("*.yaml")) == [
        "gsm8k_boxed.yaml", "gsm8k_boxed_think.yaml", "gsm8k_nll.yaml"]


TRACED = {"budget_forcing": True, "budget_scale": 0.1, "bf_reserve": 64}  # 77 of gsm8k_boxed's 768 tokens


@pytest.fixture(scope="module")
def traced(setup):
    """An unlooped and a looped run of m0 with traces, on gsm8k_nll and gsm8k_boxed (4 items of a local file)."""
    root, _ = setup
    for name, loop in (("plain", {}), ("looped", {"loop": "0:2x2"})):
        out = root / f"traced_{name}"
        manager = TaskManager(include_path=[str(root / "tasks")], include_defaults=False)
        tracker = EvaluationTracker(output_path=str(out))  # before the run, as lm_eval's CLI: it times the run
        results = lm_eval.simple_evaluate(
            model="looped", model_args={"pretrained": str(root / "m0"), "dtype": "float32", "device": "cpu",
                                        "trace": str(out), **TRACED, **loop},
            tasks=["gsm8k_nll", "gsm8k_boxed"], task_manager=manager, apply_chat_template=True, bootstrap_iters=0,
            log_samples=True)
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        for task in ("gsm8k_nll", "gsm8k_boxed"):
            tracker.save_results_samples(task_name=task, samples=samples[task])
    return root / "traced_plain", root / "traced_looped"


def test_a_scoring_only_looped_run_records_what_it_ran(traced):
    """A loglikelihood task generates nothing, yet its trace header (weights, loop, cost,
    settings, the cache check) is written, so a looped and an unlooped run pair by content
    with no difference reported besides the loop."""
    from loopeval.analysis.runs import decoding_differences

    plain, looped = (load_run(path, tasks=["gsm8k_nll"], allow_subset=True) for path in traced)
    assert plain.header is not None and looped.header is not None
    assert plain.header.loop is None and looped.header.loop["loop"] == "0:2x2"
    assert looped.header.cache_check["ok"] and plain.header.cache_check is None
    assert decoding_differences(plain, looped) == []


def trace_records(folder: Path) -> list[dict]:
    """The generation records of a run's trace, read as plain JSON."""
    (path,) = folder.glob("loopeval_trace_*.jsonl")
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "item"]


def test_compare_shows_each_metric_in_its_unit_with_its_own_margin_and_pilot(traced, capsys):
    from loopeval.analysis.compared import compare_runs

    plain, looped = traced
    with pytest.raises(ValueError, match="its data holds 4 of the task's 1319 test items"):
        compare_runs(plain, looped)
    result = compare_runs(plain, looped, allow_subset=True, n_resamples=500)
    raw = {side: load_run(path, allow_subset=True).tasks["gsm8k_nll"].scores for side, path in zip("ab", traced)}
    out, text = result.as_dict(), str(result)
    # 4 items in each task, none of them GSM8K test items (tests/fixtures/tasks/gsm8k.jsonl: 2 train, 2 made up)
    assert out["pilot"].startswith("pilot: 4 of 1319 items in each of 2 tasks (gsm8k_boxed, gsm8k_nll), 16 of the runs' items not in their task's test set")
    nll, boxed = out["tasks"]["gsm8k_nll"], out["tasks"]["gsm8k_boxed"]
    # the NLL as lm-eval reports it (nats per byte, lower is better), never negated or x100
    assert (nll["unit"], nll["higher_is_better"]) == ("nats per byte", False)
    assert (nll["baseline"], nll["candidate"]) == pytest.approx((raw["a"].mean(), raw["b"].mean()))
    assert nll["delta"] == pytest.approx(raw["b"].mean() - raw["a"].mean())
    assert nll["ci"][0] <= nll["delta"] <= nll["ci"][1]
    # no margin given in nats per byte: no equivalence verdict, in the text as in the JSON
    assert (nll["margin"], nll["equivalent"], nll["equivalence_method"]) == (None, None, "no margin")
    assert (boxed["unit"], boxed["margin"]) == ("fraction", 0.02)
    assert set(out["macros"]) == {"points", "nats per byte, lower is better"} and out["macro"] is None
    line = next(row for row in text.splitlines() if row.startswith("gsm8k_nll"))
    assert f"{raw['a'].mean():.4f}" in line and "no margin" in line and nll["outcome"] in line
    assert "-52" not in line and "nats per byte" in line
    given = compare_runs(plain, looped, allow_subset=True, n_resamples=500, margins={"nll_per_byte": 5.0}).as_dict()
    row = given["tasks"]["gsm8k_nll"]
    # a margin in nats per byte is the metric's own; at 4 items no interval is valid for a continuous score
    assert (row["margin"], row["equivalent"], row["equivalence_method"]) == (5.0, False, "none")
    with pytest.raises(ValueError, match=r"no metric here is an accuracy; give the metric's own in its unit "
                                         r"\(--margin nll_per_byte=0.01, in nats per byte\)"):
        compare_runs(plain, looped, allow_subset=True, tasks=["gsm8k_nll"], margin=0.01)
    # the sibling commands read a bare value alike: power's --delta is refused as compare's --margin is
    from loopeval.cli import main

    for command, flag in (("compare", "--margin"), ("power", "--delta")):
        args = [command, str(plain), str(looped), "--tasks", "gsm8k_nll", flag, "0.01"]
        assert main(args + (["--allow-subset"] if command == "compare" else [])) == 2
        assert (f"{flag} 0.01: a bare value is the accuracies' (a fraction, A.5's ±2 points is 0.02), and no metric "
                f"here is an accuracy; give the metric's own in its unit ({flag} nll_per_byte=0.01, in nats per "
                "byte)") in capsys.readouterr().err
    with pytest.raises(ValueError, match="no metric 'nll' in these runs"):
        compare_runs(plain, looped, allow_subset=True, margins={"nll": 0.01})


def test_budget_forcing_cost_is_split_at_the_forced_answer(traced):
    """Per run, the share of generated tokens after the forced answer and the realised cost
    before and after it, against a reading of the traces themselves."""
    from loopeval.analysis.compared import compare_runs

    result = compare_runs(*traced, allow_subset=True, n_resamples=200)
    records = {role: trace_records(path) for role, path in zip(("baseline", "candidate"), traced)}

    def passes(recs, after: bool) -> float:
        return sum((r["generated_tokens"] - r["forced_at"] if after else min(r["forced_at"], r["generated_tokens"]))
                   * r["passes_per_token"] if r["forced_at"] is not None else (0 if after else
                   r["generated_tokens"] * r["passes_per_token"]) for r in recs)

    base = passes(records["baseline"], False) + passes(records["baseline"], True)
    for role, recs in records.items():
        f = result.forcing[role]
        forced = [r for r in recs if r["forced_at"] is not None]
        assert (f["forced"], f["requests"]) == (len(forced), len(recs)) and forced
        assert f["tokens_after_share"] == pytest.approx(
            sum(r["generated_tokens"] - r["forced_at"] for r in forced) / sum(r["generated_tokens"] for r in recs))
        assert (f["before"], f["after"]) == pytest.approx((passes(recs, False) / base, passes(recs, True) / base))
    assert result.forcing["candidate"]["before"] + result.forcing["candidate"]["after"] == pytest.approx(
        result.costs["candidate"] / result.costs["baseline"])
    assert "budget forcing, candidate: fired on" in str(result)


def test_the_report_takes_nll_runs_alone_and_beside_accuracy(traced, tmp_path):
    """gsm8k_nll has no generation trace: the report charges the loop its c, decides the NLL on
    a macro of its own kind, in nats per byte, and the 0/1 task on its own."""
    from loopeval.analysis.report import build_report, render, write_report
    from loopeval.analysis.report.latex import tables

    plain, looped = traced
    c = load_run(looped, allow_subset=True).header.multiplier
    data = build_report([plain], [looped], allow_subset=True, n_resamples=300, default_scale=0.1)
    assert data.pilot.startswith("pilot: 4 of 1319 items in each of 2 tasks (gsm8k_boxed, gsm8k_nll), 16 of the runs' items not in their task's test set")
    assert {k: v for k, v in data.kinds.items()} == {"points": ["gsm8k_boxed"],
                                                     "nats per byte, lower is better": ["gsm8k_nll"]}
    nll = next(cond for cond in data.conditions if cond.tasks == ("gsm8k_nll",))
    assert nll.param.macro.unit.name == "nats per byte" and nll.param.macro.margin is None
    assert "nats per byte" in nll.verdict.sentences[0] and "no equivalence margin was given" in nll.verdict.sentences[0]
    boxed = next(cond for cond in data.conditions if cond.tasks == ("gsm8k_boxed",))
    assert boxed.forcing_split[0.1]["looped"]["forced"] > 0 and nll.forcing_split[0.1] is None  # nothing generated
    own = {r.result.loop: r.loop_cost for r in nll.flop_rows}
    assert own["looped + budget forcing @ 0.1×"] == pytest.approx(c)  # c x the twin: nothing generated
    html = render(data)
    assert "nats per byte" in html and f"{nll.param.macro.reported(nll.param.macro.baseline_accuracy):.4f}" in html
    assert "nats per byte" in tables(data)
    only = [load_run(path, tasks=["gsm8k_nll"], allow_subset=True) for path in traced]
    alone = build_report(only[:1], only[1:], allow_subset=True, n_resamples=300, margins={"nll_per_byte": 5.0},
                         default_scale=0.1)
    assert [cond.tasks for cond in alone.conditions] == [("gsm8k_nll",)] and alone.kinds == {
        "nats per byte, lower is better": ["gsm8k_nll"]}
    assert alone.conditions[0].param.macro.margin == 5.0 and alone.runs[1]["cost"] == pytest.approx(c)
    write_report(alone, tmp_path / "report.html", latex_tables=True)
    assert (tmp_path / "report_tables.tex").exists()


def test_a_study_on_a_local_subset_must_say_it_is_a_pilot(setup, tmp_path, monkeypatch):
    """The study's dry run reads each task's items, so a subset of GSM8K without ``pilot: true``
    is refused before any evaluation runs (the report would refuse it after all of them)."""
    from loopeval.tools.study import load_study
    from loopeval.tools.study.plan import check_before_compute, expand

    root, _ = setup
    study = {"name": "nll", "output": str(tmp_path / "out"), "tasks": ["gsm8k_nll"],
             "include_path": [str(root / "tasks")], "budgets": [1], "decoding": [{"name": "plain"}],
             "models": [{"name": "twin", "role": "twin", "path": str(root / "m0")},
                        {"name": "looped", "role": "looped", "base": str(root / "m0"), "loop": "0:2x2"}]}
    for pilot in (False, True):
        (tmp_path / "study.yaml").write_text(yaml.safe_dump({**study, "pilot": pilot}))
        loaded = load_study(tmp_path / "study.yaml")
        if pilot:
            check_before_compute(loaded, expand(loaded))
            # a bare margin where every task is scored by a continuous metric: refused now, not by the report
            (tmp_path / "study.yaml").write_text(yaml.safe_dump({**study, "pilot": True,
                                                                 "statistics": {"margin": 0.03}}))
            loaded = load_study(tmp_path / "study.yaml")
            with pytest.raises(ValueError, match=r"statistics.margin: 0.03 is the accuracies' margin, and no task of "
                                                 r"this study is scored by an accuracy \(gsm8k_nll nll_per_byte\); give "
                                                 r"the metric's own in its unit \(statistics.margins: "
                                                 r"\{nll_per_byte: 0.03\}, in nats per byte\)"):
                check_before_compute(loaded, expand(loaded))
            continue
        with pytest.raises(ValueError, match=r"tasks: gsm8k_nll: its data holds 4 of the task's 1319 test items "
                                             r"\(a local file with a subset\?\); .* set pilot: true"):
            check_before_compute(loaded, expand(loaded))
    # as many items as the (patched) test set, but none of them GSM8K test questions: not the benchmark
    from loopeval.evaluation import metrics

    monkeypatch.setitem(metrics.TEST_SET_SIZES, "gsm8k_nll", 4)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({**study, "pilot": False}))
    loaded = load_study(tmp_path / "study.yaml")
    with pytest.raises(ValueError, match=r"tasks: gsm8k_nll: of its 4 items, 4 item\(s\) not in the test set \(their "
                                         r"'question' is none of its items', e.g. item 0\); 1319 test item\(s\) missing: "
                                         r"not the benchmark .* set pilot: true"):
        check_before_compute(loaded, expand(loaded))


def test_lm_eval_command_line_checks_local_task_data_before_the_model_loads(tmp_path, monkeypatch):
    """``lm_eval --model looped --tasks gsm8k_nll --include_path DIR``: lm-eval builds the
    model before it reads task data; the looped model checks the named local tasks' data
    first (the model path here does not even exist, so a load would fail otherwise)."""
    from loopeval.model_adapters.looped import LoopedLM

    folder = tmp_path / "data" / "gsm8k" / "main"
    folder.mkdir(parents=True)
    shutil.copyfile(FIXTURE, folder / "test.jsonl")
    write_local_tasks(tmp_path / "data", tmp_path / "tasks", tasks=["gsm8k_nll"])
    for text, message in (("", r"test.jsonl: holds no records \(an empty file\)"),
                          ('{"question": "q"}\n', r"test.jsonl:1: no field 'answer'"),
                          ('{"question": "q", "answer": "#### 1"}\nnot json\n', r"test.jsonl:2: ")):
        (folder / "test.jsonl").write_text(text)
        for argv in (["lm_eval", "--model", "looped", "--tasks", "gsm8k_nll", "--include_path", str(tmp_path / "tasks")],
                     ["lm_eval", "run", f"--include_path={tmp_path / 'tasks'}", "-t", "arc_easy,gsm8k_nll"]):
            monkeypatch.setattr(sys, "argv", argv)
            with pytest.raises(ValueError, match=message):
                LoopedLM(pretrained=str(tmp_path / "no_such_model"))
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--tasks", "arc_easy", "--include_path", str(tmp_path / "tasks")])
    with pytest.raises(Exception) as other:  # a task not named is not read: the model load is what fails
        LoopedLM(pretrained=str(tmp_path / "no_such_model"))
    assert "test.jsonl" not in str(other.value)
