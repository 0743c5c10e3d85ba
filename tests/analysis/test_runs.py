"""loopeval.analysis.runs and loopeval.analysis.protocol on lm-eval output folders (tests/fixtures/runs, made by lm-eval)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests

from loopeval.analysis.protocol import delta_flop, delta_param, verdict
from loopeval.analysis.runs import load_run, pair_runs
from loopeval.analysis.stats import paired_bootstrap
from support import read_records

RUNS = Path(__file__).parents[1] / "fixtures" / "runs"
TRACED = ["toy_arith", "toy_aime"]  # the generative tasks; the multiple-choice task has no trace


def results_file(folder: str, which: int = -1) -> Path:
    return sorted((RUNS / folder).glob("*/results_*.json"))[which]


def samples(results: Path, task: str) -> Path:
    return results.with_name(f"samples_{task}_{results.stem.split('_', 1)[1]}.jsonl")


def raw_scores(results: Path, task: str, metric: str, filt: str) -> dict[int, float]:
    """Per-item scores read straight from lm-eval's samples file."""
    out = {}
    for line in samples(results, task).read_text().splitlines():
        rec = json.loads(line)
        if rec["filter"] == filt:
            out[rec["doc_id"]] = rec[metric]
    return out


def raw_trace(*paths: Path) -> dict[tuple, list[float]]:
    """``{(task, doc_id): [flops, tokens, layer passes]}`` summed over the records of the given trace files."""
    out = {}
    for path in paths:
        for line in path.read_text().splitlines()[1:]:
            rec = json.loads(line)
            total = out.setdefault((rec["task"], rec["doc_id"]), [0.0, 0, 0])
            total[0] += rec["flops"]
            total[1] += rec["prompt_tokens"] + rec["generated_tokens"]
            total[2] += rec["generated_tokens"] * rec["passes_per_token"]
    return out


def total_flops(*paths: Path) -> float:
    return sum(f for f, _, _ in raw_trace(*paths).values())


def copy_run(tmp_path: Path, folder: str) -> Path:
    dest = tmp_path / folder
    shutil.copytree(RUNS / folder, dest)
    return dest


def rewrite_samples(path: Path, change) -> None:
    lines = read_records(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in change(lines)))


# ---------------------------------------------------------------- loading


def test_output_folder_model_folder_and_results_file_load_the_same_run():
    latest = results_file("looped")
    runs = [load_run(RUNS / "looped"), load_run(latest.parent), load_run(latest)]
    assert {r.path for r in runs} == {latest}
    assert runs[0].name == "toy__looped"
    for task in ("toy_arith", "toy_mc", "toy_aime"):
        np.testing.assert_array_equal(runs[0].tasks[task].scores, runs[2].tasks[task].scores)


def test_the_latest_of_several_timestamps_is_taken():
    older, newer = results_file("looped", 0), results_file("looped", -1)
    assert older != newer
    run, old = load_run(RUNS / "looped"), load_run(older)
    acc = json.loads(newer.read_text())["results"]["toy_arith"]["exact_match,strict-match"]
    assert run.tasks["toy_arith"].accuracy == pytest.approx(acc)
    assert old.tasks["toy_arith"].accuracy != pytest.approx(acc)


@pytest.mark.parametrize("folder", ["twin", "looped", "twin_long", "big"])
def test_item_scores_reproduce_lm_evals_own_aggregates(folder):
    results = json.loads(results_file(folder).read_text())
    run = load_run(RUNS / folder)
    assert set(run.tasks) == {"toy_arith", "toy_mc", "toy_aime"}
    assert run.groups == {"toy_core": ("toy_arith", "toy_mc", "toy_aime")}
    for task, scores in run.tasks.items():
        assert scores.accuracy == pytest.approx(results["results"][task][scores.metric])
        assert scores.n == results["n-samples"][task]["original"] == len(scores.scores)
        np.testing.assert_array_equal(scores.doc_ids, np.arange(scores.n))
    assert run.accuracy() == pytest.approx(np.mean([run.tasks[t].accuracy for t in run.tasks]))


