"""The report's tables: the two tests per decoding condition, and the decoding-rules table.

Every number comes from :mod:`loopeval.protocol`; this module only decides which runs
go into which comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loopeval.protocol import DeltaFlop, RunComparison, Verdict, delta_flop, delta_param, verdict
from loopeval.report.evaluations import Evaluation, by_seed, label


@dataclass(frozen=True)
class FlopRow:
    """One row of the equal-FLOPs table: a looped evaluation, its costs relative to the reference."""

    result: DeltaFlop
    loop_cost: float
    comparator_cost: float | None


@dataclass(frozen=True)
class Condition:
    """The two tests under one decoding condition (plain, or budget forcing on both sides)."""

    forcing: bool
    label: str
    scales: list[float]
    param: RunComparison
    seeds: int
    flop: tuple[DeltaFlop, ...]
    flop_rows: list[FlopRow]
    verdict: Verdict


def reference(groups: dict, default_scale: float) -> Evaluation:
    """Costs are shown relative to the plain twin at the default budget (else any twin there)."""
    for key in ((False, False, default_scale), (False, True, default_scale)):
        if groups.get(key):
            return sorted(groups[key], key=lambda e: e.seed)[0]
    raise ValueError(f"no unlooped run at the default budget {default_scale:g}×")


def conditions(groups: dict, extra: Evaluation | None, *, default_scale: float, base_cost: float,
               n_resamples: int, seed: int) -> list[Condition]:
    """Δparam at the default budget and ΔFLOP over every budget, per decoding condition."""
    out = []
    for forcing in sorted({f for (lp, f, _) in groups if lp}):
        scales = sorted(s for (lp, f, s) in groups if lp and f == forcing)
        twin_scales = sorted(s for (lp, f, s) in groups if not lp and f == forcing)
        name = "with budget forcing" if forcing else "plain decoding"
        if default_scale not in scales or default_scale not in twin_scales:
            missing = "looped" if default_scale not in scales else "twin"
            runs = ", ".join(str(e.where) for s in scales for e in groups[(True, forcing, s)])
            raise ValueError(
                f"missing {missing} run at the default budget ({default_scale:g}×, {name}); the looped runs are: {runs}"
            )
        looped = {s: groups[(True, forcing, s)] for s in scales}
        twin = {s: groups[(False, forcing, s)] for s in twin_scales}
        for s, ls in looped.items():
            if s in twin and len(ls) != len(twin[s]):
                raise ValueError(
                    f"{name} at {s:g}×: {len(ls)} looped run(s) but {len(twin[s])} twin run(s); give one of each per seed"
                )
        param = delta_param(by_seed(twin[default_scale]), by_seed(looped[default_scale]),
                            n_resamples=n_resamples, seed=seed)
        unlooped = {label(False, forcing, s): by_seed(twin[s]) for s in twin_scales}
        if extra is not None and extra.forcing == forcing:
            unlooped[f"larger{' + BF' if forcing else ''} @ {extra.scale:g}×"] = [extra.run]
        flop = delta_flop(
            unlooped,
            {label(True, forcing, s): by_seed(looped[s]) for s in scales},
            twins={label(True, forcing, s): label(False, forcing, s) for s in scales if s in twin},
            n_resamples=n_resamples,
            seed=seed,
        )
        rows = [FlopRow(f, f.loop_cost / base_cost, f.comparator_cost / base_cost if f.comparator else None) for f in flop]
        out.append(Condition(forcing=forcing, label=name, scales=scales, param=param,
                             seeds=len(looped[default_scale]), flop=flop, flop_rows=rows, verdict=verdict(param, flop)))
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


def decoding_rows(groups: dict, tasks: list[str], *, default_scale: float, base_cost: float) -> list[dict]:
    """Table 4: per setting at the default budget, accuracy per task and macro, the share
    of finished answers and the cost relative to the reference."""
    rows = []
    for (lp, forcing, scale), members in sorted(groups.items()):
        if scale != default_scale:
            continue
        runs = by_seed(members)
        finished = [_finished(r) for r in runs]
        rows.append({
            "setting": label(lp, forcing),
            "accuracy": {t: float(np.mean([r.tasks[t].accuracy for r in runs])) for t in tasks},
            "macro": float(np.mean([r.accuracy() for r in runs])),
            "finished": {t: _mean_or_none([f[t] for f in finished]) for t in tasks},
            "cost": float(np.mean([r.cost() for r in runs])) / base_cost,
        })
    return rows
