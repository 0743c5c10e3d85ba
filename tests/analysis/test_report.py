"""The two-test report: its numbers against loopeval.analysis.stats on fixture runs made by lm-eval,
its bad input, its fairness checks, templates, the demo end to end, and the page in a browser."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from markupsafe import escape

from loopeval.cli import main
from loopeval.analysis.report import build_report, render, write_report
from loopeval.analysis.stats import paired_bootstrap, paired_tost
from support import read_records

TASKS = ["toy_arith", "toy_aime"]  # the generative toy tasks: both carry a cost trace
SETTINGS = {
    "twin_plain_1x": "pretrained=toy/twin,p=0.5,seed=0",
    "twin_plain_0.5x": "pretrained=toy/twin,p=0.5,seed=0,budget_scale=0.5",
    "looped_plain_1x": "pretrained=toy/looped,p=0.7,seed=1,cost=1.25",
    "looped_plain_0.5x": "pretrained=toy/looped,p=0.7,seed=1,cost=1.25,budget_scale=0.5",
    "twin_bf_1x": "pretrained=toy/twin,p=0.5,seed=0,budget_forcing=true",
    "looped_bf_1x": "pretrained=toy/looped,p=0.7,seed=1,cost=1.25,budget_forcing=true",
    "larger": "pretrained=toy/big,p=0.8,seed=2,params=2e6,layers=8",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, make_runs) -> Path:
    root = tmp_path_factory.mktemp("report_runs")
    for name, args in SETTINGS.items():
        make_runs.make_run(root / name, args, tasks=TASKS)
    return root


def _pick(root: Path, prefix: str) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.startswith(prefix))


def _item_scores(run: Path, task: str) -> np.ndarray:
    """Per-item scores read straight from lm-eval's samples file, ordered by doc_id."""
    (file,) = run.rglob(f"samples_{task}_*.jsonl")
    rows = read_records(file)
    by_doc = {}
    for r in rows:
        if r["filter"] == "strict-match" or task == "toy_aime":
            by_doc.setdefault(r["doc_id"], []).append(r["exact_match"])
    return np.array([np.mean(by_doc[d]) for d in sorted(by_doc)])


def _trace_cost(run: Path, mode: str) -> float:
    """A run's cost straight from its trace file: FLOPs, or generated tokens x layer passes."""
    (file,) = run.rglob("loopeval_trace_*.jsonl")
    items = [json.loads(line) for line in file.read_text().splitlines()[1:]]
    if mode == "flops":
        return sum(i["flops"] for i in items)
    return sum(i["generated_tokens"] * i["passes_per_token"] for i in items)


def test_report_numbers_equal_loopeval_stats(runs):
    with pytest.warns(UserWarning, match="no training_manifest.json"):
        data = build_report(_pick(runs, "twin_"), _pick(runs, "looped_"), n_resamples=2000)
    plain = next(c for c in data.conditions if not c.forcing)
    twin = {t: _item_scores(runs / "twin_plain_1x", t) for t in TASKS}
    looped = {t: _item_scores(runs / "looped_plain_1x", t) for t in TASKS}
    expected = paired_bootstrap(twin, looped, n_resamples=2000)
    m = plain.param.macro
    assert m.delta == pytest.approx(np.mean([looped[t].mean() - twin[t].mean() for t in TASKS]))
    assert (m.ci.low, m.ci.high, m.pvalue) == pytest.approx((expected.ci.low, expected.ci.high, expected.pvalue))
    # 60 items: below the bootstrap's small-sample threshold, so the equivalence interval is Tango's.
    eq = paired_tost(twin["toy_arith"], looped["toy_arith"])
    assert plain.param.tasks["toy_arith"].equivalence_method == "tango"
    assert plain.param.tasks["toy_arith"].equivalence_ci == pytest.approx(tuple(eq.ci))
    row = next(r for r in data.decoding if r["setting"] == "looped")
    assert row["macros"] == {"points": pytest.approx(np.mean([looped[t].mean() for t in TASKS]))}
    for mode, column in (("passes", "loop_cost"), ("flops", "loop_other_cost")):  # the paper's charge, and FLOPs
        base = _trace_cost(runs / "twin_plain_1x", mode)
        costs = {f.result.loop: getattr(f, column) for f in plain.flop_rows}
        assert costs["looped @ 0.5×"] == pytest.approx(_trace_cost(runs / "looped_plain_0.5x", mode) / base)
        assert costs["looped @ 1×"] == pytest.approx(_trace_cost(runs / "looped_plain_1x", mode) / base)
    assert plain.verdict.sentences[0].startswith("Equal parameters: the loop beats its twin by")
    html = render(data)
    assert f"{100 * np.mean([twin[t].mean() for t in TASKS]):.1f} → " in html
    for sentence in plain.verdict.sentences:  # the report prints protocol.verdict's own sentences
        assert str(escape(sentence)) in html
    assert json.loads(data.to_json())["conditions"][0]["param"]["macro"]["delta"] == pytest.approx(
        data.conditions[0].param.macro.delta)


