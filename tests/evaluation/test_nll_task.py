"""gsm8k_nll against a hand computation with the model's forward; its direction in the
paired tests; the local-data task overrides of ``loopeval local-tasks``."""

import json
import shutil
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
    a, b = load_run(root / "out0"), load_run(root / "out1")
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


def test_a_scoring_only_looped_run_records_what_it_ran(setup):
    """A loglikelihood task generates nothing, yet its trace header (weights, loop, cost,
    settings, the cache check) is written, so a looped and an unlooped run pair by content
    with no difference reported besides the loop."""
    from loopeval.analysis.runs import decoding_differences

    root, _ = setup
    for name, loop in (("plain", {}), ("looped", {"loop": "0:2x2"})):
        out = root / f"traced_{name}"
        manager = TaskManager(include_path=[str(root / "tasks")], include_defaults=False)
        tracker = EvaluationTracker(output_path=str(out))  # before the run, as lm_eval's CLI: it times the run
        results = lm_eval.simple_evaluate(
            model="looped", model_args={"pretrained": str(root / "m0"), "dtype": "float32", "device": "cpu",
                                        "trace": str(out), **loop},
            tasks=["gsm8k_nll"], task_manager=manager, apply_chat_template=True, bootstrap_iters=0, log_samples=True)
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        tracker.save_results_samples(task_name="gsm8k_nll", samples=samples["gsm8k_nll"])
    plain, looped = load_run(root / "traced_plain"), load_run(root / "traced_looped")
    assert plain.header is not None and looped.header is not None
    assert plain.header.loop is None and looped.header.loop["loop"] == "0:2x2"
    assert looped.header.cache_check["ok"] and plain.header.cache_check is None
    assert decoding_differences(plain, looped) == []
