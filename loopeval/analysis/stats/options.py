"""The statistics options of every comparison, defined once: the library's defaults, the
CLI flags, the study file's ``statistics:`` keys and the report all read :data:`DEFAULTS`.

Paper A.5: "Intervals come from paired bootstraps over test items ... All p-values are
two-sided, and p<0.001 marks the resampling floor. Equivalence means a 90% interval within
±2 points (two one-sided tests). Comparisons across token budgets are Holm-corrected."
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from loopeval.common.args import as_float, as_int
from loopeval.evaluation.metrics import POINTS


def as_fraction(name: str, value) -> float:
    """A level or the accuracies' margin: a fraction in (0, 1), never points
    (:meth:`Unit.check_margin` of ``POINTS``, the one check of a fraction's margin)."""
    number = as_float(name, value)
    return POINTS.check_margin(name, value if isinstance(value, (int, float)) else number)


def as_margins(name: str, value) -> dict[str, float]:
    """Equivalence margins per metric: ``{lm-eval metric name: margin in its unit}``."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}={value!r}: expected a mapping of metric name to margin, e.g. {{nll_per_byte: 0.005}}")
    out = {}
    for metric, margin in value.items():
        number = as_float(f"{name}.{metric}", margin)
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"{name}.{metric}={margin!r}: expected a positive margin in the metric's unit")
        out[str(metric)] = number
    return out


COST_MODES = ("passes", "flops")
"""How a loop is charged. A.2: "We charge the loop its layer passes, (N+m)/N, which matches
the measured slowdown of memory-bound decoding"; ``flops`` counts exact FLOPs instead."""

SELECTIONS = ("fixed", "resampled")
"""How ΔFLOP's best cheaper comparator is chosen: once on the test items, or in every resample."""


@dataclass(frozen=True)
class StatOptions:
    """Options of the paired statistics and the two tests (fractions, not points)."""

    n_resamples: int = field(default=10_000, metadata={"parse": lambda n, v: as_int(n, v, minimum=1),
        "help": "bootstrap resamples (p-values below 1/n_resamples are reported at that floor)"})
    seed: int = field(default=0, metadata={"help": "seed of the resampling"})
    confidence: float = field(default=0.95, metadata={"parse": as_fraction, "help": "two-sided confidence level of the intervals"})
    alpha: float = field(default=0.05, metadata={"parse": as_fraction,
        "help": "two-sided level of the tests; TOST uses the (1 - 2 alpha) interval, A.5's 90%"})
    margin: float = field(default=0.02, metadata={"parse": as_fraction,
        "help": "equivalence margin of accuracies, a fraction; A.5: 'a 90% interval within ±2 points' (0.02)"})
    margins: Mapping[str, float] = field(default_factory=dict, metadata={"parse": as_margins,
        "help": "equivalence margin of a metric in its own unit, by lm-eval metric name (e.g. nll_per_byte: 0.005); "
                "a continuous metric without one gets no equivalence verdict"})

    cost: str = field(default="passes", metadata={
        "help": "what a loop is charged: passes (A.2's layer passes) or flops", "choices": COST_MODES})
    selection: str = field(default="fixed", metadata={
        "help": "best cheaper comparator chosen once (fixed) or in every resample (resampled)", "choices": SELECTIONS})


DEFAULTS = StatOptions()
"""The defaults, as the paper's A.5 states them."""

STAT_OPTIONS: tuple[str, ...] = tuple(f.name for f in fields(StatOptions))
