"""The verdict (:func:`verdict`): which of the two tests the loop passes, in the paper's
order (ΔFLOP counts only once Δparam passes), and the sentences that say so; a pilot's or a
withheld verdict (:func:`withhold`) says why it is not final."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from loopeval.analysis.protocol.deltas import DeltaFlop
from loopeval.analysis.protocol.rows import Comparison, RunComparison
from loopeval.analysis.stats.display import points, pvalue as show_p


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