def test_bad_input_names_the_run(runs, tmp_path):
    looped = _pick(runs, "looped_")
    twins = [p for p in _pick(runs, "twin_") if p.name != "twin_plain_1x"]
    with pytest.raises(ValueError, match=r"missing twin run at the default budget \(1×, plain decoding\).*looped_plain"):
        build_report(twins, looped)
    with pytest.raises(ValueError, match="given as unlooped but its trace records a loop"):
        build_report(looped, looped)
    other = tmp_path / "other_task"
    shutil.copytree(runs / "twin_plain_1x", other)
    for file in other.rglob("*.json*"):
        file.write_text(file.read_text().replace("toy_aime", "toy_other"))
    for file in other.rglob("samples_toy_aime_*"):
        file.rename(file.with_name(file.name.replace("toy_aime", "toy_other")))
    with pytest.raises(ValueError, match="runs cover different tasks.*other_task: toy_arith, toy_other"):
        build_report([*twins, other], looped)


def _with_setting(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    (trace,) = dst.rglob("loopeval_trace_*.jsonl")
    lines = trace.read_text().splitlines()
    header = json.loads(lines[0])
    header["decoding"].update(changes)
    trace.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    return dst


def test_different_decoding_settings_warn_or_fail_with_strict(runs, tmp_path, capsys):
    twins = [p for p in _pick(runs, "twin_") if p.name != "twin_plain_1x"]
    twins.append(_with_setting(runs / "twin_plain_1x", tmp_path / "twin_plain_1x", dtype="bfloat16"))
    with pytest.warns(UserWarning, match="fairness check failed"):
        data = build_report(twins, _pick(runs, "looped_"), n_resamples=500)
    html = render(data)
    assert 'id="failed-checks"' in html
    assert html.index('id="failed-checks"') < html.index('id="table-param"')  # shown first, not hidden
    assert "dtype: &#39;float32&#39; vs &#39;bfloat16&#39;" in html  # autoescaped
    # issue 31: a failed check withholds every verdict (the figures stay), unless the difference is intended
    assert all(c.verdict.withheld and not c.verdict.final for c in data.conditions)
    assert "Verdict withheld" in html and "passes" not in " ".join(data.conditions[0].verdict.sentences)
    assert any(name.startswith("same decoding") for name in data.conditions[0].verdict.withheld)
    with pytest.warns(UserWarning, match="fairness check failed"):  # these runs have no training manifest
        meant = build_report(twins, _pick(runs, "looped_"), n_resamples=500, intended_differences=("dtype",))
    assert [c.name for c in meant.failed_checks] == ["twins share their training manifest"]
    assert not any(c.verdict.withheld for c in meant.conditions)  # a manifest that cannot be confirmed qualifies
    assert [c.param.macro.delta for c in meant.conditions] == [c.param.macro.delta for c in data.conditions]
    code = main(["report", "--strict", "--out", str(tmp_path / "r.html"), "--n-resamples", "200",
                 "--twin", *map(str, twins), "--looped", *map(str, _pick(runs, "looped_"))])
    assert code == 2 and "fairness check failed" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_custom_template(runs, tmp_path):
    with pytest.warns(UserWarning):
        data = build_report(_pick(runs, "twin_"), _pick(runs, "looped_"), n_resamples=500, title="<script>x</script>")
    template = tmp_path / "mine.md.j2"
    template.write_text("{{ data.title }}\n{% for c in data.conditions %}{{ c.label }}: {{ c.param.macro.delta|signed }}\n{% endfor %}")
    lines = render(data, template).splitlines()
    assert lines[0] == "&lt;script&gt;x&lt;/script&gt;"  # autoescaped
    delta = next(c for c in data.conditions if not c.forcing).param.macro.delta
    assert lines[1] == f"plain decoding: {100 * delta:+.1f}"


def test_compare_warns_when_the_runs_decode_differently(runs, capsys):
    from loopeval.analysis.runs import decoding_differences, load_run

    assert decoding_differences(load_run(runs / "twin_plain_1x"), load_run(runs / "looped_plain_1x")) == []
    diffs = decoding_differences(load_run(runs / "twin_plain_0.5x"), load_run(runs / "looped_bf_1x"))
    assert diffs[:2] == ["budget_forcing: False vs True", "bf_reserve: None vs 4"]
    assert "budget_scale: 0.5 vs 1.0" in diffs
    assert main(["compare", str(runs / "twin_plain_0.5x"), str(runs / "looped_bf_1x")]) == 0
    captured = capsys.readouterr()
    assert "warning: the runs decode differently: budget_forcing: False vs True" in captured.err
    # a failed fairness check withholds every outcome and equivalence verdict, in the text and the JSON
    assert captured.out.startswith("verdict withheld: the runs decode differently (budget_forcing: False vs True")
    rows = [line.split() for line in captured.out.splitlines() if line.split()[:1] in (["toy_arith"], ["macro"])]
    assert rows and all(row[-2:] == ["withheld", "withheld"] for row in rows)
    assert main(["compare", str(runs / "twin_plain_0.5x"), str(runs / "looped_bf_1x"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {(r["outcome"], r["equivalent"]) for r in [*out["tasks"].values(), out["macro"]]} == {("withheld", None)}
    # named as intended, the same differences leave the verdict standing
    intended = sorted({d.split(":")[0] for d in diffs if " " not in d.split(":")[0]})
    assert main(["compare", str(runs / "twin_plain_0.5x"), str(runs / "looped_bf_1x"), "--json",
                 "--intended", *intended]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["withheld"] == [] and out["macro"]["outcome"] in ("better", "worse", "equivalent", "inconclusive")
    assert main(["compare", str(runs / "twin_plain_0.5x"), str(runs / "looped_bf_1x"), "--intended", "chat"]) == 2
    assert "--intended chat: not a part of an evaluation that can differ" in capsys.readouterr().err


# -- the demo, end to end (slow) --------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "loopeval", "demo", "--size", "tiny", "--out", str(out)],
        capture_output=True, text=True, timeout=900, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out, proc.stdout


@pytest.mark.slow
def test_demo_writes_every_stage(demo):
    out, stdout = demo
    assert (out / "report.html").is_file() and (out / "study.yaml").is_file()
    assert len([p for p in (out / "evals").iterdir() if not p.name.startswith(".")]) == 16
    assert (out / "checkpoints" / "twin" / "training_manifest.json").is_file()
    assert json.loads((out / "checkpoints" / "looped" / "loop_config.json").read_text())["loop"] == "2:4x2"
    train = {json.loads(line)["prompt"] for line in (out / "data" / "train.jsonl").read_text().splitlines()}
    test = [json.loads(line)["question"] for line in (out / "data" / "test.jsonl").read_text().splitlines()]
    assert not any(q in p for q in test for p in train)  # decontaminated
    assert "5/5" in stdout and f"open {out / 'report.html'}" in stdout
    assert "fatal:" not in stdout
    data = build_report(_pick(out / "evals", "twin__"), _pick(out / "evals", "looped__"), n_resamples=500)
    assert all(c.ok for c in data.checks), [c for c in data.checks if not c.ok]  # real twins, real traces
    assert json.loads((out / "report.json").read_text())["conditions"][0]["param"]["macro"]["delta"] == pytest.approx(
        data.conditions[0].param.macro.delta)  # the report the protocol runner wrote


def _chromium() -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium is missing, and .ci/run installs it")
        pytest.skip("needs Debian's chromium (apt-get install chromium); .ci/run installs it")
    return chromium


@pytest.mark.slow
def test_report_in_headless_chromium(demo, tmp_path):
    """The report as a browser sees it: every table and the figure are in the DOM."""
    chromium = _chromium()
    out, _ = demo
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    url = (out / "report.html").resolve().as_uri()
    dom = subprocess.run([chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    for table in ("table-param", "table-flop", "table-benchmarks", "table-decoding", "table-runs"):
        assert f'id="{table}"' in dom
    assert dom.count('id="series-') == 4  # 4 curves: twin and looped, plain and budget forcing
    assert "Equal parameters:" in dom and "Equal FLOPs:" in dom
    shot = tmp_path / "report.png"
    subprocess.run([chromium, *flags, "--window-size=1200,2400", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120)
    assert shot.stat().st_size > 50_000


# -- variants, seeds and the paper's remaining tables -------------------------------------------


def test_runs_without_seeds_are_refused_and_explicit_seeds_pair_by_seed(runs, tmp_path, make_runs):
    from loopeval.analysis.report import RunSpec
    from loopeval.analysis.stats import order_interval

    make_runs.make_run(tmp_path / "twin_s1", "pretrained=toy/twin,p=0.55,seed=5", tasks=TASKS)
    make_runs.make_run(tmp_path / "looped_s1", "pretrained=toy/looped,p=0.6,seed=6,cost=1.25", tasks=TASKS)
    twins = [runs / "twin_plain_1x", tmp_path / "twin_s1"]
    loops = [runs / "looped_plain_1x", tmp_path / "looped_s1"]
    with pytest.raises(ValueError, match=r"2 runs of twin @ 1× but .*twin_plain_1x, .*twin_s1 has no training seed"):
        build_report(twins, loops)
    with pytest.warns(UserWarning, match="training manifest"):
        data = build_report([RunSpec(p, seed=s) for p, s in zip(twins, (0, 1))],
                            [RunSpec(p, seed=s) for p, s in zip(loops, (0, 1))], n_resamples=1000)
    (plain,) = data.conditions
    assert plain.param.seeds.n == 2 and len(plain.param.per_seed) == 2
    for s, (t, loop) in enumerate(zip(twins, loops)):
        a = {task: _item_scores(t, task) for task in TASKS}
        b = {task: _item_scores(loop, task) for task in TASKS}
        assert plain.param.per_seed[s].delta == pytest.approx(np.mean([b[k].mean() - a[k].mean() for k in TASKS]))
    ref = order_interval({"seeds": [s.delta for s in plain.param.per_seed]})
    assert plain.seed_interval.ci == pytest.approx(tuple(ref.ci))
    with pytest.raises(ValueError, match="share a training seed"):
        build_report([RunSpec(p, seed=0) for p in twins], [RunSpec(p, seed=s) for p, s in zip(loops, (0, 1))])


def test_one_checkpoint_given_as_two_seeds_is_refused_by_its_weights(tmp_path, make_runs):
    """Two evaluations of the same weights (the trace's fingerprint), given as seeds 0 and 1,
    would count one checkpoint twice."""
    from loopeval.analysis.report import RunSpec

    for name, args in (("t0", "pretrained=toy/twin,p=0.5,seed=0,weights=w-twin"),
                       ("t1", "pretrained=toy/twin-copy,p=0.55,seed=5,weights=w-twin"),
                       ("l0", "pretrained=toy/looped,p=0.7,seed=1,cost=1.25,weights=w-a"),
                       ("l1", "pretrained=toy/looped,p=0.6,seed=6,cost=1.25,weights=w-b")):
        make_runs.make_run(tmp_path / name, args, tasks=TASKS)
    with pytest.raises(ValueError, match=r"runs of twin @ 1×: .*t0 \(seed 0\) and .*t1 \(seed 1\) evaluated the same "
                                         r"weights \(fingerprint w-twin\): one checkpoint is one seed"):
        build_report([RunSpec(tmp_path / n, seed=s) for n, s in (("t0", 0), ("t1", 1))],
                     [RunSpec(tmp_path / n, seed=s) for n, s in (("l0", 0), ("l1", 1))], n_resamples=200)


def test_the_best_cheaper_search_spans_every_twin_variant(runs, tmp_path, make_runs):
    from loopeval.analysis.report import RunSpec

    # a twin fine-tuned longer: more accurate, as cheap per token
    make_runs.make_run(tmp_path / "twin_3x", "pretrained=toy/twin3,p=0.66,seed=0", tasks=TASKS)
    twins = [runs / "twin_plain_1x", runs / "twin_plain_0.5x", RunSpec(tmp_path / "twin_3x", variant="3x FT")]
    with pytest.warns(UserWarning):
        data = build_report(twins, [runs / "looped_plain_1x", runs / "looped_plain_0.5x"], n_resamples=1000)
    rows = {row.result.loop: row.result for row in data.conditions[0].flop_rows}
    chosen = rows["looped @ 1×"]
    assert set(chosen.costs) == {"twin @ 1×", "twin @ 0.5×", "twin, 3x FT @ 1×"}
    eligible = {n: a for n, a in chosen.accuracies.items() if chosen.costs[n] <= chosen.loop_cost}
    assert chosen.comparator == max(eligible, key=eligible.get) == "twin, 3x FT @ 1×"  # the variant that won


def test_a_training_free_loop_is_decided_by_exact_mcnemar(tmp_path, make_runs):
    from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar

    from loopeval.analysis.protocol import delta_param
    from loopeval.analysis.runs import load_run

    kinds = {"twin": "pretrained=toy/twin,p=0.5,seed=0,weights=w0",
             "free": "pretrained=toy/looped,p=0.62,seed=1,cost=1.25,weights=w0",  # the twin's own weights
             "trained": "pretrained=toy/looped,p=0.62,seed=1,cost=1.25,weights=w1"}
    for name, args in kinds.items():
        make_runs.make_run(tmp_path / name, args, tasks=["toy_arith"])
    twin = load_run(tmp_path / "twin")
    free = delta_param(twin, load_run(tmp_path / "free"), n_resamples=1000)
    trained = delta_param(twin, load_run(tmp_path / "trained"), n_resamples=1000)
    assert (free.test, trained.test) == ("mcnemar", "bootstrap")
    a, b = _item_scores(tmp_path / "twin", "toy_arith"), _item_scores(tmp_path / "free", "toy_arith")
    table = [[np.sum((a == 1) & (b == 1)), np.sum((a == 1) & (b == 0))], [np.sum((a == 0) & (b == 1)), np.sum((a == 0) & (b == 0))]]
    exact = sm_mcnemar(table, exact=True).pvalue
    assert free.macro.pvalue_decisive == pytest.approx(exact) and free.macro.decided_by == "mcnemar"
    assert free.tasks["toy_arith"].pvalue_decisive == pytest.approx(exact)
    assert trained.macro.pvalue_decisive == trained.macro.pvalue  # the bootstrap decides a trained loop
    # a sampled (AIME-style) task is not deterministic: the bootstrap decides
    make_runs.make_run(tmp_path / "twin_s", "pretrained=toy/twin,p=0.5,seed=0,weights=w0", tasks=TASKS)
    make_runs.make_run(tmp_path / "free_s", "pretrained=toy/looped,p=0.62,seed=1,cost=1.25,weights=w0", tasks=TASKS)
    assert delta_param(load_run(tmp_path / "twin_s"), load_run(tmp_path / "free_s"), n_resamples=500).test == "bootstrap"


def test_the_appendix_tables_equal_loopeval_stats(runs):
    import math

    from statsmodels.stats.multitest import multipletests

    with pytest.warns(UserWarning):
        data = build_report(_pick(runs, "twin_"), _pick(runs, "looped_"), larger=runs / "larger", sizes=(4e9, 9e9),
                            n_resamples=2000)
    plain = next(c for c in data.conditions if c.condition == "plain")
    raw = [plain.param.tasks[t].pvalue for t in plain.param.tasks]
    assert [plain.param.tasks[t].pvalue_holm for t in plain.param.tasks] == pytest.approx(
        list(multipletests(raw, method="holm")[1]))  # Table 8
    # §B.1: the items both finish, read from the trace files
    for task, n in plain.finished_both.finished.items():
        done = {}
        for side in ("twin_plain_1x", "looped_plain_1x"):
            (file,) = (runs / side).rglob("loopeval_trace_*.jsonl")
            for rec in map(json.loads, file.read_text().splitlines()[1:]):
                if rec["task"] == task:
                    done[(side, rec["doc_id"])] = done.get((side, rec["doc_id"]), True) and rec["finished"]
        ids = {d for (_, d) in done}
        both = [d for d in sorted(ids) if done[("twin_plain_1x", d)] and done[("looped_plain_1x", d)]]
        assert n == len(both)
        a, b = _item_scores(runs / "twin_plain_1x", task)[both], _item_scores(runs / "looped_plain_1x", task)[both]
        row = plain.finished_both.comparison.tasks[task]
        assert (row.baseline_accuracy, row.candidate_accuracy) == pytest.approx((a.mean(), b.mean()))
    # Table 5: Eq. 4 by hand, the twin as the small model, the larger model's accuracy from its samples
    small = np.mean([_item_scores(runs / "twin_plain_1x", t).mean() for t in TASKS])
    large = np.mean([_item_scores(runs / "larger", t).mean() for t in TASKS])
    assert data.ceiling.delta_star == pytest.approx(math.log(1.25) / math.log(9 / 4) * (large - small))
    # Table 3's lower rows: the larger model costs more than the loop, and is compared all the same
    row = next(r.result for r in plain.flop_rows if r.result.loop == "looped @ 1×")
    assert row.costs["larger @ 1×"] > row.loop_cost and "larger @ 1×" in row.costlier
    assert row.costlier["larger @ 1×"].macro.baseline_accuracy == pytest.approx(large)


def test_bad_comparators_are_refused(runs):
    with pytest.raises(ValueError, match=r"given as --larger, but its trace records a loop \(1:2x2\)"):
        build_report(_pick(runs, "twin_"), _pick(runs, "looped_"), larger=runs / "looped_bf_1x")
    with pytest.raises(ValueError, match="twin_plain_1x is given twice"):
        build_report([*_pick(runs, "twin_"), runs / "twin_plain_1x"], _pick(runs, "looped_"))


def test_cli_writes_figures_and_latex_and_refuses_bad_output_before_any_work(runs, tmp_path, capsys, monkeypatch):
    twins, loops = [str(p) for p in _pick(runs, "twin_")], [str(p) for p in _pick(runs, "looped_")]
    out = tmp_path / "r.html"
    args = ["report", "--twin", *twins, "--looped", *loops, "--n-resamples", "300"]
    with pytest.warns(UserWarning):
        assert main([*args, "--out", str(out), "--latex", "--json", str(tmp_path / "r.json")]) == 0
    for name in ("r.html", "r_cost.pdf", "r_cost.png", "r_tables.tex", "r.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    tex = (tmp_path / "r_tables.tex").read_text()
    assert tex.count(r"\begin{table}") == 4 and r"\toprule" in tex and "budget forcing" in tex
    assert "Equal parameters: the loop beats its twin" in capsys.readouterr().out

    import loopeval.analysis.report

    monkeypatch.setattr(loopeval.analysis.report, "build_report", lambda *a, **k: pytest.fail("computed before the check"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for bad, message in [(["--out", str(tmp_path)], "is a folder"),
                         (["--out", str(blocker / "r.html")], "is a file, not a folder"),
                         (["--json", str(blocker / "r.json")], "--json .* is a file, not a folder"),
                         (["--template", str(tmp_path / "none.j2")], "--template .*none.j2: no such template"),
                         (["--seed", "runs/x=1"], "--seed/--variant name runs/x, which is not among the runs"),
                         (["--seed", f"{twins[0]}=one"], "--seed='one': expected a whole number")]:
        assert main([*args, *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and __import__("re").search(message, err), (bad, err)


def test_the_training_section_draws_the_exchange_rate(runs, tmp_path):
    """Twin pair manifests whose looped loss after D tokens is the twin's after 1.5 D: the
    report's r(D) is 1.5 at every checkpoint the twin's curve covers, and the figure is written."""
    import math

    tokens = [100.0 * 2**i for i in range(8)]
    loss = lambda d: 5.0 - math.log(d)  # noqa: E731  (straight in log tokens: interpolation is exact)
    for role, factor in (("twin", 1.0), ("looped", 1.5)):
        folder = tmp_path / role
        folder.mkdir()
        points = [{"step": i, "tokens": d, "loss": loss(factor * d)} for i, d in enumerate(tokens, 1)]
        (folder / "training_manifest.json").write_text(json.dumps({
            "format": "loopeval-training/2", "recipe": "cpt", "role": role,
            "loop": {"loop": "1:3x2"} if role == "looped" else None, "heldout_curve": points,
            "tokens": {"input": tokens[-1]}, "flops": {"train": tokens[-1], "multiplier": 1.25 if role == "looped" else 1},
            "train_time_s": tokens[-1], "blocks": {"total": 8.0 * 10 * factor, "teacher": 0.0, "per_step": [8.0 * factor] * 10},
            "step_seconds": [0.5 * factor] * 10, "budget": {"steps_run": 10, "stopped_by": None},
            "final_weights_sha256": role}))
    with pytest.warns(UserWarning):
        data = build_report(_pick(runs, "twin_"), _pick(runs, "looped_"), n_resamples=300,
                            training_pairs=[(tmp_path / "twin", tmp_path / "looped")])
    (section,) = data.training
    rates = [r for r in section["exchange"]["rate"] if r is not None]
    assert rates == pytest.approx([1.5] * (len(tokens) - 1))  # the last point lies past the twin's curve
    out = write_report(data, tmp_path / "r.html")
    assert (tmp_path / "r_training.pdf").stat().st_size > 0 and 'id="figure-training"' in out.read_text()
    assert [(c["method"], c["blocks"], c["blocks_per_step"], c["seconds_per_step"]) for c in data.training_costs] == [
        ("cpt (twin)", 80.0, 8.0, 0.5), ("cpt", 120.0, 12.0, 0.75)]
    assert 'id="table-training-cost"' in out.read_text()
    with pytest.raises(ValueError, match="give the twin's checkpoint first"):
        build_report(_pick(runs, "twin_"), _pick(runs, "looped_"), training_pairs=[(tmp_path / "looped", tmp_path / "twin")])


def test_the_serving_section_shows_table_10(runs, tmp_path):
    """A serve_cost.json holding the paper's 0.8B row of Table 10 (20.6 -> 25.3 ms, 6,842 ->
    5,286 tokens/s at batch 693 -> 710, 1.5 GB): the report prints its ratios, 1.23 and 0.77."""
    from loopeval.evaluation.serving import ModelServing, ServeCost, Spread

    def side(name, loop, passes, ms, rate, batch):
        return ModelServing(name=name, loop=loop, passes=passes, generation_flops=passes * 1e9, weight_bytes=10**9,
                            kv_bytes_per_token=passes * 1024, state_bytes_per_sequence=0,
                            prefill_s=Spread.of([0.05]), latency_s=Spread.of([ms / 1e3]),
                            throughput={1: Spread.of([1e3 / ms]), batch: Spread.of([rate])}, max_batch=batch,
                            peak_memory_bytes=1.5e9, memory_growth_per_token=passes * 1024)

    served = ServeCost((side("unlooped", None, 24, 20.6, 6842, 693), side("looped", "0:8x2", 32, 25.3, 5286, 710)),
                       {"device": "cuda", "gpu": "H100", "dtype": "bfloat16", "cache": "paged"}, engine="vllm",
                       engine_version="0.32.0")
    served.write(tmp_path / "serve")
    with pytest.warns(UserWarning):
        data = build_report(_pick(runs, "twin_"), _pick(runs, "looped_"), n_resamples=300,
                            serve_cost=[tmp_path / "serve"])
    (row,) = data.serving
    assert (round(row["latency"], 2), round(row["throughput"], 2), row["multiplier"]) == (1.23, 0.77, 32 / 24)
    html = write_report(data, tmp_path / "r.html").read_text()
    table = html[html.index('id="table-serving"'):]
    for text in ("20.60 → 25.30", "<b>1.23</b>", "6,842 → 5,286", "<b>0.77</b>", "693 → 710", "1.50 → 1.50", "H100", "vllm 0.32.0"):
        assert text in table[:table.index("</table>")]
    with pytest.raises(ValueError, match="no serve_cost.json"):
        build_report(_pick(runs, "twin_"), _pick(runs, "looped_"), serve_cost=[tmp_path])


def test_wall_clock_puts_looped_points_at_their_measured_latency(runs, tmp_path):
    """The fixture loop 1:2x2 charges c = 5/4 passes; measured at 20 -> 26 ms per token
    (x1.3, inside what c allows), each looped point of Figure 2 moves by 1.3 / 1.25 = 1.04, unlooped
    points stay; a latency ratio c does not allow is refused."""
    from loopeval.evaluation.serving import ModelServing, ServeCost, Spread

    def side(loop, passes, ms):
        return ModelServing(name=loop or "unlooped", loop=loop, passes=passes, generation_flops=passes * 1e9,
                            weight_bytes=10**9, kv_bytes_per_token=passes, state_bytes_per_sequence=0,
                            prefill_s=Spread.of([0.05]), latency_s=Spread.of([ms / 1e3]),
                            throughput={1: Spread.of([1e3 / ms])}, max_batch=1, peak_memory_bytes=10**9,
                            memory_growth_per_token=passes)

    ServeCost((side(None, 4, 20.0), side("1:2x2", 5, 26.0)), {"device": "cpu"}).write(tmp_path / "serve")
    twins, looped = _pick(runs, "twin_"), _pick(runs, "looped_")
    with pytest.warns(UserWarning):
        charged = build_report(twins, looped, n_resamples=300)
    with pytest.warns(UserWarning):
        timed = build_report(twins, looped, n_resamples=300, serve_cost=[tmp_path / "serve"], wall_clock=True)
    assert timed.wall_clock == pytest.approx(1.04)
    for a, b in zip(charged.figure, timed.figure):
        for p, q in zip(a["points"], b["points"]):
            assert q["x"] == pytest.approx(p["x"] * (1.04 if a["looped"] else 1.0)) and q["y"] == p["y"]
    assert "measured decode time" in render(timed)
    with pytest.raises(ValueError, match="--wall-clock needs one --serve-cost measurement of the loop 1:2x2"):
        build_report(twins, looped, wall_clock=True)
    with pytest.raises(ValueError, match="drop --cost flops"):
        build_report(twins, looped, serve_cost=[tmp_path / "serve"], wall_clock=True, cost="flops")
    ServeCost((side(None, 4, 20.0), side("1:2x2", 5, 16.0)), {"device": "cpu"}).write(tmp_path / "fast")
    with pytest.raises(ValueError, match=r"fast's latency is unreliable: latency x0.800 .* faster than the unlooped"):
        build_report(twins, looped, serve_cost=[tmp_path / "fast"], wall_clock=True)


def test_a_training_free_report_needs_no_manifest_and_opens_with_the_verdict(tmp_path, make_runs):
    # Issue 24: a training-free loop (the twin's own weights) has no training to compare, so a
    # missing training_manifest.json is no fairness failure; a trained loop without one still is.
    for name, args in {"twin": "pretrained=toy/twin,p=0.5,seed=0,weights=w0",
                       "free": "pretrained=toy/looped,p=0.62,seed=1,cost=1.25,weights=w0",
                       "trained": "pretrained=toy/looped,p=0.62,seed=1,cost=1.25,weights=w1"}.items():
        make_runs.make_run(tmp_path / name, args, tasks=["toy_arith"])
    data = build_report([tmp_path / "twin"], [tmp_path / "free"], n_resamples=500)
    assert data.failed_checks == []
    (check,) = [c for c in data.checks if c.name.startswith("training-free loop")]
    assert check.ok and "no training manifest is needed" in check.detail
    assert data.conditions[0].param.test == "mcnemar"
    page = render(data)
    assert "Fairness checks failed" not in page
    assert page.index('id="verdict"') < page.index('id="checks"')
    with pytest.warns(UserWarning, match="no training_manifest.json"):
        trained = build_report([tmp_path / "twin"], [tmp_path / "trained"], n_resamples=500)
    page = render(trained)
    assert page.index('id="verdict"') < page.index('id="failed-checks"') < page.index('id="table-param"')


def test_a_pilots_tables_say_so(runs):
    from loopeval.analysis.report.latex import tables

    with pytest.warns(UserWarning, match="no training_manifest.json"):
        data = build_report(_pick(runs, "twin_"), _pick(runs, "looped_"), n_resamples=200)
    data.pilot = "pilot: 10 of 60 items"  # as build_report sets it from --limit runs (--allow-subset)
    tex = tables(data)
    assert tex.count(r"\caption{Pilot: 10 of 60 items, not final. ") == tex.count(r"\caption{") == 4
    page = render(data)
    assert page.count("(pilot: 10 of 60 items)") >= 6 and 'id="pilot"' in page


def test_a_missing_default_budget_names_the_flag(runs):
    with pytest.raises(ValueError, match=r"no unlooped run at the default budget 2× \(unlooped runs are at 0.5×, 1×\); "
                                         r"name the default budget with --default-scale"):
        build_report(_pick(runs, "twin_"), _pick(runs, "looped_"), default_scale=2.0, n_resamples=200)
