"""Planning from a paired pilot: the minimum detectable difference, or the items a difference needs.

Normal approximation of the two-sided paired test at level ``alpha`` with power
``power``: a mean difference over ``n`` items has standard error ``sd / sqrt(n)``, where
``sd`` is the pilot's per-item SD of ``b − a``, and it is detected when
``|delta| >= (z_{1 − alpha/2} + z_{power}) sd / sqrt(n)`` (the far tail is ignored).
For a macro over benchmarks the items keep the pilot's proportions across benchmarks,
so ``sd`` is the effective per-item SD, ``sqrt(N var_macro)`` with ``N`` the pilot's
items and ``var_macro = sum_k sd_k² / n_k / K²``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral

import numpy as np
from scipy.stats import norm

from loopeval.analysis.stats.scores import score_table
from loopeval.analysis.stats.units import fraction
from loopeval.analysis.stats.options import DEFAULTS


@dataclass(frozen=True)
class PowerResult:
    """``mde``: the smallest paired difference detected with probability ``power`` at ``n`` items.

    ``sd`` is the pilot's per-item SD of ``b − a``; ``se`` the standard error of the mean
    difference at ``n``; ``n_needed`` the items that detect ``delta`` (``None`` without
    ``delta``). For a macro, ``sd`` is the effective per-item SD, and ``n``, ``n_pilot`` and
    ``n_needed`` count the items of all benchmarks together, in the pilot's proportions.
    """

    mde: float
    se: float
    n: int
    sd: float
    n_pilot: int
    delta: float | None
    n_needed: int | None
    alpha: float
    power: float


def _positive_int(x, name: str) -> None:
    if isinstance(x, bool) or not isinstance(x, Integral) or x < 1:
        raise ValueError(f"{name} must be a positive integer, got {x!r}")


def power(pilot_a, pilot_b, *, alpha: float = DEFAULTS.alpha, power: float = 0.8, n: int | None = None,
          delta: float | None = None) -> PowerResult:
    """Minimum detectable paired difference of ``b − a`` at ``n`` items, and the items ``delta`` needs.

    ``pilot_a`` (baseline) and ``pilot_b`` (candidate) are paired per-item pilot scores:
    arrays, or ``{benchmark: array}`` for a macro (further axes are averaged per item).
    ``n`` defaults to the pilot's items. Two-sided normal approximation with the
    pilot's per-item difference variance (sample variance, at least two items per benchmark).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if not 0 < power < 1:
        raise ValueError(f"power must lie in (0, 1), got {power!r}")
    if n is not None:
        _positive_int(n, "n")
    if isinstance(pilot_a, Mapping) != isinstance(pilot_b, Mapping):
        raise ValueError("pilot_a and pilot_b must both be arrays or both be {benchmark: array} mappings")
    table = score_table({"pilot_a": pilot_a, "pilot_b": pilot_b})
    if delta is not None:
        if all(np.all((x >= 0) & (x <= 1)) for x in table.values()):  # fractions: the difference is one too
            fraction("delta", delta, low=-1, high=1, closed=False)
        elif not (isinstance(delta, (int, float)) and math.isfinite(delta)):
            raise ValueError(f"delta must be a finite difference in the scores' unit, got {delta!r}")
        if delta == 0:
            raise ValueError("delta must be a non-zero difference")
    for bench, x in table.items():
        if len(x) < 2:
            where = f" on benchmark {bench!r}" if bench else ""
            raise ValueError(f"the pilot needs at least two items{where} to estimate a variance, got {len(x)}")
    n_pilot = sum(len(x) for x in table.values())
    var_macro = sum(np.var(x[:, 1] - x[:, 0], ddof=1) / len(x) for x in table.values()) / len(table) ** 2
    if not var_macro > 0:
        raise ValueError("the pilot cannot estimate the variance: its per-item differences b - a are all equal "
                         f"(zero variance over {n_pilot} items), which would claim an MDE of 0; run a larger or "
                         "more varied pilot")
    sd = math.sqrt(n_pilot * var_macro)
    z = float(norm.ppf(1 - alpha / 2) + norm.ppf(power))
    at = n_pilot if n is None else int(n)
    se = sd / math.sqrt(at)
    return PowerResult(
        mde=z * se,
        se=se,
        n=at,
        sd=sd,
        n_pilot=n_pilot,
        delta=delta,
        n_needed=None if delta is None else max(1, math.ceil((z * sd / abs(delta)) ** 2)),
        alpha=alpha,
        power=power,
    )
