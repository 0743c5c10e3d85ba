"""Tests of the class (issue 23.7): every part of an evaluation's identity, enumerated from its
one definition (:mod:`loopeval.evaluation.identity`), is detected by compare, the report's (and so the
study's) fairness checks and the resume store; a trace joins only its own run."""

import json
import shutil
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from loopeval.evaluation import identity
from loopeval.analysis.report.checks import decoding_checks, seed_checks
from loopeval.evaluation.responses import request_key
from loopeval.analysis.runs import decoding_differences, load_run
from loopeval.evaluation.trace import DecodingSettings, TraceHeader, read_trace

RUNS = Path(__file__).parents[1] / "fixtures" / "runs"
TRACED = ["toy_arith", "toy_aime"]


def _other(name: str):
    """A value of the setting's declared type unequal to its default."""
    field = next(f for f in fields(DecodingSettings) if f.name == name)
    default = DecodingSettings().__getattribute__(name)
    kind = [t.strip() for t in str(field.type).split("|") if t.strip() != "None"][0]
    return {"bool": lambda: not default, "int": lambda: (default or 0) + 3, "float": lambda: (default or 0) + 3.0,
            "str": lambda: f"changed-{default}", "dict": lambda: {"changed": True}}[kind]()


def _forcing_only(name: str) -> bool:
    return any(f.name == name and f.metadata.get("forcing") for f in fields(DecodingSettings))


def _header_lines(folder: Path):
    (trace,) = folder.rglob("loopeval_trace_*.jsonl")
    lines = trace.read_text().splitlines()
    return trace, json.loads(lines[0]), lines[1:]


def _copy_with(tmp_path: Path, name: str, **decoding) -> Path:
    dest = tmp_path / name
    shutil.copytree(RUNS / "twin", dest)
    trace, header, items = _header_lines(dest)
    header["decoding"].update(decoding)
    trace.write_text("\n".join([json.dumps(header), *items]) + "\n")
    return dest


def _evaluation(run, seed=None):
    return SimpleNamespace(run=run, seed=seed, header=run.header, where=run.path.parent)


def test_settings_are_every_decoding_settings_field():
    assert identity.SETTINGS == tuple(f.name for f in fields(DecodingSettings))


@pytest.mark.parametrize("name", identity.SETTINGS)
def test_each_output_setting_is_detected_by_compare_report_study_and_resume_store(tmp_path, name):
    changed = _other(name)
    # a forcing option changes outputs only with forcing on (without it, it is recorded as None)
    forcing = {"budget_forcing": True} if _forcing_only(name) else {}
    a = load_run(_copy_with(tmp_path, "a", **forcing))
    b = load_run(_copy_with(tmp_path, "b", **forcing, **{name: changed}))
    assert getattr(b.header.decoding, name) == changed
    # compare
    diffs = decoding_differences(a, b)
    assert [d.split(":")[0] for d in diffs] == [name]
    assert decoding_differences(a, b, intended=(name,)) == []
    # report, and the study's report: the fairness check fails
    groups = {(True, "plain", "", 1.0): [_evaluation(b)], (False, "plain", "", 1.0): [_evaluation(a)]}
    (check,) = decoding_checks(groups)
    assert not check.ok and name in check.detail
    # the resume store: another key
    ha, hb = a.header, b.header
    key = [request_key(identity.output_identity(h), "ctx", {"until": []}) for h in (ha, hb)]
    assert key[0] != key[1]


@pytest.mark.parametrize("part", ["prompts", "generation_kwargs", "task_version"])
def test_prompts_generation_kwargs_and_task_versions_are_detected(tmp_path, part):
    a_dir, b_dir = _copy_with(tmp_path, "a"), _copy_with(tmp_path, "b")
    (results,) = b_dir.rglob("results_*.json")
    data = json.loads(results.read_text())
    if part == "prompts":  # e.g. --apply_chat_template or --system_instruction on one side only
        samples = next(b_dir.rglob("samples_toy_arith_*.jsonl"))
        rows = [json.loads(line) for line in samples.read_text().splitlines()]
        for r in rows:
            if r["doc_id"] == 2:
                r["prompt_hash"] = "0" * 64
        samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif part == "generation_kwargs":
        data["configs"]["toy_arith"]["generation_kwargs"]["until"] = ["Q"]
    else:
        data["versions"]["toy_arith"] = 2.0
    results.write_text(json.dumps(data))
    a, b = load_run(a_dir), load_run(b_dir)
    diffs = decoding_differences(a, b)
    assert len(diffs) == 1 and diffs[0].startswith("toy_arith")
    if part == "prompts":
        assert "differs for 1 of" in diffs[0] and "first doc_id 2" in diffs[0]
    assert decoding_differences(a, b, intended=(part,)) == []
    groups = {(True, "plain", "", 1.0): [_evaluation(b)], (False, "plain", "", 1.0): [_evaluation(a)]}
    assert not decoding_checks(groups)[0].ok


