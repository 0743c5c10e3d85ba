"""McNemar's exact test for paired 0/1 outcomes (deterministic, training-free comparisons)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loopeval.analysis.stats.scores import score_table


@dataclass(frozen=True)
class McNemarResult:
    """``only_baseline``/``only_candidate``: items only the baseline/candidate gets right, of ``n``."""

    statistic: int
    pvalue: float
    only_baseline: int
    only_candidate: int
    n: int


def mcnemar(a, b) -> McNemarResult:
    """Exact (binomial) McNemar test of paired 0/1 scores ``a`` (baseline) and ``b`` (candidate).

    statsmodels' ``mcnemar(exact=True)``: ``statistic = min(only_baseline, only_candidate)``
    and ``pvalue = min(1, 2 P(X <= statistic))`` for ``X ~ Binomial(only_baseline + only_candidate, 1/2)``.
    """
    from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar  # slow import, not at CLI start

    x = score_table({"a": a, "b": b})
    if len(x) != 1:
        raise ValueError("mcnemar compares one benchmark; pass arrays, not a mapping")
    (table,) = x.values()
    for j, name in enumerate("ab"):
        odd = table[:, j][(table[:, j] != 0) & (table[:, j] != 1)]
        if odd.size:
            raise ValueError(f"mcnemar needs 0/1 scores; {name} has {float(odd[0])!r} (a per-item mean?)")
    right_a, right_b = table[:, 0] == 1, table[:, 1] == 1
    counts = [[np.count_nonzero(right_a & right_b), np.count_nonzero(right_a & ~right_b)],
              [np.count_nonzero(~right_a & right_b), np.count_nonzero(~right_a & ~right_b)]]
    res = sm_mcnemar(counts, exact=True)
    return McNemarResult(statistic=int(res.statistic), pvalue=float(res.pvalue), only_baseline=int(counts[0][1]),
                         only_candidate=int(counts[1][0]), n=len(table))
