"""``ReportData``: everything a report template needs, as plain values."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, is_dataclass

import numpy as np

from loopeval.analysis.report.checks import Check
from loopeval.analysis.report.tables import Ceiling, Condition
from loopeval.evaluation.metrics import POINTS, Unit


@dataclass
class ReportData:
    """The report's content. Numbers are fractions for 0/1 accuracies and the metric's unit
    otherwise; templates format them with :meth:`show` or a comparison's own ``show``
    (points for fractions), and p-values with the ``pvalue`` filter. ``to_json`` writes it as JSON.

    ``cost_mode`` is how costs are charged ("passes": the paper's layer passes, or
    "flops"); ``selection`` how the best cheaper comparator is chosen ("fixed" on the
    test items, or "resampled" in every resample). ``figure`` holds the data of the
    accuracy-against-cost figure, one series per curve.
    """

    title: str
    created: str
    loop: str
    multiplier: float
    cost_mode: str
    selection: str
    tasks: list[str]
    conditions: list[Condition]
    decoding: list[dict]
    figure: list[dict]
    checks: list[Check]
    runs: list[dict]
    ceiling: Ceiling | None = None
    training: list[dict] = field(default_factory=list)  # report.training.section: Fig. 3 and 5 per twin pair
    training_costs: list[dict] = field(default_factory=list)  # report.training.costs: blocks and seconds per method
    serving: list[dict] = field(default_factory=list)  # report.serving.section: Table 10 rows
    wall_clock: float | None = None  # Figure 2 on measured time: looped points x (latency ratio / c)
    strict: bool = False
    notes: list[str] = field(default_factory=list)
    pilot: str | None = None  # "pilot: n of N items" when built from --limit runs (--allow-subset)
    unfinished_fallback: str = "credit"  # how number-fallback verdicts of cut responses were scored
    fallbacks: list[dict] = field(default_factory=list)  # per run and task: fallback verdicts of cut responses
    kinds: dict[str, list[str]] = field(default_factory=dict)  # kind of metric -> its tasks; one macro each
    units: dict[str, Unit] = field(default_factory=dict)  # task -> its metric's unit

    def show(self, task: str, x: float | None, *, signed: bool = False) -> str:
        """A task's value (as its metric reports it) in its unit."""
        return self.units.get(task, POINTS).show(x, signed=signed)

    def kind_unit(self, kind: str) -> Unit:
        return self.units.get(self.kinds[kind][0], POINTS) if kind in self.kinds else POINTS

    @property
    def other_cost_mode(self) -> str:
        return "flops" if self.cost_mode == "passes" else "passes"

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> str:
        return json.dumps(_plain(self), indent=2, default=str)


def _plain(obj):
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return obj
