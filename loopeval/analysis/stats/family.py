"""Family-adjusted confidence levels: one level for each of ``k`` intervals of a family."""

from __future__ import annotations

from numbers import Integral
from loopeval.analysis.stats.options import DEFAULTS

FAMILY_METHODS = ("bonferroni",)


def family_level(confidence: float = DEFAULTS.confidence, family: tuple[int, str] | None = None) -> float:
    """The confidence level of each interval of a family, ``1 − α/k`` for Bonferroni.

    ``α = 1 − confidence`` is the family's error rate and ``family = (k, "bonferroni")``
    names its size and method; ``None`` leaves ``confidence`` as it is. The companion
    paper's levels: ``family_level(0.95, (4, "bonferroni")) == 0.9875`` (98.75%), 99.375%
    for 8 and 99.5833% for 12.
    """
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    if family is None:
        return float(confidence)
    if not (isinstance(family, tuple) and len(family) == 2):
        raise ValueError(f"family must be (k, method), e.g. (4, 'bonferroni'), got {family!r}")
    k, method = family
    if isinstance(k, bool) or not isinstance(k, Integral) or k < 1:
        raise ValueError(f"family size must be a positive integer, got {k!r}")
    if method not in FAMILY_METHODS:
        raise ValueError(f"family method must be one of {FAMILY_METHODS}, got {method!r}")
    return 1 - (1 - confidence) / int(k)
