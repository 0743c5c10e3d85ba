"""Tango's score interval and equivalence test for a difference of paired proportions.

For 0/1 scores of the same items by two systems, only the discordant items carry
information on the difference: ``b`` items only the candidate gets right, ``c`` only
the baseline, of ``n``. The difference is ``Δ = (b − c) / n``. Tango (1998, Stat Med
17:891–908) inverts the score test

    Z(Δ) = (b − c − nΔ) / sqrt(n (2 q(Δ) + Δ (1 − Δ)))

where ``q(Δ)`` is the maximum-likelihood estimate of the probability of "only the
baseline right" under the constraint that the difference is ``Δ`` (a quadratic's root,
Tango's eq. 4): the interval is ``{Δ : |Z(Δ)| < z}``. It stays valid at small ``n``
and with few or no discordant items, where the paired bootstrap collapses to a point
(no discordant item: every resample has difference 0); at ``b = c = 0`` its half-width
is ``z² / (n + z²)``. It depends on ``b``, ``c`` and ``n`` alone. Newcombe's hybrid
interval (1998, method 10) also depends on how the concordant items split between
both-right and both-wrong, which says nothing about the difference: at 24 items and no
discordant item its 90% half-width is 6.5 points with 12 of each and 11.3 with 1 and 23.
At ``Δ = 0`` Tango's statistic is McNemar's ``(b − c) / sqrt(b + c)``, the test the
protocol already uses for 0/1 comparisons.

The equivalence test (Tango's §3) is two one-sided score tests at ``±margin``;
equivalence at level ``alpha`` is the same as the ``1 − 2 alpha`` interval lying inside
``(−margin, +margin)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from loopeval.analysis.stats.results import ConfidenceInterval, ScipyNames
from loopeval.analysis.stats.units import fraction
from loopeval.evaluation.metrics import POINTS


@dataclass(frozen=True)
class PairedProportionsResult(ScipyNames):
    """Candidate − baseline difference of paired proportions with Tango's score interval.

    ``only_candidate`` (``b``) and ``only_baseline`` (``c``) count the discordant items
    of ``n``; ``pvalue`` is the two-sided score test of ``Δ = 0`` (McNemar's, uncorrected,
    normal approximation; 1 without discordant items).
    """

    delta: float
    ci: ConfidenceInterval
    pvalue: float
    confidence: float
    only_candidate: int
    only_baseline: int
    n: int


@dataclass(frozen=True)
class PairedEquivalenceResult(ScipyNames):
    """Tango's equivalence test of ``|candidate − baseline| < margin``: ``ci`` is the
    ``1 − 2 alpha`` score interval, ``pvalue`` the larger of the two one-sided p-values."""

    equivalent: bool
    ci: ConfidenceInterval
    pvalue: float
    delta: float
    margin: float
    alpha: float


def _counts(a, b) -> tuple[int, int, int]:
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"paired 0/1 scores must be two 1-d arrays of one length, got shapes {x.shape} and {y.shape}")
    if x.size == 0:
        raise ValueError("no items to compare")
    for name, v in (("a", x), ("b", y)):
        odd = v[(v != 0) & (v != 1)]
        if odd.size:
            raise ValueError(f"paired proportions need 0/1 scores; {name} has {float(odd[0])!r}")
    return int(np.count_nonzero((y == 1) & (x == 0))), int(np.count_nonzero((x == 1) & (y == 0))), x.size


def tango_statistic(b: int, c: int, n: int, delta: float) -> float:
    """Tango's score statistic ``Z(Δ)`` for ``b`` items only the candidate gets right and
    ``c`` only the baseline, of ``n`` (decreasing in ``Δ``; ``±inf`` where the constrained
    variance is 0 and the numerator is not)."""
    a_ = 2 * n
    b_ = -b - c + (2 * n - b + c) * delta
    c_ = -c * delta * (1 - delta)
    q = (math.sqrt(max(b_ * b_ - 4 * a_ * c_, 0.0)) - b_) / (2 * a_)
    numerator = b - c - n * delta
    variance = n * (2 * q + delta * (1 - delta))
    if variance <= 0:
        return 0.0 if numerator == 0 else math.copysign(math.inf, numerator)
    return numerator / math.sqrt(variance)


def _normal_quantile(p: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(p))


def _bounds(b: int, c: int, n: int, z: float) -> ConfidenceInterval:
    """The Δ where ``Z(Δ) = ±z``, by bisection on the monotone statistic."""
    from scipy.optimize import brentq

    estimate = (b - c) / n
    edge = 1.0 - 1e-12

    def solve(target: float, lo: float, hi: float, outer: float) -> float:
        f = lambda d: tango_statistic(b, c, n, d) - target
        if f(outer) * f(estimate) > 0:  # no crossing before the edge of [-1, 1]
            return math.copysign(1.0, outer)
        return float(brentq(f, lo, hi, xtol=1e-12))

    low = -1.0 if estimate <= -edge else solve(z, -edge, estimate, -edge)
    high = 1.0 if estimate >= edge else solve(-z, estimate, edge, edge)
    return ConfidenceInterval(low, high)


def paired_proportions(a, b, *, confidence: float = 0.95) -> PairedProportionsResult:
    """Tango's score interval for ``mean(b) − mean(a)`` of paired 0/1 scores ``a``
    (baseline) and ``b`` (candidate), items in the same order."""
    fraction("confidence", confidence, closed=False)
    only_b, only_a, n = _counts(a, b)
    z = _normal_quantile((1 + confidence) / 2)
    discordant = only_b + only_a
    pvalue = 1.0 if discordant == 0 else float(math.erfc(abs(only_b - only_a) / math.sqrt(discordant) / math.sqrt(2)))
    return PairedProportionsResult(
        delta=(only_b - only_a) / n, ci=_bounds(only_b, only_a, n, z), pvalue=pvalue, confidence=confidence,
        only_candidate=only_b, only_baseline=only_a, n=n,
    )


def paired_tost(a, b, *, margin: float = 0.02, alpha: float = 0.05) -> PairedEquivalenceResult:
    """Tango's equivalence test of paired 0/1 scores ``a`` (baseline) and ``b`` (candidate)
    within ``±margin`` (a fraction) at level ``alpha``."""
    POINTS.check_margin("margin", margin)
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")
    only_b, only_a, n = _counts(a, b)
    ci = _bounds(only_b, only_a, n, _normal_quantile(1 - alpha))
    from scipy.stats import norm

    p_low = float(norm.sf(tango_statistic(only_b, only_a, n, -margin)))  # H0: Δ <= -margin
    p_high = float(norm.cdf(tango_statistic(only_b, only_a, n, margin)))  # H0: Δ >= +margin
    return PairedEquivalenceResult(
        equivalent=bool(-margin < ci.low and ci.high < margin), ci=ci, pvalue=max(p_low, p_high),
        delta=(only_b - only_a) / n, margin=margin, alpha=alpha,
    )
