"""loopeval.analysis.score_audit and ``loopeval score-audit`` on a run that lm-eval itself writes.

A scripted model answers loopeval's tasks (local copies of the hub datasets, as in
tests/test_tasks.py) so that each disputable rule decides some verdicts; the run is saved
as ``lm_eval --output_path X --log_samples`` saves it.
"""

import json
import re
import shutil
from pathlib import Path

import pytest
from lm_eval.loggers import EvaluationTracker
from support import FIXTURES, ScriptedLM, evaluate, local_tasks, rows, write_jsonl, read_records

from loopeval.evaluation import scoring
from loopeval.cli import main
from loopeval.analysis.score_audit import score_audit

INTERVAL = {"problem": "Solve $2 \\le x < 5$ and give the solution set.\nExpress your answer in interval notation.",
            "solution": "$\\boxed{[2,5)}$", "answer": "[2,5)", "subject": "Algebra", "level": 1,
            "unique_id": "test/algebra/0.json"}
SCRIPT = {
    # gsm8k_boxed: acc 3/4; number fallback twice (one right), several boxes once (right).
    "Natalia sold clips": [r"48 + 24 = \boxed{72}"],
    "Weng earns $12": ["She earned $10 (I checked it 3 times)."],
    "A bakery sells 400": [r"\boxed{1100}? No: \boxed{1{,}200} loaves."],
    "James writes a 3-page": ["So he writes 624 pages."],
    # math500_boxed: acc 1/3; a math-verify failure and an inequality against an interval.
    "Convert the point": [r"$\boxed{(3, \frac{\pi}{2})}$"],
    "Simplify $\\sqrt{242}$": [r"$\boxed{11\sqrt2 +}$"],
    "Solve $2 \\le x": [r"$\boxed{2 \le x < 5}$"],
    # aime24_boxed: 8 samples each; one sample of the first problem changes its mind.
    "Every morning Aya": [r"\boxed{204}"] * 7 + [r"\boxed{200}, no, \boxed{204}"],
    "There exist real numbers": [r"\boxed{25}"] * 8,
}
HEDGED_GPQA = "recGPQA0001"


def respond(prompt: str) -> str:
    if "\nA. " in prompt:  # GPQA: box the right letter, or hedge between it and the next one
        (row,) = [r for r in rows("gpqa_diamond.jsonl") if r["Question"].strip() in prompt]
        listed = dict(re.findall(r"^([A-D])\. (.*)$", prompt, re.MULTILINE))
        (letter,) = [k for k, text in listed.items() if text == row["Correct Answer"].strip()]
        if row["Record ID"] == HEDGED_GPQA:
            return rf"\boxed{{{letter} \text{{ or }} {'ABCD'[('ABCD'.index(letter) + 1) % 4]}}}"
        return rf"\boxed{{\text{{({letter})}}}}"
    (key,) = [k for k in SCRIPT if k in prompt]
    return SCRIPT[key].pop(0) if len(SCRIPT[key]) > 1 else SCRIPT[key][0]


@pytest.fixture(scope="module")
def run(tokenizer, tmp_path_factory):
    """An lm-eval output folder; the hedged GPQA item is recorded as right, as the scorer before issue 10 had it."""
    tmp = tmp_path_factory.mktemp("audit")
    math500 = write_jsonl(tmp / "math500.jsonl", rows("math500.jsonl") + [INTERVAL])
    files = {"gsm8k_boxed": FIXTURES / "gsm8k.jsonl", "math500_boxed": math500,
             "aime24_boxed": FIXTURES / "aime24.jsonl", "gpqa_diamond_boxed": FIXTURES / "gpqa_diamond.jsonl",
             "arc_challenge_letter": FIXTURES / "arc_challenge.jsonl"}
    include = local_tasks(tmp / "tasks", files)
    lm = ScriptedLM(tokenizer, respond=respond, pick=lambda prompt: "A")
    tracker = EvaluationTracker(output_path=str(tmp / "out"))
    results = evaluate(lm, list(files), include, evaluation_tracker=tracker)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task in results["configs"]:
        tracker.save_results_samples(task_name=task, samples=samples[task])
    (gpqa,) = (tmp / "out").rglob("samples_gpqa_diamond_boxed_*.jsonl")
    records = read_records(gpqa)
    for rec in records:
        if rec["doc"]["Record ID"] == HEDGED_GPQA:
            assert rec["acc"] == 0.0
            rec["acc"] = 1.0
    gpqa.write_text("".join(json.dumps(rec) + "\n" for rec in records))
    return tmp / "out"


