"""The two-test report: a plain data object from lm-eval runs, and HTML from a template.

``build_report`` reads a looped model's evaluations and its twin's (one run per token
budget, with or without budget forcing, one run per training seed) and composes:

* :mod:`~loopeval.report.evaluations`: which run is which (trace header, manifest);
* :mod:`~loopeval.report.tables`: the equal-parameters test (twin -> looped at the
  default budget), the equal-FLOPs test (best cheaper unlooped evaluation -> looped,
  Holm over budgets) and the decoding-rules table, all from :mod:`loopeval.protocol`;
* :mod:`~loopeval.report.figures`: accuracy against cost;
* :mod:`~loopeval.report.checks`: the fairness checks.

``render(data, template)`` fills any Jinja2 template (autoescaped) with the resulting
:class:`ReportData`; ``write_report`` renders loopeval's own ``reports/report.html.j2``.
"""

from __future__ import annotations

import warnings
from datetime import datetime, timezone
from pathlib import Path

from loopeval.report import checks, evaluations, figures, tables
from loopeval.report.checks import Check
from loopeval.report.data import ReportData
from loopeval.report.render import render, write_report
from loopeval.runs import Run

__all__ = ["Check", "ReportData", "build_report", "render", "write_report"]


def build_report(
    twin: list[str | Path | Run],
    looped: list[str | Path | Run],
    *,
    larger: str | Path | Run | None = None,
    default_scale: float = 1.0,
    title: str | None = None,
    strict: bool = False,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> ReportData:
    """Compute the two-test report from lm-eval output folders (or loaded runs).

    ``twin``: the unlooped twin's evaluations; ``looped``: the looped model's (for
    several training seeds, one of each per seed). Each evaluation's loop, budget scale
    and decoding rules come from its trace. ``larger`` is an optional larger unlooped
    model, a further equal-FLOPs comparator. Bad input raises ``ValueError`` naming
    the run; with ``strict``, so does a failed fairness check.
    """
    evals, extra = evaluations.classify(twin, looped, larger)
    groups = evaluations.group(evals)
    base_cost = tables.reference(groups, default_scale).run.cost()
    tasks = sorted(evals[0].run.tasks)
    first_looped = next(e for e in evals if e.looped)
    data = ReportData(
        title=title or f"Does the loop {first_looped.header.loop['loop']} pay for its compute?",
        created=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        loop=first_looped.header.loop["loop"],
        multiplier=first_looped.header.multiplier,
        tasks=tasks,
        conditions=tables.conditions(groups, extra, default_scale=default_scale, base_cost=base_cost,
                                     n_resamples=n_resamples, seed=seed),
        decoding=tables.decoding_rows(groups, tasks, default_scale=default_scale, base_cost=base_cost),
        figure=figures.cost_figure(groups, extra, base_cost, n_resamples=min(n_resamples, 2000), seed=seed),
        checks=checks.fairness_checks(evals, groups),
        runs=[
            {"name": e.where.name, "path": str(e.where), "setting": evaluations.label(*e.key),
             "seed": e.seed, "accuracy": e.run.accuracy(), "cost": e.run.cost() / base_cost}
            for e in sorted(evals, key=lambda e: (*e.key, e.seed))
        ],
        strict=strict,
    )
    if data.failed_checks:
        message = "; ".join(f"{c.name}: {c.detail}" for c in data.failed_checks)
        if strict:
            raise ValueError(f"fairness check failed: {message}")
        warnings.warn(f"fairness check failed (shown in the report): {message}", stacklevel=2)
    return data
