"""McNemar's exact test for paired 0/1 outcomes (deterministic, training-free comparisons)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

from loopeval.stats.scores import score_table


@dataclass(frozen=True)
class McNemarResult:
    """``b``: items only the baseline gets right; ``c``: items only the candidate gets right."""

    statistic: int
    pvalue: float
    b: int
    c: int
    n: int


def mcnemar(a, b) -> McNemarResult:
    """Exact (binomial) McNemar test of paired 0/1 scores ``a`` (baseline) and ``b`` (candidate).

    ``statistic = min(b, c)`` and ``pvalue = min(1, 2 P(X <= statistic))`` for
    ``X ~ Binomial(b + c, 1/2)``, as ``statsmodels``' ``mcnemar(exact=True)``.
    """
    x = score_table({"a": a, "b": b})
    if len(x) != 1:
        raise ValueError("mcnemar compares one benchmark; pass arrays, not a mapping")
    (table,) = x.values()
    for j, name in enumerate("ab"):
        odd = table[:, j][(table[:, j] != 0) & (table[:, j] != 1)]
        if odd.size:
            raise ValueError(f"mcnemar needs 0/1 scores; {name} has {float(odd[0])!r} (a per-item mean?)")
    only_a = int(np.count_nonzero((table[:, 0] == 1) & (table[:, 1] == 0)))
    only_b = int(np.count_nonzero((table[:, 0] == 0) & (table[:, 1] == 1)))
    stat = min(only_a, only_b)
    pvalue = min(1.0, 2 * float(binom.cdf(stat, only_a + only_b, 0.5)))
    return McNemarResult(statistic=stat, pvalue=pvalue, b=only_a, c=only_b, n=len(table))