def test_counts_per_task(run):
    audit = score_audit(run)
    assert set(audit.tasks) == {"gsm8k_boxed", "math500_boxed", "aime24_boxed", "gpqa_diamond_boxed"}
    assert audit.skipped == {"arc_challenge_letter": "not generative (multiple_choice): no answer is extracted"}
    zero = dict.fromkeys(scoring.FLAGS, 0)

    gsm8k = audit.tasks["gsm8k_boxed"]
    assert (gsm8k.n_items, gsm8k.n_responses, gsm8k.accuracy, gsm8k.recorded_accuracy) == (4, 4, 0.75, 0.75)
    assert gsm8k.counts == zero | {"number_fallback": 2, "several_boxes": 1}
    assert (gsm8k.flagged, gsm8k.flagged_correct, gsm8k.changed_items) == (3, 2, 0)
    assert [(i.doc_id, i.answer, i.correct, i.flags) for i in gsm8k.items] == [
        (1, "3", False, ("number_fallback",)),
        (2, "1{,}200", True, ("several_boxes",)),
        (3, "624", True, ("number_fallback",)),
    ]

    math500 = audit.tasks["math500_boxed"]
    assert math500.accuracy == pytest.approx(1 / 3)
    assert math500.counts == zero | {"math_verify_failed": 1, "relation_vs_interval": 1}
    assert [(i.doc_id, i.gold, i.flags) for i in math500.items] == [
        (1, r"11\sqrt2", ("math_verify_failed",)), (2, "[2,5)", ("relation_vs_interval",))]

    aime = audit.tasks["aime24_boxed"]
    assert (aime.n_items, aime.n_responses, aime.accuracy) == (2, 16, 1.0)
    assert [(i.doc_id, i.response, i.flags) for i in aime.items] == [(0, 7, ("several_boxes",))]

    gpqa = audit.tasks["gpqa_diamond_boxed"]
    assert gpqa.counts == zero | {"hedged_letter": 1}
    assert (gpqa.accuracy, gpqa.recorded_accuracy, gpqa.changed_items) == (7 / 8, 1.0, 1)
    (hedge,) = gpqa.items
    assert (hedge.correct, hedge.gold) == (False, hedge.answer[0])


def test_tasks_option_selects(run):
    audit = score_audit(run, tasks=["gpqa_diamond_boxed"])
    assert list(audit.tasks) == ["gpqa_diamond_boxed"] and audit.skipped == {}


