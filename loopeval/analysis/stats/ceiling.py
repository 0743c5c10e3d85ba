"""Eq. 4 of the paper: the gain a loop of cost ``c`` should buy if it were worth extra parameters."""

from __future__ import annotations

import math

from loopeval.analysis.stats.units import fraction


def ceiling_gain(c: float, params_small: float, params_large: float, acc_small: float, acc_large: float) -> float:
    """``Δ* ≈ log c / log(P_large / P_small) × (Acc_large − Acc_small)``.

    The accuracy a looped small model would gain if its ``c``-fold compute bought
    accuracy at the rate that scaling parameters from ``P_small`` to ``P_large`` does
    (log-linear in parameters). Accuracies are fractions; so is the result. The paper:
    ``ceiling_gain(1.29, 4e9, 9e9, 0.597, 0.676) ≈ 0.0248`` (2.5 points).
    """
    if not c >= 1:
        raise ValueError(f"loop cost c must be >= 1, got {c!r}")
    if not 0 < params_small < params_large:
        raise ValueError(f"need 0 < params_small < params_large, got {params_small!r} and {params_large!r}")
    fraction("acc_small", acc_small)
    fraction("acc_large", acc_large)
    return math.log(c) / math.log(params_large / params_small) * (acc_large - acc_small)
