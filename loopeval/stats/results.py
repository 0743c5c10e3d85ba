"""Shared pieces of the result objects: the interval type and scipy.stats' attribute names."""

from __future__ import annotations

from typing import NamedTuple


class ConfidenceInterval(NamedTuple):
    low: float
    high: float


class ScipyNames:
    """scipy.stats names for the fields: ``.statistic`` is ``.delta``, ``.confidence_interval`` is ``.ci``."""

    @property
    def statistic(self) -> float:
        return self.delta

    @property
    def confidence_interval(self) -> ConfidenceInterval:
        return self.ci
