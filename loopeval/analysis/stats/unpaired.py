"""Differences of published accuracies, where only accuracy and n are known (no items)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral

# 004 calls a gain clear when it exceeds this many standard errors of the difference.
CLEAR_SE = 2
NOTE = ("unpaired: treats the two accuracies as independent samples; paired runs on the same items "
        "have a smaller standard error, so use paired_bootstrap or mcnemar when the items are available")


@dataclass(frozen=True)
class UnpairedSummary:
    """``delta = acc_b − acc_a`` with its unpaired binomial standard error ``se``.

    ``clear``: ``|delta| > 2 se``. ``note`` says that pairing is ignored.
    """

    delta: float
    se: float
    se_a: float
    se_b: float
    clear: bool
    note: str = NOTE

    @property
    def statistic(self) -> float:
        return self.delta


def _check(acc, n, name: str) -> None:
    if isinstance(acc, bool) or not isinstance(acc, (int, float)) or not 0 <= acc <= 1:
        raise ValueError(f"acc_{name} must be an accuracy in [0, 1] (a fraction), got {acc!r}")
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
        raise ValueError(f"n_{name} must be a positive integer, got {n!r}")


def unpaired_from_summary(acc_a: float, n_a: int, acc_b: float, n_b: int) -> UnpairedSummary:
    """Candidate ``b`` − baseline ``a`` from accuracies (fractions) and item counts alone.

    ``se = sqrt(acc_a (1 − acc_a) / n_a + acc_b (1 − acc_b) / n_b)``, and the gain is
    clear when it exceeds two standard errors, as 004 reads its table: "+4.3 points on
    GSM8K, +3.8 on MMLU-Pro, and +2.2 on MATH, each exceeding two standard errors of the
    difference". It ignores pairing: for published baselines only.
    """
    _check(acc_a, n_a, "a")
    _check(acc_b, n_b, "b")
    se_a, se_b = math.sqrt(acc_a * (1 - acc_a) / n_a), math.sqrt(acc_b * (1 - acc_b) / n_b)
    delta = acc_b - acc_a
    se = math.hypot(se_a, se_b)
    return UnpairedSummary(delta=delta, se=se, se_a=se_a, se_b=se_b, clear=abs(delta) > CLEAR_SE * se)