def test_cli_prints_the_table_and_json(run, capsys):
    assert main(["score-audit", str(run)]) == 2  # a handful of each benchmark's items: a pilot
    assert "test items (a local file with a subset?)" in capsys.readouterr().err
    assert main(["score-audit", str(run), "--allow-subset"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("gsm8k_boxed "))
    assert row.split()[:8] == ["gsm8k_boxed", "4", "4", "75.0", "75.0", "0", "3", "2"]
    assert "skipped arc_challenge_letter: not generative" in text
    assert re.search(r"doc 0 #7\s+right\s+several_boxes", text)

    assert main(["score-audit", str(run), "--json", "--tasks", "math500_boxed", "--allow-subset"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tasks"]["math500_boxed"]["counts"]["relation_vs_interval"] == 1
    assert set(data["flags"]) == set(scoring.FLAGS)


def test_tasks_not_scored_by_loopeval_are_skipped():
    # The fixture runs use lm-eval's exact_match on toy tasks, and a letter log-likelihood task.
    audit = score_audit(Path(__file__).parents[1] / "fixtures" / "runs" / "twin")
    assert audit.tasks == {}
    assert audit.skipped["toy_arith"] == "its process_results is not loopeval's boxed-answer scoring"
    assert audit.skipped["toy_mc"].startswith("not generative")


def test_bad_input(run, tmp_path, capsys):
    assert main(["score-audit", str(tmp_path / "nothing")]) == 2
    assert "no such run" in capsys.readouterr().err
    broken = shutil.copytree(run, tmp_path / "broken")
    (samples,) = broken.rglob("samples_gsm8k_boxed_*.jsonl")
    samples.write_text(samples.read_text().replace('"gold"', '"answer_key"'))
    with pytest.raises(ValueError, match=r"samples_gsm8k_boxed_.*jsonl:1: corrupt lm-eval samples line \(KeyError"):
        score_audit(broken)


def add_trace(out: Path, finished: dict[int, bool], task: str = "gsm8k_boxed") -> None:
    """A looped-model trace for ``task``'s items, written while the run was evaluating, saying
    which responses finished (ended by end-of-sequence or a stop) and which were cut."""
    from dataclasses import asdict

    from loopeval.evaluation.trace import DecodingSettings, TraceHeader, TraceItem

    (results,) = out.rglob("results_*.json")
    date = json.loads(results.read_text())["date"]
    (samples,) = out.rglob(f"samples_{task}_*.jsonl")
    header = TraceHeader(model="scripted", loop=None, cost={}, decoding=DecodingSettings())
    lines = [{"kind": "header", "format": 2, "created": float(date), **header.to_dict()}]
    for rec in map(json.loads, samples.read_text().splitlines()):
        item = TraceItem(task, rec["doc_id"], 0, rec["prompt_hash"], 10, 32, 32, finished[rec["doc_id"]], None, None,
                         30, 1.0)
        lines.append({"kind": "item", **asdict(item)})
    (out / "loopeval_trace_2000-01-01T00-00-00.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_fallback_verdicts_from_unfinished_responses_are_counted_and_can_be_scored_wrong(run, tmp_path, capsys):
    # gsm8k_boxed: doc 1 falls back to "3" (wrong), doc 3 to "624" (right); both were cut at
    # their budget, the boxed docs 0 and 2 finished.
    from loopeval.analysis.runs import load_run
    from loopeval.analysis.score_audit import unfinished_fallback_wrong

    out = shutil.copytree(run, tmp_path / "out")
    add_trace(out, {0: True, 1: False, 2: True, 3: False})
    gsm8k = score_audit(out, tasks=["gsm8k_boxed"]).tasks["gsm8k_boxed"]
    assert (gsm8k.unfinished_fallback, gsm8k.unfinished_fallback_right, gsm8k.untraced) == (2, 1, 0)
    assert gsm8k.accuracy == 0.75  # the paper's rule credits the cut "624"
    assert [(i.doc_id, i.finished) for i in gsm8k.items] == [(1, False), (2, True), (3, False)]
    wrong = score_audit(out, tasks=["gsm8k_boxed"], unfinished_fallback="wrong").tasks["gsm8k_boxed"]
    assert (wrong.accuracy, wrong.recorded_accuracy) == (0.5, 0.75)
    loaded = load_run(out, tasks=["gsm8k_boxed"], allow_subset=True)
    assert unfinished_fallback_wrong(loaded).tasks["gsm8k_boxed"].scores.tolist() == [1, 0, 1, 0]
    assert loaded.tasks["gsm8k_boxed"].scores.tolist() == [1, 0, 1, 1]  # the run itself is left as recorded

    assert main(["score-audit", str(out), "--tasks", "gsm8k_boxed", "--allow-subset"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("gsm8k_boxed "))
    assert row.split()[8:10] == ["2", "1"]
    assert re.search(r"doc 3\s+right\s+number_fallback\s+UNFINISHED", text)


def test_scoring_cut_fallbacks_wrong_needs_a_trace(run):
    from loopeval.analysis.runs import load_run
    from loopeval.analysis.score_audit import unfinished_fallback_wrong

    with pytest.raises(ValueError, match=r"gsm8k_boxed: 2 number-fallback responses have no trace record"):
        unfinished_fallback_wrong(load_run(run, tasks=["gsm8k_boxed"], allow_subset=True))