def test_main_metric_and_overrides():
    run = load_run(RUNS / "twin")
    assert {t: s.metric for t, s in run.tasks.items()} == {
        "toy_arith": "exact_match,strict-match", "toy_mc": "acc,none", "toy_aime": "exact_match,all"}
    flex = load_run(RUNS / "twin", metric="exact_match,flexible-extract", tasks=["toy_arith"])
    truth = raw_scores(results_file("twin"), "toy_arith", "exact_match", "flexible-extract")
    np.testing.assert_array_equal(flex.tasks["toy_arith"].scores, [truth[i] for i in range(60)])
    per_task = load_run(RUNS / "twin", metric={"toy_mc": "acc_norm"}, tasks=["toy_mc", "toy_arith"])
    assert per_task.tasks["toy_mc"].metric == "acc_norm,none"
    assert per_task.tasks["toy_arith"].metric == "exact_match,strict-match"
    with pytest.raises(ValueError, match="task toy_aime: no metric 'acc_norm'; it has \\['exact_match,all'\\]"):
        load_run(RUNS / "twin", metric="acc_norm")


def test_repeated_answers_are_one_item_scored_by_their_mean():
    aime = load_run(RUNS / "twin", tasks=["toy_aime"]).tasks["toy_aime"]
    truth = raw_scores(results_file("twin"), "toy_aime", "exact_match", "all")
    np.testing.assert_allclose(aime.scores, [truth[i] for i in range(12)])
    assert set(np.unique(aime.scores)) - {0, 0.25, 0.5, 0.75, 1} == set()
    assert all(len(recs) == 4 for recs in aime.trace)  # four traced generations per problem


def test_duplicate_records_of_an_item_collapse_when_identical_and_are_refused_otherwise(tmp_path):
    folder = copy_run(tmp_path, "twin")
    path = samples(sorted(folder.glob("*/results_*.json"))[-1], "toy_arith")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines + [lines[0]]) + "\n")  # the same record twice
    assert load_run(folder, tasks=["toy_arith"]).tasks["toy_arith"].accuracy == load_run(
        RUNS / "twin", tasks=["toy_arith"]).tasks["toy_arith"].accuracy
    first = json.loads(lines[0])
    first["exact_match"] = 1 - first["exact_match"]
    path.write_text("\n".join(lines + [json.dumps(first)]) + "\n")
    with pytest.raises(ValueError, match=rf"samples_toy_arith_.*:{len(lines) + 1}: doc_id {first['doc_id']} is "
                                         r"recorded twice with different scores \(first on line 1\)"):
        load_run(folder, tasks=["toy_arith"])


def test_task_and_group_selection():
    assert list(load_run(RUNS / "twin", tasks=["toy_core"]).tasks) == ["toy_arith", "toy_mc", "toy_aime"]
    assert list(load_run(RUNS / "twin", tasks=["toy_mc"]).tasks) == ["toy_mc"]
    with pytest.raises(ValueError, match="no task or group 'gsm8k'"):
        load_run(RUNS / "twin", tasks=["gsm8k"])


def test_configuration_is_kept():
    run, long = load_run(RUNS / "twin"), load_run(RUNS / "twin_long")
    assert run.model_args.startswith("pretrained=toy/twin,p=0.5")
    assert run.tasks["toy_arith"].generation_kwargs["max_gen_toks"] == 32
    assert long.tasks["toy_arith"].generation_kwargs["max_gen_toks"] == 48
    assert (run.tasks["toy_arith"].n_original, run.tasks["toy_arith"].n_effective) == (60, 60)
    (header,) = run.trace_headers
    assert header.loop is None and header.multiplier == 1.0 and header.decoding.dtype == "float32"


# ---------------------------------------------------------------- traces and costs


