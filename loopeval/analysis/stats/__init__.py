"""Paired statistics for the two-test protocol (paper, Appendix A.5) and the companion papers.

Values are in their metric's stored unit (:class:`loopeval.evaluation.metrics.Unit`): a 0/1
accuracy and its margins are fractions, never points; a continuous metric (``gsm8k_nll``'s
nats per byte) keeps its own. ``Unit.show`` formats every value for display.

* :func:`paired_bootstrap`, :func:`tost` and :class:`Resampler` (shared resamples for
  the comparisons of one table): paired bootstrap over test items or clusters of items,
  macro over benchmarks; :meth:`Resampler.best_cheaper_bootstrap`: ΔFLOP against the best
  cheaper system, chosen once or in every resample;
* :func:`family_level`: the level of each interval of a Bonferroni family;
* :func:`mcnemar`: exact test for deterministic, training-free comparisons;
* :func:`paired_proportions`, :func:`paired_tost`: Tango's score interval and equivalence
  test for paired 0/1 scores, valid with few items or few discordant items;
* :func:`holm`: correction across token budgets;
* :func:`seed_summary`: how many training seeds favour the candidate;
* :func:`order_interval`: Welch interval over training orders of fixed parents;
* :func:`unpaired_from_summary`: difference of published accuracies (2 SE rule);
* :func:`power`: minimum detectable difference, or items needed, from a paired pilot;
* :func:`macro`, :func:`best_cheaper`, :func:`ceiling_gain` (Eq. 4).
"""

from loopeval.analysis.stats.bootstrap import PairedBootstrapResult, Resampler, TOSTResult, paired_bootstrap, tost
from loopeval.analysis.stats.ceiling import ceiling_gain
from loopeval.analysis.stats.comparators import best_cheaper
from loopeval.analysis.stats.family import family_level
from loopeval.analysis.stats.holm import holm
from loopeval.analysis.stats.mcnemar import McNemarResult, mcnemar
from loopeval.analysis.stats.order import OrderInterval, order_interval
from loopeval.analysis.stats.paired_proportions import (
    PairedEquivalenceResult,
    PairedProportionsResult,
    paired_proportions,
    paired_tost,
)
from loopeval.analysis.stats.power import PowerResult, power
from loopeval.analysis.stats.results import ConfidenceInterval
from loopeval.analysis.stats.scores import item_scores, macro
from loopeval.analysis.stats.seeds import SeedSummary, seed_summary
from loopeval.analysis.stats.selection import BestCheaperResult, best_cheaper_bootstrap
from loopeval.analysis.stats.unpaired import UnpairedSummary, unpaired_from_summary

__all__ = [
    "BestCheaperResult",
    "ConfidenceInterval",
    "McNemarResult",
    "OrderInterval",
    "PairedBootstrapResult",
    "PairedEquivalenceResult",
    "PairedProportionsResult",
    "PowerResult",
    "Resampler",
    "SeedSummary",
    "TOSTResult",
    "UnpairedSummary",
    "best_cheaper",
    "best_cheaper_bootstrap",
    "ceiling_gain",
    "family_level",
    "holm",
    "item_scores",
    "macro",
    "mcnemar",
    "order_interval",
    "paired_bootstrap",
    "paired_proportions",
    "paired_tost",
    "power",
    "seed_summary",
    "tost",
    "unpaired_from_summary",
]
