"""Paired bootstrap over test items (or clusters of items), with common random numbers.

A :class:`Resampler` draws ``n_resamples`` bootstrap resamples of the items of every
benchmark once, and evaluates every system's mean on each of them. All comparisons
taken from one resampler (one table) therefore share their resamples. A macro resamples
within each benchmark and averages the per-benchmark means.

With ``clusters``, a resample draws a benchmark's clusters with replacement (as many as
it has) instead of its items, and a system's resampled mean is the ratio estimator
``sum of the drawn clusters' item scores / sum of their sizes``: every drawn item counts
once, so a large cluster weighs more, and on the full data it is the item mean.
Without clusters every item is its own cluster: one code path, so singleton clusters
give the item bootstrap exactly.

Definitions (``d`` is the resampled candidate − baseline difference, ``B`` resamples):

* interval: the percentile interval, the ``(1 ∓ confidence)/2`` quantiles of ``d``;
  ``family=(k, "bonferroni")`` widens it to level ``1 − (1 − confidence)/k``;
* two-sided p-value: ``min(1, 2 (1 + min(#{d <= 0}, #{d >= 0})) / (B + 1))``, the
  smallest level at which the percentile interval excludes 0, with resamples tied at
  zero counted on both sides (conservative) and the usual +1 so that p is never 0.
  Its floor is ``2 / (B + 1)``; report ``p < 0.001`` below 0.001 (the paper's floor);
* TOST: ``equivalent`` when the ``1 − 2 alpha`` percentile interval lies strictly
  inside ``(−margin, +margin)``; ``pvalue = max(p_low, p_high)`` with
  ``p_low = (1 + #{d <= −margin}) / (B + 1)`` and ``p_high = (1 + #{d >= margin}) / (B + 1)``.

Each benchmark draws from its own generator, seeded by ``seed`` and a SHA-256 of the
benchmark name, so results do not depend on dict order or on which other benchmarks
are present, and they are deterministic for a given seed and data. Two samplers give
the same resampling distribution: when a benchmark's cluster matrix (clusters ×
(per-system sums, size)) has few distinct rows (always the case for 0/1 accuracies of
two systems without clusters), a resample is drawn as a multinomial count vector over
the distinct rows; otherwise cluster indices are drawn, in chunks that bound memory,
counted, and the counts multiplied into the matrix.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from loopeval.analysis.stats.clusters import cluster_sums, cluster_table
from loopeval.analysis.stats.family import family_level
from loopeval.analysis.stats.results import ConfidenceInterval, ScipyNames, percentile_interval
from loopeval.analysis.stats.scores import score_table
from loopeval.analysis.stats.options import DEFAULTS
from loopeval.evaluation.metrics import POINTS, Unit

METHODS = ("auto", "multinomial", "index")
# Index sampling holds at most this many drawn indices at a time.
_CHUNK = 1 << 17
# "auto" draws multinomially when a benchmark has at most k / _SHORTCUT distinct rows
# (k clusters): one multinomial category costs about ten times one drawn index.
_SHORTCUT = 10


@dataclass(frozen=True)
class PairedBootstrapResult(ScipyNames):
    """Candidate − baseline difference of means with its bootstrap interval and p-value.

    ``confidence`` is the level of ``ci``, family-adjusted when ``family`` is set;
    ``n_clusters`` equals ``n`` when items resample on their own.
    """

    delta: float
    ci: ConfidenceInterval
    pvalue: float
    n: int
    n_clusters: int
    baseline: float
    candidate: float
    confidence: float
    family: tuple[int, str] | None
    n_resamples: int
    distribution: np.ndarray = field(repr=False, compare=False)


@dataclass(frozen=True)
class TOSTResult(ScipyNames):
    """Two one-sided tests of ``|candidate − baseline| < margin`` by the paired bootstrap."""

    equivalent: bool
    ci: ConfidenceInterval
    pvalue: float
    delta: float
    margin: float
    alpha: float


def _name_key(name: str) -> int:
    # Python's hash() is salted per process; a digest is stable across runs and machines.
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


@functools.cache
def _blas():
    from threadpoolctl import ThreadpoolController  # finds the BLAS libraries once per process

    return ThreadpoolController()


def _index_sums(rng: np.random.Generator, x: np.ndarray, n_resamples: int) -> np.ndarray:
    # Counting the drawn indices and multiplying the counts into x costs one matrix
    # product, instead of one gather per column: many systems stay cheap.
    k = len(x)
    chunk = max(1, _CHUNK // k)
    out = np.empty((n_resamples, x.shape[1]))
    for start in range(0, n_resamples, chunk):
        rows = min(chunk, n_resamples - start)
        idx = rng.integers(0, k, size=(rows, k))
        idx += np.arange(0, rows * k, k)[:, None]
        counts = np.bincount(idx.reshape(-1), minlength=rows * k).reshape(rows, k)
        out[start : start + rows] = counts.astype(float) @ x
    return out


class Resampler:
    """Bootstrap resamples of test items, shared by every comparison drawn from it.

    ``scores`` maps each system to its per-item scores: an array (axis 0 items, further
    axes averaged per item) or ``{benchmark: array}`` for a macro. All systems need the
    same benchmarks and item counts, with items in the same order.
    ``clusters`` resamples clusters of items instead of items: one id per item (scores
    as arrays) or ``{benchmark: ids}`` (benchmarks left out resample items).
    ``method`` picks the sampler ("auto", "multinomial" or "index"); all three give the
    same distribution. The work is done on construction.
    """

    def __init__(self, scores: Mapping[str, object], *, n_resamples: int = DEFAULTS.n_resamples, seed: int = 0,
                 method: str = "auto", clusters=None):
        if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
            raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self._table = score_table(scores)
        index = cluster_table(clusters, self._table)
        self.systems = tuple(str(s) for s in scores)
        self.benchmarks = tuple(self._table)
        self.n_resamples = int(n_resamples)
        self.seed = int(seed)
        self.method = method
        sums = {b: cluster_sums(x, index[b]) for b, x in self._table.items()}
        self._n_clusters = {b: len(v) for b, v in sums.items()}
        scale = max(1.0, max(float(np.abs(x).max()) for x in self._table.values()))
        # Differences within this of zero are ties: summation order leaves rounding noise.
        self._tie = 64 * np.finfo(float).eps * scale
        # Benchmarks draw from separate generators, so threads (numpy drops the GIL) keep results deterministic.
        # They already share out the cores: BLAS threads on top of them made the count products up to
        # ten times slower on a busy two-core machine.
        with _blas().limit(limits=1, user_api="blas"), \
                ThreadPoolExecutor(max_workers=min(len(sums), os.cpu_count() or 1)) as pool:
            self._means = dict(zip(sums, pool.map(self._resample, sums, sums.values())))

    def _resample(self, benchmark: str, x: np.ndarray) -> np.ndarray:
        # x: clusters × (per-system sums, size). Returns resamples × systems means.
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _name_key(benchmark)]))
        rows, counts = np.unique(x, axis=0, return_counts=True)
        if self.method == "multinomial" or (self.method == "auto" and len(rows) * _SHORTCUT <= len(x)):
            # A resample is a count vector over the distinct rows: the same distribution as drawing clusters.
            sums = rng.multinomial(len(x), counts / len(x), size=self.n_resamples) @ rows
        else:
            sums = _index_sums(rng, x, self.n_resamples)
        return sums[:, :-1] / sums[:, -1:]

    def _column(self, system: str) -> int:
        try:
            return self.systems.index(system)
        except ValueError:
            raise ValueError(f"unknown system {system!r}; this resampler has {list(self.systems)}") from None

    def _benchmarks(self, benchmark: str | tuple[str, ...] | None) -> tuple[str, ...]:
        """One benchmark, a macro over a tuple of them, or over all of them (``None``)."""
        if benchmark is None:
            return self.benchmarks
        chosen = benchmark if isinstance(benchmark, tuple) else (benchmark,)
        unknown = [b for b in chosen if b not in self._table]
        if unknown or not chosen:
            raise ValueError(f"unknown benchmark {(unknown or [benchmark])[0]!r}; this resampler has {list(self.benchmarks)}")
        return chosen

    def n(self, benchmark: str | None = None) -> int:
        """Number of items: of one benchmark, or of all together."""
        return sum(len(self._table[b]) for b in self._benchmarks(benchmark))

    def n_clusters(self, benchmark: str | None = None) -> int:
        """Number of resampled units (clusters, or items without clusters): of one benchmark, or of all."""
        return sum(self._n_clusters[b] for b in self._benchmarks(benchmark))

    def scores(self, system: str, benchmark: str | None = None) -> np.ndarray:
        """Per-item scores (averaged per item) of one system on one benchmark (default: the only one)."""
        if benchmark is None and len(self.benchmarks) > 1:
            raise ValueError(f"name a benchmark: this resampler has {list(self.benchmarks)}")
        (bench,) = self._benchmarks(benchmark)
        return self._table[bench][:, self._column(system)].copy()

    def mean(self, system: str, benchmark: str | None = None) -> float:
        """Observed mean of one benchmark, or the macro (unweighted over benchmarks) for ``None``."""
        j = self._column(system)
        return float(np.mean([self._table[b][:, j].mean() for b in self._benchmarks(benchmark)]))

    def distribution(self, system: str, benchmark: str | None = None) -> np.ndarray:
        """Resampled means (one per resample) of one benchmark, or of the macro for ``None``."""
        j = self._column(system)
        return np.mean([self._means[b][:, j] for b in self._benchmarks(benchmark)], axis=0)

    def _difference(self, baseline: str, candidate: str, benchmark: str | None) -> np.ndarray:
        i, j = self._column(baseline), self._column(candidate)
        return np.mean([self._means[b][:, j] - self._means[b][:, i] for b in self._benchmarks(benchmark)], axis=0)

    def pvalue(self, d: np.ndarray) -> float:
        """Two-sided p of resampled differences ``d``: ``min(1, 2 (1 + k) / (B + 1))``, ``k`` the
        smaller of ``#{d <= 0}`` and ``#{d >= 0}`` (ties at zero count for both sides)."""
        below = int(np.count_nonzero(d <= self._tie))
        above = int(np.count_nonzero(d >= -self._tie))
        return min(1.0, 2 * (1 + min(below, above)) / (self.n_resamples + 1))

    def paired_bootstrap(self, baseline: str, candidate: str, *, benchmark: str | None = None,
                         confidence: float = DEFAULTS.confidence, family: tuple[int, str] | None = None) -> PairedBootstrapResult:
        """Candidate − baseline on one benchmark, or on the macro for ``benchmark=None``.

        ``family=(k, "bonferroni")`` gives ``ci`` the level ``1 − (1 − confidence)/k``;
        the p-value is not adjusted (compare it with ``alpha / k``, or use :func:`holm`).
        """
        level = family_level(confidence, family)
        d = self._difference(baseline, candidate, benchmark)
        a, b = self.mean(baseline, benchmark), self.mean(candidate, benchmark)
        return PairedBootstrapResult(
            delta=b - a,
            ci=percentile_interval(d, level),
            pvalue=self.pvalue(d),
            n=self.n(benchmark),
            n_clusters=self.n_clusters(benchmark),
            baseline=a,
            candidate=b,
            confidence=level,
            family=family,
            n_resamples=self.n_resamples,
            distribution=d,
        )

    def tost(self, baseline: str, candidate: str, *, benchmark: str | None = None, margin: float = DEFAULTS.margin,
             alpha: float = DEFAULTS.alpha) -> TOSTResult:
        """Equivalence of candidate and baseline within ``±margin`` at level ``alpha``: a fraction
        when every score is one (0/1 accuracies), else a positive number in the scores' unit."""
        fractions = all(np.all((self._table[b] >= 0) & (self._table[b] <= 1)) for b in self._benchmarks(benchmark))
        (POINTS if fractions else Unit("the scores' unit")).check_margin("margin", margin)
        if not 0 < alpha < 0.5:
            raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")
        d = self._difference(baseline, candidate, benchmark)
        ci = percentile_interval(d, 1 - 2 * alpha)
        p_low = (1 + np.count_nonzero(d <= -margin + self._tie)) / (self.n_resamples + 1)
        p_high = (1 + np.count_nonzero(d >= margin - self._tie)) / (self.n_resamples + 1)
        return TOSTResult(
            equivalent=bool(-margin < ci.low and ci.high < margin),
            ci=ci,
            pvalue=float(min(1.0, max(p_low, p_high))),
            delta=self.mean(candidate, benchmark) - self.mean(baseline, benchmark),
            margin=margin,
            alpha=alpha,
        )


