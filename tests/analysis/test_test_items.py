"""A run's items against the task's full test set by content (GSM8K's shipped item list):
a subset of the test set is a pilot of n of 1,319; items from elsewhere are not the benchmark."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from loopeval.analysis.runs import load_run, pilot_label
from loopeval.evaluation import metrics

FIXTURES = Path(__file__).parents[1] / "fixtures"
TEST_ROWS = [json.loads(line) for line in (FIXTURES / "real" / "gsm8k_test_first8.jsonl").read_text().splitlines()]
OTHER_ROWS = [json.loads(line) for line in (FIXTURES / "tasks" / "gsm8k.jsonl").read_text().splitlines()]  # 2 train, 2 made up
SHARED_TEST = Path(os.environ.get("LOOPEVAL_GSM8K_TEST")
                   or Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl")
"""GSM8K's test set: the project's shared/ beside the checkout (as CI lays it), or LOOPEVAL_GSM8K_TEST."""


def shared_test_rows() -> list[dict]:
    """GSM8K's 1,319 test rows; skips without them, and fails when CI is set (CI's clone has shared/ beside it)."""
    if not SHARED_TEST.is_file():
        reason = f"GSM8K's test set not found at {SHARED_TEST} (set LOOPEVAL_GSM8K_TEST)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI is set, and CI's clone has shared/ beside it")
        pytest.skip(reason)
    return [json.loads(line) for line in SHARED_TEST.read_text().splitlines()]


def write_run(folder: Path, rows: list[dict], task: str = "gsm8k_boxed", original: int | None = None) -> Path:
    """A minimal lm-eval ``--log_samples`` run of ``task`` over ``rows`` (docs as the task logs them)."""
    folder.mkdir(parents=True)
    stamp = "2026-01-01T00-00-00.000000"
    n = len(rows) if original is None else original
    results = {"results": {task: {"alias": task, "exact_match,none": 0.5}}, "configs": {task: {"output_type": "generate_until"}},
               "n-samples": {task: {"original": n, "effective": len(rows)}}, "higher_is_better": {task: {"exact_match": True}}}
    (folder / f"results_{stamp}.json").write_text(json.dumps(results))
    with (folder / f"samples_{task}_{stamp}.jsonl").open("w") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps({"doc_id": i, "doc": row, "filter": "none", "exact_match": i % 2,
                                "doc_hash": hashlib.sha256(row["question"].encode()).hexdigest(),
                                "target_hash": "t", "prompt_hash": f"p{i}"}) + "\n")
    return folder


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def test_the_shipped_item_list_is_gsm8ks_test_questions_and_answers():
    fields, questions, items = metrics.test_items("gsm8k_nll")
    assert fields == ("question", "answer") and len(questions) == len(items) == metrics.TEST_SET_SIZES["gsm8k_nll"] == 1319
    assert all(_sha(r["question"]) in questions and _sha(r["question"] + "\0" + r["answer"]) in items for r in TEST_ROWS)
    assert not any(_sha(r["question"]) in questions for r in OTHER_ROWS)
    assert metrics.test_items("arc_challenge_letter") is None


def test_the_shipped_item_list_is_the_whole_gsm8k_test_set():
    _, questions, items = metrics.test_items("gsm8k_nll")
    rows = shared_test_rows()
    assert questions == {_sha(r["question"]) for r in rows}
    assert items == {_sha(r["question"] + "\0" + r["answer"]) for r in rows}


def test_a_subset_of_the_test_set_is_a_pilot_of_the_benchmark(tmp_path):
    run = load_run(write_run(tmp_path / "a", TEST_ROWS), allow_subset=True)
    assert run.tasks["gsm8k_boxed"].foreign_items == ()
    assert pilot_label([run]) == "pilot: 8 of 1319 items"


def test_items_not_in_the_test_set_are_not_the_benchmark_whatever_their_count(tmp_path, monkeypatch):
    rows = TEST_ROWS[:4] + OTHER_ROWS  # as many items as the (patched) full set: not a pilot by count
    monkeypatch.setitem(metrics.TEST_SET_SIZES, "gsm8k_boxed", len(rows))
    folder = write_run(tmp_path / "a", rows)
    with pytest.raises(ValueError, match=r"task gsm8k_boxed: of its 8 items, 4 item\(s\) not in the test set "
                                         r"\(their 'question' is none of its items', e.g. doc_id 4\); 1315 test item\(s\) "
                                         r"missing: this run is not the benchmark of 8 items"):
        load_run(folder)
    run = load_run(folder, allow_subset=True)
    assert run.tasks["gsm8k_boxed"].foreign_items == (4, 5, 6, 7)
    assert pilot_label([run]) == ("pilot: 8 of 8 items, 4 of the runs' items not in their task's test set "
                                  "(e.g. gsm8k_boxed doc_id 4)")


def test_tasks_without_a_known_item_list_are_checked_by_count_only(tmp_path, monkeypatch):
    monkeypatch.setitem(metrics.TEST_SET_SIZES, "toy_gsm8k", len(OTHER_ROWS))
    run = load_run(write_run(tmp_path / "a", OTHER_ROWS, task="toy_gsm8k"))
    assert run.tasks["toy_gsm8k"].foreign_items == () and pilot_label([run]) is None


def test_an_edited_gold_answer_is_not_the_benchmark(tmp_path, monkeypatch):
    rows = [dict(r) for r in TEST_ROWS]
    monkeypatch.setitem(metrics.TEST_SET_SIZES, "gsm8k_boxed", len(rows))
    rows[2]["answer"] = rows[2]["answer"].replace("####", "#### 1")  # the gold changed, the question kept
    with pytest.raises(ValueError, match=r"of its 8 items, 1 item\(s\) with a test item's 'question' but another "
                                         r"'answer' than the test set's \(e.g. doc_id 2\)"):
        load_run(write_run(tmp_path / "a", rows), allow_subset=False)
    run = load_run(tmp_path / "a", allow_subset=True)
    assert run.tasks["gsm8k_boxed"].foreign_items == (2,)


def test_a_duplicated_item_is_named_and_counted_once(tmp_path, monkeypatch):
    """As many rows as the test set, one missing and one repeated: not the benchmark; in a
    pilot the repeat is counted once (a bootstrap would weigh it twice)."""
    rows = TEST_ROWS[:7] + [TEST_ROWS[0]]
    monkeypatch.setitem(metrics.TEST_SET_SIZES, "gsm8k_boxed", len(rows))
    with pytest.raises(ValueError, match=r"of its 8 items, 1 duplicated item\(s\) \(doc_id 7 repeats doc_id 0\); "
                                         r"\d+ test item\(s\) missing: this run is not the benchmark"):
        load_run(write_run(tmp_path / "a", rows))
    task = load_run(tmp_path / "a", allow_subset=True).tasks["gsm8k_boxed"]
    assert list(task.doc_ids) == list(range(7)) and task.duplicate_items == (7,) and len(task.scores) == 7
    assert pilot_label([load_run(tmp_path / "a", allow_subset=True)]) == (
        "pilot: 7 of 8 items, 1 duplicated item(s) counted once (e.g. gsm8k_boxed doc_id 7)")


def test_the_whole_test_set_with_one_row_missing_and_one_duplicated_is_refused(tmp_path):
    rows = shared_test_rows()
    rows = rows[:-1] + [rows[5]]  # 1,319 rows: the count of the benchmark
    with pytest.raises(ValueError, match=r"of its 1319 items, 1 duplicated item\(s\) \(doc_id 1318 repeats doc_id 5\); "
                                         r"1 test item\(s\) missing: this run is not the benchmark of 1319 items"):
        load_run(write_run(tmp_path / "a", rows))