@pytest.mark.parametrize(("folder", "traces"), [("twin", "toy__twin/loopeval_trace_*"), ("looped", "loopeval_trace_*")])
def test_trace_costs_join_on_task_doc_id_and_prompt_hash(folder, traces):
    # twin keeps its trace in the model folder, looped in the --output_path folder above it,
    # which two looped runs share: the newer trace is the latest run's.
    run = load_run(RUNS / folder)
    truth = raw_trace(max((RUNS / folder).glob(traces)))
    for task in TRACED:
        scores = run.tasks[task]
        np.testing.assert_allclose(scores.flops, [truth[(task, d)][0] for d in scores.doc_ids])
        np.testing.assert_array_equal(scores.tokens, [truth[(task, d)][1] for d in scores.doc_ids])
    assert run.cost(TRACED, mode="flops") == pytest.approx(sum(f for f, _, _ in truth.values()))
    assert run.cost(TRACED, mode="flops", flops_per_token=3.0) == pytest.approx(3.0 * sum(t for _, t, _ in truth.values()))
    # the paper's charge: generated tokens x layer passes, in units of the model's average layer (1e6 / 4)
    assert run.cost(TRACED) == pytest.approx(2.5e5 * sum(p for _, _, p in truth.values()))
    # toy_mc scores letter log-likelihoods (nothing generated, no trace): only generation is charged,
    # and a task set that generates nothing is charged the loop's c per item
    assert run.cost() == run.cost(TRACED)
    c = run.header.multiplier
    assert run.cost(["toy_mc"]) == pytest.approx(2.5e5 * c * run.tasks["toy_mc"].n)


def test_an_older_run_in_a_shared_folder_keeps_its_own_trace():
    old, new = load_run(results_file("looped", 0)), load_run(RUNS / "looped")
    assert old.cost(TRACED) != new.cost(TRACED)
    assert len(old.trace_headers) == len(new.trace_headers) == 1