def _pair(a, b) -> dict[str, object]:
    if isinstance(a, Mapping) != isinstance(b, Mapping):
        raise ValueError("a and b must both be arrays or both be {benchmark: array} mappings")
    return {"a": a, "b": b}


def paired_bootstrap(a, b, *, n_resamples: int = DEFAULTS.n_resamples, confidence: float = DEFAULTS.confidence,
                     family: tuple[int, str] | None = None, clusters=None, seed: int = 0) -> PairedBootstrapResult:
    """Paired bootstrap of ``mean(b) − mean(a)`` over items (a macro for mappings).

    ``a`` (baseline) and ``b`` (candidate) are per-item scores in the same item order:
    arrays, or ``{benchmark: array}`` resampled within each benchmark. ``clusters``
    (one id per item, or ``{benchmark: ids}``) resamples clusters of items instead.
    ``ci`` is the percentile interval at ``confidence``, or at ``1 − (1 − confidence)/k``
    for ``family=(k, "bonferroni")``; ``pvalue`` is two-sided, ``min(1, 2 (1 + k) / (B + 1))``
    where ``k`` counts the resampled differences on the smaller side of zero, ties at zero
    counting for both sides (floor ``2 / (B + 1)``). Deterministic for a given seed.
    """
    family_level(confidence, family)  # bad options fail before resampling
    return Resampler(_pair(a, b), n_resamples=n_resamples, seed=seed, clusters=clusters).paired_bootstrap(
        "a", "b", confidence=confidence, family=family)


def tost(a, b, *, margin: float = DEFAULTS.margin, alpha: float = DEFAULTS.alpha, clusters=None, n_resamples: int = DEFAULTS.n_resamples,
         seed: int = 0) -> TOSTResult:
    """Bootstrap TOST: are ``a`` and ``b`` equivalent within ``±margin``? (90% interval at alpha 0.05)."""
    return Resampler(_pair(a, b), n_resamples=n_resamples, seed=seed, clusters=clusters).tost(
        "a", "b", margin=margin, alpha=alpha)
