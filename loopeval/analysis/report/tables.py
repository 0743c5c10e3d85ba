"""The report's tables: the two tests per decoding condition and training variant, and the
tables of the paper's appendix (Table 4's decoding rules, Table 5's ceiling, Table 8's
per-benchmark Holm, per-seed differences, answers both models finish).

Every number comes from :mod:`loopeval.analysis.protocol` and :mod:`loopeval.analysis.stats`; this module
only decides which runs go into which comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loopeval.analysis.protocol import (
    DeltaFlop,
    FinishedBoth,
    RunComparison,
    Verdict,
    delta_flop,
    delta_param,
    finished_both,
    verdict,
)
from loopeval.analysis.report.evaluations import Evaluation, by_seed, condition_label, label
from loopeval.analysis.runs import cost_split, forcing_shares
from loopeval.analysis.stats import OrderInterval, ceiling_gain, order_interval


@dataclass(frozen=True)
class FlopRow:
    """One row of the equal-FLOPs table: a looped evaluation and its costs relative to the
    reference, in the report's cost mode and (where the traces allow) the other one."""

    result: DeltaFlop
    loop_cost: float
    comparator_cost: float | None
    loop_other_cost: float | None


@dataclass(frozen=True)
class Condition:
    """The two tests for one training variant of the loop under one decoding condition
    (plain, or a decoding rule given to both sides), on the tasks of one kind of metric
    (``kind``: ``None`` when every task shares one)."""

    condition: str
    variant: str
    label: str
    forcing: bool
    scales: list[float]
    param: RunComparison
    seeds: int
    flop: tuple[DeltaFlop, ...]
    flop_rows: list[FlopRow]
    verdict: Verdict
    finished_both: FinishedBoth | None
    seed_interval: OrderInterval | None  # a t interval over the per-seed differences (two or more seeds)
    reserves: dict[float, list[int]]  # budget scale -> the reserves budget forcing used there
    tasks: tuple[str, ...] = ()
    kind: str | None = None
    forcing_split: dict = None  # budget scale -> report.forcing rows of the looped runs (budget forcing only)


def reference(groups: dict, default_scale: float) -> Evaluation:
    """Costs are shown relative to the plain twin at the default budget (else any twin there)."""
    keys = sorted((k for k in groups if not k[0] and k[3] == default_scale), key=lambda k: (k[1] != "plain", k[2]))
    if not keys:
        scales = sorted({k[3] for k in groups if not k[0]})
        raise ValueError(f"no unlooped run at the default budget {default_scale:g}× (unlooped runs are at "
                         f"{', '.join(f'{x:g}×' for x in scales) or 'no budget'}); name the default budget with "
                         "--default-scale")
    return sorted(groups[keys[0]], key=lambda e: (e.seed is None, e.seed or 0))[0]


def _reserves(evals: list[Evaluation]) -> list[int]:
    values = {r.bf_reserve for e in evals for ts in e.run.tasks.values() for recs in (ts.trace or ()) for r in recs}
    return sorted(v for v in values if v is not None)