def _write_trace(folder: Path, created: float, flops: float, items) -> None:
    lines = [{"kind": "header", "format": 1, "created": created, "settings": {"note": flops}}]
    lines += [{"kind": "item", **{**item.__dict__, "flops": flops}} for item in items]
    (folder / f"loopeval_trace_{created}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_newest_trace_wins_but_traces_from_outside_the_run_are_ignored(tmp_path):
    folder = copy_run(tmp_path, "twin")
    run = load_run(folder, tasks=["toy_arith"])
    results = json.loads(run.path.read_text())
    own = json.loads(next(run.path.parent.glob("loopeval_trace_*")).read_text().splitlines()[0])["created"]
    items = [recs[0] for recs in run.tasks["toy_arith"].trace[:5]]
    _write_trace(run.path.parent, results["date"] + float(results["total_evaluation_time_seconds"]) + 1, 1.0, items)
    _write_trace(run.path.parent, results["date"] - 1, 2.0, items)  # later and earlier runs sharing the folder
    assert load_run(folder, tasks=["toy_arith"]).cost() == run.cost()
    _write_trace(run.path.parent, own + 0.001, 7.0, items)  # newer than the run's own trace, within the run
    flops = load_run(folder, tasks=["toy_arith"]).tasks["toy_arith"].flops
    assert (flops[:5] == 7.0).all() and (flops[5:] == run.tasks["toy_arith"].flops[5:]).all()


def test_items_missing_from_the_trace_are_refused_when_costs_are_needed(tmp_path):
    folder = copy_run(tmp_path, "twin")
    trace = next(folder.glob("*/loopeval_trace_*.jsonl"))
    lines = trace.read_text().splitlines()
    trace.write_text("\n".join(line for line in lines if '"doc_id": 7,' not in line or "toy_arith" not in line) + "\n")
    run = load_run(folder)
    assert run.tasks["toy_arith"].accuracy == load_run(RUNS / "twin").tasks["toy_arith"].accuracy
    with pytest.raises(ValueError, match="toy_arith: 1 of 60 items have no trace record.*doc_id 7.*the trace lost their lines.*evaluate again"):
        run.cost(["toy_arith"])
    # the missing record sits in a trace written after the run: it belongs to another run, and the error says so
    results = json.loads(run.path.read_text())
    late = results["date"] + float(results["total_evaluation_time_seconds"]) + 60
    items = [recs[0] for d, recs in zip(load_run(RUNS / "twin").tasks["toy_arith"].doc_ids,
                                        load_run(RUNS / "twin").tasks["toy_arith"].trace) if d == 7]
    _write_trace(trace.parent, late, 1.0, items)
    with pytest.raises(ValueError, match=r"doc_id 7; .*loopeval_trace_.* holds it but was written at .*, outside this "
                                         r"run's evaluation .*so it belongs to another run"):
        load_run(folder).cost(["toy_arith"])


def test_a_corrupt_trace_blocks_costs_but_not_accuracies(tmp_path):
    folder = copy_run(tmp_path, "twin")
    header = {"kind": "header", "format": 1, "created": 1.0, "settings": {}}
    (folder / "loopeval_trace_crashed.jsonl").write_text(json.dumps(header) + '\n{"ki')  # cut by a crash
    run = load_run(folder)
    assert run.accuracy() == load_run(RUNS / "twin").accuracy()
    with pytest.raises(ValueError, match=r"cannot read the cost traces: .*loopeval_trace_crashed.jsonl:2: corrupt"):
        run.cost(TRACED)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda h, items: [i.update(passes_per_token=4) for i in items],
     r"passes_per_token of item \(task \S+, doc_id \d+\) is 4, but the trace's loop 1:2x2 gives 5"),
    (lambda h, items: [h["cost"].update(passes=4, multiplier=1.0)] + [i.update(passes_per_token=4) for i in items],
     r"the cost's layer passes per token \(of 4 layers\) is 4, but the trace's loop 1:2x2 gives 5"),
    (lambda h, items: h["cost"].update(multiplier=1.0), r"the cost multiplier c is 1.0, but the trace's loop 1:2x2 gives 1.25"),
    (lambda h, items: h["cost"].update(loop="1:2x3"), r"the cost's loop is '1:2x3', but the trace's loop 1:2x2 gives '1:2x2'"),
    (lambda h, items: h.update(loop=None), r"the cost's loop is '1:2x2', but the trace's loop none \(unlooped\) gives None"),
])
def test_a_trace_that_disagrees_with_its_loop_is_refused(tmp_path, edit, message):
    """Issue 32: a trace edited to fewer passes was labelled with its loop and c = 1.000."""
    folder = copy_run(tmp_path, "looped")
    for path in folder.glob("loopeval_trace_*.jsonl"):
        header, *items = read_records(path)
        edit(header, items)
        path.write_text("".join(json.dumps(r) + "\n" for r in (header, *items)))
    run = load_run(folder)
    assert run.accuracy() == load_run(RUNS / "looped").accuracy()
    with pytest.raises(ValueError, match=message):
        run.cost(TRACED)


# ---------------------------------------------------------------- refusals


def test_a_run_cut_by_limit_is_refused():
    with pytest.raises(ValueError, match=r"task toy_aime: the run was cut by --limit \(10 of 12 items\)"):
        load_run(RUNS / "limited")
    with pytest.raises(ValueError, match=r"task toy_arith: the run was cut by --limit \(10 of 60 items\)"):
        load_run(RUNS / "limited", tasks=["toy_arith"])


def test_a_samples_file_missing_items_is_refused(tmp_path):
    folder = copy_run(tmp_path, "twin")
    path = samples(sorted(folder.glob("*/results_*.json"))[-1], "toy_arith")
    rewrite_samples(path, lambda recs: [r for r in recs if r["doc_id"] != 5])
    with pytest.raises(ValueError, match=r"toy_arith: .* has 59 of 60 items \(missing doc_id 5.*cover all of"):
        load_run(folder)