def test_one_checkpoint_twice_is_not_two_seeds(tmp_path):
    """Case 6: two seed runs with one weights fingerprint and one torch seed fail the seed check."""
    a = load_run(_copy_with(tmp_path, "a"))
    b = load_run(_copy_with(tmp_path, "b"))
    for run, weights in ((a, "w1"), (b, "w1")):
        object.__setattr__(run, "trace_headers", (replace(run.header, weights=weights),))

    def check():
        (result,) = seed_checks({(True, "plain", "", 1.0): [_evaluation(a, 0), _evaluation(b, 1)]})
        return result

    assert not check().ok and "one weights fingerprint" in check().detail
    object.__setattr__(b, "trace_headers", (replace(b.header, weights="w2"),))
    assert check().ok
    object.__setattr__(b, "trace_headers", (replace(b.header, weights="w1", decoding=replace(b.header.decoding, seed=9)),))
    assert check().ok  # an explicit, different seed: distinct draws


def test_a_trace_of_another_run_in_a_shared_folder_is_never_joined(tmp_path):
    """Case 5: two runs wrote into one folder at once; the twin's results must not take the looped trace."""
    twin = tmp_path / "twin"
    shutil.copytree(RUNS / "twin", twin)
    own, own_header, _ = _header_lines(twin)
    expected = load_run(twin).cost(TRACED)
    for path in sorted((RUNS / "looped").glob("loopeval_trace_*.jsonl")):
        lines = path.read_text().splitlines()
        header = json.loads(lines[0])
        header["created"] = own_header["created"] + 0.5  # newer, and inside the twin's evaluation window
        (own.parent / path.name.replace("09-07", "09-08")).write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    run = load_run(twin)
    assert run.cost(TRACED) == expected and run.header.model == "toy/twin"
    own.unlink()  # only the foreign trace is left: refused, naming both files
    run = load_run(twin)
    with pytest.raises(ValueError, match=r"loopeval_trace_.*written by another run than .*results_.*pretrained=toy/looped"):
        run.cost(TRACED)


def test_header_mismatch_reads_model_args_as_lm_eval_records_them():
    header = read_trace(next((RUNS / "twin").rglob("loopeval_trace_*.jsonl"))).header
    assert identity.header_mismatch(header, "pretrained=toy/twin,p=0.5") is None
    assert identity.header_mismatch(header, {"pretrained": "toy/twin", "budget_scale": "1.0"}) is None
    assert "budget_scale" in identity.header_mismatch(header, "pretrained=toy/twin,budget_scale=0.5")
    assert identity.header_mismatch(header, "pretrained=toy/twin,dtype=auto") is None
    assert "pretrained" in identity.header_mismatch(header, "pretrained=other")
    assert "budget_scale" in identity.header_mismatch(header, '{"pretrained": "toy/twin", "budget_scale": 0.5}')


def test_a_new_header_field_is_identity_unless_named_speed_only():
    names = {f.name for f in fields(TraceHeader)}
    header = TraceHeader(model="m", loop=None, cost={}, decoding=DecodingSettings())
    assert set(identity.output_identity(header)) == names - set(identity.NOT_OUTPUT)


def test_a_tasks_functions_bring_the_modules_they_import_from_their_folder_or_loopeval(tmp_path, monkeypatch):
    """The task fingerprint hashes the scorer behind ``process_results`` too: ``tasks/utils.py``
    brings ``loopeval/evaluation/scoring.py``; a user's utils brings the helper module beside it
    (imported through its folder on sys.path) but not numpy, whose version is recorded apart."""
    import importlib.util
    import sys

    from loopeval.common.paths import tasks_path
    from loopeval.evaluation.identity import _local_sources

    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)

    load(tasks_path() / "utils.py", "loopeval_test_tasks_utils")
    shipped = _local_sources([str(tasks_path() / "utils.py")])
    assert [Path(f).name for f in shipped] == ["scoring.py", "utils.py"]

    (tmp_path / "helpers_for_identity.py").write_text("def keep(docs):\n    return docs\n")
    (tmp_path / "my_utils.py").write_text(
        "import numpy\nimport helpers_for_identity\n\ndef process_docs(docs):\n    return helpers_for_identity.keep(docs)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    load(tmp_path / "my_utils.py", "my_utils_for_identity")
    assert _local_sources([str(tmp_path / "my_utils.py")]) == sorted(
        str((tmp_path / n).resolve()) for n in ("helpers_for_identity.py", "my_utils.py"))
