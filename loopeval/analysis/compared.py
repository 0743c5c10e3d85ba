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


def load_two(baseline, candidate, **options) -> tuple[dict[str, Run], object]:
    """The two runs (baseline first) and their item pairing; ``options`` go to :func:`load_run`."""
    runs = {role: load_run(path, **options) for role, path in (("baseline", baseline), ("candidate", candidate))}
    return runs, pair_runs(runs)


def runs_header(runs: Mapping[str, Run]) -> str:
    return "\n".join(f"{role:<9}  {run.path}  ({run.name})" for role, run in runs.items())


@dataclass(frozen=True)
class ComparedRuns:
    """What ``loopeval compare`` reports: the paired comparison of two runs and their cost
    ratio over the traced generative tasks (``None`` without traces). ``notes`` say what
    the reader must know (runs that decode differently, why there is no cost ratio)."""

    comparison: RunComparison
    runs: Mapping[str, Run]
    costs: Mapping[str, float] | None
    cost_mode: str
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict:
        r = self.comparison
        return {"tasks": {t: c.as_dict() for t, c in r.tasks.items()}, "macro": r.macro.as_dict(),
                "runs": {role: str(run.path) for role, run in self.runs.items()}, "costs": self.costs,
                "cost_mode": self.cost_mode, "test": r.test, "confidence": r.confidence,
                "n_resamples": r.n_resamples, "seed": r.bootstrap_seed, "notes": list(self.notes)}

    def __str__(self) -> str:
        result, runs = self.comparison, self.runs
        level = f"{100 * result.confidence:.6g}%"
        family = f" (Bonferroni over {result.family[0]})" if result.family else ""
        lines = [
            runs_header(runs),
            f"paired bootstrap over items, {result.n_resamples} resamples, seed {result.bootstrap_seed}; "
            f"{level} intervals{family}; decided by {result.test}; equivalent: 90% interval inside "
            f"±{points(result.margin)} points",
        ]
        if self.costs:
            lines.append(f"cost ({self.cost_mode}, generative tasks): candidate / baseline = "
                         f"{self.costs['candidate'] / self.costs['baseline']:.3f}")
        header = ("task", "metric", "n", "baseline", "candidate", "delta", f"{level} CI", "p", "Holm p",
                  "McNemar p", "outcome")
        rows = [
            (name, runs["baseline"].tasks[c.task].metric if c.task else "", str(c.n),
             points(c.baseline_accuracy), points(c.candidate_accuracy), points(c.delta, signed=True),
             f"[{points(c.ci.low, signed=True)}, {points(c.ci.high, signed=True)}]", pvalue(c.pvalue),
             pvalue(c.pvalue_holm), pvalue(c.mcnemar_pvalue), c.outcome)
            for name, c in [*result.tasks.items(), ("macro", result.macro)]
        ]
        lines += ["", table(header, rows, text_columns=2)]
        if result.seeds:
            lines.append(f"\nseed runs favouring the candidate: {result.seeds}")
        notes = [f"{name}: {w}" for name, c in [*result.tasks.items(), ("macro", result.macro)] for w in c.warnings]
        if notes:
            lines += ["", "small samples:", *(f"  {n}" for n in notes)]
        return "\n".join(lines)


def compare_runs(baseline, candidate, *, metric: str | None = None, tasks=None, cluster_field: str | None = None,
                 cost: str = DEFAULTS.cost, test: str = "bootstrap", family: int | None = None,
                 n_resamples: int = DEFAULTS.n_resamples, seed: int = DEFAULTS.seed) -> ComparedRuns:
    """Load two runs (folders or results files, baseline first), pair them item by item and
    compare them per task and on the macro (:func:`loopeval.analysis.protocol.compare`)."""
    runs, paired = load_two(baseline, candidate, metric=metric, tasks=tasks, cluster_field=cluster_field)
    notes = [f"the runs decode differently: {d}" for d in decoding_differences(runs["baseline"], runs["candidate"])]
    result = compare(paired, "baseline", "candidate", resampler=paired.resampler(n_resamples=n_resamples, seed=seed),
                     family=(family, "bonferroni") if family else None, test=test)
    traced = [t for t in paired.tasks if all(run.tasks[t].trace is not None for run in runs.values())]
    try:
        costs = {role: run.cost(traced, mode=cost) for role, run in runs.items()} if traced else None
    except ValueError as exc:
        costs = None
        notes.append(f"no cost ratio ({exc})")
    return ComparedRuns(result, runs, costs, cost, tuple(notes))


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
