"""Pair runs item by item (:func:`pair_runs`) for the paired statistics of
:mod:`loopeval.analysis.stats`: ``doc_id`` aligns the items, ``doc_hash`` and ``target_hash``
check them, and scores are oriented so that higher is better."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from loopeval.analysis.runs.run import Run, TaskScores, pilot_label
from loopeval.analysis.stats import Resampler
from loopeval.analysis.stats.options import DEFAULTS
from loopeval.evaluation.metrics import POINTS, Unit


@dataclass(frozen=True, eq=False)
class PairedRuns:
    """Runs aligned item by item: ``scores[system][task]`` is ``(n_items, n_seeds)``.

    Scores are oriented so that higher is better: a task whose metric is lower-is-better
    (``higher_is_better[task]`` is ``False``, e.g. ``gsm8k_nll``'s NLL) enters negated,
    so every difference candidate − baseline is positive when the candidate is better,
    and the paired bootstrap, TOST and both tests read it the right way round."""

    systems: tuple[str, ...]
    tasks: tuple[str, ...]
    doc_ids: Mapping[str, np.ndarray]
    scores: Mapping[str, Mapping[str, np.ndarray]]
    runs: Mapping[str, tuple[Run, ...]]
    clusters: Mapping[str, tuple] | None = None  # per task, the item clusters all runs agree on
    higher_is_better: Mapping[str, bool] | None = None  # per task, the metric's direction (None: all higher)
    units: Mapping[str, Unit] | None = None  # per task, the metric's unit (None: all points)

    def unit(self, task: str) -> Unit:
        return (self.units or {}).get(task, POINTS)

    def kinds(self) -> dict[str, tuple[str, ...]]:
        """The tasks by kind of metric (:func:`kind`), fractions first: each kind has a macro
        of its own, since a macro never averages two units."""
        out: dict[str, list[str]] = {}
        for t in sorted(self.tasks, key=lambda t: not self.unit(t).fraction):
            out.setdefault(kind(self.unit(t), (self.higher_is_better or {}).get(t, True)), []).append(t)
        return {k: tuple(ts) for k, ts in out.items()}

    def metric_name(self, task: str) -> str | None:
        """lm-eval's name of the task's metric (``nll_per_byte``) in the first run (``None`` without runs)."""
        first = next(iter((self.runs or {}).values()), None)
        return first[0].tasks[task].metric.split(",", 1)[0] if first and first[0] is not None else None

    def resampler(self, *, n_resamples: int = DEFAULTS.n_resamples, seed: int = 0) -> Resampler:
        """Shared bootstrap resamples for every comparison among these runs (seeds averaged per
        item; clusters resampled whole where the runs were loaded with ``cluster_field``)."""
        return Resampler(self.scores, n_resamples=n_resamples, seed=seed, clusters=self.clusters or None)

    @property
    def pilot(self) -> str | None:
        """``"pilot: n of N items"`` when a run is a subset (:func:`pilot_label`), else ``None``."""
        return pilot_label([r for rs in self.runs.values() for r in rs if r is not None], self.tasks)

    def accuracy(self, system: str, task: str | None = None) -> float:
        """Seed-averaged accuracy on one task, or the macro over tasks for ``None``."""
        tasks = self.tasks if task is None else (task,)
        return float(np.mean([self.scores[system][t].mean() for t in tasks]))

    def binary(self, task: str, *systems: str) -> bool:
        """Whether the systems (default: all) score this task 0/1 with one seed run (McNemar applies)."""
        return all(
            self.scores[s][task].shape[1] == 1 and np.isin(self.scores[s][task], (0.0, 1.0)).all()
            for s in systems or self.systems
        )


def kind(unit: Unit, higher_is_better: bool = True) -> str:
    """A kind of metric: its unit, and its direction where lower is better ("nats per byte, lower is better")."""
    return unit.name + ("" if higher_is_better else ", lower is better")


def pair_runs(runs: Mapping[str, Run | Sequence[Run]], *, tasks: Sequence[str] | None = None) -> PairedRuns:
    """Align runs item by item on their common leaf tasks.

    ``runs`` maps a system name to a run or to one run per training seed. ``tasks``
    (leaf tasks or groups) defaults to the tasks of the first run, and every run must
    hold exactly those. Items pair on ``doc_id``; a different item set, ``doc_hash`` or
    ``target_hash`` raises ``ValueError`` naming the task and the counts.
    """
    if not runs:
        raise ValueError("no runs to pair")
    seeds = {str(name): (r,) if isinstance(r, Run) else tuple(r) for name, r in runs.items()}
    for name, rs in seeds.items():
        if not rs or not all(isinstance(r, Run) for r in rs):
            raise ValueError(f"{name}: expected a Run or a non-empty sequence of Runs")
    labelled = [(f"{name}" + (f" (seed run {i})" if len(rs) > 1 else ""), r)
                for name, rs in seeds.items() for i, r in enumerate(rs)]
    _refuse_repeats(labelled)
    first_label, first = labelled[0]
    selected = first._leaves(tasks)
    for label, run in labelled:
        leaves = run._leaves(tasks)
        if set(leaves) != set(selected):
            raise ValueError(
                f"{first_label} and {label} cover different tasks ({sorted(selected)} vs {sorted(leaves)}); "
                "pick common ones with tasks="
            )
    for task in selected:
        ref = first.tasks[task]
        for label, run in labelled[1:]:
            _check_items(task, first_label, ref, label, run.tasks[task])
    clusters = {t: first.tasks[t].clusters for t in selected if first.tasks[t].clusters is not None}
    for label, run in labelled[1:]:
        theirs = {t: run.tasks[t].clusters for t in selected if run.tasks[t].clusters is not None}
        if theirs and theirs != clusters:
            raise ValueError(f"{first_label} and {label} cluster the items differently; load both with one cluster_field")
    direction = {t: first.tasks[t].higher_is_better for t in selected}
    for label, run in labelled[1:]:
        odd = [t for t in selected if run.tasks[t].higher_is_better != direction[t]]
        if odd:
            raise ValueError(f"task {odd[0]}: {first_label} and {label} score it with metrics of opposite direction "
                             f"({first.tasks[odd[0]].metric} and {run.tasks[odd[0]].metric})")
    units = {t: first.tasks[t].unit for t in selected}
    for label, run in labelled[1:]:
        odd = [t for t in selected if run.tasks[t].unit != units[t]]
        if odd:
            raise ValueError(f"task {odd[0]}: {first_label} scores it in {units[odd[0]].name} and {label} in "
                             f"{run.tasks[odd[0]].unit.name} ({first.tasks[odd[0]].metric} and "
                             f"{run.tasks[odd[0]].metric}); compare one metric")
    sign = {t: 1.0 if up else -1.0 for t, up in direction.items()}
    scores = {
        name: {t: sign[t] * np.column_stack([r.tasks[t].scores for r in rs]) for t in selected}
        for name, rs in seeds.items()
    }
    return PairedRuns(
        systems=tuple(seeds),
        tasks=tuple(selected),
        doc_ids={t: first.tasks[t].doc_ids for t in selected},
        scores=scores,
        runs=seeds,
        clusters=clusters or None,
        higher_is_better=direction,
        units=units,
    )


def _refuse_repeats(labelled: list[tuple[str, Run]]) -> None:
    """The same run twice (one results file, or a copy of it) would count as two seeds or systems."""
    seen: dict[str, str] = {}
    for label, run in labelled:
        digest = hashlib.sha256(run.path.read_bytes()).hexdigest()
        if digest in seen:
            raise ValueError(f"{seen[digest]} and {label} are the same run ({run.path}); give each evaluation once")
        seen[digest] = label


def _check_items(task: str, la: str, a: TaskScores, lb: str, b: TaskScores) -> None:
    if not np.array_equal(a.doc_ids, b.doc_ids):
        only_a = np.setdiff1d(a.doc_ids, b.doc_ids)
        only_b = np.setdiff1d(b.doc_ids, a.doc_ids)
        raise ValueError(
            f"task {task}: {la} has {a.n} items and {lb} has {b.n} "
            f"({len(only_a)} doc_ids only in {la}, {len(only_b)} only in {lb}); the runs evaluated different items"
        )
    for attr in ("doc_hashes", "target_hashes"):
        differ = [int(d) for d, x, y in zip(a.doc_ids, getattr(a, attr), getattr(b, attr)) if x != y]
        if differ:
            raise ValueError(
                f"task {task}: {attr[:-2]} differs for {len(differ)} of {a.n} items "
                f"(first doc_id {differ[0]}) between {la} and {lb}; the runs evaluated different data"
            )
