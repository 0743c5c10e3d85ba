"""The two tests of the paper (Section 3, Appendix A.5, B.2) on lm-eval runs.

* :func:`compare`: a paired comparison of two systems per task and on the macro, all
  from one set of shared resamples: accuracies, difference, 95% interval, p-value,
  McNemar p (0/1 single-seed tasks), TOST within ±2 points, per-seed differences.
* :func:`delta_param`: the looped model against its identically trained twin.
* :func:`delta_flop`: each looped evaluation (one per token budget) against the best
  cheaper unlooped evaluation (most accurate with FLOPs <= the loop's, chosen on the
  test items, which favours the unlooped side), Holm-corrected over the budgets; the
  same-budget twin is compared as well.
* :func:`verdict`: which test passes, and the sentences that say so. ΔFLOP only counts
  once Δparam passes.

Every comparison takes the baseline first: ``compare(paired, baseline, candidate)``,
``delta_param(twin, looped)``, ``delta_flop(unlooped, looped)``.

An outcome is "better" or "worse" when the two-sided p-value (Holm-adjusted for ΔFLOP)
is below ``alpha``, else "equivalent" when TOST passes, else "inconclusive". Results
are plain dataclasses holding every number (accuracies and differences as fractions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loopeval.runs import PairedRuns, Run, pair_runs
from loopeval.stats import (
    ConfidenceInterval,
    Resampler,
    SeedSummary,
    best_cheaper,
    holm,
    mcnemar,
    seed_summary,
)
from loopeval.stats.display import points, pvalue as show_p

RunLike = Run | Sequence[Run]


@dataclass(frozen=True)
class Comparison:
    """Candidate against baseline on one task, or on the macro over tasks (``task=None``)."""

    task: str | None
    baseline: str
    candidate: str
    n: int
    baseline_accuracy: float
    candidate_accuracy: float
    delta: float
    ci: ConfidenceInterval
    pvalue: float
    mcnemar_pvalue: float | None
    equivalent: bool
    equivalence_ci: ConfidenceInterval
    equivalence_pvalue: float
    outcome: str

    def as_dict(self) -> dict:
        """The JSON row of ``loopeval compare --json``."""
        return {
            "n": self.n,
            "baseline": self.baseline_accuracy,
            "candidate": self.candidate_accuracy,
            "delta": self.delta,
            "ci": list(self.ci),
            "pvalue": self.pvalue,
            "mcnemar_pvalue": self.mcnemar_pvalue,
            "equivalent": self.equivalent,
        }


@dataclass(frozen=True)
class RunComparison:
    """A comparison per task and on the macro, with the per-seed macro differences
    (``None`` when the two sides have different numbers of seed runs)."""

    baseline: str
    candidate: str
    tasks: Mapping[str, Comparison]
    macro: Comparison
    seeds: SeedSummary | None
    confidence: float
    margin: float
    alpha: float
    n_resamples: int
    bootstrap_seed: int


def _outcome(delta: float, pvalue: float, equivalent: bool, alpha: float) -> str:
    if pvalue < alpha:
        return "better" if delta > 0 else "worse"
    return "equivalent" if equivalent else "inconclusive"


def compare(paired: PairedRuns, baseline: str, candidate: str, *, resampler: Resampler | None = None,
            confidence: float = 0.95, margin: float = 0.02, alpha: float = 0.05) -> RunComparison:
    """Compare two systems of ``paired`` per task and on the macro.

    ``resampler`` (default: ``paired.resampler()``, 10,000 resamples, seed 0) supplies
    the shared resamples, so every row of one table uses the same ones.
    """
    rs = paired.resampler() if resampler is None else resampler

    def row(task: str | None) -> Comparison:
        boot = rs.paired_bootstrap(baseline, candidate, benchmark=task, confidence=confidence)
        eq = rs.tost(baseline, candidate, benchmark=task, margin=margin, alpha=alpha)
        mc = None
        if task is not None and paired.binary(task, baseline, candidate):
            mc = mcnemar(rs.scores(baseline, task), rs.scores(candidate, task)).pvalue
        return Comparison(
            task=task, baseline=baseline, candidate=candidate, n=boot.n,
            baseline_accuracy=boot.baseline, candidate_accuracy=boot.candidate, delta=boot.delta,
            ci=boot.ci, pvalue=boot.pvalue, mcnemar_pvalue=mc, equivalent=eq.equivalent,
            equivalence_ci=eq.ci, equivalence_pvalue=eq.pvalue,
            outcome=_outcome(boot.delta, boot.pvalue, eq.equivalent, alpha),
        )

    a, b = paired.scores[baseline], paired.scores[candidate]
    return RunComparison(
        baseline=baseline,
        candidate=candidate,
        tasks={t: row(t) for t in paired.tasks},
        macro=row(None),
        seeds=seed_summary(a, b) if len(paired.runs[baseline]) == len(paired.runs[candidate]) else None,
        confidence=confidence,
        margin=margin,
        alpha=alpha,
        n_resamples=rs.n_resamples,
        bootstrap_seed=rs.seed,
    )


def delta_param(twin: RunLike, looped: RunLike, *, tasks: Sequence[str] | None = None, n_resamples: int = 10_000,
                seed: int = 0, confidence: float = 0.95, margin: float = 0.02, alpha: float = 0.05) -> RunComparison:
    """Δparam (Eq. 2): ``looped`` against its identically trained ``twin`` ("twin" → "looped").

    Either side may be one run per training seed (paired by position); item scores are
    averaged over seeds, and ``seeds`` counts the seeds favouring the loop.
    """
    paired = pair_runs({"twin": twin, "looped": looped}, tasks=tasks)
    rs = paired.resampler(n_resamples=n_resamples, seed=seed)
    return compare(paired, "twin", "looped", resampler=rs, confidence=confidence, margin=margin, alpha=alpha)


@dataclass(frozen=True)
class DeltaFlop:
    """ΔFLOP (Eq. 3) of one looped evaluation.

    ``comparison`` is best cheaper → loop (``None`` when every unlooped evaluation costs
    more); ``pvalue_holm`` is its macro p-value Holm-adjusted over the looped
    evaluations tested together. ``twin_comparison`` is same-budget twin → loop.
    ``costs`` and ``accuracies`` cover every unlooped evaluation. ``outcome`` uses the
    Holm p-value; it is "untestable" without a cheaper comparator.
    """

    loop: str
    loop_cost: float
    loop_accuracy: float
    costs: Mapping[str, float]
    accuracies: Mapping[str, float]
    comparator: str | None
    comparator_cost: float | None
    comparator_accuracy: float | None
    comparison: RunComparison | None
    pvalue_holm: float | None
    twin: str | None
    twin_comparison: RunComparison | None
    outcome: str


def delta_flop(unlooped: Mapping[str, RunLike], looped: Mapping[str, RunLike], *,
               twins: Mapping[str, str] | None = None, tasks: Sequence[str] | None = None,
               flops_per_token: Mapping[str, float] | None = None, n_resamples: int = 10_000, seed: int = 0,
               confidence: float = 0.95, margin: float = 0.02, alpha: float = 0.05) -> tuple[DeltaFlop, ...]:
    """ΔFLOP (Eq. 3) for each looped evaluation, e.g. one per token budget.

    ``unlooped`` and ``looped`` map names to runs (or one run per seed). A cost is the
    total FLOPs of the traced items (:meth:`Run.cost`; mean over seed runs), or
    ``flops_per_token[name]`` times the traced tokens. ``twins`` maps a looped name to
    its same-budget twin among ``unlooped``. All comparisons share one set of resamples.
    """
    clash = set(looped) & set(unlooped)
    if clash:
        raise ValueError(f"names used for both looped and unlooped runs: {sorted(clash)}")
    if not looped or not unlooped:
        raise ValueError("delta_flop needs at least one looped and one unlooped evaluation")
    twins = dict(twins or {})
    for loop, twin in twins.items():
        if loop not in looped or twin not in unlooped:
            raise ValueError(f"twins: {loop!r} -> {twin!r} must map a looped name to an unlooped name")
    paired = pair_runs({**looped, **unlooped}, tasks=tasks)
    fpt = dict(flops_per_token or {})

    def cost(name: str) -> float:
        runs = paired.runs[name]
        return sum(r.cost(paired.tasks, flops_per_token=fpt.get(name)) for r in runs) / len(runs)

    costs = {name: cost(name) for name in paired.systems}
    accuracy = {name: paired.accuracy(name) for name in paired.systems}
    pool = {name: (costs[name], accuracy[name]) for name in unlooped}
    rs = paired.resampler(n_resamples=n_resamples, seed=seed)
    options = dict(resampler=rs, confidence=confidence, margin=margin, alpha=alpha)

    comparators = {loop: best_cheaper(costs[loop], pool) for loop in looped}
    comparisons = {loop: compare(paired, comparators[loop], loop, **options) for loop in looped if comparators[loop]}
    adjusted = dict(zip(comparisons, holm([c.macro.pvalue for c in comparisons.values()])))
    out = []
    for loop in looped:
        comp, best, twin = comparisons.get(loop), comparators[loop], twins.get(loop)
        out.append(DeltaFlop(
            loop=loop,
            loop_cost=costs[loop],
            loop_accuracy=accuracy[loop],
            costs={u: costs[u] for u in unlooped},
            accuracies={u: accuracy[u] for u in unlooped},
            comparator=best,
            comparator_cost=costs[best] if best else None,
            comparator_accuracy=accuracy[best] if best else None,
            comparison=comp,
            pvalue_holm=float(adjusted[loop]) if comp else None,
            twin=twin,
            twin_comparison=compare(paired, twin, loop, **options) if twin else None,
            outcome=_outcome(comp.macro.delta, adjusted[loop], comp.macro.equivalent, alpha) if comp else "untestable",
        ))
    return tuple(out)


@dataclass(frozen=True)
class Verdict:
    """Which of the two tests the loop passes, and one sentence per test.

    ``flop`` is ``None`` when ΔFLOP is not meaningful (the loop does not beat its twin)
    or was not evaluated; ``passes_flop`` likewise.
    """

    param: str
    flop: tuple[str, ...] | None
    passes_param: bool
    passes_flop: bool | None
    sentences: tuple[str, str]

    @property
    def text(self) -> str:
        return " ".join(self.sentences)


def _p(p: float) -> str:
    text = show_p(p)
    return f"p{text}" if text.startswith("<") else f"p = {text}"


def _interval(c: Comparison) -> str:
    return f"[{points(c.ci.low, signed=True)}, {points(c.ci.high, signed=True)}]"


def verdict(param: RunComparison, flop: Sequence[DeltaFlop] | None = None) -> Verdict:
    """The paper's order of the tests (§4.3): "The second question matters only if the
    answer to the first is yes." ΔFLOP counts only when the loop beats its twin
    (Δparam "better"), and it passes when the loop beats the best cheaper unlooped
    evaluation at every looped evaluation (budget)."""
    m = param.macro
    seeds = f", {param.seeds.favour} of {param.seeds.n} seeds favouring the loop" if param.seeds else ""
    where = f"{points(m.delta, signed=True)} points {_interval(m)}, {_p(m.pvalue)}"
    if m.outcome == "better":
        first = f"Equal parameters: the loop beats its twin by {where}{seeds}."
    elif m.outcome == "worse":
        first = (f"Equal parameters: the loop is worse than its twin by {points(-m.delta)} points "
                 f"{_interval(m)}, {_p(m.pvalue)}{seeds}.")
    else:
        why = f"equivalent within ±{points(param.margin)} points" if m.outcome == "equivalent" else "not significant"
        first = f"Equal parameters: no significant difference from the twin, {where} ({why})."
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
