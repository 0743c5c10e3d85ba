"""How far a candidate's PPL_T could move with other test text: a bootstrap over test documents.

A PPL_T is ``exp(sum NLL_T / tokens)`` over the test tokens, and tokens of one document
are not independent, so the unit resampled is the test document. Every candidate uses
the same resamples (the same seed), so the paired ratio PPL_T(candidate) / PPL_T(unlooped)
resamples both on the same documents; a candidate is *distinguishable* from the unlooped
model when that ratio's interval excludes 1. The intervals are percentile intervals,
per candidate, not adjusted for the number of candidates compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loopeval.analysis.stats.results import ConfidenceInterval, percentile_interval

N_RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0
MIN_TEST_DOCUMENTS = 5
"""Below this many test documents no candidate is called distinguishable: a bootstrap over
n documents has only C(2n-1, n) distinct resamples (3 for two documents, 10 for three),
too few for a 95% percentile interval to mean anything; five give 126. A decision, not the
paper's."""


def distinguishable(ratio_interval, documents: int | None) -> bool | None:
    """Whether the paired ratio's interval excludes 1; ``None`` (undecided) without an
    interval or with fewer than :data:`MIN_TEST_DOCUMENTS` test documents."""
    if ratio_interval is None or documents is None or documents < MIN_TEST_DOCUMENTS:
        return None
    low, high = ratio_interval
    return not low <= 1.0 <= high


@dataclass(frozen=True)
class PPLInterval:
    """``statistic``: the PPL_T; ``confidence_interval`` its interval; ``ratio`` and
    ``ratio_interval``: PPL_T over the unlooped model's, paired on the same resamples;
    ``documents``: the test documents resampled."""

    statistic: float
    confidence_interval: ConfidenceInterval
    ratio: float
    ratio_interval: ConfidenceInterval
    documents: int

    @property
    def distinguishable(self) -> bool | None:
        return distinguishable(self.ratio_interval, self.documents)


def resample_counts(documents: int, *, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> np.ndarray:
    """(n_resamples, documents): how often each document is drawn in each resample."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, documents, size=(n_resamples, documents))
    return np.stack([np.bincount(row, minlength=documents) for row in idx]).astype(float)


def ppl_interval(nll, tokens, base_nll=None, *, confidence: float = CONFIDENCE, counts: np.ndarray | None = None,
                 n_resamples: int = N_RESAMPLES, seed: int = SEED) -> PPLInterval:
    """The PPL_T of per-document NLL sums ``nll`` over per-document scored ``tokens``,
    with its bootstrap interval, and its ratio to ``base_nll`` (the unlooped model's sums
    on the same documents; without it the ratio is 1). ``counts`` (``resample_counts``)
    lets many candidates share one set of resamples."""
    nll, tokens = np.asarray(nll, float), np.asarray(tokens, float)
    base = nll if base_nll is None else np.asarray(base_nll, float)
    if nll.shape != tokens.shape or base.shape != tokens.shape or nll.ndim != 1 or len(nll) == 0:
        raise ValueError(f"ppl_interval: nll, tokens and base_nll must be equal-length 1-d arrays, got "
                         f"{nll.shape}, {tokens.shape} and {base.shape}")
    if counts is None:
        counts = resample_counts(len(nll), n_resamples=n_resamples, seed=seed)
    drawn = counts @ tokens
    ok = drawn > 0  # a resample of only empty documents has no perplexity
    mean = (counts @ nll)[ok] / drawn[ok]
    base_mean = (counts @ base)[ok] / drawn[ok]
    return PPLInterval(
        statistic=float(np.exp(nll.sum() / tokens.sum())),
        confidence_interval=ConfidenceInterval(*(float(x) for x in np.exp(percentile_interval(mean, confidence)))),
        ratio=float(np.exp((nll.sum() - base.sum()) / tokens.sum())),
        ratio_interval=ConfidenceInterval(*(float(x) for x in np.exp(percentile_interval(mean - base_mean, confidence)))),
        documents=len(nll),
    )
