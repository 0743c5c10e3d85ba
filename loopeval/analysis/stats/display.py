"""Formatting for display only: results stay fractions, tables show points."""

from __future__ import annotations

import math


def points(x: float, *, signed: bool = False, digits: int = 1) -> str:
    """A fraction as percentage points: ``points(0.041, signed=True) == '+4.1'``."""
    value = round(100 * x, digits) + 0.0  # + 0.0 turns -0.0 into 0.0
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def pvalue(p: float | None, *, floor: float = 0.001) -> str:
    """``'<0.001'`` under the resampling floor, three decimals below 0.01, else two; ``'–'`` for None."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    if p < floor:
        return f"<{floor:g}"
    return f"{p:.3f}" if p < 0.01 else f"{p:.2f}"
