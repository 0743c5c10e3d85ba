"""The comparison rows (:func:`compare`): candidate against baseline per task and on one macro
per kind of metric, from one set of shared resamples, with each row's outcome, its equivalence
(bootstrap TOST where the bootstrap is trusted, Tango's interval for few 0/1 items) and
Holm's adjustment over the tasks; and the checks of a margin before any resampling."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from loopeval.analysis.runs import PairedRuns, kind
from loopeval.analysis.stats import (
    ConfidenceInterval,
    Resampler,
    SeedSummary,
    family_level,
    holm,
    mcnemar,
    paired_tost,
    seed_summary,
)
from loopeval.analysis.stats.display import pvalue as show_p
from loopeval.analysis.stats.options import DEFAULTS
from loopeval.common.errors import UserError
from loopeval.evaluation.metrics import POINTS, Unit

SMALL_N = 100  # items
SMALL_DISCORDANT = 30  # items on which the two sides disagree (0/1 scores)
"""Below either count the paired bootstrap is not trusted: its p is flagged and its TOST
interval is replaced by Tango's score interval (0/1 scores), or equivalence is not claimed."""
EQUIVALENCE_METHODS = ("bootstrap", "tango", "tango-bonferroni", "none", "no margin")


@dataclass(frozen=True)
class Comparison:
    """Candidate against baseline on one task, or on the macro over tasks (``task=None``).

    ``pvalue`` is the paired bootstrap's; ``decided_by`` names the test whose p decided
    ``outcome`` (``pvalue_decisive``). ``pvalue_holm`` adjusts a task's deciding p over
    the tasks of its comparison (Table 8); ``None`` on the macro. ``warnings`` flag a
    sample too small for the bootstrap p to be trusted.

    Numbers are oriented so that higher is better; ``unit`` and ``higher_is_better`` say
    how to read them as the metric reports them (:meth:`reported`, :meth:`show`).
    ``margin`` is the equivalence margin in the metric's unit; ``None`` (a continuous
    metric without one): no equivalence verdict, ``equivalent`` is ``None``.
    """

    task: str | None
    baseline: str
    candidate: str
    n: int
    baseline_accuracy: float
    candidate_accuracy: float
    delta: float
    ci: ConfidenceInterval
    confidence: float
    pvalue: float
    mcnemar_pvalue: float | None
    discordant: int | None
    equivalent: bool
    equivalence_ci: ConfidenceInterval
    equivalence_pvalue: float
    decided_by: str
    pvalue_decisive: float
    pvalue_holm: float | None
    outcome: str
    warnings: tuple[str, ...]
    equivalence_method: str = "bootstrap"
    unit: Unit = POINTS
    higher_is_better: bool = True
    margin: float | None = DEFAULTS.margin

    @property
    def kind(self) -> str:
        return kind(self.unit, self.higher_is_better)

    def reported(self, x: float) -> float:
        """An oriented value (mean or difference) as the metric reports it."""
        return x if self.higher_is_better else -x

    def reported_ci(self, ci: ConfidenceInterval) -> ConfidenceInterval:
        return ci if self.higher_is_better else ConfidenceInterval(-ci.high, -ci.low)

    def show(self, x: float, *, signed: bool = False) -> str:
        """An oriented value as the metric reports it, in its unit: ``'52.6'``, ``'0.5262'``."""
        return self.unit.show(self.reported(x), signed=signed)

    def interval(self, ci: ConfidenceInterval | None = None) -> str:
        """``'[-1.2, +3.4]'``: ``ci`` (default: the difference's) as the metric reports it."""
        low, high = self.reported_ci(self.ci if ci is None else ci)
        return f"[{self.unit.show(low, signed=True)}, {self.unit.show(high, signed=True)}]"

    @property
    def equivalence(self) -> str:
        """The equivalence verdict in words: ``'yes (±2.0 points)'``, ``'no (±0.0050 nats per byte)'``,
        ``'no valid interval'`` or ``'no margin'``."""
        if self.margin is None:
            return "no margin"
        if self.equivalence_method == "none":
            return "no valid interval"
        return f"{'yes' if self.equivalent else 'no'} (±{self.unit.amount(self.margin)})"

    def as_dict(self) -> dict:
        """The JSON row of ``loopeval compare --json``: values as the metric reports them
        (fractions for a 0/1 accuracy), ``delta`` and ``ci`` candidate − baseline."""
        return {
            "n": self.n,
            "unit": "fraction" if self.unit.fraction else self.unit.name,
            "higher_is_better": self.higher_is_better,
            "baseline": self.reported(self.baseline_accuracy),
            "candidate": self.reported(self.candidate_accuracy),
            "delta": self.reported(self.delta),
            "ci": list(self.reported_ci(self.ci)),
            "confidence": self.confidence,
            "pvalue": self.pvalue,
            "pvalue_holm": self.pvalue_holm,
            "mcnemar_pvalue": self.mcnemar_pvalue,
            "decided_by": self.decided_by,
            "outcome": self.outcome,
            "equivalent": self.equivalent,
            "margin": self.margin,
            "equivalence_ci": list(self.reported_ci(self.equivalence_ci)),
            "equivalence_method": self.equivalence_method,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class SeedComparison:
    """The macro difference of one pair of training-seed runs, with its own bootstrap."""

    index: int  # position of the seed run on both sides
    delta: float
    ci: ConfidenceInterval
    pvalue: float


@dataclass(frozen=True)
class RunComparison:
    """A comparison per task and on the macro. ``seeds`` counts the seed runs favouring
    the candidate and ``per_seed`` compares each pair of seed runs (both ``None`` when the
    sides have different numbers of seed runs; ``per_seed`` also with a single seed).
    ``macros`` holds one macro per kind of metric (:meth:`PairedRuns.kinds`), fractions
    first; ``macro`` is the first of them (the only one when every task shares a kind).
    ``margin`` is the fractions' equivalence margin, ``margins`` those given per metric."""

    baseline: str
    candidate: str
    tasks: Mapping[str, Comparison]
    macro: Comparison
    seeds: SeedSummary | None
    per_seed: tuple[SeedComparison, ...] | None
    test: str
    confidence: float
    family: tuple[int, str] | None
    margin: float
    alpha: float
    n_resamples: int
    bootstrap_seed: int
    pilot: str | None = None  # "pilot: n of N items" when a run is a --limit subset
    macros: Mapping[str, Comparison] | None = None
    margins: Mapping[str, float] | None = None


def _outcome(delta: float, pvalue: float, equivalent: bool | None, alpha: float) -> str:
    if pvalue < alpha:
        return "better" if delta > 0 else "worse"
    return "equivalent" if equivalent else "inconclusive"


def _check_options(confidence: float, margin: float, alpha: float, margins: Mapping[str, float] | None = None) -> None:
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")
    POINTS.check_margin("margin", margin)
    if margins is not None and not isinstance(margins, Mapping):
        raise ValueError(f"margins must map a metric name to its margin, got {margins!r}")
    family_level(confidence)


def task_margin(paired: PairedRuns, task: str, margin: float, margins: Mapping[str, float] | None) -> float | None:
    """The equivalence margin of ``task``'s metric, in its unit: ``margins[metric]`` where
    given, else ``margin`` (A.5's ±2 points) for a fraction, else ``None`` (no equivalence claim)."""
    unit = paired.unit(task)
    name = paired.metric_name(task)
    if name in (margins or {}):
        return unit.check_margin(f"margin of {name}", margins[name])
    return margin if unit.fraction else None


def check_amounts(paired: PairedRuns, bare: float | None, named: Mapping[str, float] | None, flag: str) -> None:
    """The one rule for an amount given per metric, before any resampling: an equivalence
    margin (``--margin`` of ``compare`` and ``report``, a study's ``statistics.margin`` and
    ``margins``) and a difference to detect (``power``'s ``--delta``). A named metric must be
    one these runs report, its value in that metric's unit (:meth:`Unit.check_margin`); a bare
    value is the accuracies' (a fraction in (0, 1)) and needs an accuracy among the metrics.
    ``flag`` names the option in the refusal."""
    by_name: dict[str, list[str]] = {}
    for t in paired.tasks:
        by_name.setdefault(paired.metric_name(t), []).append(t)
    for name, value in (named or {}).items():
        if name not in by_name:
            raise UserError(f"{flag} {name}=...: no metric {name!r} in these runs (their metrics: "
                            f"{', '.join(sorted(by_name))})")
        for t in by_name[name]:
            paired.unit(t).check_margin(f"{flag} {name}", value)
    if bare is None:
        return
    if not any(paired.unit(t).fraction for t in paired.tasks):
        first = next(iter(by_name))
        raise UserError(f"{flag} {bare:g}: a bare value is the accuracies' (a fraction, A.5's ±2 points is 0.02), "
                        f"and no metric here is an accuracy; give the metric's own in its unit "
                        f"({flag} {first}={bare:g}, in {paired.unit(by_name[first][0]).name})")
    POINTS.check_margin(flag, bare)


def single_kind(paired: PairedRuns, what: str) -> None:
    """Refuse tasks of several kinds where one macro decides (a macro never averages two units)."""
    kinds = paired.kinds()
    if len(kinds) > 1:
        detail = "; ".join(f"{k}: {', '.join(ts)}" for k, ts in kinds.items())
        raise ValueError(f"{what} decides on one macro, and the tasks' metrics are of different kinds ({detail}); "
                         "a macro never averages two units: pass tasks= of one kind (the report builds one "
                         "section per kind)")


def compare(paired: PairedRuns, baseline: str, candidate: str, *, resampler: Resampler | None = None,
            confidence: float = DEFAULTS.confidence, family: tuple[int, str] | None = None, margin: float = DEFAULTS.margin,
            alpha: float = DEFAULTS.alpha, test: str = "bootstrap", margins: Mapping[str, float] | None = None) -> RunComparison:
    """Compare two systems of ``paired`` per task and on the macro.

    ``resampler`` (default: ``paired.resampler()``, 10,000 resamples, seed 0) supplies
    the shared resamples, so every row of one table uses the same ones. ``family``
    (e.g. ``(4, "bonferroni")``) widens every interval to its family level. ``test``:
    ``"bootstrap"`` decides by the paired bootstrap (paper A.5); ``"mcnemar"`` decides
    each task by exact McNemar and the macro by the tasks' McNemar p-values,
    Holm-adjusted (:func:`delta_param` explains when). ``margin`` is the equivalence margin
    of fractions (A.5's ±2 points), ``margins`` gives a metric's own (by lm-eval metric
    name, in its unit); there is one macro per kind of metric (``RunComparison.macros``).
    """
    if test not in ("bootstrap", "mcnemar"):
        raise ValueError(f"test {test!r}: choose bootstrap or mcnemar")
    _check_options(confidence, margin, alpha, margins)
    rs = paired.resampler() if resampler is None else resampler
    binary = {t: paired.binary(t, baseline, candidate) for t in paired.tasks}
    if test == "mcnemar" and not all(binary.values()):
        odd = [t for t, b in binary.items() if not b]
        raise ValueError(f"test='mcnemar' needs 0/1 scores from one run per side; {', '.join(odd)} has not")
    own = {t: task_margin(paired, t, margin, margins) for t in paired.tasks}

    def read(row: Comparison, task: str) -> Comparison:
        return replace(row, unit=paired.unit(task), higher_is_better=(paired.higher_is_better or {}).get(task, True))

    rows = {t: read(_row(rs, baseline, candidate, t, confidence, family, own[t], alpha, binary[t]), t)
            for t in paired.tasks}
    kinds = paired.kinds()
    macros = {}
    for name, tasks in kinds.items():
        shared = {own[t] for t in tasks}
        kind_margin = shared.pop() if len(shared) == 1 else None
        which = None if len(kinds) == 1 else tuple(tasks)
        macro = read(_row(rs, baseline, candidate, which, confidence, family, kind_margin, alpha, False), tasks[0])
        macro = _macro_equivalence(rs, baseline, candidate, macro, {t: rows[t] for t in tasks}, kind_margin, alpha)
        macros[name] = replace(macro, outcome=_outcome(macro.delta, macro.pvalue, macro.equivalent, alpha))
    deciding = [r.mcnemar_pvalue if test == "mcnemar" else r.pvalue for r in rows.values()]
    adjusted = dict(zip(rows, holm(deciding)))
    rows = {t: _decide(r, test, float(adjusted[t]), alpha) for t, r in rows.items()}
    if test == "mcnemar":
        macros = {name: _decide_macro_by_tasks(m, {t: rows[t] for t in kinds[name]}, alpha) for name, m in macros.items()}
    macro = next(iter(macros.values()))
    a, b = paired.scores[baseline], paired.scores[candidate]
    same_seeds = len(paired.runs[baseline]) == len(paired.runs[candidate])
    return RunComparison(
        baseline=baseline,
        candidate=candidate,
        tasks=rows,
        macro=macro,
        seeds=seed_summary(a, b) if same_seeds else None,
        per_seed=_per_seed(a, b, rs, confidence, family) if same_seeds else None,
        test=test,
        confidence=family_level(confidence, family),
        family=family,
        margin=margin,
        alpha=alpha,
        n_resamples=rs.n_resamples,
        bootstrap_seed=rs.seed,
        pilot=paired.pilot,
        macros=macros,
        margins=dict(margins or {}),
    )


def _row(rs: Resampler, baseline: str, candidate: str, task: str | tuple[str, ...] | None, confidence: float,
         family: tuple[int, str] | None, margin: float | None, alpha: float, binary: bool) -> Comparison:
    boot = rs.paired_bootstrap(baseline, candidate, benchmark=task, confidence=confidence, family=family)
    mc = mcnemar(rs.scores(baseline, task), rs.scores(candidate, task)) if binary else None
    discordant = mc.only_baseline + mc.only_candidate if mc else None
    warnings = []
    if boot.n < SMALL_N:
        warnings.append(f"only {boot.n} items: the bootstrap p is approximate")
    if discordant is not None and discordant < SMALL_DISCORDANT:
        warnings.append(f"only {discordant} discordant items: trust the exact McNemar p ({show_p(mc.pvalue)}) "
                        f"over the bootstrap p ({show_p(boot.pvalue)})")
    equivalent, eq_ci, eq_p, method = _equivalence(rs, baseline, candidate, task, margin, alpha, binary, discordant)
    if method == "none" and isinstance(task, str):
        warnings.append("too few items for the bootstrap and no 0/1 scores for Tango's interval: "
                        "equivalence is not claimed")
    return Comparison(
        task=task if isinstance(task, str) else None, baseline=baseline, candidate=candidate, n=boot.n,
        baseline_accuracy=boot.baseline, candidate_accuracy=boot.candidate, delta=boot.delta,
        ci=boot.ci, confidence=boot.confidence, pvalue=boot.pvalue, mcnemar_pvalue=mc.pvalue if mc else None,
        discordant=discordant, equivalent=equivalent, equivalence_ci=eq_ci, equivalence_pvalue=eq_p,
        decided_by="bootstrap", pvalue_decisive=boot.pvalue, pvalue_holm=None,
        outcome=_outcome(boot.delta, boot.pvalue, equivalent, alpha), warnings=tuple(warnings),
        equivalence_method=method, margin=margin,
    )


def bootstrap_reliable(n: int, discordant: int | None) -> bool:
    """Whether the paired bootstrap is trusted: at least :data:`SMALL_N` items and, for 0/1
    scores, at least :data:`SMALL_DISCORDANT` discordant items."""
    return n >= SMALL_N and (discordant is None or discordant >= SMALL_DISCORDANT)


def _equivalence(rs: Resampler, baseline: str, candidate: str, task, margin: float | None, alpha: float,
                 binary: bool, discordant: int | None) -> tuple[bool | None, ConfidenceInterval, float, str]:
    """TOST within ±margin: the bootstrap's where it is reliable, Tango's score interval for
    0/1 items (without clusters) where it is not, else no claim. A zero-width interval is
    never evidence of equivalence. Without a margin (a continuous metric given none): no
    verdict (``None``), the bootstrap's ``1 − 2 alpha`` interval for reference."""
    if margin is None:
        ci = rs.paired_bootstrap(baseline, candidate, benchmark=task, confidence=1 - 2 * alpha).ci
        return None, ci, float("nan"), "no margin"
    if bootstrap_reliable(rs.n(task), discordant):
        eq = rs.tost(baseline, candidate, benchmark=task, margin=margin, alpha=alpha)
        return eq.equivalent and eq.ci.high > eq.ci.low, eq.ci, eq.pvalue, "bootstrap"
    if binary and rs.n_clusters(task) == rs.n(task):
        eq = paired_tost(rs.scores(baseline, task), rs.scores(candidate, task), margin=margin, alpha=alpha)
        return eq.equivalent, eq.ci, eq.pvalue, "tango"
    eq = rs.tost(baseline, candidate, benchmark=task, margin=margin, alpha=alpha)
    return False, eq.ci, 1.0, "none"


def _macro_equivalence(rs: Resampler, baseline: str, candidate: str, macro: Comparison,
                       rows: Mapping[str, Comparison], margin: float | None, alpha: float) -> Comparison:
    """The macro's equivalence when a task's bootstrap is unreliable: with one task, that
    task's; with several 0/1 tasks (no clusters), the mean of their Tango intervals at the
    Bonferroni level ``1 − 2 alpha / k``, which covers the macro difference at ``1 − 2 alpha``
    because the k intervals hold together (no p-value: ``nan``); otherwise no claim."""
    if margin is None or all(r.equivalence_method == "bootstrap" for r in rows.values()):
        return macro
    if len(rows) == 1:
        (row,) = rows.values()
        return replace(macro, equivalent=row.equivalent, equivalence_ci=row.equivalence_ci,
                       equivalence_pvalue=row.equivalence_pvalue, equivalence_method=row.equivalence_method)
    if all(r.discordant is not None and rs.n_clusters(t) == rs.n(t) for t, r in rows.items()):
        parts = [paired_tost(rs.scores(baseline, t), rs.scores(candidate, t), margin=margin,
                             alpha=alpha / len(rows)).ci for t in rows]
        ci = ConfidenceInterval(float(np.mean([c.low for c in parts])), float(np.mean([c.high for c in parts])))
        return replace(macro, equivalent=bool(-margin < ci.low and ci.high < margin), equivalence_ci=ci,
                       equivalence_pvalue=float("nan"), equivalence_method="tango-bonferroni")
    return replace(macro, equivalent=False, equivalence_pvalue=1.0, equivalence_method="none",
                   warnings=(*macro.warnings, "a task's bootstrap is unreliable and its scores are not 0/1: "
                             "the macro's equivalence is not claimed"))


def _decide(row: Comparison, test: str, holm_p: float, alpha: float) -> Comparison:
    p = row.mcnemar_pvalue if test == "mcnemar" else row.pvalue
    return replace(row, decided_by=test, pvalue_decisive=p, pvalue_holm=holm_p,
                    outcome=_outcome(row.delta, p, row.equivalent, alpha))


def _decide_macro_by_tasks(macro: Comparison, rows: Mapping[str, Comparison], alpha: float) -> Comparison:
    """The macro of a McNemar comparison: significant where a task is after Holm over the
    tasks, in that task's direction (mixed directions: inconclusive); p is the smallest
    Holm-adjusted p. McNemar has no macro of its own, and the pooled test would weight
    the larger benchmark more than the macro does."""
    p = min(r.pvalue_holm for r in rows.values())
    directions = {"better" if r.delta > 0 else "worse" for r in rows.values() if r.pvalue_holm < alpha}
    if len(directions) == 1:
        outcome = directions.pop()
    elif directions:
        outcome = "inconclusive"
    else:
        outcome = "equivalent" if macro.equivalent else "inconclusive"
    return replace(macro, decided_by="mcnemar", pvalue_decisive=p, outcome=outcome,
                    discordant=sum(r.discordant for r in rows.values()))


def _per_seed(a, b, rs: Resampler, confidence: float, family) -> tuple[SeedComparison, ...]:
    """Seed run s of the candidate against seed run s of the baseline, on its own resamples."""
    k = next(iter(a.values())).shape[1]
    scores = {}
    for s in range(k):
        scores[f"baseline#{s}"] = {t: x[:, s] for t, x in a.items()}
        scores[f"candidate#{s}"] = {t: x[:, s] for t, x in b.items()}
    seeded = Resampler(scores, n_resamples=rs.n_resamples, seed=rs.seed)
    out = []
    for s in range(k):
        boot = seeded.paired_bootstrap(f"baseline#{s}", f"candidate#{s}", confidence=confidence, family=family)
        out.append(SeedComparison(s, boot.delta, boot.ci, boot.pvalue))
    return tuple(out)