def test_a_corrupt_samples_line_names_file_and_line(tmp_path):
    folder = copy_run(tmp_path, "twin")
    path = samples(sorted(folder.glob("*/results_*.json"))[-1], "toy_mc")
    text = path.read_text()
    path.write_text(text[: len(text) - 200])  # a crash mid-write truncates the last line
    n = text.count("\n")
    with pytest.raises(ValueError, match=rf"samples_toy_mc_.*\.jsonl:{n}: corrupt lm-eval samples line"):
        load_run(folder)


def test_missing_samples_file_corrupt_results_and_ambiguous_folders(tmp_path):
    folder = copy_run(tmp_path, "twin")
    results = sorted(folder.glob("*/results_*.json"))[-1]
    samples(results, "toy_mc").unlink()
    with pytest.raises(ValueError, match="no samples file samples_toy_mc_.*--log_samples"):
        load_run(folder)
    load_run(folder, tasks=["toy_arith"])  # the other tasks still load
    results.write_text(results.read_text()[:100])
    with pytest.raises(ValueError, match="not a readable lm-eval results file"):
        load_run(folder)
    shutil.copytree(RUNS / "big" / "toy__big", folder / "toy__big")
    with pytest.raises(ValueError, match="several model folders"):
        load_run(folder)
    with pytest.raises(FileNotFoundError):
        load_run(tmp_path / "nowhere")


def test_pairing_checks_doc_hash_and_target_hash(tmp_path):
    twin = load_run(RUNS / "twin")
    folder = copy_run(tmp_path, "looped")
    path = samples(sorted(folder.glob("*/results_*.json"))[-1], "toy_arith")

    def tamper(recs):
        for r in recs:
            if r["doc_id"] == 3:
                r["doc_hash"] = "0" * 64
        return recs

    rewrite_samples(path, tamper)
    with pytest.raises(ValueError, match=r"task toy_arith: doc_hash differs for 1 of 60 items \(first doc_id 3\)"):
        pair_runs({"twin": twin, "looped": load_run(folder)})


def test_pairing_refuses_different_items_and_tasks(tmp_path):
    twin = load_run(RUNS / "twin")
    folder = copy_run(tmp_path, "looped")
    results = sorted(folder.glob("*/results_*.json"))[-1]
    rewrite_samples(samples(results, "toy_mc"), lambda recs: [r for r in recs if r["doc_id"] < 25])
    data = json.loads(results.read_text())
    data["n-samples"]["toy_mc"] = {"original": 25, "effective": 25}  # a different (smaller) dataset
    results.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="task toy_mc: twin has 30 items and looped has 25"):
        pair_runs({"twin": twin, "looped": load_run(folder)})
    with pytest.raises(ValueError, match="cover different tasks"):
        pair_runs({"twin": twin, "looped": load_run(RUNS / "looped", tasks=["toy_arith"])})
    paired = pair_runs({"twin": twin, "looped": load_run(RUNS / "looped", tasks=["toy_arith"])}, tasks=["toy_arith"])
    assert paired.tasks == ("toy_arith",)


def test_seed_runs_are_stacked_per_item():
    twin, long = load_run(RUNS / "twin"), load_run(RUNS / "twin_long")
    paired = pair_runs({"twins": [twin, long], "big": load_run(RUNS / "big")})
    assert paired.scores["twins"]["toy_arith"].shape == (60, 2)
    assert paired.accuracy("twins", "toy_arith") == pytest.approx(
        (twin.tasks["toy_arith"].accuracy + long.tasks["toy_arith"].accuracy) / 2)
    assert not paired.binary("toy_arith")  # two seeds: per-item means are not 0/1
    assert paired.binary("toy_arith", "big") and not paired.binary("toy_aime", "big")


