"""``loopeval protocol``: study files validated before compute, evaluations that resume and
never count half-written, parallel workers, and the report at the end."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import write_generate_task

from loopeval.cli import main
from loopeval.tools.study import load_study, run_study

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A base checkpoint, its twin and looped model (random weights), and a tiny task."""
    from loopeval import apply_loop, save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("study")
    tok = tiny_tokenizer()
    save_model(tiny_model("qwen3", vocab_size=len(tok), num_layers=4), tok, root / "twin")
    save_model(apply_loop(tiny_model("qwen3", vocab_size=len(tok), num_layers=4), "1:3x2"), tok, root / "looped")
    rows = [{"question": f"What is {a} + {a}?", "answer": str(2 * a)} for a in range(6)]
    write_generate_task(root / "tasks", "tiny_boxed", rows, max_gen_toks=16)
    return root


def _study(world: Path, folder: Path, **changes) -> Path:
    study = {
        "name": "tiny",
        "output": str(folder / "out"),
        "models": [{"name": "twin", "role": "twin", "path": str(world / "twin")},
                   {"name": "looped", "role": "looped", "path": str(world / "looped")}],
        "tasks": ["tiny_boxed"],
        "include_path": [str(world / "tasks")],
        "budgets": [0.5, 1],
        "decoding": [{"name": "plain"}],
        "lm_eval": {"batch_size": 3, "device": "cpu"},
        "statistics": {"n_resamples": 200},
    }
    study.update(changes)
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.mark.parametrize(("change", "message"), [
    ({"modles": []}, r"study.yaml: modles: unknown key"),
    ({"models": [{"name": "twin", "role": "twin", "path": "nowhere/at/all"}]}, r"models\[0\] \(twin\): .*nowhere/at/all"),
    ({"models": [{"name": "looped", "role": "looped", "base": "B", "loop": "1:3x2"}]}, r"models\[0\]: the looped model 'looped' has no twin"),
    ({"models": [{"name": "a", "role": "twin", "path": "x"}, {"name": "a", "role": "twin", "path": "y"}]}, r"models\[1\]: duplicate 'a'"),
    ({"models": [{"name": "a", "role": "boss", "path": "x"}]}, r"models\[0\].role: 'boss': choose one of twin, looped, larger"),
    ({"budgets": [0.5, 2]}, r"budgets: must include the default budget scale 1"),
    ({"decoding": [{"name": "bf", "budget_forcing": "maybe"}]}, r"decoding\[0\]: budget_forcing='maybe': expected a boolean"),
    ({"decoding": [{"name": "bf", "forcing": True}]}, r"decoding\[0\].forcing: unknown key"),
    ({"lm_eval": {"batch": 3}}, r"lm_eval.batch: unknown key"),
    ({"lm_eval": {"limit": 3}}, r"lm_eval.limit: a run of a subset of the items is a pilot; set pilot: true"),
    ({"lm_eval": {"limit": -1}, "pilot": True}, r"lm_eval.limit: .*"),
    ({"intended_differences": ["prompt"]}, r"intended_differences\[0\]: 'prompt' is not a setting that can differ; "
                                           r"choose from .*prompts"),
    ({"include_path": ["no/such/tasks"]}, r"include_path\[0\]: no/such/tasks: no such folder \(relative paths are read"),
])
def test_a_bad_study_file_names_the_file_and_key(world, tmp_path, change, message):
    path = _study(world, tmp_path, **change)
    with pytest.raises((ValueError, OSError), match=message):
        study = load_study(path)
        from loopeval.tools.study.plan import check_before_compute, expand

        check_before_compute(study, expand(study))


@pytest.mark.parametrize("where", ["lm_eval", "models"])
def test_model_args_the_runner_sets_are_refused(world, tmp_path, where):
    """Generated from RUNNER_KEYS: each is set by the runner for every evaluation (so a given
    value would be silently overwritten), and each is refused in a model_args."""
    from loopeval.tools.study.plan import expand
    from loopeval.tools.study.spec import RUNNER_KEYS

    study = load_study(_study(world, tmp_path))
    assert set(RUNNER_KEYS) <= set(expand(study)[0].model_args(study))
    for key in RUNNER_KEYS:
        if where == "lm_eval":
            change, at = {"lm_eval": {"model_args": {key: "x"}}}, f"lm_eval.model_args.{key}"
        else:
            change = {"models": [{"name": "twin", "role": "twin", "path": str(world / "twin"), "model_args": {key: "x"}},
                                 {"name": "looped", "role": "looped", "path": str(world / "looped")}]}
            at = f"models[0].model_args.{key}"
        with pytest.raises(ValueError, match=rf"study.yaml: {re.escape(at)}: set by the runner for every evaluation"):
            load_study(_study(world, tmp_path, **change))


