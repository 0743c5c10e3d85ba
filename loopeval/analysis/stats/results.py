"""Shared pieces of the result objects: the interval type and scipy.stats' attribute names."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


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


def percentile_interval(d: np.ndarray, confidence: float) -> ConfidenceInterval:
    """The ``(1 ∓ confidence)/2`` quantiles of the resampled differences ``d``."""
    low, high = np.quantile(d, [(1 - confidence) / 2, (1 + confidence) / 2])
    return ConfidenceInterval(float(low), float(high))
