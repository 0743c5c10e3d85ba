"""Formatting for display only: values stay in their metric's stored unit (a fraction for a
0/1 accuracy), and are shown by their :class:`~loopeval.evaluation.metrics.Unit`."""

from __future__ import annotations

import math

from loopeval.evaluation.metrics import POINTS


def points(x: float, *, signed: bool = False, digits: int = 1) -> str:
    """A fraction as percentage points, by :meth:`Unit.show` of ``POINTS``:
    ``points(0.041, signed=True) == '+4.1'``."""
    return POINTS.show(x, signed=signed, digits=digits)


def pvalue(p: float | None, *, floor: float = 0.001) -> str:
    """``'<0.001'`` under the resampling floor, three decimals below 0.01, else two; ``'–'`` for None."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    if p < floor:
        return f"<{floor:g}"
    return f"{p:.3f}" if p < 0.01 else f"{p:.2f}"
