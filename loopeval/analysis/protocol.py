"""The two tests of the paper (Section 3, Appendix A.5, B.2) on lm-eval runs.

* :func:`compare`: a paired comparison of two systems per task and on the macro, all
  from one set of shared resamples: accuracies, difference, interval, p-value (and
  its Holm adjustment over the tasks), McNemar p (0/1 single-seed tasks), TOST within
  ±2 points, per-seed differences and small-sample warnings.
* :func:`delta_param`: the looped model against its identically trained twin; a
  training-free loop is decided by exact McNemar tests (Table 2's ‡).
* :func:`delta_flop`: each looped evaluation (one per token budget) against the best
  cheaper unlooped evaluation, Holm-corrected over the budgets, with costs charged as
  layer passes (the paper's rule) or FLOPs; the same-budget twin is compared as well.
* :func:`finished_both`: accuracy on the items both models finish (§B.1).
* :func:`verdict`: which test passes, and the sentences that say so. ΔFLOP only counts
  once Δparam passes.

Every comparison takes the baseline first: ``compare(paired, baseline, candidate)``,
``delta_param(twin, looped)``, ``delta_flop(unlooped, looped)``.

An outcome is "better" or "worse" when the deciding two-sided p-value (Holm-adjusted
where a family is tested) is below ``alpha``, else "equivalent" when TOST passes, else
"inconclusive". Results are frozen dataclasses holding every number (fractions for a 0/1
accuracy, the metric's own unit for a continuous one, oriented so that higher is better).

Each metric keeps its unit (:mod:`loopeval.evaluation.metrics`): a macro averages the
tasks of one kind only (one unit, one direction), and the equivalence margin is the
metric's: A.5's ±2 points (``margin=0.02``) for fractions, and for a continuous metric only
the margin given in its unit (``margins={"nll_per_byte": 0.005}``); without one no
equivalence is claimed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from loopeval.analysis.runs import PairedRuns, Run, kind, pair_runs
from loopeval.analysis.stats import (
    BestCheaperResult,
    best_cheaper_bootstrap,
    ConfidenceInterval,
    Resampler,
    SeedSummary,
    family_level,
    holm,
    mcnemar,
    paired_tost,
    seed_summary,
)
from loopeval.analysis.stats.display import points, pvalue as show_p
from loopeval.analysis.stats.options import COST_MODES, DEFAULTS, SELECTIONS
from loopeval.common.errors import UserError
from loopeval.evaluation.metrics import POINTS, Unit

RunLike = Run | Sequence[Run]
TESTS = ("auto", "bootstrap", "mcnemar")
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


def training_free(paired: PairedRuns, twin: str, looped: str) -> bool:
    """Whether ``looped`` is ``twin``'s very weights plus a loop, decoded greedily once each
    with 0/1 scores: the deterministic comparison the paper decides by McNemar's test."""
    runs = paired.runs[twin] + paired.runs[looped]
    if len(paired.runs[twin]) != 1 or len(paired.runs[looped]) != 1:
        return False
    headers = [r.header for r in runs]
    if any(h is None or h.weights is None for h in headers) or headers[0].weights != headers[1].weights:
        return False
    greedy = all(not (ts.generation_kwargs or {}).get("do_sample", False) for r in runs for ts in r.tasks.values())
    return greedy and all(paired.binary(t, twin, looped) for t in paired.tasks)


