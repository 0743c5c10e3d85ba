"""Plain-text tables for the terminal: what ``loopeval compare`` and ``loopeval power`` print.

Numbers arrive as fractions and leave as points (:mod:`loopeval.stats.display`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loopeval.stats.display import points, pvalue


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, text_columns: int = 1) -> str:
    """Aligned columns: the first ``text_columns`` left-aligned, the rest right-aligned."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(v.ljust(w) if i < text_columns else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip()
        for row in (header, *rows)
    )


def runs_header(runs: Mapping) -> str:
    return "\n".join(f"{role:<9}  {run.label}  {run.path}" for role, run in runs.items())


def cost_lines(runs: Mapping, costs: Mapping[str, float] | None, cost_mode: str) -> list[str]:
    """Both costs of candidate against baseline, each named, and which one ΔFLOP charges."""
    headers = [run.header for run in runs.values()]
    lines = []
    if all(h is not None for h in headers):
        c = headers[1].multiplier / headers[0].multiplier
        lines.append(f"c (nominal cost: layer passes per token, candidate / baseline) = {c:.3f}")
    if costs:
        what = "layer passes x generated tokens" if cost_mode == "passes" else "traced FLOPs"
        lines.append(f"realised cost ({what}, generative tasks, candidate / baseline) = "
                     f"{costs['candidate'] / costs['baseline']:.3f}; ΔFLOP charges this one (A.2: \"We charge the "
                     "loop its layer passes\", per generated token)")
    return lines


def comparison(result, runs: Mapping, costs: Mapping[str, float] | None, cost_mode: str, *,
               notes: Sequence[str] = ()) -> str:
    """The ``loopeval compare`` table of a :class:`loopeval.protocol.RunComparison`; ``notes``
    (e.g. verdicts resting on unfinished responses) follow the table."""
    level = f"{100 * result.confidence:.6g}%"
    family = f" (Bonferroni over {result.family[0]})" if result.family else ""
    lines = [
        runs_header(runs),
        f"paired bootstrap over items, {result.n_resamples} resamples, seed {result.bootstrap_seed}; "
        f"{level} intervals{family}; decided by {result.test}; equivalent: {points(1 - 2 * result.alpha, digits=0)}% "
        f"interval inside ±{points(result.margin)} points (bootstrap; Tango's score interval where the "
        "bootstrap is unreliable, see 'small samples')",
    ]
    lines += cost_lines(runs, costs, cost_mode)
    if result.pilot:
        lines.insert(0, f"{result.pilot}; outcomes below are a pilot's, not a final verdict")
    header = ("task", "metric", "n", "baseline", "candidate", "delta", f"{level} CI", "p", "Holm p", "McNemar p",
              "TOST interval", "outcome")
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
    if notes:
        lines += ["", *notes]
    notes = [f"{name}: {w}" for name, c in [*result.tasks.items(), ("macro", result.macro)] for w in c.warnings]
    if notes:
        lines += ["", "small samples:", *(f"  {n}" for n in notes)]
    return "\n".join(lines)


def _tost_interval(c) -> str:
    """The equivalence interval and the method behind it (``none``: no valid interval)."""
    if c.equivalence_method == "none":
        return "none valid"
    return (f"[{points(c.equivalence_ci.low, signed=True)}, {points(c.equivalence_ci.high, signed=True)}] "
            f"{c.equivalence_method}")


def power_table(rows: Mapping, runs: Mapping, *, alpha: float, power: float, n: int | None,
                delta: float | None) -> str:
    """The ``loopeval power`` table of :func:`loopeval.stats.power` results per task and the macro."""
    at = "the pilot's items" if n is None else f"{n} items"
    header = ("task", "pilot n", "SD of difference", "MDE")
    if delta is not None:
        header += (f"items for {points(delta, signed=True)} points",)
    body = [
        (task, str(r.n_pilot), points(r.sd), points(r.mde)) + ((f"{r.n_needed:,}",) if delta is not None else ())
        for task, r in rows.items()
    ]
    return "\n".join([
        runs_header(runs),
        f"paired pilot, normal approximation: two-sided alpha {alpha:g}, power {points(power, digits=0)}%",
        f"MDE: minimum detectable difference at {at}; the macro counts all tasks' items together, "
        "in the pilot's proportions",
        "",
        table(header, body),
    ])
