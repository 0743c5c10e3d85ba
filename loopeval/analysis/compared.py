"""Two lm-eval runs compared item by item (``loopeval compare``) or used as a paired pilot
(``loopeval power``): the results, with their text and JSON forms."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from loopeval.analysis.protocol import RunComparison, compare
from loopeval.analysis.runs import Run, decoding_differences, load_run, pair_runs
from loopeval.analysis.stats import PowerResult, power
from loopeval.analysis.stats.display import points, pvalue
from loopeval.analysis.stats.options import DEFAULTS
from loopeval.common.text import table


def load_two(baseline, candidate, *, unfinished_fallback: str = "credit", **options) -> tuple[dict[str, Run], object]:
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


def cost_lines(runs: Mapping[str, Run], costs: Mapping[str, float] | None, cost_mode: str) -> list[str]:
    """Both costs of candidate against baseline, each named, and which one ΔFLOP charges."""
    lines = []
    c = nominal_ratio(runs)
    if c is not None:
        lines.append(f"c (nominal cost: layer passes per token, candidate / baseline) = {c:.3f}")
    if costs:
        what = "layer passes x generated tokens" if cost_mode == "passes" else "traced FLOPs"
        lines.append(f"realised cost ({what}, generative tasks, candidate / baseline) = "
                     f"{costs['candidate'] / costs['baseline']:.3f}; ΔFLOP charges this one (A.2: \"We charge the "
                     "loop its layer passes\", per generated token)")
    return lines


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


def _tost_interval(c) -> str:
    """The equivalence interval and the method behind it (``none``: no valid interval)."""
    if c.equivalence_method == "none":
        return "none valid"
    return (f"[{points(c.equivalence_ci.low, signed=True)}, {points(c.equivalence_ci.high, signed=True)}] "
            f"{c.equivalence_method}")


@dataclass(frozen=True)
class ComparedRuns:
    """What ``loopeval compare`` reports: the paired comparison of two runs and their cost
    ratio over the traced generative tasks (``None`` without traces). ``notes`` say what
    the reader must know (runs that decode differently, why there is no cost ratio);
    ``fallbacks`` the verdicts that rest on responses cut at their budget."""

    comparison: RunComparison
    runs: Mapping[str, Run]
    costs: Mapping[str, float] | None
    cost_mode: str
    unfinished_fallback: str = "credit"
    notes: tuple[str, ...] = field(default=())
    fallbacks: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict:
        r = self.comparison
        return {"tasks": {t: c.as_dict() for t, c in r.tasks.items()}, "macro": r.macro.as_dict(),
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
            f"interval inside ±{points(result.margin)} points (bootstrap; Tango's score interval where the "
            "bootstrap is unreliable, see 'small samples')",
        ]
        lines += cost_lines(runs, self.costs, self.cost_mode)
        if result.pilot:
            lines.insert(0, f"{result.pilot}; outcomes below are a pilot's, not a final verdict")
        header = ("task", "metric", "n", "baseline", "candidate", "delta", f"{level} CI", "p", "Holm p",
                  "McNemar p", "TOST interval", "outcome")
        rows = [
            (name, runs["baseline"].tasks[c.task].metric if c.task else "", str(c.n),
             points(c.baseline_accuracy), points(c.candidate_accuracy), points(c.delta, signed=True),
             f"[{points(c.ci.low, signed=True)}, {points(c.ci.high, signed=True)}]", pvalue(c.pvalue),
             pvalue(c.pvalue_holm), pvalue(c.mcnemar_pvalue), _tost_interval(c), c.outcome)
            for name, c in [*result.tasks.items(), ("macro", result.macro)]
        ]
        lines += ["", table(header, rows, text_columns=2)]
        if result.seeds:
            lines.append(f"\nseed runs favouring the candidate: {result.seeds}")
        if self.fallbacks:
            lines += ["", *self.fallbacks]
        warnings = [f"{name}: {w}" for name, c in [*result.tasks.items(), ("macro", result.macro)] for w in c.warnings]
        if warnings:
            lines += ["", "small samples:", *(f"  {n}" for n in warnings)]
        return "\n".join(lines)


def compare_runs(baseline, candidate, *, metric: str | None = None, tasks=None, cluster_field: str | None = None,
                 cost: str = DEFAULTS.cost, test: str = "bootstrap", family: int | None = None,
                 n_resamples: int = DEFAULTS.n_resamples, seed: int = DEFAULTS.seed, allow_subset: bool = False,
                 unfinished_fallback: str = "credit") -> ComparedRuns:
    """Load two runs (folders or results files, baseline first), pair them item by item and
    compare them per task and on the macro (:func:`loopeval.analysis.protocol.compare`).
    ``allow_subset`` reads pilots (``--limit`` runs); ``unfinished_fallback`` credits or
    scores wrong a GSM8K number fallback from a response cut at its budget."""
    runs, paired = load_two(baseline, candidate, metric=metric, tasks=tasks, cluster_field=cluster_field,
                            allow_subset=allow_subset, unfinished_fallback=unfinished_fallback)
    notes = [f"the runs decode differently: {d}" for d in decoding_differences(runs["baseline"], runs["candidate"])]
    result = compare(paired, "baseline", "candidate", resampler=paired.resampler(n_resamples=n_resamples, seed=seed),
                     family=(family, "bonferroni") if family else None, test=test)
    traced = [t for t in paired.tasks if all(run.tasks[t].trace is not None for run in runs.values())]
    try:
        costs = {role: run.cost(traced, mode=cost) for role, run in runs.items()} if traced else None
    except ValueError as exc:
        costs = None
        notes.append(f"no cost ratio ({exc})")
    return ComparedRuns(result, runs, costs, cost, unfinished_fallback, tuple(notes),
                        tuple(fallback_notes(runs, unfinished_fallback)))


@dataclass(frozen=True)
class PilotPower:
    """What ``loopeval power`` reports: :func:`loopeval.analysis.stats.power` per task and
    for the macro, from a paired pilot of two runs."""

    rows: Mapping[str, PowerResult]
    runs: Mapping[str, Run]
    alpha: float
    power: float
    n: int | None
    delta: float | None

    def as_dict(self) -> dict:
        return {"tasks": {t: asdict(r) for t, r in self.rows.items() if t != "macro"},
                "macro": asdict(self.rows["macro"]), "runs": {role: str(run.path) for role, run in self.runs.items()}}

    def __str__(self) -> str:
        at = "the pilot's items" if self.n is None else f"{self.n} items"
        header = ("task", "pilot n", "SD of difference", "MDE")
        if self.delta is not None:
            header += (f"items for {points(self.delta, signed=True)} points",)
        body = [(task, str(r.n_pilot), points(r.sd), points(r.mde))
                + ((f"{r.n_needed:,}",) if self.delta is not None else ()) for task, r in self.rows.items()]
        return "\n".join([
            runs_header(self.runs),
            f"paired pilot, normal approximation: two-sided alpha {self.alpha:g}, power {points(self.power, digits=0)}%",
            f"MDE: minimum detectable difference at {at}; the macro counts all tasks' items together, "
            "in the pilot's proportions",
            "",
            table(header, body),
        ])


def pilot_power(baseline, candidate, *, alpha: float = DEFAULTS.alpha, power_: float = 0.8, n: int | None = None,
                delta: float | None = None, metric: str | None = None, tasks=None) -> PilotPower:
    """Two runs as a paired pilot: the minimum detectable difference (or the items needed
    for ``delta``) per task and for the macro."""
    runs, paired = load_two(baseline, candidate, metric=metric, tasks=tasks)
    a, b = paired.scores["baseline"], paired.scores["candidate"]
    options = dict(alpha=alpha, power=power_, n=n, delta=delta)
    rows = {t: power(a[t], b[t], **options) for t in paired.tasks}
    rows["macro"] = power(a, b, **options)
    return PilotPower(rows, runs, alpha, power_, n, delta)