def delta_param(twin: RunLike, looped: RunLike, *, tasks: Sequence[str] | None = None, test: str = "auto",
                n_resamples: int = DEFAULTS.n_resamples, seed: int = 0, confidence: float = DEFAULTS.confidence,
                family: tuple[int, str] | None = None, margin: float = DEFAULTS.margin, alpha: float = DEFAULTS.alpha,
                margins: Mapping[str, float] | None = None) -> RunComparison:
    """Δparam (Eq. 2): ``looped`` against its identically trained ``twin`` ("twin" → "looped").

    Either side may be one run per training seed (paired by position); item scores are
    averaged over seeds, and ``seeds`` counts the seeds favouring the loop. ``test``:
    ``"auto"`` follows Table 2 ("‡ marks the training-free loop (McNemar test [32])"): exact
    McNemar decides when the comparison is training-free (:func:`training_free`), the
    paired bootstrap otherwise (A.5: "Intervals come from paired bootstraps over test
    items"); ``"bootstrap"`` or ``"mcnemar"`` force one. ``RunComparison.test`` says which
    decided. The tasks' metrics must be of one kind (one unit): the test decides on their macro.
    """
    if test not in TESTS:
        raise ValueError(f"test {test!r}: choose one of {', '.join(TESTS)}")
    paired = pair_runs({"twin": twin, "looped": looped}, tasks=tasks)
    single_kind(paired, "Δparam")
    if test == "auto":
        test = "mcnemar" if training_free(paired, "twin", "looped") else "bootstrap"
    rs = paired.resampler(n_resamples=n_resamples, seed=seed)
    return compare(paired, "twin", "looped", resampler=rs, confidence=confidence, family=family, margin=margin,
                   alpha=alpha, test=test, margins=margins)


@dataclass(frozen=True)
class DeltaFlop:
    """ΔFLOP (Eq. 3) of one looped evaluation.

    ``costs`` (every unlooped evaluation) and ``loop_cost`` are in the ``cost_mode``
    charge; ``other_costs`` in the other mode where the traces allow it. ``comparator``
    is the best cheaper evaluation chosen on the test items; ``comparison`` is
    comparator → loop (``None`` when every unlooped evaluation costs more).
    ``selected`` is the same difference with the comparator chosen once (``fixed``) and
    ``reselected`` with it chosen again in every resample (``resampled``);
    ``selection`` says which decided. ``pvalue_holm`` is the deciding macro p
    Holm-adjusted over the looped evaluations tested together. ``twin_comparison`` is
    same-budget twin → loop; ``costlier`` compares the comparators named in
    ``delta_flop(costlier=...)`` whatever they cost (Table 3's lower rows).
    """

    loop: str
    cost_mode: str
    loop_cost: float
    loop_accuracy: float
    costs: Mapping[str, float]
    other_costs: Mapping[str, float] | None
    accuracies: Mapping[str, float]
    comparator: str | None
    comparator_cost: float | None
    comparator_accuracy: float | None
    comparison: RunComparison | None
    selected: BestCheaperResult | None
    reselected: BestCheaperResult | None
    selection: str
    pvalue_holm: float | None
    twin: str | None
    twin_comparison: RunComparison | None
    costlier: Mapping[str, RunComparison]
    outcome: str


