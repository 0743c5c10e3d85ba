"""The paper's two tests: :func:`delta_param` (Eq. 2, the loop against its identically
trained twin), :func:`delta_flop` (Eq. 3, against the best cheaper unlooped evaluation,
Holm over the looped evaluations) and :func:`finished_both` (§B.1). Each comparison is
rows of :func:`loopeval.analysis.protocol.rows.compare`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from loopeval.analysis.protocol.rows import RunComparison, _check_options, _outcome, compare, single_kind
from loopeval.analysis.runs import PairedRuns, Run, pair_runs
from loopeval.analysis.stats import BestCheaperResult, Resampler, best_cheaper_bootstrap, holm
from loopeval.analysis.stats.options import COST_MODES, DEFAULTS, SELECTIONS

RunLike = Run | Sequence[Run]
TESTS = ("auto", "bootstrap", "mcnemar")


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
    twins = _check_flop_arguments(unlooped, looped, twins, costlier, cost, selection)
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
    chosen, deciding, adjusted = _comparators(rs, looped, pool, costs, selection, confidence, family)
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


def _check_flop_arguments(unlooped: Mapping[str, RunLike], looped: Mapping[str, RunLike],
                          twins: Mapping[str, str] | None, costlier: Sequence[str], cost: str,
                          selection: str) -> dict[str, str]:
    """:func:`delta_flop`'s cost mode, selection and names checked before any run is read; ``twins`` as a dict."""
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
    return twins


def _comparators(rs: Resampler, looped: Mapping[str, RunLike], pool: Mapping[str, float], costs: Mapping[str, float],
                 selection: str, confidence: float, family: tuple[int, str] | None) -> tuple[dict, dict, dict]:
    """Each loop's best cheaper comparator chosen once and in every resample (``(fixed,
    resampled)``), the deciding one of the loops that have a cheaper comparator (``selection``),
    and its p Holm-adjusted over those loops."""

    def choose(loop: str, how: str) -> BestCheaperResult | None:
        return best_cheaper_bootstrap(rs, loop, pool, costs[loop], selection=how, confidence=confidence, family=family)

    chosen = {loop: (choose(loop, "fixed"), choose(loop, "resampled")) for loop in looped}
    deciding = {loop: (pair[0] if selection == "fixed" else pair[1]) for loop, pair in chosen.items()
                if pair[0] is not None}
    adjusted = dict(zip(deciding, holm([r.pvalue for r in deciding.values()])))
    return chosen, deciding, adjusted


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
