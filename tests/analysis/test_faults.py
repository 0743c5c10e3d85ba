"""Hand-edited files (issue 23.4, cases 11 and 12): each field of each format set to a wrong
type gives one ValueError naming the file (and line) and the field; no traceback, no silent use."""

import json
import shutil
from dataclasses import fields
from pathlib import Path

import pytest

from loopeval.evaluation.responses import ResponseStore
from loopeval.analysis.runs import load_run
from loopeval.evaluation.trace import DecodingSettings, TraceItem, read_trace

RUNS = Path(__file__).parents[1] / "fixtures" / "runs"
WRONG = {"str": [1], "int": "8", "float": None, "bool": "yes", "dict": [1]}


def _wrong(field) -> object:
    kind = [t.strip() for t in str(field.type).split("|") if t.strip() != "None"][0]
    return WRONG[kind]


def _trace(tmp_path: Path) -> Path:
    shutil.copytree(RUNS / "twin", tmp_path / "twin")
    (trace,) = (tmp_path / "twin").rglob("loopeval_trace_*.jsonl")
    return trace


@pytest.mark.parametrize("field", fields(TraceItem), ids=lambda f: f.name)
def test_a_trace_item_field_of_the_wrong_type(tmp_path, field):
    trace = _trace(tmp_path)
    lines = trace.read_text().splitlines()
    item = json.loads(lines[3])
    item[field.name] = _wrong(field)
    lines[3] = json.dumps(item)
    trace.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"{trace.name}:4: .*field '{field.name}'"):
        read_trace(trace)
    run = load_run(trace.parent)  # accuracies still load; costs name the file, line and field
    with pytest.raises(ValueError, match=rf"{trace.name}:4: .*field '{field.name}'"):
        run.cost(["toy_arith"])


@pytest.mark.parametrize("field", fields(DecodingSettings), ids=lambda f: f.name)
def test_a_trace_header_setting_of_the_wrong_type(tmp_path, field):
    trace = _trace(tmp_path)
    lines = trace.read_text().splitlines()
    header = json.loads(lines[0])
    header["decoding"][field.name] = _wrong(field)
    lines[0] = json.dumps(header)
    trace.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"{trace.name}:1: .*field '{field.name}'"):
        read_trace(trace)


@pytest.mark.parametrize("n_samples", [[1, 2], {"toy_arith": {"original": 6}}, {"toy_arith": {"original": "6", "effective": 6}}])
def test_a_results_file_with_bad_n_samples(tmp_path, n_samples):
    shutil.copytree(RUNS / "twin", tmp_path / "twin")
    (results,) = (tmp_path / "twin").rglob("results_*.json")
    data = json.loads(results.read_text())
    data["n-samples"] = n_samples
    results.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"{results.name}: .*n-samples"):
        load_run(results, tasks=["toy_arith"])


def test_invalid_utf8_names_the_file_and_line(tmp_path):
    trace = _trace(tmp_path)
    trace.write_bytes(trace.read_bytes() + b'{"kind": "item", "task": "\xff"}\n')
    with pytest.raises(ValueError, match=rf"{trace.name}:\d+: loopeval trace line is not UTF-8"):
        read_trace(trace)
    (samples,) = (tmp_path / "twin").rglob("samples_toy_arith_*.jsonl")
    samples.write_bytes(b"\xff\xfe\n" + samples.read_bytes())
    with pytest.raises(ValueError, match=rf"{samples.name}:1: lm-eval samples line is not UTF-8"):
        load_run(tmp_path / "twin", tasks=["toy_arith"])


@pytest.mark.parametrize(("field", "value"), [("generated", "12"), ("generated", [1, "2"]), ("prompt_tokens", "3"),
                                              ("outcome", [1]), ("outcome", {"generated_tokens": "3"})])
def test_a_response_store_line_of_the_wrong_type(tmp_path, field, value):
    good = {"key": "k", "generated": [1, 2], "outcome": {"generated_tokens": 2, "finished": True, "forced_at": None,
                                                          "repetition_stop_at": None}, "prompt_tokens": 3}
    bad = {**good, "key": "j", field: value}
    (tmp_path / "loopeval_responses.jsonl").write_text(json.dumps(bad) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(ValueError, match=r"loopeval_responses.jsonl:1: corrupt response-store line"):
        ResponseStore(tmp_path)


def test_a_search_json_holding_a_list(tmp_path):
    from loopeval.tools.placement.search import SETTINGS_NAME, _check_resume

    (tmp_path / SETTINGS_NAME).write_text("[1, 2]")
    with pytest.raises(ValueError, match=rf"{SETTINGS_NAME}: expected a mapping of search settings, got a list"):
        _check_resume(tmp_path, {"model": "m"})