def delta_flop(unlooped: Mapping[str, RunLike], looped: Mapping[str, RunLike], *,
               twins: Mapping[str, str] | None = None, costlier: Sequence[str] = (),
               tasks: Sequence[str] | None = None, cost: str = "passes", selection: str = "fixed",
               flops_per_token: Mapping[str, float] | None = None, n_resamples: int = DEFAULTS.n_resamples, seed: int = 0,
               confidence: float = DEFAULTS.confidence, family: tuple[int, str] | None = None, margin: float = DEFAULTS.margin,
               alpha: float = DEFAULTS.alpha, margins: Mapping[str, float] | None = None) -> tuple[DeltaFlop, ...]:
    """ΔFLOP (Eq. 3) for each looped evaluation, e.g. one per token budget.

    ``unlooped`` and ``looped`` map names to runs (or one run per seed; costs average
    over them). ``cost="passes"`` (default) follows A.2: "We charge the loop its layer
    passes, (N+m)/N, which matches the measured slowdown of memory-bound decoding"; a
    run's cost is its generated tokens × layer passes per token (:meth:`Run.cost`).
    ``cost="flops"`` uses the traced FLOPs, or ``flops_per_token[name]`` times the traced
    tokens. The comparator is "the most accurate unlooped evaluation, over all budgets,
    whose FLOPs do not exceed the loop's. Choosing it on the test items favours the
    unlooped model" (B.2); ``selection="resampled"`` lets the choice decide inside every
    resample instead (both are reported). ``twins`` maps a looped name to its
    same-budget twin; ``costlier`` names unlooped evaluations to compare with every
    loop although they may cost more (a larger model). All comparisons share one set of
    resamples; the deciding p-values are Holm-corrected over the looped evaluations.
    The tasks' metrics must be of one kind (one unit): the test decides on their macro.
    """
    if cost not in COST_MODES:
        raise ValueError(f"cost {cost!r}: choose one of {', '.join(COST_MODES)}")
    if selection not in SELECTIONS:
        raise ValueError(f"selection {selection!r}: choose one of {', '.join(SELECTIONS)}")
    clash = set(looped) & set(unlooped)
    if clash:
        raise ValueError(f"names used for both looped and unlooped runs: {sorted(clash)}")
    if not looped or not unlooped:
        raise ValueError("delta_flop needs at least one looped and one unlooped evaluation")
    twins = dict(twins or {})
    for loop, twin in twins.items():
        if loop not in looped or twin not in unlooped:
            raise ValueError(f"twins: {loop!r} -> {twin!r} must map a looped name to an unlooped name")
    for name in costlier:
        if name not in unlooped:
            raise ValueError(f"costlier: {name!r} is not an unlooped evaluation")
    _check_options(confidence, margin, alpha, margins)
    paired = pair_runs({**looped, **unlooped}, tasks=tasks)
    single_kind(paired, "ΔFLOP")
    fpt = dict(flops_per_token or {})
    costs = _costs(paired, cost, fpt)
    other_mode = "flops" if cost == "passes" else "passes"
    try:
        other = _costs(paired, other_mode, fpt)
    except ValueError:
        other = None
    accuracy = {name: paired.accuracy(name) for name in paired.systems}
    rs = paired.resampler(n_resamples=n_resamples, seed=seed)
    options = dict(resampler=rs, confidence=confidence, family=family, margin=margin, alpha=alpha, margins=margins)
    pool = {u: costs[u] for u in unlooped}

    def choose(loop: str, how: str) -> BestCheaperResult | None:
        return best_cheaper_bootstrap(rs, loop, pool, costs[loop], selection=how, confidence=confidence, family=family)

    chosen = {loop: (choose(loop, "fixed"), choose(loop, "resampled")) for loop in looped}
    deciding = {loop: (pair[0] if selection == "fixed" else pair[1]) for loop, pair in chosen.items()
                if pair[0] is not None}
    adjusted = dict(zip(deciding, holm([r.pvalue for r in deciding.values()])))
    out = []
    for loop in looped:
        fixed, resampled = chosen[loop]
        best = fixed.comparator if fixed else None
        comp = compare(paired, best, loop, **options) if best else None
        twin = twins.get(loop)
        decided = deciding.get(loop)
        outcome = "untestable"
        if decided is not None:
            outcome = _outcome(decided.delta, adjusted[loop], comp.macro.equivalent, alpha)
        out.append(DeltaFlop(
            loop=loop,
            cost_mode=cost,
            loop_cost=costs[loop],
            loop_accuracy=accuracy[loop],
            costs={u: costs[u] for u in unlooped},
            other_costs=None if other is None else {name: other[name] for name in (*unlooped, loop)},
            accuracies={u: accuracy[u] for u in unlooped},
            comparator=best,
            comparator_cost=costs[best] if best else None,
            comparator_accuracy=accuracy[best] if best else None,
            comparison=comp,
            selected=fixed,
            reselected=resampled,
            selection=selection,
            pvalue_holm=float(adjusted[loop]) if decided is not None else None,
            twin=twin,
            twin_comparison=compare(paired, twin, loop, **options) if twin else None,
            costlier={name: compare(paired, name, loop, **options) for name in costlier},
            outcome=outcome,
        ))
    return tuple(out)


def _costs(paired: PairedRuns, mode: str, flops_per_token: Mapping[str, float]) -> dict[str, float]:
    """Each system's cost in ``mode``, averaged over its seed runs."""
    if mode == "passes":
        known = {r.header is not None and bool(r.header.cost.get("layer_params"))
                 for rs in paired.runs.values() for r in rs}
        if len(known) > 1:
            raise ValueError("some traces record their model's layer sizes and some do not, so layer passes of "
                             "different models cannot be charged alike; evaluate all with loopeval's looped model "
                             "or use cost='flops'")
    return {name: float(np.mean([r.cost(paired.tasks, mode=mode, flops_per_token=flops_per_token.get(name))
                                 for r in runs]))
            for name, runs in paired.runs.items()}


