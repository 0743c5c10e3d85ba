"""Fairness checks: is each comparison of the report a fair one?

A failed check is shown first in the report, warned about, and an error under
``strict``. The checks: both sides decode with the same shared settings
(:data:`loopeval.trace.SHARED`), twins share their training manifest apart from the
loop, every item is covered, and cached looped decoding was checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from loopeval.manifest import twin_mismatches
from loopeval.report.evaluations import Evaluation, label
from loopeval.runs import decoding_differences
from loopeval.trace import SHARED


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def decoding_checks(groups: dict) -> list[Check]:
    """Each looped evaluation against the twin at the same budget and rules, seed by seed."""
    out = []
    for (lp, forcing, scale), members in sorted(groups.items()):
        if not lp:
            continue
        twins = sorted(groups.get((False, forcing, scale), []), key=lambda e: e.seed)
        for a, b in zip(sorted(members, key=lambda e: e.seed), twins):
            diffs = decoding_differences(a.run, b.run)
            out.append(Check(f"same decoding settings: {label(True, forcing, scale)} vs twin (seed {a.seed})",
                             not diffs, "; ".join(diffs) or f"{', '.join(SHARED)} and generation kwargs match"))
    return out


def manifest_checks(evals: list[Evaluation]) -> list[Check]:
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


def coverage_checks(evals: list[Evaluation]) -> list[Check]:
    short = [
        f"{e.where.name}/{t}: {ts.n_effective} of {ts.n_original}"
        for e in evals for t, ts in e.run.tasks.items() if ts.n_effective < ts.n_original
    ]
    n = sum(ts.n for ts in evals[0].run.tasks.values())
    return [Check("every item covered", not short, "; ".join(short) or f"all {n} items in every evaluation")]


def cache_checks(evals: list[Evaluation]) -> list[Check]:
    bad = []
    for e in evals:
        if not e.looped:
            continue
        result = e.header.cache_check
        if not result or not result.get("ok"):
            bad.append(f"{e.where.name}: {'not run' if not result else 'failed'}")
    return [Check("cached looped decoding equals full recomputation", not bad,
                  "; ".join(bad) or "checked on the first batch of every looped evaluation")]


def fairness_checks(evals: list[Evaluation], groups: dict) -> list[Check]:
    """Every check, in the order the report lists them."""
    return decoding_checks(groups) + manifest_checks(evals) + coverage_checks(evals) + cache_checks(evals)
