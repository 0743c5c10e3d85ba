"""Tango's score interval for paired proportions against independent truth: a closed form
derived by hand, the constrained likelihood maximised numerically, statsmodels' McNemar
statistic, and coverage and test size computed exactly over every table."""

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.stats import norm

from loopeval.analysis.stats.paired_proportions import (
    _bounds,
    paired_proportions,
    paired_tost,
    tango_statistic,
)


def table(both: int, only_baseline: int, only_candidate: int, neither: int):
    """Baseline and candidate 0/1 scores of a paired 2x2 table."""
    a = [1] * both + [1] * only_baseline + [0] * only_candidate + [0] * neither
    b = [1] * both + [0] * only_baseline + [1] * only_candidate + [0] * neither
    return np.array(a), np.array(b)


@pytest.mark.parametrize("n", [10, 24, 200])
@pytest.mark.parametrize("confidence", [0.9, 0.95])
def test_no_discordant_items_closed_form(n, confidence):
    # b = c = 0: q(Δ) = 0 for Δ >= 0, so Z(Δ)² = nΔ / (1 − Δ) and the bound solves nΔ = z²(1 − Δ).
    z = norm.ppf((1 + confidence) / 2)
    r = paired_proportions(*table(1, 0, 0, n - 1), confidence=confidence)
    assert r.ci.high == pytest.approx(z * z / (n + z * z), abs=1e-9)
    assert r.ci.low == pytest.approx(-r.ci.high, abs=1e-9)
    assert r.delta == 0 and r.pvalue == 1


def _constrained_q(b: int, c: int, n: int, delta: float) -> float:
    """The MLE of P(only baseline right) given the difference, by numerical maximisation."""
    lo, hi = max(0.0, -delta), (1 - delta) / 2

    def nll(q):
        p = np.array([q + delta, q, 1 - 2 * q - delta])
        return -sum(k * math.log(max(x, 1e-300)) for k, x in zip((b, c, n - b - c), p) if k)

    return minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13}).x


@pytest.mark.parametrize("cells", [(36, 12, 2, 0), (1, 7, 1, 12), (59, 16, 6, 80), (0, 3, 0, 21), (5, 0, 4, 15)])
def test_bounds_solve_the_score_equation(cells):
    # At each bound the score statistic, with q from the numerically maximised constrained
    # likelihood (not the quadratic's root), is ±z.
    a, b = table(*cells)
    r = paired_proportions(a, b)
    only_b, only_a, n = cells[2], cells[1], sum(cells)
    z = norm.ppf(0.975)
    for bound, target in ((r.ci.low, z), (r.ci.high, -z)):
        if abs(bound) == 1:
            continue
        q = _constrained_q(only_b, only_a, n, bound)
        stat = (only_b - only_a - n * bound) / math.sqrt(n * (2 * q + bound * (1 - bound)))
        assert stat == pytest.approx(target, abs=1e-4)
    assert r.ci.low <= r.delta <= r.ci.high


@pytest.mark.parametrize("cells", [(36, 12, 2, 0), (10, 5, 9, 6), (3, 1, 0, 20)])
def test_statistic_at_zero_is_mcnemar(cells):
    from statsmodels.stats.contingency_tables import mcnemar

    both, only_a, only_b, neither = cells
    chi2 = mcnemar([[both, only_a], [only_b, neither]], exact=False, correction=False).statistic
    assert tango_statistic(only_b, only_a, sum(cells), 0.0) ** 2 == pytest.approx(chi2)
    assert paired_proportions(*table(*cells)).pvalue == pytest.approx(2 * norm.sf(math.sqrt(chi2)))


def _tables(n: int, z: float):
    """Every (b, c) table of n items with its interval and log multinomial coefficient."""
    rows = []
    for b in range(n + 1):
        for c in range(n + 1 - b):
            coef = math.lgamma(n + 1) - math.lgamma(b + 1) - math.lgamma(c + 1) - math.lgamma(n - b - c + 1)
            rows.append((b, c, coef, _bounds(b, c, n, z)))
    return rows


def _probability(rows, n: int, p12: float, p21: float, keep) -> float:
    """The probability, under true cell probabilities p12 (only candidate) and p21 (only
    baseline), of the tables whose interval ``keep`` accepts."""
    total = 0.0
    for b, c, coef, ci in rows:
        cells = ((b, p12), (c, p21), (n - b - c, 1 - p12 - p21))
        if keep(ci) and not any(k and p <= 0 for k, p in cells):
            total += math.exp(coef + sum(k * math.log(p) for k, p in cells if k))
    return total


@pytest.mark.parametrize("n", [10, 24, 40])
def test_exact_coverage(n):
    # Coverage of the 95% interval summed exactly over every table, for true (P(only
    # candidate), P(only baseline)) from none to many discordant items. A score interval
    # is not exact, but its coverage stays near the nominal level everywhere, including
    # with no discordant items, where the bootstrap interval is the single point 0.
    rows = _tables(n, norm.ppf(0.975))
    grid = [(p12, p21) for p12 in (0.0, 0.02, 0.1, 0.3) for p21 in (0.0, 0.05, 0.2)]
    cover = [_probability(rows, n, p12, p21, lambda ci, d=p12 - p21: ci.low <= d <= ci.high) for p12, p21 in grid]
    assert min(cover) > 0.92
    assert np.mean(cover) > 0.95


def test_equivalence_test_size_exact():
    # At a true difference on the margin, the chance of declaring equivalence is at most
    # about alpha (exact over all tables of 60 items).
    n, margin, alpha = 60, 0.15, 0.05
    rows = _tables(n, norm.ppf(1 - alpha))
    inside = lambda ci: -margin < ci.low and ci.high < margin
    for p12, p21 in ((0.25, 0.10), (0.15, 0.0), (0.05, 0.20)):
        assert _probability(rows, n, p12, p21, inside) < alpha + 0.01


def test_one_of_24_each_is_not_equivalent():
    # The real SmolLM2 comparison of issue 24: 1/24 right on both sides, no discordant item.
    # The bootstrap interval is [0, 0]; Tango's 90% interval is about ±10 points.
    r = paired_tost(*table(1, 0, 0, 23), margin=0.02, alpha=0.05)
    assert not r.equivalent
    assert r.ci.high > 0.09 and r.pvalue > 0.05


def test_large_agreement_is_equivalent():
    r = paired_tost(*table(900, 5, 5, 1090), margin=0.02)
    assert r.equivalent and r.pvalue < 0.05


def test_bad_input():
    with pytest.raises(ValueError, match="0/1 scores"):
        paired_proportions([0, 0.5], [1, 0])
    with pytest.raises(ValueError, match="one length"):
        paired_proportions([0, 1], [1])
    with pytest.raises(ValueError, match="margin"):
        paired_tost([0, 1], [1, 0], margin=2)
