"""The two-test report: a plain data object from lm-eval runs, and HTML from a template.

``build_report`` reads a looped model's evaluations and its twin's (one run per token
budget, with or without budget forcing, one run per training seed) and composes:

* :mod:`~loopeval.analysis.report.evaluations`: which run is which (trace header, manifest);
* :mod:`~loopeval.analysis.report.tables`: the equal-parameters test (twin -> looped at the
  default budget), the equal-FLOPs test (best cheaper unlooped evaluation -> looped,
  Holm over budgets) and the decoding-rules table, all from :mod:`loopeval.analysis.protocol`;
* :mod:`~loopeval.analysis.report.figures`: accuracy against cost;
* :mod:`~loopeval.analysis.report.checks`: the fairness checks.

``render(data, template)`` fills any Jinja2 template (autoescaped) with the resulting
:class:`ReportData`; ``write_report`` renders loopeval's own ``reports/report.html.j2``.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from loopeval.analysis.report import checks, evaluations, figures, serving, tables, training
from loopeval.analysis.report.checks import Check
from loopeval.analysis.report.data import ReportData
from loopeval.analysis.report.evaluations import RunSpec
from loopeval.analysis.report.render import check_output, render, write_report
from loopeval.analysis.protocol import check_amounts, withhold
from loopeval.analysis.runs import Run, pair_runs, pilot_label
from loopeval.analysis.stats.options import COST_MODES, DEFAULTS

__all__ = ["Check", "ReportData", "RunSpec", "build_report", "check_output", "render", "write_report"]

RunSource = str | Path | Run | RunSpec


def build_report(
    twin: list[RunSource], looped: list[RunSource], *, larger: RunSource | None = None,
    sizes: tuple[float, float] | None = None, default_scale: float = 1.0, cost: str = "passes",
    selection: str = "fixed", alpha: float = DEFAULTS.alpha, margin: float | None = None,
    margins: dict[str, float] | None = None, training_pairs: list[tuple[str | Path, str | Path]] = (),
    serve_cost: list[str | Path] = (), wall_clock: bool = False, title: str | None = None, strict: bool = False,
    n_resamples: int = DEFAULTS.n_resamples, seed: int = 0, intended_differences: tuple[str, ...] = (),
    allow_subset: bool = False, unfinished_fallback: str = "credit",
) -> ReportData:
    """Compute the two-test report from lm-eval output folders (or loaded runs).

    ``twin``: the unlooped twin's evaluations; ``looped``: the looped model's, one per
    budget scale, decoding condition, training variant and training seed (each read
    from its trace and manifest, or given by a :class:`RunSpec`). ``larger`` is an
    optional larger unlooped model: a further comparator, shown where it costs more
    (Table 3's lower rows), and with ``sizes`` (small, large parameter counts) the
    ceiling of Eq. 4 (Table 5). ``cost`` charges layer passes (the paper's rule) or
    FLOPs; ``selection`` picks the best cheaper comparator once or in every resample;
    ``alpha`` and ``margin`` (a fraction; ``None``: A.5's 0.02) are the tests' level and
    accuracies' equivalence margin; ``margins`` gives a continuous metric's margin in its unit (``{"nll_per_byte":
    0.005}``; without one, no equivalence verdict). Tasks whose metrics differ in kind (a 0/1
    accuracy and ``gsm8k_nll``'s NLL) get the two tests each, on a macro of their own kind:
    ``ReportData.kinds``, and one condition per kind and decoding condition. Tasks without a
    generation trace (log-likelihood scoring) are charged the loop's c per item.
    The training section (Fig. 3 and 5) draws every twin pair whose manifests hold
    held-out curves: the evaluated checkpoints', and ``training_pairs`` of (twin, looped)
    checkpoint folders. ``serve_cost`` folders (``loopeval serve-cost --out``) add the
    serving section (Table 10); with ``wall_clock``, Figure 2 puts the looped points at
    their measured latency instead of their layer-pass charge.
    ``allow_subset`` accepts ``--limit`` runs as a pilot: every table and the verdict say
    "pilot: n of N items" and no verdict is final. ``unfinished_fallback="wrong"`` scores
    GSM8K number-fallback verdicts from responses cut at their budget as wrong; either way
    the report counts them per run and task (``ReportData.fallbacks``).
    Bad input raises ``ValueError`` naming the run; a failed fairness check withholds every
    verdict (:func:`loopeval.analysis.protocol.withhold`; the tables keep their figures), and
    with ``strict`` raises. ``intended_differences`` names identity parts the two sides may differ in
    (:mod:`loopeval.evaluation.identity`: a setting, ``prompts``, ``generation_kwargs``, ``task_version``).
    """
    if cost not in COST_MODES:
        raise ValueError(f"cost {cost!r}: choose one of {', '.join(COST_MODES)}")
    served = serving.section(list(serve_cost))
    evals, extra = evaluations.classify(twin, looped, larger, allow_subset=allow_subset,
                                        unfinished_fallback=unfinished_fallback)
    trained = training.pairs_from_paths(list(training_pairs)) + training.pairs_from_evaluations(evals)
    groups = evaluations.group(evals)
    reference = tables.reference(groups, default_scale).run
    base_costs = _costs(reference, None, cost)
    tasks = sorted(evals[0].run.tasks)
    kinds = pair_runs({"reference": reference}).kinds()
    check_amounts(pair_runs({"reference": reference}), margin, margins, "--margin")
    margin = DEFAULTS.margin if margin is None else margin
    first_looped = next(e for e in evals if e.looped)
    scale = serving.wall_clock_scale(served, loop=first_looped.header.loop["loop"], multiplier=first_looped.header.multiplier,
                                     cost=cost, larger=extra is not None) if wall_clock else None
    first_kind = next(iter(kinds.values()))
    figure = figures.cost_series(groups, extra, reference.cost(first_kind, mode=cost), cost=cost,
                                 n_resamples=min(n_resamples, 2000), seed=seed, tasks=first_kind)
    conditions = [c for name, kind_tasks in kinds.items() for c in tables.conditions(
        groups, extra, default_scale=default_scale, base_costs=_costs(reference, kind_tasks, cost), cost=cost,
        selection=selection, alpha=alpha, margin=margin, margins=margins, n_resamples=n_resamples, seed=seed,
        tasks=kind_tasks, kind=name if len(kinds) > 1 else None)]
    ceiling = _ceiling(conditions, evals, extra, first_looped.header.multiplier, sizes)
    data = ReportData(
        title=title or f"Does the loop {first_looped.header.loop['loop']} pay for its compute?",
        created=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        loop=first_looped.header.loop["loop"], multiplier=first_looped.header.multiplier, cost_mode=cost,
        selection=selection, tasks=tasks, kinds={name: list(ts) for name, ts in kinds.items()},
        units={t: reference.tasks[t].unit for t in tasks}, conditions=conditions,
        decoding=tables.decoding_rows(groups, tasks, default_scale=default_scale, base_costs=base_costs, kinds=kinds),
        figure=figure if scale is None else serving.on_wall_clock(figure, scale), wall_clock=scale,
        checks=checks.fairness_checks(evals, groups, intended_differences, allow_subset=allow_subset),
        pilot=pilot_label([e.run for e in evals]), unfinished_fallback=unfinished_fallback,
        fallbacks=_fallbacks(evals), runs=_runs(evals, kinds, cost, base_costs), ceiling=ceiling,
        training=training.section(trained), training_costs=training.costs(trained, evals), serving=served,
        strict=strict,
        notes=[f"{c.label}, {row.task or 'macro'}: {w}" for c in conditions
               for row in (*c.param.tasks.values(), c.param.macro) for w in row.warnings]
        + training.undecontaminated(evals) + training.loop_conversion(evals),
    )
    return _apply_checks(data, strict)


def _runs(evals, kinds: dict, cost: str, base_costs: dict[str, float]) -> list[dict]:
    """The report's list of evaluations: name, model, setting, seed, macros and relative cost."""
    return [{"name": e.where.name, "model": e.run.label, "path": str(e.where), "setting": evaluations.label(*e.key),
             "seed": e.seed, "macros": {k: e.run.accuracy(ts) for k, ts in kinds.items()},
             "cost": e.run.cost(mode=cost) / base_costs[cost]}
            for e in sorted(evals, key=lambda e: (*e.key, e.seed or 0))]


def _ceiling(conditions, evals, extra, multiplier: float, sizes):
    """Eq. 4's ceiling (Table 5), where a larger model and the parameter counts are known; else ``None``."""
    if extra is None:
        return None
    plain = next((c for c in conditions if c.condition == extra.condition and c.param.macro.unit.fraction), None)
    twin_eval = next(e for e in evals if not e.looped and e.condition == extra.condition)
    if plain is not None and (sizes is not None or extra.header.cost.get("layer_params")):
        return tables.ceiling(plain, twin_eval, extra, multiplier, sizes)
    return None


def _apply_checks(data: ReportData, strict: bool) -> ReportData:
    """``data`` with every verdict a failed fairness check withholds withheld, and a warning
    naming the checks; with ``strict``, ``ValueError``."""
    if not data.failed_checks:
        return data
    message = "; ".join(f"{c.name}: {c.detail}" for c in data.failed_checks)
    if strict:
        raise ValueError(f"fairness check failed: {message}")
    failed = [c.name for c in data.failed_checks if c.withholds]
    warnings.warn(f"fairness check failed{' (the verdict is withheld)' if failed else ''}: {message}",
                  stacklevel=3)  # the caller of build_report
    return replace(data, conditions=[replace(c, verdict=withhold(c.verdict, failed)) for c in data.conditions])


def _costs(reference: Run, tasks, cost: str) -> dict[str, float]:
    """The reference's cost of ``tasks`` in each mode the traces allow (the report's mode must work)."""
    out = {}
    for mode in COST_MODES:
        try:
            out[mode] = reference.cost(tasks, mode=mode)
        except ValueError:
            if mode == cost:
                raise
    return out


def _fallbacks(evals) -> list[dict]:
    """Per evaluation and task, the GSM8K number-fallback verdicts from responses that did not
    finish (cut at the budget): how many, and how many were scored right by the paper's rule."""
    from loopeval.analysis.score_audit import fallback_tasks, score_audit

    rows = []
    for e in evals:
        for task, t in score_audit(e.run, tasks=fallback_tasks(e.run)).tasks.items():
            if t.unfinished_fallback or t.untraced:
                rows.append({"name": e.where.name, "setting": evaluations.label(*e.key), "task": task,
                             "fallback": t.counts["number_fallback"], "unfinished": t.unfinished_fallback,
                             "unfinished_right": t.unfinished_fallback_right, "untraced": t.untraced})
    return rows