def test_an_empty_or_non_mapping_study_file_is_named(tmp_path):
    for text, message in (("", "the study file is empty; it needs at least output, models and tasks"),
                          ("- a\n- b\n", "the study file holds a list, not a mapping of study keys")):
        (tmp_path / "s.yaml").write_text(text)
        with pytest.raises(ValueError, match=rf"s.yaml: {message}"):
            load_study(tmp_path / "s.yaml")


def test_local_task_data_is_checked_before_any_model_loads(world, tmp_path):
    """A study over a local-tasks folder whose data file was emptied (or lost a field)
    after local-tasks wrote it is refused before compute, naming the file and line."""
    from loopeval.evaluation.local_data import write_local_tasks
    from loopeval.tools.study.plan import check_before_compute, expand

    data = tmp_path / "data" / "gsm8k" / "main"
    data.mkdir(parents=True)
    rows = [{"question": f"What is {a} + {a}?", "answer": f"#### {2 * a}"} for a in range(3)]
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "test-backup.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # not a shard
    written = write_local_tasks(tmp_path / "data", tmp_path / "local", tasks=["gsm8k_boxed"])
    assert written.tasks["gsm8k_boxed"] == [data / "test.jsonl"]
    path = _study(world, tmp_path, tasks=["gsm8k_boxed"], include_path=[str(tmp_path / "local")])
    for text, message in (("", r"test.jsonl: holds no records \(an empty file\)"),
                          ('{"question": "q"}\n', r"test.jsonl:1: no field 'answer' \(task gsm8k_boxed reads it")):
        (data / "test.jsonl").write_text(text)
        study = load_study(path)
        with pytest.raises(ValueError, match=message):
            check_before_compute(study, expand(study))


def test_checks_before_compute(world, tmp_path):
    from loopeval.tools.study.plan import check_before_compute, expand

    def check(**change):
        study = load_study(_study(world, tmp_path, **change))
        check_before_compute(study, expand(study))

    with pytest.raises(ValueError, match=r"tasks\[0\]: lm-eval cannot find task or group 'tiny_boxd'"):
        check(tasks=["tiny_boxd"])
    with pytest.raises(ValueError, match=r"models\[1\] \(looped\): .*window 2:9x2 reaches past the last layer"):
        check(models=[{"name": "twin", "role": "twin", "path": str(world / "twin")},
                      {"name": "looped", "role": "looped", "base": str(world / "twin"), "loop": "2:9x2"}])
    with pytest.raises(ValueError, match=r"role twin, but .*looped is looped \(1:3x2\)"):
        check(models=[{"name": "twin", "role": "twin", "path": str(world / "looped")},
                      {"name": "looped", "role": "looped", "path": str(world / "looped")}])
    with pytest.raises(ValueError, match=r"looped and its twin twin get different model_args \(enable_thinking\)"):
        check(models=[{"name": "twin", "role": "twin", "path": str(world / "twin")},
                      {"name": "looped", "role": "looped", "path": str(world / "looped"),
                       "model_args": {"enable_thinking": True}}])
    check(models=[{"name": "twin", "role": "twin", "path": str(world / "twin")},
                  {"name": "looped", "role": "looped", "path": str(world / "looped"), "model_args": {"enable_thinking": True}}],
          intended_differences=["enable_thinking"])


