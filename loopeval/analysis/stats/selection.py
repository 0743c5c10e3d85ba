"""The best cheaper comparator inside the bootstrap: chosen once on the test items, or in every resample.

The paper's ΔFLOP comparator is "the most accurate unlooped evaluation, over all budgets,
whose FLOPs do not exceed the loop's. Choosing it on the test items favours the unlooped
model." ``selection="fixed"`` is that rule followed by the paired bootstrap of the
difference, as if the comparator had been named in advance. ``selection="resampled"``
repeats the choice inside every resample (the same shared resamples), so the interval
and p also carry the uncertainty of which system is best. On every resample the
re-chosen comparator is at least as accurate as the fixed one, so the resampled
difference is never above the fixed one: the winner's curse of picking the best of many
noisy accuracies is charged to the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from loopeval.analysis.stats.comparators import best_cheaper
from loopeval.analysis.stats.family import family_level
from loopeval.analysis.stats.results import ConfidenceInterval, ScipyNames, percentile_interval
from loopeval.analysis.stats.options import DEFAULTS, SELECTIONS

if TYPE_CHECKING:
    from loopeval.analysis.stats.bootstrap import Resampler



@dataclass(frozen=True)
class BestCheaperResult(ScipyNames):
    """Candidate − best cheaper system, with the bootstrap interval and p of ``selection``.

    ``comparator`` is the system chosen on the full data, ``baseline`` its mean and
    ``delta`` the observed difference (the same for both selections). ``chosen`` gives,
    for every eligible system (cost <= the candidate's, cheapest first), the share of
    resamples in which it was the comparator: ``{comparator: 1.0}`` for ``"fixed"``.
    """

    delta: float
    ci: ConfidenceInterval
    pvalue: float
    n: int
    comparator: str
    baseline: float
    candidate: float
    selection: str
    chosen: Mapping[str, float]
    confidence: float
    family: tuple[int, str] | None
    n_resamples: int
    distribution: np.ndarray = field(repr=False, compare=False)


def best_cheaper_bootstrap(resampler: Resampler, candidate: str, pool_costs: Mapping[str, float],
                           candidate_cost: float, *, selection: str = "fixed", benchmark: str | None = None,
                           confidence: float = DEFAULTS.confidence, family: tuple[int, str] | None = None) -> BestCheaperResult | None:
    """``candidate`` against the most accurate system of ``pool_costs`` costing ``<= candidate_cost``.

    ``pool_costs`` maps systems of ``resampler`` to their costs. Accuracy is the macro
    (or one ``benchmark``'s mean); ties go to the cheaper system, then to the name that
    sorts first (:func:`loopeval.analysis.stats.best_cheaper`). ``selection="fixed"`` chooses once on
    the full data and bootstraps that difference (:meth:`Resampler.paired_bootstrap`);
    ``"resampled"`` chooses again on every resample's accuracies and reports the interval
    and p (same definitions) of the re-chosen differences. ``None`` when every system of
    the pool costs more than the candidate.
    """
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    level = family_level(confidence, family)
    if candidate not in resampler.systems:
        raise ValueError(f"unknown system {candidate!r}; this resampler has {list(resampler.systems)}")
    if candidate in pool_costs:
        raise ValueError(f"the candidate {candidate!r} cannot also be in pool_costs")
    unknown = [str(s) for s in pool_costs if s not in resampler.systems]
    if unknown:
        raise ValueError(f"pool_costs names unknown systems {unknown}; this resampler has {list(resampler.systems)}")
    observed = {name: (cost, resampler.mean(name, benchmark)) for name, cost in pool_costs.items()}
    comparator = best_cheaper(candidate_cost, observed)
    if comparator is None:
        return None
    if selection == "fixed":
        d = resampler.paired_bootstrap(comparator, candidate, benchmark=benchmark).distribution
        chosen = {comparator: 1.0}
    else:
        # Columns cheapest first, then by name: argmax takes the first maximum, best_cheaper's tie rule.
        names = [name for cost, name in sorted((c, n) for n, (c, _) in observed.items() if c <= candidate_cost)]
        accuracy = np.column_stack([resampler.distribution(s, benchmark) for s in names])
        pick = np.argmax(accuracy, axis=1)
        rows = np.arange(resampler.n_resamples)
        benchmarks = resampler.benchmarks if benchmark is None else (benchmark,)
        # The macro of per-benchmark differences, as Resampler.paired_bootstrap computes it.
        d = np.mean([
            resampler.distribution(candidate, b)
            - np.column_stack([resampler.distribution(s, b) for s in names])[rows, pick]
            for b in benchmarks
        ], axis=0)
        share = np.bincount(pick, minlength=len(names)) / resampler.n_resamples
        chosen = {name: float(x) for name, x in zip(names, share)}
    a, b = observed[comparator][1], resampler.mean(candidate, benchmark)
    return BestCheaperResult(
        delta=b - a,
        ci=percentile_interval(d, level),
        pvalue=resampler.pvalue(d),
        n=resampler.n(benchmark),
        comparator=comparator,
        baseline=a,
        candidate=b,
        selection=selection,
        chosen=chosen,
        confidence=level,
        family=family,
        n_resamples=resampler.n_resamples,
        distribution=d,
    )