def test_a_fresh_lm_eval_run_loads(tmp_path, make_runs):
    model_dir = make_runs.make_run(tmp_path / "out", "pretrained=toy/fresh,p=0.6,seed=4", trace="parent")
    run = load_run(tmp_path / "out")
    results = json.loads(run.path.read_text())
    assert run.path.parent == model_dir
    for task, scores in run.tasks.items():
        assert scores.accuracy == pytest.approx(results["results"][task][scores.metric])
    assert run.cost(TRACED, mode="flops") == pytest.approx(total_flops(*(tmp_path / "out").glob("loopeval_trace_*")))


# ---------------------------------------------------------------- the two tests


def test_delta_param_is_the_paired_bootstrap_of_looped_against_twin():
    twin, looped = load_run(RUNS / "twin"), load_run(RUNS / "looped")
    res = delta_param(twin, looped, n_resamples=5000, seed=1)
    a = {t: twin.tasks[t].scores for t in twin.tasks}
    b = {t: looped.tasks[t].scores for t in twin.tasks}
    ref = paired_bootstrap(a, b, n_resamples=5000, seed=1)
    m = res.macro
    assert (m.delta, m.ci, m.pvalue) == (ref.delta, ref.ci, ref.pvalue)
    assert (m.baseline, m.candidate, m.task) == ("twin", "looped", None)
    assert m.baseline_accuracy == pytest.approx(twin.accuracy()) and m.n == 102
    assert m.outcome == "better" and m.mcnemar_pvalue is None
    assert res.tasks["toy_arith"].mcnemar_pvalue is not None and res.tasks["toy_aime"].mcnemar_pvalue is None
    assert (res.seeds.n, res.seeds.favour) == (1, 1)


def test_delta_param_over_seeds_counts_seeds_favouring_the_loop():
    twins = [load_run(RUNS / "twin"), load_run(RUNS / "twin_long")]
    loops = [load_run(RUNS / "looped"), load_run(results_file("looped", 0))]
    res = delta_param(twins, loops, n_resamples=2000)
    per_seed = [loop.accuracy() - twin.accuracy() for loop, twin in zip(loops, twins)]
    assert res.seeds.deltas == pytest.approx(per_seed)
    assert res.seeds.favour == sum(d > 0 for d in per_seed) and res.seeds.n == 2
    assert res.macro.delta == pytest.approx(np.mean(per_seed))


def test_the_same_run_twice_is_refused_and_near_identical_small_runs_are_not_called_equivalent(tmp_path):
    twin = load_run(RUNS / "twin")
    with pytest.raises(ValueError, match=r"twin and looped are the same run"):
        delta_param(twin, twin)
    copy = copy_run(tmp_path, "twin")
    with pytest.raises(ValueError, match=r"are the same run"):  # a copy of the folder is no second evaluation
        delta_param(twin, load_run(copy))
    path = samples(sorted(copy.glob("*/results_*.json"))[-1], "toy_arith")
    rewrite_samples(path, lambda recs: [{**r, "exact_match": 1 - r["exact_match"]} if r["doc_id"] == 0 else r
                                        for r in recs])
    results = sorted(copy.glob("*/results_*.json"))[-1]
    results.write_text(results.read_text().replace('"date"', '"date" ', 1))  # another evaluation's file
    res = delta_param(twin, load_run(copy), n_resamples=2000)
    # 60 items a task, one discordant: the bootstrap's 90% interval is near [0, 0], but no
    # valid interval is that narrow (Tango's 90% interval for 1 of 60 discordant is [-7.1, +2.7]), so the
    # comparison is not called equivalent (issue 24).
    assert abs(res.macro.delta) == pytest.approx(1 / 60 / 3) and res.macro.outcome == "inconclusive"
    arith = res.tasks["toy_arith"]
    assert arith.equivalence_method == "tango" and not arith.equivalent and arith.equivalence_ci.low < -0.07
    assert res.macro.equivalence_method == "none"  # toy_aime's scores are not 0/1
    v = verdict(res)
    assert (v.param, v.flop, v.passes_param, v.passes_flop) == ("inconclusive", None, False, None)
    assert "not meaningful" in v.text and "equivalent within" not in v.text


