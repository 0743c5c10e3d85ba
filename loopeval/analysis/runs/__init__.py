"""Read lm-eval runs (``--output_path`` folders written with ``--log_samples``) and pair them.

:func:`load_run` gives one run's per-item scores for each leaf task, its configuration
and, where the ``looped`` model wrote one, its per-item cost trace. :func:`pair_runs`
aligns several runs item by item (``doc_id``, checked by ``doc_hash`` and
``target_hash``) for the paired statistics of :mod:`loopeval.analysis.stats`.

Every evaluation must cover all of its items: a run cut by ``--limit``, a run over a
local data file holding fewer than the task's full test set (:data:`loopeval.evaluation.metrics.TEST_SET_SIZES`),
a run with items that are not in that test set (where its items are known,
:data:`loopeval.evaluation.metrics.TEST_SET_ITEMS`), a samples file missing items, a corrupt samples line or runs of different items are
refused with a ``ValueError`` that names the task, the file or the counts. A pilot is the
explicit exception: ``load_run(..., allow_subset=True)`` accepts such a run, and
:func:`pilot_label` then says "pilot: n of N items", N the benchmark's size, wherever its
results are shown.

* :mod:`~loopeval.analysis.runs.run`: :class:`TaskScores`, :class:`Run` and what a run answers;
* :mod:`~loopeval.analysis.runs.load`: :func:`load_run`;
* :mod:`~loopeval.analysis.runs.pair`: :class:`PairedRuns`, :func:`pair_runs`.
"""

from loopeval.analysis.runs.load import load_run
from loopeval.analysis.runs.pair import PairedRuns, kind, pair_runs
from loopeval.analysis.runs.run import Run, TaskScores, cost_split, decoding_differences, forcing_shares, pilot_label

__all__ = [
    "PairedRuns",
    "Run",
    "TaskScores",
    "cost_split",
    "decoding_differences",
    "forcing_shares",
    "kind",
    "load_run",
    "pair_runs",
    "pilot_label",
]
