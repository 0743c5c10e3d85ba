"""The library's unit: accuracies, differences and margins are fractions, never points."""

from __future__ import annotations

import math


def fraction(name: str, value, *, low: float = 0.0, high: float = 1.0, closed: bool = True) -> float:
    """``value`` as a fraction in ``[low, high]`` (``(low, high)`` unless ``closed``); a value
    that looks like percentage points gets the hint "fractions, not points"."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    inside = ok and (low <= value <= high if closed else low < value < high)
    if not inside:
        bounds = f"[{low:g}, {high:g}]" if closed else f"({low:g}, {high:g})"
        hint = f" (fractions, not points: {value:g} points is {value / 100:g})" if ok and 1 < abs(value) <= 100 else ""
        raise ValueError(f"{name} must be a fraction in {bounds}, got {value!r}{hint}")
    return float(value)
