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

* :mod:`~loopeval.analysis.protocol.rows`: :class:`Comparison`, :class:`RunComparison`, :func:`compare`;
* :mod:`~loopeval.analysis.protocol.deltas`: :func:`delta_param`, :func:`delta_flop`, :func:`finished_both`;
* :mod:`~loopeval.analysis.protocol.verdicts`: :class:`Verdict`, :func:`verdict`, :func:`withhold`.
"""

from loopeval.analysis.protocol.deltas import (
    TESTS,
    DeltaFlop,
    FinishedBoth,
    RunLike,
    delta_flop,
    delta_param,
    finished_both,
    training_free,
)
from loopeval.analysis.protocol.rows import (
    EQUIVALENCE_METHODS,
    SMALL_DISCORDANT,
    SMALL_N,
    Comparison,
    RunComparison,
    SeedComparison,
    bootstrap_reliable,
    check_amounts,
    compare,
    single_kind,
    task_margin,
)
from loopeval.analysis.protocol.verdicts import Verdict, verdict, withhold

__all__ = [
    "EQUIVALENCE_METHODS",
    "SMALL_DISCORDANT",
    "SMALL_N",
    "TESTS",
    "Comparison",
    "DeltaFlop",
    "FinishedBoth",
    "RunComparison",
    "RunLike",
    "SeedComparison",
    "Verdict",
    "bootstrap_reliable",
    "check_amounts",
    "compare",
    "delta_flop",
    "delta_param",
    "finished_both",
    "single_kind",
    "task_margin",
    "training_free",
    "verdict",
    "withhold",
]
