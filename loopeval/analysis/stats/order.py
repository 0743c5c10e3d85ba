"""Data-order intervals: variation over training orders of a few fixed parents (002, Table 6).

The companion paper reports, next to its text-bootstrap intervals, "a small-sample 95%
interval for the equal-parent mean, conditional on C/D"; "Order intervals are
conditional Welch 95% intervals for the two fixed parents." The two intervals describe
different sources of uncertainty (which text, which training order) and are not combined.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t

from loopeval.analysis.stats.family import family_level
from loopeval.analysis.stats.results import ConfidenceInterval, ScipyNames
from loopeval.analysis.stats.scores import numeric_array
from loopeval.analysis.stats.options import DEFAULTS


@dataclass(frozen=True)
class OrderInterval(ScipyNames):
    """Equal-parent mean ``delta`` with its Welch–Satterthwaite t interval ``ci`` and ``df``.

    ``means``, ``sds`` (sample SDs) and ``n`` are per parent. ``df`` is NaN when every
    parent's SD is zero; ``ci`` is then the point ``[delta, delta]``.
    """

    delta: float
    ci: ConfidenceInterval
    df: float
    se: float
    means: Mapping[str, float]
    sds: Mapping[str, float]
    n: Mapping[str, int]
    confidence: float


def order_interval(groups: Mapping[str, object], *, confidence: float = DEFAULTS.confidence) -> OrderInterval:
    """Interval for the equal-parent mean of per-order differences, conditional on the parents.

    ``groups`` maps each fixed parent to its per-order paired differences (one value per
    training order, at least two). The estimate weighs parents equally,
    ``delta = mean over parents of the parent means``, with standard error
    ``sqrt(sum_p s_p² / n_p) / P`` and Welch–Satterthwaite degrees of freedom
    ``(sum_p v_p)² / sum_p (v_p² / (n_p − 1))``, ``v_p = s_p² / n_p``; the interval is
    ``delta ± t_df se``. With one parent it is the one-sample t interval.
    """
    level = family_level(confidence)
    if not isinstance(groups, Mapping) or not groups:
        raise ValueError("groups must map each parent to its per-order differences, and name at least one parent")
    values = {}
    for parent, x in groups.items():
        arr = numeric_array(x, name=f"groups[{parent!r}]")
        if arr.ndim != 1 or len(arr) < 2:
            raise ValueError(f"groups[{parent!r}]: need a 1-D array of at least two orders, got shape {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError(f"groups[{parent!r}] contains NaN or inf")
        values[str(parent)] = arr
    means = {p: float(x.mean()) for p, x in values.items()}
    sds = {p: float(x.std(ddof=1)) for p, x in values.items()}
    n = {p: len(x) for p, x in values.items()}
    v = np.array([sds[p] ** 2 / n[p] for p in values])
    dof = np.array([n[p] - 1 for p in values])
    delta = float(np.mean(list(means.values())))
    se = float(np.sqrt(v.sum()) / len(values))
    if se == 0:
        return OrderInterval(delta=delta, ci=ConfidenceInterval(delta, delta), df=float("nan"), se=0.0,
                             means=means, sds=sds, n=n, confidence=level)
    df = float(v.sum() ** 2 / np.sum(v**2 / dof))
    half = float(student_t.ppf((1 + level) / 2, df)) * se
    return OrderInterval(delta=delta, ci=ConfidenceInterval(delta - half, delta + half), df=df, se=se,
                         means=means, sds=sds, n=n, confidence=level)
