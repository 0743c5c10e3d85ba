"""The equal-FLOP comparator: the best unlooped evaluation that costs no more than the loop."""

from __future__ import annotations

import math
from collections.abc import Mapping


def best_cheaper(loop_cost: float, candidates: Mapping[str, tuple[float, float]]) -> str | None:
    """Name of the most accurate candidate with ``cost <= loop_cost``, or ``None`` if none qualifies.

    ``candidates`` maps a name to ``(cost, accuracy)``. Equal cost qualifies. Ties in
    accuracy go to the cheaper candidate, then to the name that sorts first.
    """
    if not (isinstance(loop_cost, (int, float)) and math.isfinite(loop_cost) and loop_cost > 0):
        raise ValueError(f"loop_cost must be a positive finite number, got {loop_cost!r}")
    for name, pair in candidates.items():
        if len(pair) != 2 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in pair):
            raise ValueError(f"candidate {name!r}: expected (cost, accuracy) as finite numbers, got {pair!r}")
        if pair[0] < 0:
            raise ValueError(f"candidate {name!r}: cost {pair[0]!r} is negative")
    eligible = [(-acc, cost, str(name)) for name, (cost, acc) in candidates.items() if cost <= loop_cost]
    return min(eligible)[2] if eligible else None