@dataclass(frozen=True)
class FinishedBoth:
    """§B.1: accuracy on the items that both models finish (in every seed run), per task
    and on the macro of those subsets; ``finished`` counts them per task."""

    finished: Mapping[str, int]
    comparison: RunComparison


def finished_both(twin: RunLike, looped: RunLike, *, tasks: Sequence[str] | None = None, n_resamples: int = DEFAULTS.n_resamples,
                  seed: int = 0, confidence: float = DEFAULTS.confidence, margin: float = DEFAULTS.margin, alpha: float = DEFAULTS.alpha,
                  margins: Mapping[str, float] | None = None) -> FinishedBoth:
    """Twin → looped on the items both finish within their budget ("On GSM8K problems that
    both models finish, the looped model answers 79.1% correctly against 75.6%"), so a
    gain there does not come from finishing. ``finished`` comes from the traces."""
    paired = pair_runs({"twin": twin, "looped": looped}, tasks=tasks)
    masks = {}
    for t in paired.tasks:
        done = np.column_stack([r.tasks[t].finished for side in ("twin", "looped") for r in paired.runs[side]])
        masks[t] = done.all(axis=1)
    kept = [t for t in paired.tasks if masks[t].any()]
    if not kept:
        raise ValueError("no item is finished by both models")
    subset = PairedRuns(
        systems=paired.systems, tasks=tuple(kept),
        doc_ids={t: paired.doc_ids[t][masks[t]] for t in kept},
        scores={s: {t: paired.scores[s][t][masks[t]] for t in kept} for s in paired.systems},
        runs=paired.runs, higher_is_better=paired.higher_is_better, units=paired.units,
    )
    rs = subset.resampler(n_resamples=n_resamples, seed=seed)
    result = compare(subset, "twin", "looped", resampler=rs, confidence=confidence, margin=margin, alpha=alpha,
                     margins=margins)
    return FinishedBoth(finished={t: int(masks[t].sum()) for t in paired.tasks}, comparison=result)


@dataclass(frozen=True)
class Verdict:
    """Which of the two tests the loop passes, and one sentence per test.

    ``flop`` is ``None`` when ΔFLOP is not meaningful (the loop does not beat its twin)
    or was not evaluated; ``passes_flop`` likewise. ``pilot`` ("pilot: n of N items") marks
    a verdict from a subset of the items: its sentences say so and ``final`` is false.
    """

    param: str
    flop: tuple[str, ...] | None
    passes_param: bool
    passes_flop: bool | None
    sentences: tuple[str, str]
    pilot: str | None = None
    withheld: tuple[str, ...] = ()

    @property
    def final(self) -> bool:
        """Whether this is a final verdict (not a pilot's, not withheld)."""
        return self.pilot is None and not self.withheld

    @property
    def text(self) -> str:
        return " ".join(self.sentences)


def _as_pilot(v: Verdict, pilot: str | None) -> Verdict:
    if pilot is None:
        return v
    lead = f"{pilot[0].upper()}{pilot[1:]}, not a final verdict. "
    return replace(v, pilot=pilot, sentences=(lead + v.sentences[0], v.sentences[1]))


def withhold(v: Verdict, failed: Sequence[str]) -> Verdict:
    """``v`` withheld because the fairness checks ``failed`` (their names) did not pass: a
    comparison is a verdict only when the two sides differ in the loop alone, or in what is
    named as intended. The tables keep their figures; the sentences say why there is no verdict."""
    if not failed:
        return v
    return replace(v, withheld=tuple(failed), sentences=(
        f"Verdict withheld: {len(failed)} fairness check(s) failed ({'; '.join(failed)}), so the two sides "
        "were not compared on equal terms.",
        "Fix the difference, or name it as intended (intended_differences, --intended) if it is meant; "
        "the figures below are not a verdict."))


def _p(p: float) -> str:
    text = show_p(p)
    return f"p{text}" if text.startswith("<") else f"p = {text}"


