"""``loopeval compare`` on lm-eval output folders (tests/fixtures/runs, made by lm-eval)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar

from loopeval.cli import main
from loopeval.analysis.stats import paired_bootstrap
from support import read_records

RUNS = Path(__file__).parents[1] / "fixtures" / "runs"
TWIN, LOOPED = str(RUNS / "twin"), str(RUNS / "looped")


def run_json(capsys, *argv) -> dict:
    assert main(["compare", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def item_scores(folder: str, task: str, metric: str, filt: str) -> np.ndarray:
    """Per-item scores read straight from the latest samples file of a run."""
    results = max(Path(folder).glob("*/results_*.json"))
    path = results.with_name(f"samples_{task}_{results.stem.split('_', 1)[1]}.jsonl")
    recs = read_records(path)
    by_doc = {r["doc_id"]: r[metric] for r in recs if r["filter"] == filt}
    return np.array([by_doc[i] for i in range(len(by_doc))], float)


MAIN = {"toy_arith": ("exact_match", "strict-match"), "toy_mc": ("acc", "none"), "toy_aime": ("exact_match", "all")}


def test_json_rows_match_an_independent_reading_of_the_samples(capsys):
    out = run_json(capsys, TWIN, LOOPED, "--n-resamples", "4000")
    assert set(out["tasks"]) == set(MAIN)
    for task, (metric, filt) in MAIN.items():
        a, b = item_scores(TWIN, task, metric, filt), item_scores(LOOPED, task, metric, filt)
        row = out["tasks"][task]
        assert set(row) == {"n", "unit", "higher_is_better", "baseline", "candidate", "delta", "ci", "confidence",
                            "pvalue", "pvalue_holm", "mcnemar_pvalue", "decided_by", "outcome", "equivalent", "margin",
                            "equivalence_ci", "equivalence_method", "warnings"}
        assert (row["unit"], row["higher_is_better"], row["margin"]) == ("fraction", True, 0.02)
        assert row["n"] == len(a)
        assert (row["baseline"], row["candidate"]) == pytest.approx((a.mean(), b.mean()))
        assert row["delta"] == pytest.approx(b.mean() - a.mean())
        # the row is loopeval.analysis.stats on these very scores, keyed by the task (its own resample stream)
        ref = paired_bootstrap({task: a}, {task: b}, n_resamples=4000)
        assert (row["ci"], row["pvalue"]) == (pytest.approx(list(ref.ci)), pytest.approx(ref.pvalue))
        if task == "toy_aime":  # per-item means of four answers: no McNemar
            assert row["mcnemar_pvalue"] is None
        else:
            table = [[np.sum((a == 1) & (b == 1)), np.sum((a == 1) & (b == 0))],
                     [np.sum((a == 0) & (b == 1)), np.sum((a == 0) & (b == 0))]]
            assert row["mcnemar_pvalue"] == pytest.approx(sm_mcnemar(table, exact=True).pvalue)
    macro = out["macro"]
    both = {t: item_scores(TWIN, t, *MAIN[t]) for t in MAIN}, {t: item_scores(LOOPED, t, *MAIN[t]) for t in MAIN}
    ref = paired_bootstrap(*both, n_resamples=4000)
    assert (macro["ci"], macro["pvalue"]) == (pytest.approx(list(ref.ci)), pytest.approx(ref.pvalue))
    assert macro["baseline"] == pytest.approx(np.mean([r["baseline"] for r in out["tasks"].values()]))
    assert macro["delta"] == pytest.approx(np.mean([r["delta"] for r in out["tasks"].values()]))
    assert macro["n"] == 102 and macro["mcnemar_pvalue"] is None
    assert out["n_resamples"] == 4000 and out["seed"] == 0
    assert out["runs"]["baseline"].endswith(".json") and "twin" in out["runs"]["baseline"]


def test_seed_and_resamples_make_the_output_deterministic(capsys):
    one = run_json(capsys, TWIN, LOOPED, "--n-resamples", "2000", "--seed", "3")
    two = run_json(capsys, TWIN, LOOPED, "--n-resamples", "2000", "--seed", "3")
    other = run_json(capsys, TWIN, LOOPED, "--n-resamples", "2000", "--seed", "4")
    assert one == two
    assert one["macro"]["ci"] != other["macro"]["ci"]


def test_tasks_groups_and_metric_options(capsys):
    only = run_json(capsys, TWIN, LOOPED, "--tasks", "toy_arith", "--n-resamples", "1000")
    assert list(only["tasks"]) == ["toy_arith"]
    per_task = ("mcnemar_pvalue", "pvalue_holm", "warnings")  # a macro has no McNemar and no task family
    assert {k: v for k, v in only["macro"].items() if k not in per_task} == {
        k: v for k, v in only["tasks"]["toy_arith"].items() if k not in per_task}
    group = run_json(capsys, TWIN, LOOPED, "--tasks", "toy_core", "--n-resamples", "1000")
    assert set(group["tasks"]) == set(MAIN)
    norm = run_json(capsys, TWIN, LOOPED, "--tasks", "toy_mc", "--metric", "acc_norm", "--n-resamples", "1000")
    a, b = item_scores(TWIN, "toy_mc", "acc_norm", "none"), item_scores(LOOPED, "toy_mc", "acc_norm", "none")
    assert norm["tasks"]["toy_mc"]["delta"] == pytest.approx(b.mean() - a.mean())


def test_the_same_run_twice_is_refused(capsys):
    assert main(["compare", TWIN, TWIN]) == 2
    assert "baseline and candidate are the same run" in capsys.readouterr().err


def test_table_shows_points_per_task_and_the_macro(capsys):
    assert main(["compare", TWIN, LOOPED, "--n-resamples", "2000"]) == 0
    text = capsys.readouterr().out
    out = run_json(capsys, TWIN, LOOPED, "--n-resamples", "2000")
    lines = {line.split()[0]: line for line in text.splitlines() if line.split() and line.split()[0] in
             {*MAIN, "macro"}}
    assert set(lines) == {*MAIN, "macro"}
    arith = out["tasks"]["toy_arith"]
    assert f"{100 * arith['baseline']:.1f}" in lines["toy_arith"]
    assert f"{100 * arith['delta']:+.1f}" in lines["toy_arith"]
    assert f"[{100 * arith['ci'][0]:+.1f}, {100 * arith['ci'][1]:+.1f}]" in lines["toy_arith"]
    assert "<0.001" in lines["toy_arith"]  # the resampling floor, not 0.0002
    assert lines["macro"].split()[1:3] == ["points", "102"]
    assert "seed runs favouring the candidate: 1 of 1" in text
    # Both costs, each named (the fixture traces: 5 of 4 passes per token; the realised ratio
    # also counts how many tokens each side generated), and the runs by model and loop.
    assert "c (nominal cost: layer passes per token, candidate / baseline) = 1.250" in text
    assert "realised cost (layer passes x generated tokens, generative tasks, candidate / baseline) = 1.255; " \
           "ΔFLOP charges this one" in text
    assert text.splitlines()[0].split()[:3] == ["baseline", "twin", "(unlooped)"]
    assert text.splitlines()[1].split()[:5] == ["candidate", "looped", "(loop", "1:2x2", "repeat)"]
    assert (out["c"], out["labels"]["candidate"]) == (1.25, "looped (loop 1:2x2 repeat)")


def refused(capsys, *argv) -> str:
    assert main(["compare", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def copy_run(tmp_path: Path, folder: str) -> tuple[Path, Path]:
    dest = tmp_path / folder
    shutil.copytree(RUNS / folder, dest)
    return dest, max(dest.glob("*/results_*.json"))


def samples_file(results: Path, task: str) -> Path:
    return results.with_name(f"samples_{task}_{results.stem.split('_', 1)[1]}.jsonl")


def test_a_run_cut_by_limit_is_refused(capsys):
    err = refused(capsys, TWIN, str(RUNS / "limited"))
    assert "loopeval compare: error:" in err and "--limit (10 of 12 items)" in err and "toy_aime" in err


def test_a_pilot_is_accepted_with_allow_subset_and_labelled(capsys, tmp_path):
    # Two --limit runs of the same 10 items per task (a second evaluation: its own results file).
    folder, results = copy_run(tmp_path, "limited")
    results.write_text(results.read_text().replace('"date"', '"date" ', 1))
    err = refused(capsys, str(RUNS / "limited"), str(folder))
    assert "a pilot: --allow-subset" in err
    assert main(["compare", str(RUNS / "limited"), str(folder), "--allow-subset", "--n-resamples", "500"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "pilot: 10 of 12 items of toy_aime, 10 of 60 items of toy_arith, 10 of 30 items of toy_mc; outcomes below are a pilot's, not a final verdict"
    out = run_json(capsys, str(RUNS / "limited"), str(folder), "--allow-subset", "--n-resamples", "500")
    assert out["pilot"] == "pilot: 10 of 12 items of toy_aime, 10 of 60 items of toy_arith, 10 of 30 items of toy_mc"


def test_missing_items_are_refused(capsys, tmp_path):
    folder, results = copy_run(tmp_path, "looped")
    path = samples_file(results, "toy_arith")
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()
                            if json.loads(line)["doc_id"] != 11))
    err = refused(capsys, TWIN, str(folder))
    assert "toy_arith" in err and "59 of 60 items" in err and "every evaluation must cover all of its items" in err


def test_a_doc_hash_mismatch_is_refused(capsys, tmp_path):
    folder, results = copy_run(tmp_path, "looped")
    path = samples_file(results, "toy_mc")
    lines = read_records(path)
    lines[4]["doc_hash"] = "f" * 64
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    err = refused(capsys, TWIN, str(folder))
    assert f"task toy_mc: doc_hash differs for 1 of 30 items (first doc_id {lines[4]['doc_id']})" in err


def test_a_corrupt_samples_line_is_refused_with_file_and_line(capsys, tmp_path):
    folder, results = copy_run(tmp_path, "looped")
    path = samples_file(results, "toy_arith")
    lines = path.read_text().splitlines()
    lines[6] = lines[6][:50]
    path.write_text("\n".join(lines) + "\n")
    err = refused(capsys, TWIN, str(folder))
    assert f"{path.name}:7: corrupt lm-eval samples line" in err


def test_other_refusals(capsys, tmp_path):
    assert "no task or group 'gsm8k'" in refused(capsys, TWIN, LOOPED, "--tasks", "gsm8k")
    assert "no metric 'acc_norm'" in refused(capsys, TWIN, LOOPED, "--metric", "acc_norm")
    assert "no such run" in refused(capsys, TWIN, str(tmp_path / "missing"))
    assert "n_resamples must be a positive integer" in refused(capsys, TWIN, LOOPED, "--n-resamples", "0")


@pytest.mark.slow
def test_the_installed_command_exits_2_with_the_reason_on_stderr():
    proc = subprocess.run([sys.executable, "-m", "loopeval", "compare", TWIN, str(RUNS / "limited")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("loopeval compare: error:") and "--limit" in proc.stderr
    assert "Traceback" not in proc.stderr