def conditions(groups: dict, extra: Evaluation | None, *, default_scale: float, base_costs: dict[str, float],
               cost: str, selection: str, alpha: float, margin: float, n_resamples: int, seed: int,
               margins: dict[str, float] | None = None, tasks=None, kind: str | None = None) -> list[Condition]:
    """Δparam at the default budget and ΔFLOP over every budget, per decoding condition and
    looped training variant, on ``tasks`` (one kind of metric; ``kind`` names it in the labels).
    The best cheaper comparator is sought among every unlooped evaluation of the condition:
    every budget and every training variant of the twin."""
    out = []
    for cond, variant in sorted({(c, v) for (lp, c, v, _) in groups if lp}, key=lambda cv: (cv[0] != "plain", cv)):
        scales = sorted(s for (lp, c, v, s) in groups if lp and c == cond and v == variant)
        twin_scales = sorted(s for (lp, c, v, s) in groups if not lp and c == cond and v == variant)
        name = condition_label(cond, variant) + (f", {kind}" if kind else "")
        if default_scale not in scales or default_scale not in twin_scales:
            missing = "looped" if default_scale not in scales else "twin"
            runs = ", ".join(str(e.where) for s in scales for e in groups[(True, cond, variant, s)])
            raise ValueError(
                f"missing {missing} run at the default budget ({default_scale:g}×, {name}); the looped runs are: {runs}"
            )
        looped = {s: groups[(True, cond, variant, s)] for s in scales}
        twin = {s: groups[(False, cond, variant, s)] for s in twin_scales}
        for s, ls in looped.items():
            if s in twin and len(ls) != len(twin[s]):
                raise ValueError(
                    f"{name} at {s:g}×: {len(ls)} looped run(s) but {len(twin[s])} twin run(s); give one of each per seed"
                )
        options = dict(alpha=alpha, margin=margin, margins=margins, n_resamples=n_resamples, seed=seed, tasks=tasks)
        param = delta_param(by_seed(twin[default_scale]), by_seed(looped[default_scale]), **options)
        unlooped = {label(False, c, v, s): by_seed(members)
                    for (lp, c, v, s), members in groups.items() if not lp and c == cond}
        costlier = []
        if extra is not None and extra.condition == cond:
            name_larger = f"larger @ {extra.scale:g}×"
            unlooped[name_larger] = [extra.run]
            costlier.append(name_larger)
        loops = {label(True, cond, variant, s): by_seed(looped[s]) for s in scales}
        flop = delta_flop(
            unlooped, loops, twins={label(True, cond, variant, s): label(False, cond, variant, s)
                                    for s in scales if s in twin},
            costlier=costlier, cost=cost, selection=selection, **options,
        )
        base, other_base = base_costs[cost], base_costs.get("flops" if cost == "passes" else "passes")
        rows = [FlopRow(f, f.loop_cost / base, f.comparator_cost / base if f.comparator else None,
                        f.other_costs[f.loop] / other_base if f.other_costs and other_base else None) for f in flop]
        try:
            both = finished_both(by_seed(twin[default_scale]), by_seed(looped[default_scale]), **options)
        except ValueError:  # no trace of finished answers, or no item both finish
            both = None
        per_seed = param.seeds.deltas if param.seeds else ()
        out.append(Condition(
            condition=cond, variant=variant, label=name, forcing=cond.startswith("budget forcing"), scales=scales,
            param=param, seeds=len(looped[default_scale]), flop=flop, flop_rows=rows, verdict=verdict(param, flop),
            finished_both=both,
            seed_interval=order_interval({"seeds": list(per_seed)}) if len(per_seed) >= 2 else None,
            reserves={s: _reserves(looped[s] + twin.get(s, [])) for s in scales},
            tasks=tuple(tasks or param.tasks), kind=kind,
            forcing_split={s: forcing_rows(looped[s], twin.get(s), param.tasks) for s in scales}
            if cond.startswith("budget forcing") else {},
        ))
    return out


def _mean_or_none(values):
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _finished(run) -> dict[str, float | None]:
    out = {}
    for task, ts in run.tasks.items():
        recs = [r for item in (ts.trace or ()) for r in item]
        out[task] = float(np.mean([r.finished for r in recs])) if recs else None
    return out


def _answered(run) -> dict[str, float | None]:
    return {task: None if ts.answered is None else float(ts.answered.mean()) for task, ts in run.tasks.items()}