def test_a_study_runs_resumes_and_refuses_to_overwrite_other_settings(world, tmp_path, monkeypatch, capsys):
    from loopeval.tools.study import execute

    path = _study(world, tmp_path)
    plan = run_study(path, dry_run=True)
    out = capsys.readouterr().out
    assert set(plan.outcomes.values()) == {"planned"}
    # twin: 4 layer passes x 16 tokens x 6 items x 0.5 = 192; looped (1:3x2): 6 passes
    budgeted = dict(re.findall(r"(\S+__plain__\S+) +todo +budgeted (\S+) ", out))
    assert budgeted == {"twin__plain__0.5x": "192", "twin__plain__1x": "384", "looped__plain__0.5x": "288",
                        "looped__plain__1x": "576"}

    calls, real = [], execute.run_lm_eval

    def killed_on_the_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    monkeypatch.setattr(execute, "run_lm_eval", killed_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        run_study(path, progress=False)
    evals = tmp_path / "out" / "evals"
    assert sorted(p.name for p in evals.iterdir() if not p.name.startswith(".")) == ["twin__plain__0.5x", "twin__plain__1x"]
    monkeypatch.setattr(execute, "run_lm_eval", real)

    result = run_study(path, progress=False)
    assert result.outcomes == {"twin__plain__0.5x": "skipped: done", "twin__plain__1x": "skipped: done",
                               "looped__plain__0.5x": "done", "looped__plain__1x": "done"}
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["loop"] == "1:3x2" and len(report["runs"]) == 4
    again = run_study(path, progress=False)  # everything done: only the report is rebuilt
    assert set(again.outcomes.values()) == {"skipped: done"} and again.report == result.report

    changed = _study(world, tmp_path, lm_eval={"batch_size": 2, "device": "cpu"})
    with pytest.raises(ValueError, match=r"evaluation twin__plain__0.5x: .* was made with other settings "
                                         r"\(lm_eval.batch_size: 3 then, 2 now\)"):
        run_study(changed, progress=False, rerun=False)
    assert main(["protocol", str(changed), "--no-rerun"]) == 2
    with pytest.raises(ValueError, match=r"--report-only: 4 finished evaluation\(s\) were made with other settings"):
        run_study(changed, progress=False, report_only=True)


def test_evaluations_run_without_a_report_are_reused_by_the_full_study(world, tmp_path):
    """What the demo does with its twin while the looped model trains."""
    path = _study(world, tmp_path)
    first = run_study(path, only="twin__*", report=False, progress=False)
    assert first.report is None and set(first.outcomes.values()) == {"done"}
    assert not (tmp_path / "out" / "report.json").exists()
    result = run_study(path, progress=False)
    assert result.outcomes == {"twin__plain__0.5x": "skipped: done", "twin__plain__1x": "skipped: done",
                               "looped__plain__0.5x": "done", "looped__plain__1x": "done"}
    assert result.report is not None


def test_done_means_every_output_the_report_reads_is_there(world, tmp_path):
    """A finished folder whose trace lost an item line, or whose samples file was deleted, is
    not done: it is run again (or refused with --no-rerun), never reported from."""
    from loopeval.tools.study.plan import expand, status

    path = _study(world, tmp_path, budgets=[1])
    run_study(path, only="twin__*", report=False, progress=False)
    study = load_study(path)
    (e,) = [e for e in expand(study) if e.name == "twin__plain__1x"]
    assert status(e, study) == "done"
    (trace,) = e.folder.rglob("loopeval_trace_*.jsonl")
    lines = trace.read_text().splitlines(keepends=True)
    trace.write_text("".join(lines[:-1]))  # the last item's line lost
    assert re.match(r"stale: outputs incomplete: .* 1 of \d+ items have no trace record", status(e, study))
    with pytest.raises(ValueError, match=r"twin__plain__1x: .* lacks outputs the report needs .*run without --no-rerun"):
        status(e, study, rerun=False)
    trace.write_text("".join(lines))
    assert status(e, study) == "done"
    next(e.folder.rglob("samples_*.jsonl")).unlink()
    assert re.match(r"stale: outputs incomplete: task \w+: no samples file", status(e, study))
    result = run_study(path, only="twin__*", report=False, progress=False)
    assert result.outcomes == {"twin__plain__1x": "done"} and status(e, study) == "done"


def test_a_checkpoint_retrained_in_place_is_evaluated_again(world, tmp_path, capsys):
    """Issue 23 case 1: a study re-run after retraining the looped checkpoint into its folder
    re-runs that checkpoint's evaluations (the old folders kept), and --no-rerun names the change."""
    import shutil

    from loopeval import apply_loop, save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    looped = tmp_path / "looped"
    shutil.copytree(world / "looped", looped)
    models = [{"name": "twin", "role": "twin", "path": str(world / "twin")},
              {"name": "looped", "role": "looped", "path": str(looped)}]
    path = _study(world, tmp_path, models=models, budgets=[1])
    run_study(path, progress=False)
    tok = tiny_tokenizer()
    save_model(apply_loop(tiny_model("qwen3", vocab_size=len(tok), num_layers=4, seed=7), "1:3x2"), tok, looped)
    with pytest.raises(ValueError, match=r"looped__plain__1x: .* other settings \(weights\.pretrained: "):
        run_study(path, progress=False, rerun=False)
    result = run_study(path, progress=False)
    assert result.outcomes == {"twin__plain__1x": "skipped: done", "looped__plain__1x": "done"}
    assert "re-running looped__plain__1x" in capsys.readouterr().err
    assert len(list((tmp_path / "out" / "evals" / ".replaced").iterdir())) == 1
    from loopeval.evaluation.trace import find_traces

    (trace,) = find_traces(tmp_path / "out" / "evals" / "looped__plain__1x")
    (old,) = find_traces(next((tmp_path / "out" / "evals" / ".replaced").iterdir()))
    assert trace.header.weights != old.header.weights

    # issue 32: weights removed: the stale evaluation is moved aside before its re-run fails,
    # and no report is left standing from it
    (looped / "model.safetensors").unlink()
    failed = run_study(path, progress=False)
    assert failed.failed == ["looped__plain__1x"] and failed.report is None
    assert not (tmp_path / "out" / "evals" / "looped__plain__1x").exists()
    assert not (tmp_path / "out" / "report.html").exists()
    assert len(list((tmp_path / "out" / ".replaced").glob("report.*/report.html"))) == 2  # one per re-run


@pytest.mark.slow
def test_two_workers_on_the_cpu(world, tmp_path):
    path = _study(world, tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "loopeval", "protocol", str(path), "--workers", "2"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "wrote" in proc.stdout and (tmp_path / "out" / "report.html").is_file()
    evals = sorted(p.name for p in (tmp_path / "out" / "evals").iterdir() if not p.name.startswith("."))
    assert evals == ["looped__plain__0.5x", "looped__plain__1x", "twin__plain__0.5x", "twin__plain__1x"]


def test_a_pilot_study_runs_on_a_subset_and_says_so(world, tmp_path):
    # pilot: true with lm_eval.limit: 4 of the 6 items; the report labels every table and the
    # verdict, and no verdict is final.
    path = _study(world, tmp_path, pilot=True, budgets=[1], lm_eval={"batch_size": 3, "device": "cpu", "limit": 4})
    assert load_study(path).lm_eval["limit"] == 4
    result = run_study(path, progress=False)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["pilot"] == "pilot: 4 of 6 items"
    verdict = report["conditions"][0]["verdict"]
    assert verdict["pilot"] == "pilot: 4 of 6 items" and verdict["sentences"][0].startswith(
        "Pilot: 4 of 6 items, not a final verdict. ")
    page = result.report.read_text()
    assert page.count("(pilot: 4 of 6 items)") >= 5


def test_a_study_applying_a_chat_template_refuses_a_tokenizer_without_one_before_any_weights_load(world, tmp_path):
    from loopeval.tools.study.plan import check_before_compute, expand

    bare = tmp_path / "bare_twin"
    shutil.copytree(world / "twin", bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    models = [{"name": "twin", "role": "twin", "path": str(bare)},
              {"name": "looped", "role": "looped", "path": str(world / "looped")}]
    chat = {"batch_size": 3, "device": "cpu", "apply_chat_template": True}
    study = load_study(_study(world, tmp_path, models=models, lm_eval=chat))
    with pytest.raises(ValueError, match=r"study.yaml: lm_eval.apply_chat_template: twin: the tokenizer of "
                                         r".*bare_twin has no chat template .*bare_twin/chat_template.jinja"):
        check_before_compute(study, expand(study))
    with_template = load_study(_study(world, tmp_path, lm_eval=chat))
    check_before_compute(with_template, expand(with_template))