@pytest.mark.parametrize("mode", ["flops", "passes"])
def test_delta_flop_picks_the_best_cheaper_evaluation_and_holm_corrects_budgets(mode):
    unlooped = {"twin": load_run(RUNS / "twin"), "twin_long": load_run(RUNS / "twin_long"),
                "big": load_run(RUNS / "big")}
    looped = {"loop@new": load_run(RUNS / "looped"), "loop@old": load_run(results_file("looped", 0))}
    tests = delta_flop(unlooped, looped, twins={"loop@new": "twin"}, tasks=TRACED, cost=mode, n_resamples=4000)
    # independently: FLOPs summed from the trace files, or generated tokens x passes per token x (1e6 / 4)
    column = {"flops": 0, "passes": 2}[mode]
    unit = {"flops": 1.0, "passes": 2.5e5}[mode]
    costs = {name: unit * sum(v[column] for v in raw_trace(*r.path.parent.glob("loopeval_trace_*")).values())
             for name, r in unlooped.items()}
    assert tests[0].costs == pytest.approx(costs) and tests[0].cost_mode == mode
    assert costs["big"] > tests[0].loop_cost > costs["twin_long"] > costs["twin"]
    acc = {name: r.accuracy(TRACED) for name, r in unlooped.items()}
    assert acc["big"] > acc["twin_long"] > acc["twin"]  # big is best but costs more than the loop
    new = tests[0]
    assert (new.comparator, new.comparator_cost, new.comparator_accuracy) == (
        "twin_long", costs["twin_long"], pytest.approx(acc["twin_long"]))
    assert new.comparison.baseline == "twin_long" and new.comparison.candidate == "loop@new"
    assert new.twin == "twin" and new.twin_comparison.baseline == "twin"
    raw = [t.comparison.macro.pvalue for t in tests]
    assert [t.pvalue_holm for t in tests] == pytest.approx(list(multipletests(raw, method="holm")[1]))
    assert tests[1].twin is None and tests[1].twin_comparison is None
    assert set(new.other_costs) == {"twin", "twin_long", "big", "loop@new"}


def test_cost_by_passes_is_table_4s_arithmetic():
    """Table 4's cost column: each setting's generated tokens x layer passes, relative to the
    plain twin; a loop of 5 passes instead of 4 costs 1.25x per generated token."""
    twin, looped = load_run(RUNS / "twin"), load_run(RUNS / "looped")
    gen = {name: sum(r["generated_tokens"] for r in map(json.loads, trace.read_text().splitlines()[1:]))
           for name, trace in (("twin", max((RUNS / "twin").rglob("loopeval_trace_*"))),
                               ("looped", max((RUNS / "looped").glob("loopeval_trace_*"))))}
    relative = looped.cost(TRACED) / twin.cost(TRACED)
    assert relative == pytest.approx(gen["looped"] * 5 / (gen["twin"] * 4))


def test_delta_flop_with_a_flops_per_token_figure_and_without_a_cheaper_comparator():
    unlooped = {"twin": load_run(RUNS / "twin"), "big": load_run(RUNS / "big")}
    looped = {"loop": load_run(RUNS / "looped")}
    cheap_big = delta_flop(unlooped, looped, tasks=TRACED, cost="flops", flops_per_token={"big": 1.0},
                           n_resamples=1000)[0]
    assert cheap_big.costs["big"] == unlooped["big"].cost(TRACED, mode="flops", flops_per_token=1.0)
    assert cheap_big.comparator == "big"
    none = delta_flop({"big": unlooped["big"]}, looped, tasks=TRACED, n_resamples=1000)[0]
    assert none.comparator is None and none.comparison is None and none.outcome == "untestable"
    # the multiple-choice task generates nothing (no trace): the loop is charged its generation
    every = delta_flop(unlooped, looped, n_resamples=100)[0]
    assert every.loop_cost == looped["loop"].cost(TRACED)
    with pytest.raises(ValueError, match="both looped and unlooped"):
        delta_flop({"loop": unlooped["twin"]}, looped, tasks=TRACED)


