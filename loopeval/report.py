"""The two-test report: a plain data object from lm-eval runs, and ``render`` to HTML.

``build_report`` reads a looped model's evaluations and its twin's (one run per token
budget, with or without budget forcing, one run per training seed), computes the
equal-parameters test (twin -> looped at the default budget), the equal-FLOPs test
(best cheaper unlooped evaluation -> looped, Holm over budgets), the per-benchmark
TOST table, the decoding-rules table and the accuracy-versus-cost figure, and runs the
fairness checks. Every number comes from ``loopeval.protocol`` / ``loopeval.stats``.

``render(data, template)`` fills any Jinja2 template (autoescaped) with that object;
``write_report`` renders loopeval's own ``reports/report.html.j2``.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from loopeval.paths import reports_path
from loopeval.protocol import delta_flop, delta_param, verdict
from loopeval.runs import Run, decoding_differences, load_run, pair_runs
from loopeval.stats.display import points, pvalue

PALETTE = ("#1b6ca8", "#d1495b", "#00798c", "#edae49", "#66a182", "#8d5a97")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class ReportData:
    """Everything a template needs, as plain values (fractions; ``fmt`` helpers for points)."""

    title: str
    created: str
    loop: str
    multiplier: float
    tasks: list[str]
    conditions: list[dict]
    decoding: list[dict]
    figure: dict
    checks: list[Check]
    runs: list[dict]
    strict: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> str:
        return json.dumps(_plain(self), indent=2, default=str)


def _plain(obj):
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return obj


@dataclass(frozen=True)
class _Eval:
    where: Path  # the folder the user gave (or the run's model folder)
    run: Run
    looped: bool
    forcing: bool
    scale: float
    seed: int
    settings: dict
    manifest: dict | None


def _describe(source: str | Path | Run) -> _Eval:
    run = source if isinstance(source, Run) else load_run(source)
    where = run.path.parent if isinstance(source, Run) else Path(source)
    if not run.trace_settings:
        reason = f" ({run.trace_error})" if run.trace_error else ""
        raise ValueError(
            f"run {where}: no loopeval trace{reason}; evaluate with "
            "`lm_eval --model looped --model_args ...,trace=OUTPUT_PATH` so its cost and settings are known"
        )
    settings = dict(run.trace_settings[-1])
    manifest = None
    model = Path(str(settings.get("model", "")))
    if (model / "training_manifest.json").is_file():
        from loopeval.train import read_manifest

        manifest = read_manifest(model)
    seed = int(manifest["config"]["seed"]) if manifest else 0
    return _Eval(
        where=where,
        run=run,
        looped=settings.get("loop") is not None,
        forcing=bool(settings.get("budget_forcing")),
        scale=float(settings.get("budget_scale", 1.0)),
        seed=seed,
        settings=settings,
        manifest=manifest,
    )


def _label(looped: bool, forcing: bool, scale: float | None = None) -> str:
    name = ("looped" if looped else "twin") + (" + BF" if forcing else "")
    return name if scale is None else f"{name} @ {scale:g}×"


def _by_seed(evals: list[_Eval]) -> list[Run]:
    return [e.run for e in sorted(evals, key=lambda e: e.seed)]


def _finished(run: Run) -> dict[str, float | None]:
    out = {}
    for task, ts in run.tasks.items():
        recs = [r for item in (ts.trace or ()) for r in item]
        out[task] = float(np.mean([r.finished for r in recs])) if recs else None
    return out


def _sentences(param, flop, margin: float) -> list[str]:
    """The verdict: one sentence per test."""
    m = param.macro
    ci = f"[{points(m.ci.low, signed=True)}, {points(m.ci.high, signed=True)}]"
    p = pvalue(m.pvalue)
    p = f"p{p}" if p.startswith("<") else f"p = {p}"
    seeds = f", {param.seeds.favour} of {param.seeds.n} seeds favouring the loop" if param.seeds else ""
    if m.outcome == "better":
        first = f"Equal parameters: the loop beats its twin by {points(m.delta, signed=True)} points {ci}, {p}{seeds}."
    elif m.outcome == "worse":
        first = f"Equal parameters: the loop is worse than its twin by {points(-m.delta)} points {ci}, {p}{seeds}."
    else:
        eq = f"equivalent within ±{points(margin)} points" if m.outcome == "equivalent" else "not significant"
        first = f"Equal parameters: no significant difference from the twin, {points(m.delta, signed=True)} points {ci}, {p} ({eq})."
    if m.outcome != "better":
        return [first, "Equal FLOPs: not meaningful, since the loop does not beat its twin."]
    wins = sum(f.outcome == "better" for f in flop)
    worse = sum(f.outcome == "worse" for f in flop)
    second = (
        f"Equal FLOPs: the loop beats the best cheaper unlooped evaluation at {wins} of {len(flop)} budgets "
        f"(Holm-corrected){f' and loses at {worse}' if worse else ''}, so it "
        + ("pays for its compute." if wins == len(flop) else "does not pay for its compute at every budget.")
    )
    return [first, second]


def build_report(
    looped: list[str | Path | Run],
    unlooped: list[str | Path | Run],
    *,
    larger: str | Path | Run | None = None,
    default_scale: float = 1.0,
    title: str | None = None,
    strict: bool = False,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> ReportData:
    """Compute the two-test report from lm-eval output folders (or loaded runs).

    ``looped``: the looped model's evaluations; ``unlooped``: its twin's (and, for
    several training seeds, one of each per seed). Each evaluation's loop, budget scale
    and decoding rules come from its trace. ``larger`` is an optional larger unlooped
    model, a further equal-FLOPs comparator. Bad input raises ``ValueError`` naming
    the run; with ``strict``, so does a failed fairness check.
    """
    evals = [_describe(r) for r in (*looped, *unlooped)]
    for e, wanted in zip(evals, [True] * len(looped) + [False] * len(unlooped)):
        if e.looped != wanted:
            kind = "a loop" if e.looped else "no loop"
            raise ValueError(f"run {e.where}: given as {'looped' if wanted else 'unlooped'} but its trace records {kind}")
    extra = _describe(larger) if larger is not None else None
    task_sets = {tuple(sorted(e.run.tasks)) for e in evals + ([extra] if extra else [])}
    if len(task_sets) > 1:
        detail = "; ".join(f"{e.where.name}: {', '.join(sorted(e.run.tasks))}" for e in evals)
        raise ValueError(f"runs cover different tasks ({detail})")
    tasks = sorted(evals[0].run.tasks)

    groups: dict[tuple[bool, bool, float], list[_Eval]] = defaultdict(list)
    for e in evals:
        groups[(e.looped, e.forcing, e.scale)].append(e)
    reference = _reference(groups, default_scale)
    base_cost = reference.run.cost()
    checks: list[Check] = []
    conditions = []
    loops = sorted({e.settings["loop"] for e in evals if e.looped})
    if len(loops) != 1:
        raise ValueError(f"the looped runs must share one loop, found {loops or 'none'}")
    for forcing in sorted({e.forcing for e in evals if e.looped}):
        scales = sorted(s for (lp, f, s) in groups if lp and f == forcing)
        twin_scales = sorted(s for (lp, f, s) in groups if not lp and f == forcing)
        label = "with budget forcing" if forcing else "plain decoding"
        if default_scale not in scales or default_scale not in twin_scales:
            missing = "looped" if default_scale not in scales else "twin"
            runs = ", ".join(str(e.where) for e in evals if e.looped and e.forcing == forcing)
            raise ValueError(
                f"missing {missing} run at the default budget ({default_scale:g}×, {label}); "
                f"the looped runs are: {runs}"
            )
        L = {s: groups[(True, forcing, s)] for s in scales}
        U = {s: groups[(False, forcing, s)] for s in twin_scales}
        for s, ls in L.items():
            if s in U and len(ls) != len(U[s]):
                raise ValueError(
                    f"{label} at {s:g}×: {len(ls)} looped run(s) but {len(U[s])} twin run(s); give one of each per seed"
                )
        param = delta_param(_by_seed(L[default_scale]), _by_seed(U[default_scale]), n_resamples=n_resamples, seed=seed)
        unlooped_map = {_label(False, forcing, s): _by_seed(U[s]) for s in twin_scales}
        if extra is not None and extra.forcing == forcing:
            unlooped_map[f"larger{' + BF' if forcing else ''} @ {extra.scale:g}×"] = [extra.run]
        flop = delta_flop(
            {_label(True, forcing, s): _by_seed(L[s]) for s in scales},
            unlooped_map,
            twins={_label(True, forcing, s): _label(False, forcing, s) for s in scales if s in U},
            n_resamples=n_resamples,
            seed=seed,
        )
        conditions.append(
            {
                "forcing": forcing,
                "label": label,
                "scales": scales,
                "param": param,
                "seeds": len(L[default_scale]),
                "flop": flop,
                "flop_rows": [
                    {"result": f, "loop_cost": f.loop_cost / base_cost,
                     "comparator_cost": f.comparator_cost / base_cost if f.comparator else None}
                    for f in flop
                ],
                "verdict": verdict(param, flop),
                "sentences": _sentences(param, flop, param.margin),
            }
        )
        for s in scales:
            for a, b in zip(sorted(L[s], key=lambda e: e.seed), sorted(U.get(s, []), key=lambda e: e.seed)):
                diffs = decoding_differences(a.run, b.run)
                checks.append(
                    Check(
                        f"same decoding settings: {_label(True, forcing, s)} vs twin (seed {a.seed})",
                        not diffs,
                        "; ".join(diffs) or "budget forcing, reserve, string, repetition stop, budget, dtype, "
                        "batch size and chat template match",
                    )
                )
    checks += _manifest_checks(evals)
    checks += _coverage_checks(evals)
    checks += _cache_checks(evals)

    decoding = []
    for (lp, forcing, scale), members in sorted(groups.items()):
        if scale != default_scale:
            continue
        runs = _by_seed(members)
        finished = [_finished(r) for r in runs]
        decoding.append(
            {
                "setting": _label(lp, forcing),
                "accuracy": {t: float(np.mean([r.tasks[t].accuracy for r in runs])) for t in tasks},
                "macro": float(np.mean([r.accuracy() for r in runs])),
                "finished": {t: _mean_or_none([f[t] for f in finished]) for t in tasks},
                "cost": float(np.mean([r.cost() for r in runs])) / base_cost,
            }
        )
    figure = _figure(groups, extra, base_cost, n_resamples=min(n_resamples, 2000), seed=seed)
    data = ReportData(
        title=title or f"Does the loop {loops[0]} pay for its compute?",
        created=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        loop=loops[0],
        multiplier=float(next(e for e in evals if e.looped).settings["cost"]["multiplier"]),
        tasks=tasks,
        conditions=conditions,
        decoding=decoding,
        figure=figure,
        checks=checks,
        runs=[
            {"name": e.where.name, "path": str(e.where), "setting": _label(e.looped, e.forcing, e.scale),
             "seed": e.seed, "accuracy": e.run.accuracy(), "cost": e.run.cost() / base_cost}
            for e in sorted(evals, key=lambda e: (e.looped, e.forcing, e.scale, e.seed))
        ],
        strict=strict,
    )
    if data.failed_checks:
        message = "; ".join(f"{c.name}: {c.detail}" for c in data.failed_checks)
        if strict:
            raise ValueError(f"fairness check failed: {message}")
        warnings.warn(f"fairness check failed (shown in the report): {message}", stacklevel=2)
    return data


def _mean_or_none(values):
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _reference(groups, default_scale: float) -> _Eval:
    """Costs are shown relative to the plain twin at the default budget (else any twin there)."""
    for key in ((False, False, default_scale), (False, True, default_scale)):
        if groups.get(key):
            return sorted(groups[key], key=lambda e: e.seed)[0]
    raise ValueError(f"no unlooped run at the default budget {default_scale:g}×")


def _manifest_checks(evals: list[_Eval]) -> list[Check]:
    from loopeval.train import twin_mismatches

    looped = {e.seed: e for e in evals if e.looped and e.manifest}
    twins = {e.seed: e for e in evals if not e.looped and e.manifest}
    if not looped and not twins:
        return [Check("twins share their training manifest", False,
                       "no training_manifest.json beside the evaluated checkpoints; twin training cannot be confirmed")]
    out = []
    for seed in sorted(set(looped) | set(twins)):
        if seed not in looped or seed not in twins:
            out.append(Check(f"twins share their training manifest (seed {seed})", False,
                             "only one side of this seed has a training manifest"))
            continue
        diffs = twin_mismatches(looped[seed].manifest, twins[seed].manifest)
        out.append(Check(f"twins share their training manifest (seed {seed})", not diffs,
                         "; ".join(diffs) or "same base weights, data, batches, steps and seeds; only the loop differs"))
    return out


def _coverage_checks(evals: list[_Eval]) -> list[Check]:
    short = [
        f"{e.where.name}/{t}: {ts.n_effective} of {ts.n_original}"
        for e in evals for t, ts in e.run.tasks.items() if ts.n_effective < ts.n_original
    ]
    n = sum(ts.n for ts in evals[0].run.tasks.values())
    return [Check("every item covered", not short, "; ".join(short) or f"all {n} items in every evaluation")]


def _cache_checks(evals: list[_Eval]) -> list[Check]:
    bad = []
    for e in evals:
        if not e.looped:
            continue
        result = e.settings.get("cache_check")
        if not result or not result.get("ok"):
            bad.append(f"{e.where.name}: {'not run' if not result else 'failed'}")
    return [Check("cached looped decoding equals full recomputation", not bad,
                  "; ".join(bad) or "checked on the first batch of every looped evaluation")]


def _figure(groups, extra: _Eval | None, base_cost: float, *, n_resamples: int, seed: int) -> dict:
    """Accuracy (macro, %) against cost (x the plain twin at the default budget): one
    curve per model and decoding rule, one point per budget, 95% bootstrap error bars."""
    curves = defaultdict(list)
    for (lp, forcing, scale), members in groups.items():
        curves[_label(lp, forcing)].append((scale, _by_seed(members)))
    if extra is not None:
        curves["larger" + (" + BF" if extra.forcing else "")].append((extra.scale, [extra.run]))
    series = []
    for i, (name, pts) in enumerate(sorted(curves.items())):
        points_ = []
        for scale, runs in sorted(pts):
            paired = pair_runs({name: runs})
            dist = paired.resampler(n_resamples=n_resamples, seed=seed).distribution(name)
            lo, hi = np.percentile(dist, [2.5, 97.5])
            points_.append({"scale": scale, "x": float(np.mean([r.cost() for r in runs])) / base_cost,
                            "y": paired.accuracy(name), "lo": float(lo), "hi": float(hi)})
        series.append({"name": name, "color": PALETTE[i % len(PALETTE)], "points": points_,
                       "dashed": "twin" in name or "larger" in name})
    return _layout(series)


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo or 1.0
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 2.5, 5, 10):
        if span / (step * m) <= n:
            step *= m
            break
    start = math.floor(lo / step) * step
    return [round(start + k * step, 10) for k in range(int(math.ceil((hi - start) / step)) + 1)]


def _layout(series: list[dict], width: int = 640, height: int = 380) -> dict:
    """Pixel coordinates for the SVG figure, so the template only draws."""
    left, right, top, bottom = 64, 180, 20, 48
    xs = [p["x"] for s in series for p in s["points"]]
    ys = [v for s in series for p in s["points"] for v in (p["lo"], p["hi"])]
    xt = _nice_ticks(min(xs), max(xs))
    yt = _nice_ticks(100 * min(ys), 100 * max(ys))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def px(x):
        return left + (x - x0) / ((x1 - x0) or 1) * (width - left - right)

    def py(y):
        return height - bottom - (100 * y - y0) / ((y1 - y0) or 1) * (height - top - bottom)

    for s in series:
        for p in s["points"]:
            p.update(px=px(p["x"]), py=py(p["y"]), py_lo=py(p["lo"]), py_hi=py(p["hi"]))
        s["path"] = " ".join(f"{'M' if i == 0 else 'L'}{p['px']:.1f},{p['py']:.1f}" for i, p in enumerate(s["points"]))
    return {
        "width": width,
        "height": height,
        "plot": {"left": left, "right": width - right, "top": top, "bottom": height - bottom},
        "xticks": [{"px": px(t), "label": f"{t:g}"} for t in xt],
        "yticks": [{"py": py(t / 100), "label": f"{t:g}"} for t in yt],
        "series": series,
    }


def render(data: ReportData, template: str | Path = "report.html.j2") -> str:
    """Render ``data`` with a Jinja2 template: a name in loopeval's ``reports/`` folder
    or a path to your own. Autoescaping is on; ``points`` and ``pvalue`` format numbers."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    template = Path(template)
    folders = [str(reports_path())]
    if template.parent != Path("."):
        folders.insert(0, str(template.parent.resolve()))
    env = Environment(
        loader=FileSystemLoader(folders),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["points"] = points
    env.filters["signed"] = lambda x: points(x, signed=True)
    env.filters["pvalue"] = pvalue
    return env.get_template(template.name).render(data=data)


def write_report(data: ReportData, path: str | Path, *, template: str | Path = "report.html.j2") -> Path:
    """Render ``data`` and write one self-contained HTML file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(data, template), encoding="utf-8")
    return path
