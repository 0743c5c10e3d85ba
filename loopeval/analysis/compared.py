"""Two lm-eval runs compared item by item (``loopeval compare``) or used as a paired pilot
(``loopeval power``): the results, with their text and JSON forms.

Every number is shown in its metric's unit (points for a 0/1 accuracy, nats per byte for
``gsm8k_nll``'s NLL ...), with one macro per kind of metric. A comparison whose runs
decode differently (a failed fairness check) withholds its outcomes, unless each
difference is named as intended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from loopeval.analysis.protocol import Comparison, RunComparison, check_amounts, compare
from loopeval.analysis.runs import (PairedRuns, Run, cost_split, decoding_differences, forcing_shares, load_run,
                                   pair_runs)
from loopeval.analysis.stats import PowerResult, power
from loopeval.analysis.stats.display import points, pvalue
from loopeval.analysis.stats.options import DEFAULTS
from loopeval.common.text import table
from loopeval.evaluation.metrics import POINTS, Unit


def load_two(baseline, candidate, *, unfinished_fallback: str = "credit", **options) -> tuple[dict[str, Run], PairedRuns]:
    """The two runs (baseline first) and their item pairing; ``options`` go to :func:`load_run`,
    ``unfinished_fallback`` to :func:`loopeval.analysis.score_audit.read_runs`."""
    from loopeval.analysis.score_audit import read_runs

    runs = {role: load_run(path, **options) for role, path in (("baseline", baseline), ("candidate", candidate))}
    runs = read_runs(runs, unfinished_fallback)
    return runs, pair_runs(runs)


def runs_header(runs: Mapping[str, Run]) -> str:
    return "\n".join(f"{role:<9}  {run.label}  {run.path}" for role, run in runs.items())


def nominal_ratio(runs: Mapping[str, Run]) -> float | None:
    """c of the candidate over the baseline: their layer passes per token (``None`` without traces)."""
    headers = [run.header for run in runs.values()]
    return None if None in headers else headers[1].multiplier / headers[0].multiplier


def cost_lines(runs: Mapping[str, Run], costs: Mapping[str, float] | None, cost_mode: str,
               forcing: Mapping[str, dict] | None = None) -> list[str]:
    """Both costs of candidate against baseline, each named, and which one ΔFLOP charges;
    with ``forcing`` (:func:`forcing_split`), how much of each run's realised cost was
    generated after budget forcing inserted its answer."""
    lines = []
    c = nominal_ratio(runs)
    if c is not None:
        lines.append(f"c (nominal cost: layer passes per token, candidate / baseline) = {c:.3f}")
    if costs:
        what = "layer passes x generated tokens" if cost_mode == "passes" else "traced FLOPs"
        lines.append(f"realised cost ({what}, generative tasks, candidate / baseline) = "
                     f"{costs['candidate'] / costs['baseline']:.3f}; ΔFLOP charges this one (A.2: \"We charge the "
                     "loop its layer passes\", per generated token)")
    for role, f in (forcing or {}).items():
        lines.append(
            f"budget forcing, {role}: fired on {f['forced']} of {f['requests']} requests; "
            f"{100 * f['tokens_after_share']:.1f}% of its generated tokens came after the forced answer; "
            f"realised cost / baseline's = {f['before']:.3f} before forcing + {f['after']:.3f} after = "
            f"{f['before'] + f['after']:.3f}")
    return lines


def forcing_split(runs: Mapping[str, Run], tasks: Sequence[str]) -> dict[str, dict]:
    """Per run whose trace shows budget forcing firing on ``tasks``: on how many requests,
    the share of its generated tokens after the forced answer (the answer string and what
    followed), and its realised layer-pass cost relative to the baseline's total, split
    before / after the forced answer. Empty when forcing fired in neither run."""
    out = {role: forcing_shares([run], tasks) for role, run in runs.items()}
    if not any(f["forced"] for f in out.values()):
        return {}
    return {role: cost_split(f, out["baseline"]["total"]) for role, f in out.items()}


def fallback_notes(runs: Mapping[str, Run], unfinished_fallback: str) -> list[str]:
    """One line per run and task whose right verdicts rest on the number fallback of a response
    that did not finish (the looped model's trace says which)."""
    from loopeval.analysis.score_audit import fallback_tasks, score_audit

    lines = []
    for role, run in runs.items():
        for task, t in score_audit(run, tasks=fallback_tasks(run)).tasks.items():
            if t.unfinished_fallback_right:
                how = "scored wrong" if unfinished_fallback == "wrong" else "credited (--unfinished-fallback wrong to not)"
                n = t.unfinished_fallback_right
                lines.append(f"{role} {task}: {n} right verdict{'s' if n > 1 else ''} rest{'' if n > 1 else 's'} on the "
                             f"last number of a response cut at its budget ({t.unfinished_fallback} such fallbacks); {how}")
    return lines


def _tost_interval(c: Comparison) -> str:
    """The equivalence interval and the method behind it (``none``: no valid interval)."""
    if c.equivalence_method == "none":
        return "none valid"
    return f"{c.interval(c.equivalence_ci)} {c.equivalence_method}"


def macro_rows(result: RunComparison) -> list[tuple[str, Comparison]]:
    """``("macro", row)``, or one ``("macro (points)", row)`` per kind of metric."""
    macros = result.macros or {"": result.macro}
    return [("macro" if len(macros) == 1 else f"macro ({k})", m) for k, m in macros.items()]


def margins_line(result: RunComparison, run: Run) -> str:
    """Each metric's equivalence margin, or how to give one (``run`` names the metrics)."""
    parts = {}
    for task, c in result.tasks.items():
        name = run.tasks[task].metric.split(",", 1)[0]
        parts[name] = (f"{name} ±{c.unit.amount(c.margin)}" if c.margin is not None else
                       f"{name}: none given, so no equivalence verdict (--margin {name}=VALUE, in {c.unit.name})")
    return "; ".join(parts.values())


@dataclass(frozen=True)
class ComparedRuns:
    """What ``loopeval compare`` reports: the paired comparison of two runs and their cost
    ratio over the traced generative tasks (``None`` without traces). ``notes`` say what
    the reader must know (runs that decode differently, why there is no cost ratio);
    ``fallbacks`` the verdicts that rest on responses cut at their budget. ``withheld`` lists
    the differences in decoding (a failed fairness check) that withhold every outcome and
    equivalence verdict; ``forcing`` is :func:`forcing_split`."""

    comparison: RunComparison
    runs: Mapping[str, Run]
    costs: Mapping[str, float] | None
    cost_mode: str
    unfinished_fallback: str = "credit"
    notes: tuple[str, ...] = field(default=())
    fallbacks: tuple[str, ...] = field(default=())
    withheld: tuple[str, ...] = field(default=())
    forcing: Mapping[str, dict] = field(default_factory=dict)

    def _row(self, c: Comparison) -> dict:
        row = c.as_dict()
        if self.withheld:
            row.update(outcome="withheld", equivalent=None)
        return row

    def outcome(self, c: Comparison) -> str:
        return "withheld" if self.withheld else c.outcome

    def as_dict(self) -> dict:
        r = self.comparison
        macros = {name: self._row(m) for name, m in (r.macros or {"": r.macro}).items()}
        return {"tasks": {t: self._row(c) for t, c in r.tasks.items()},
                "macro": next(iter(macros.values())) if len(macros) == 1 else None, "macros": macros,
                "withheld": list(self.withheld), "forcing": dict(self.forcing),
                "runs": {role: str(run.path) for role, run in self.runs.items()},
                "labels": {role: run.label for role, run in self.runs.items()}, "costs": self.costs,
                "c": nominal_ratio(self.runs), "cost_mode": self.cost_mode, "pilot": r.pilot,
                "unfinished_fallback": self.unfinished_fallback, "fallback_notes": list(self.fallbacks),
                "test": r.test, "confidence": r.confidence, "n_resamples": r.n_resamples, "seed": r.bootstrap_seed,
                "notes": list(self.notes)}

    def __str__(self) -> str:
        result, runs = self.comparison, self.runs
        level = f"{100 * result.confidence:.6g}%"
        family = f" (Bonferroni over {result.family[0]})" if result.family else ""
        lines = [
            runs_header(runs),
            f"paired bootstrap over items, {result.n_resamples} resamples, seed {result.bootstrap_seed}; "
            f"{level} intervals{family}; decided by {result.test}; equivalent: {points(1 - 2 * result.alpha, digits=0)}% "
            f"interval inside the metric's margin ({margins_line(result, runs['baseline'])}; bootstrap; Tango's score interval where "
            "the bootstrap is unreliable, see 'small samples')",
            "values in each metric's unit; delta and intervals are candidate - baseline as the metric reports "
            "them, so for a lower-is-better metric a negative delta is an improvement",
        ]
        lines += cost_lines(runs, self.costs, self.cost_mode, self.forcing)
        if self.withheld:
            lines.insert(0, "verdict withheld: the runs decode differently (" + "; ".join(self.withheld)
                         + "); a comparison is fair only when only the loop differs (name an intended difference "
                         "with --intended NAME)")
        if result.pilot:
            lines.insert(0, f"{result.pilot}; outcomes below are a pilot's, not a final verdict")
        header = ("task", "metric", "unit", "n", "baseline", "candidate", "delta", f"{level} CI", "p", "Holm p",
                  "McNemar p", "TOST interval", "equivalent", "outcome")
        rows = [
            (name, runs["baseline"].tasks[c.task].metric if c.task else "",
             c.unit.name + ("" if c.higher_is_better else ", lower better"), str(c.n),
             c.show(c.baseline_accuracy), c.show(c.candidate_accuracy), c.show(c.delta, signed=True),
             c.interval(), pvalue(c.pvalue), pvalue(c.pvalue_holm), pvalue(c.mcnemar_pvalue), _tost_interval(c),
             "withheld" if self.withheld else c.equivalence, self.outcome(c))
            for name, c in [*result.tasks.items(), *macro_rows(result)]
        ]
        lines += ["", table(header, rows, text_columns=3)]
        if result.seeds:
            lines.append(f"\nseed runs favouring the candidate: {result.seeds}")
        if self.fallbacks:
            lines += ["", *self.fallbacks]
        warnings = [f"{name}: {w}" for name, c in [*result.tasks.items(), *macro_rows(result)] for w in c.warnings]
        if warnings:
            lines += ["", "small samples:", *(f"  {n}" for n in warnings)]
        return "\n".join(lines)


def compare_runs(baseline, candidate, *, metric: str | None = None, tasks=None, cluster_field: str | None = None,
                 cost: str = DEFAULTS.cost, test: str = "bootstrap", family: int | None = None,
                 n_resamples: int = DEFAULTS.n_resamples, seed: int = DEFAULTS.seed, allow_subset: bool = False,
                 unfinished_fallback: str = "credit", margin: float | None = None,
                 margins: Mapping[str, float] | None = None, intended: Sequence[str] = ()) -> ComparedRuns:
    """Load two runs (folders or results files, baseline first), pair them item by item and
    compare them per task and on one macro per kind of metric (:func:`loopeval.analysis.protocol.compare`).
    ``margin`` is the accuracy margin (default A.5's 0.02), ``margins`` a metric's own in its
    unit (``{"nll_per_byte": 0.005}``; a continuous metric without one gets no equivalence
    verdict). Runs that decode differently have their outcomes withheld unless each
    difference is named in ``intended`` (:func:`loopeval.evaluation.identity.differences`).
    ``allow_subset`` reads pilots (``--limit`` runs, subsets of a test set); ``unfinished_fallback``
    credits or scores wrong a GSM8K number fallback from a response cut at its budget."""
    from loopeval.evaluation.identity import check_intended

    check_intended(intended)
    runs, paired = load_two(baseline, candidate, metric=metric, tasks=tasks, cluster_field=cluster_field,
                            allow_subset=allow_subset, unfinished_fallback=unfinished_fallback)
    check_amounts(paired, margin, margins, "--margin")
    notes = [f"cannot check that the runs decode alike: {d}"
             for d in decoding_differences(runs["baseline"], runs["candidate"], settings=False)]
    differences = decoding_differences(runs["baseline"], runs["candidate"], intended=tuple(intended), traces=False)
    notes += [f"the runs decode differently: {d}" for d in differences]
    result = compare(paired, "baseline", "candidate", resampler=paired.resampler(n_resamples=n_resamples, seed=seed),
                     family=(family, "bonferroni") if family else None, test=test,
                     margin=DEFAULTS.margin if margin is None else margin, margins=margins)
    generative = [t for t in paired.tasks if all(run.tasks[t].generative for run in runs.values())]
    traced = [t for t in generative if all(run.tasks[t].trace is not None for run in runs.values())]
    forcing = {}
    try:
        costs = {role: run.cost(traced, mode=cost) for role, run in runs.items()} if traced else None
        forcing = forcing_split(runs, traced) if traced else {}
    except ValueError as exc:
        costs = None
        notes.append(f"no cost ratio ({exc})")
    return ComparedRuns(result, runs, costs, cost, unfinished_fallback, tuple(notes),
                        tuple(fallback_notes(runs, unfinished_fallback)), tuple(differences), forcing)


@dataclass(frozen=True)
class PilotPower:
    """What ``loopeval power`` reports: :func:`loopeval.analysis.stats.power` per task and
    for one macro per kind of metric, from a paired pilot of two runs; ``units`` gives
    each row's unit (SD and MDE are in it)."""

    rows: Mapping[str, PowerResult]
    runs: Mapping[str, Run]
    alpha: float
    power: float
    n: int | None
    delta: float | None
    units: Mapping[str, Unit] = field(default_factory=dict)

    def as_dict(self) -> dict:
        macros = {name: asdict(r) for name, r in self.rows.items() if name.startswith("macro")}
        unit = {name: "fraction" if u.fraction else u.name for name, u in self.units.items()}
        return {"tasks": {t: {**asdict(r), "unit": unit.get(t)} for t, r in self.rows.items() if not t.startswith("macro")},
                "macro": next(iter(macros.values())) if len(macros) == 1 else None,
                "macros": {name: {**r, "unit": unit.get(name)} for name, r in macros.items()},
                "runs": {role: str(run.path) for role, run in self.runs.items()}}

    def __str__(self) -> str:
        at = "the pilot's items" if self.n is None else f"{self.n} items"
        header = ("task", "unit", "pilot n", "SD of difference", "MDE")
        sized = any(r.delta is not None for r in self.rows.values())
        if sized:
            header += ("items for the delta",)
        body = []
        for task, r in self.rows.items():
            u = self.units.get(task, POINTS)
            needed = ("–" if r.n_needed is None else f"{r.n_needed:,} for {u.amount(r.delta, signed=True)}",)
            body.append((task, u.name, str(r.n_pilot), u.show(r.sd), u.show(r.mde))
                        + (needed if sized else ()))
        return "\n".join([
            runs_header(self.runs),
            f"paired pilot, normal approximation: two-sided alpha {self.alpha:g}, power {points(self.power, digits=0)}%",
            f"MDE: minimum detectable difference at {at}; SD and MDE in each metric's unit; a macro counts its "
            "tasks' items together, in the pilot's proportions, and never mixes units",
            "",
            table(header, body, text_columns=2),
        ])


def pilot_power(baseline, candidate, *, alpha: float = DEFAULTS.alpha, power_: float = 0.8, n: int | None = None,
                delta: float | None = None, deltas: Mapping[str, float] | None = None, metric: str | None = None,
                tasks=None) -> PilotPower:
    """Two runs as a paired pilot: the minimum detectable difference (or the items needed
    for a difference) per task and for one macro per kind of metric. ``delta`` is the
    difference to detect on accuracies (a fraction), ``deltas`` on a named metric in its unit.
    The runs may be subsets (``--limit``, a local file): a pilot is what this plans from."""
    runs, paired = load_two(baseline, candidate, metric=metric, tasks=tasks, allow_subset=True)  # pilots, by design
    a, b = paired.scores["baseline"], paired.scores["candidate"]
    names = {t: paired.metric_name(t) for t in paired.tasks}
    check_amounts(paired, delta, deltas, "--delta")

    def wanted(task: str) -> float | None:
        return (deltas or {}).get(names[task], delta if paired.unit(task).fraction else None)

    rows, units = {}, {}
    for t in paired.tasks:
        rows[t] = power(a[t], b[t], alpha=alpha, power=power_, n=n, delta=wanted(t))
        units[t] = paired.unit(t)
    kinds = paired.kinds()
    for name, ts in kinds.items():
        label = "macro" if len(kinds) == 1 else f"macro ({name})"
        shared = {wanted(t) for t in ts}
        rows[label] = power({t: a[t] for t in ts}, {t: b[t] for t in ts}, alpha=alpha, power=power_, n=n,
                            delta=shared.pop() if len(shared) == 1 else None)
        units[label] = paired.unit(ts[0])
    return PilotPower(rows, runs, alpha, power_, n, delta, units)