def _difference(c: Comparison) -> str:
    """``'+4.1 points [+1.0, +7.2]'``, ``'-0.0086 nats per byte [-0.0111, -0.0061] (lower is better)'``."""
    lower = "" if c.higher_is_better else " (lower is better)"
    return f"{c.unit.amount(c.reported(c.delta), signed=True)} {c.interval()}{lower}"


_INTERVAL_NAMES = {"bootstrap": "bootstrap", "tango": "Tango score", "tango-bonferroni": "Tango score, Bonferroni over tasks"}


def _equivalence_words(c: Comparison, alpha: float) -> str:
    """Why the comparison is or is not equivalent, naming the interval that decided."""
    level = f"{points(1 - 2 * alpha, digits=0)}%"
    if c.margin is None:
        return (f"no equivalence margin was given in {c.unit.name}, so equivalence is not judged "
                f"(the {level} interval is {c.interval(c.equivalence_ci)})")
    if c.equivalence_method == "none":
        return "too few items for a valid equivalence interval, so not shown equivalent"
    where = f"{level} {_INTERVAL_NAMES[c.equivalence_method]} interval {c.interval(c.equivalence_ci)}"
    if c.equivalent:
        return f"equivalent within ±{c.unit.amount(c.margin)}: {where}"
    return f"not shown equivalent: the {where} is not within ±{c.unit.amount(c.margin)}"


def verdict(param: RunComparison, flop: Sequence[DeltaFlop] | None = None) -> Verdict:
    """See :func:`_verdict`; a pilot's verdict says it is one (``Verdict.pilot``)."""
    return _as_pilot(_verdict(param, flop), param.pilot)


def _verdict(param: RunComparison, flop: Sequence[DeltaFlop] | None = None) -> Verdict:
    """The paper's order of the tests (§4.3): "The second question matters only if the
    answer to the first is yes." ΔFLOP counts only when the loop beats its twin
    (Δparam "better"), and it passes when the loop beats the best cheaper unlooped
    evaluation at every looped evaluation (budget)."""
    m = param.macro
    seeds = f", {param.seeds.favour} of {param.seeds.n} seeds favouring the loop" if param.seeds else ""
    test = " (exact McNemar, training-free)" if param.test == "mcnemar" else ""
    p = _p(m.pvalue_decisive) + test
    if m.outcome == "better":
        first = f"Equal parameters: the loop beats its twin by {_difference(m)}, {p}{seeds}."
    elif m.outcome == "worse":
        first = f"Equal parameters: the loop is worse than its twin by {_difference(m)}, {p}{seeds}."
    else:
        first = (f"Equal parameters: no significant difference from the twin, {_difference(m)}, {p} "
                 f"({_equivalence_words(m, param.alpha)}).")
    if m.outcome != "better":
        return Verdict(param=m.outcome, flop=None, passes_param=False, passes_flop=None,
                       sentences=(first, "Equal FLOPs: not meaningful, since the loop does not beat its twin."))
    if not flop:
        return Verdict(param=m.outcome, flop=None, passes_param=True, passes_flop=None,
                       sentences=(first, "Equal FLOPs: not evaluated."))
    outcomes = tuple(f.outcome for f in flop)
    wins, losses, untestable = outcomes.count("better"), outcomes.count("worse"), outcomes.count("untestable")
    passes_flop = wins == len(outcomes)
    details = "; ".join(
        f"{f.loop}: {f.outcome}" + (f" vs {f.comparator}, Holm {_p(f.pvalue_holm)}" if f.comparator else "")
        for f in flop
    )
    second = (
        f"Equal FLOPs: the loop beats the best cheaper unlooped evaluation at {wins} of {len(outcomes)} budgets "
        f"(Holm-corrected)" + (f" and loses at {losses}" if losses else "")
        + (f"; {untestable} have no cheaper unlooped evaluation" if untestable else "")
        + f" ({details}), so it " + ("pays for its compute." if passes_flop else "does not pay for its compute at every budget.")
    )
    return Verdict(param=m.outcome, flop=outcomes, passes_param=True, passes_flop=passes_flop, sentences=(first, second))