def forcing_rows(looped: list[Evaluation], twin: list[Evaluation] | None, tasks) -> dict | None:
    """Budget forcing's share of the looped runs' cost at one budget (seeds pooled): requests it
    fired on, the share of generated tokens after the forced answer, and the realised layer-pass
    cost relative to the same-budget twin's, split before / after the forced answer (the twin's
    own split beside it), on ``tasks``. ``None`` when none of them generates."""
    first = looped[0].run
    tasks = [t for t in tasks if first.tasks[t].generative and first.tasks[t].trace is not None]
    if not tasks:
        return None
    mine = forcing_shares([e.run for e in looped], tasks)
    theirs = forcing_shares([e.run for e in twin], tasks) if twin else None
    base = (theirs or mine)["total"]
    return {"looped": cost_split(mine, base), **({"twin": cost_split(theirs, base)} if theirs else {})}


def decoding_rows(groups: dict, tasks: list[str], *, default_scale: float, base_costs: dict[str, float],
                  kinds: dict[str, tuple[str, ...]] | None = None) -> list[dict]:
    """Table 4: per setting at the default budget, each task's score (as its metric reports
    it) and one macro per kind of metric (``kinds``; default: one over every task), the share
    of responses that finished (ended by end-of-sequence or a stop, from the trace) and
    that gave a scored answer (from the samples), and the cost relative to the reference
    in each cost mode."""
    rows = []
    for (lp, cond, variant, scale), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "plain", kv[0][1:])):
        if scale != default_scale:
            continue
        runs = by_seed(members)
        finished = [_finished(r) for r in runs]
        answered = [_answered(r) for r in runs]
        costs = {}
        for mode, base in base_costs.items():
            try:
                costs[mode] = float(np.mean([r.cost(mode=mode) for r in runs])) / base
            except ValueError:
                costs[mode] = None
        rows.append({
            "setting": label(lp, cond, variant),
            "accuracy": {t: float(np.mean([r.tasks[t].accuracy for r in runs])) for t in tasks},
            "macros": {k: float(np.mean([r.accuracy(ts) for r in runs])) for k, ts in (kinds or {"": tasks}).items()},
            "finished": {t: _mean_or_none([f[t] for f in finished]) for t in tasks},
            "answered": {t: _mean_or_none([a[t] for a in answered]) for t in tasks},
            "cost": costs,
            "seeds": len(runs),
        })
    return rows


@dataclass(frozen=True)
class Ceiling:
    """Table 5 / Eq. 4: the gain Δ* a loop of cost ``c`` should buy if compute bought accuracy
    at the rate parameters do, against the Δparam interval."""

    c: float
    params_small: float
    params_large: float
    accuracy_small: float
    accuracy_large: float
    delta_star: float
    param: RunComparison

    @property
    def reachable(self) -> bool:
        """Whether the Δparam interval reaches Δ* (else the loop gains less than Δ*)."""
        return self.param.macro.ci.high >= self.delta_star


def _params(e: Evaluation) -> float | None:
    cost = e.header.cost
    return float(cost["layer_params"] + cost.get("head_params", 0)) if cost.get("layer_params") else None


def ceiling(condition: Condition, twin: Evaluation, extra: Evaluation, multiplier: float,
            sizes: tuple[float, float] | None) -> Ceiling:
    """Eq. 4 with the twin as the small model and ``extra`` as the large one, both at the
    default budget. ``sizes`` are the two parameter counts; without them, the traces'
    layer and LM-head parameters (embeddings are not counted, which the ratio barely feels)."""
    small, large = sizes if sizes is not None else (_params(twin), _params(extra))
    if small is None or large is None:
        raise ValueError("the ceiling (Table 5) needs the two models' sizes: give --sizes SMALL LARGE "
                         "(parameter counts), since a trace without layer sizes cannot tell them")
    acc_small, acc_large = condition.param.macro.baseline_accuracy, extra.run.accuracy(condition.tasks or None)
    return Ceiling(c=multiplier, params_small=small, params_large=large, accuracy_small=acc_small,
                   accuracy_large=acc_large, delta_star=ceiling_gain(multiplier, small, large, acc_small, acc_large),
                   param=condition.param)