def test_verdict_reports_both_tests_in_order():
    twin, looped, long = load_run(RUNS / "twin"), load_run(RUNS / "looped"), load_run(RUNS / "twin_long")
    param = delta_param(twin, looped, tasks=TRACED, n_resamples=2000)
    flop = delta_flop({"twin": twin, "twin_long": long}, {"loop": looped}, tasks=TRACED, n_resamples=2000)
    # Independently: twin_long is the best unlooped evaluation that costs no more than the loop,
    # and the loop beats it (one budget, so the Holm p is the raw p).
    scores = lambda run: {t: run.tasks[t].scores for t in TRACED}  # noqa: E731
    assert long.cost(TRACED) <= looped.cost(TRACED) and long.accuracy(TRACED) > twin.accuracy(TRACED)
    ref = paired_bootstrap(scores(long), scores(looped), n_resamples=2000)
    assert ref.delta > 0 and ref.pvalue < 0.05
    v = verdict(param, flop)
    assert (v.param, v.flop, v.passes_param, v.passes_flop) == ("better", ("better",), True, True)
    gain = 100 * (looped.accuracy(TRACED) - twin.accuracy(TRACED))
    assert v.sentences[0].startswith(f"Equal parameters: the loop beats its twin by +{gain:.1f} points")
    assert "loop: better vs twin_long" in v.sentences[1] and v.sentences[1].endswith("so it pays for its compute.")
    assert v.text == " ".join(v.sentences)
    assert verdict(param).passes_flop is None and verdict(param).sentences[1] == "Equal FLOPs: not evaluated."


# ---------------------------------------------------------------- the trace format


def test_a_trace_header_round_trips_and_format_1_still_loads(tmp_path):
    from loopeval.evaluation.trace import DecodingSettings, TraceHeader, TraceItem, TraceWriter, read_trace

    header = TraceHeader(model="m", loop={"loop": "1:2x2", "operator": "damped", "beta": 0.25, "mix": None},
                         cost={"multiplier": 1.25}, decoding=DecodingSettings(budget_forcing=True, bf_reserve=8,
                                                                               chat_template_args={"enable_thinking": True}))
    item = TraceItem("t", 3, 0, "h", 5, 7, 9, True, None, None, 5, 1.5)
    writer = TraceWriter(tmp_path, header)
    writer.write([item])
    trace = read_trace(writer.path)
    assert (trace.header, trace.items) == (header, [item])

    # a header written by loopeval 0.1.0's looped model (one flat "settings" object)
    old = read_trace(Path(__file__).parents[1] / "fixtures" / "traces" / "format1.jsonl")
    assert old.header.loop == {"loop": "2:4x2", "operator": "repeat", "beta": 0.0, "mix": None}
    assert old.header.decoding == DecodingSettings(
        budget_forcing=True, bf_reserve=12, bf_string=" The answer is \\boxed{", repetition_stop=False, budget_scale=1.0,
        dtype="float32", batch_size="64", chat_template_args={},
        chat_template_sha="e4f515d3a775a5365872f6de02f9a26a72aea06470286087465316a4ac651ac3")
    assert old.header.multiplier == pytest.approx(8 / 6) and old.header.cache_check["ok"] is True
    assert [i.doc_id for i in old.items] == [19, 20]
    bad = tmp_path / "loopeval_trace_x.jsonl"
    bad.write_text(json.dumps({"kind": "header", "format": 9, "created": 1.0}) + "\n")
    with pytest.raises(ValueError, match=r"loopeval_trace_x.jsonl:1: .*unknown loopeval trace format 9"):
        read_trace(bad)
