"""Cluster bootstrap against independent truth: the item bootstrap, a naive loop, exact enumeration."""

import hashlib
import itertools

import numpy as np
import pytest
from scipy import stats as sps

from loopeval.analysis.stats import Resampler, paired_bootstrap, tost


def pair(n, seed, real=False):
    rng = np.random.default_rng(seed)
    if real:
        a = rng.gamma(4, 0.6, n)
        return a, a + rng.normal(-0.05, 0.3, n)
    a = (rng.random(n) < 0.5).astype(float)
    return a, np.where(rng.random(n) < 0.2, 1 - a, a)


@pytest.mark.parametrize("method", ["auto", "index", "multinomial"])
@pytest.mark.parametrize("real", [False, True])
def test_singleton_clusters_are_the_item_bootstrap_exactly(method, real):
    a, b = pair(400, seed=1, real=real)
    items = Resampler({"a": a, "b": b}, method=method, seed=3, n_resamples=2000).paired_bootstrap("a", "b")
    for ids in (np.random.default_rng(2).permutation(400) * 7, [f"q{i}" for i in range(400)]):
        clustered = Resampler({"a": a, "b": b}, method=method, seed=3, n_resamples=2000,
                              clusters=ids).paired_bootstrap("a", "b")
        np.testing.assert_array_equal(clustered.distribution, items.distribution)
        assert (clustered.ci, clustered.pvalue, clustered.n_clusters) == (items.ci, items.pvalue, 400)


def test_singleton_clusters_equal_items_in_a_macro_and_benchmarks_left_out_resample_items():
    (a1, b1), (a2, b2) = pair(300, 4), pair(120, 5, real=True)
    a, b = {"gsm8k": a1, "math": a2}, {"gsm8k": b1, "math": b2}
    items = paired_bootstrap(a, b, seed=7)
    assert paired_bootstrap(a, b, seed=7, clusters={"gsm8k": np.arange(300)[::-1]}) == items
    np.testing.assert_array_equal(
        paired_bootstrap(a, b, seed=7, clusters={"gsm8k": np.arange(300), "math": np.arange(120)}).distribution,
        items.distribution)
    assert tost(a, b, seed=7, clusters={"math": np.arange(120)}) == tost(a, b, seed=7)


def naive_cluster_distribution(a, b, ids, n_resamples, seed):
    """Resample clusters by the documented generator, one resample at a time in Python."""
    key = int.from_bytes(hashlib.sha256(b"").digest()[:8], "little")  # a plain array is benchmark ""
    rng = np.random.default_rng(np.random.SeedSequence([seed, key]))
    order = list(dict.fromkeys(ids))  # clusters in order of first appearance
    members = {c: [i for i, x in enumerate(ids) if x == c] for c in order}
    draws = rng.integers(0, len(order), size=(n_resamples, len(order)))
    out = []
    for row in draws:
        items = [i for k in row for i in members[order[k]]]
        out.append(sum(b[i] for i in items) / len(items) - sum(a[i] for i in items) / len(items))
    return np.array(out)


def test_cluster_bootstrap_matches_a_naive_loop_over_resampled_clusters():
    rng = np.random.default_rng(6)
    ids = rng.permutation(np.r_[np.arange(200), rng.integers(0, 200, 700)])  # 200 unequal, scattered clusters
    a, b = pair(900, 7, real=True)
    res = paired_bootstrap(a, b, clusters=ids, n_resamples=1500, seed=9)
    # index sampling: 200 clusters, drawn in several chunks of resamples
    assert Resampler({"a": a, "b": b}, clusters=ids).n_clusters() == len(np.unique(ids)) == 200
    np.testing.assert_allclose(res.distribution, naive_cluster_distribution(a, b, ids.tolist(), 1500, 9), atol=1e-12)
    assert res.n == 900 and res.n_clusters == 200
    assert res.delta == pytest.approx(b.mean() - a.mean())  # the ratio estimator on the full data: the item mean


def exact_cluster_distribution(a, b, ids):
    """Every one of the k**k equally likely cluster resamples: {ratio-estimator difference: probability}."""
    clusters = list(dict.fromkeys(ids))
    members = [[i for i, x in enumerate(ids) if x == c] for c in clusters]
    k = len(clusters)
    dist = {}
    for draw in itertools.product(range(k), repeat=k):
        items = [i for c in draw for i in members[c]]
        d = round(float(np.mean(b[items]) - np.mean(a[items])), 12)
        dist[d] = dist.get(d, 0) + 1 / k**k
    return dist


def test_both_samplers_give_the_exact_cluster_resampling_distribution():
    # Five clusters of sizes 1-3; two clusters are identical, so the multinomial shortcut merges them.
    ids = np.array([0, 0, 1, 2, 2, 2, 3, 4, 4, 1])
    a = np.array([1, 0, 1, 0, 1, 1, 0, 1, 0, 0], float)
    b = np.array([1, 1, 0, 1, 1, 0, 1, 1, 1, 1], float)
    dist = exact_cluster_distribution(a, b, ids.tolist())
    atoms = np.array(sorted(dist))
    probs = np.array([dist[d] for d in atoms])
    assert np.all(probs * 40_000 >= 5)  # no sparse cells to pool

    def chi2(draws):
        counts = np.array([np.sum(np.isclose(draws, d)) for d in atoms])
        return sps.chisquare(counts, probs * 40_000).pvalue if counts.sum() == len(draws) else 0.0

    for method in ("index", "multinomial"):
        rs = Resampler({"a": a, "b": b}, clusters=ids, n_resamples=40_000, seed=1, method=method)
        assert chi2(rs.paired_bootstrap("a", "b").distribution) > 1e-3, method
    # The test has power: the item bootstrap of the same data is another distribution.
    assert chi2(paired_bootstrap(a, b, n_resamples=40_000, seed=1).distribution) < 1e-6


@pytest.mark.parametrize("method", ["index", "multinomial"])
def test_clusters_of_identical_copies_are_the_item_bootstrap_of_the_distinct_items(method):
    a, b = pair(150, 8)
    copies = 4
    expanded = Resampler({"a": np.repeat(a, copies), "b": np.repeat(b, copies)}, method=method, seed=2,
                         clusters=np.repeat(np.arange(150), copies))
    distinct = Resampler({"a": a, "b": b}, method=method, seed=2)
    np.testing.assert_array_equal(expanded.paired_bootstrap("a", "b").distribution,
                                  distinct.paired_bootstrap("a", "b").distribution)
    # Treating the copies as independent items would claim twice the precision.
    naive = paired_bootstrap(np.repeat(a, copies), np.repeat(b, copies), seed=2).ci
    clustered = expanded.paired_bootstrap("a", "b").ci
    assert (clustered.high - clustered.low) / (naive.high - naive.low) == pytest.approx(2, rel=0.1)


def test_cluster_results_are_deterministic_and_independent_of_dict_order():
    (a1, b1), (a2, b2) = pair(200, 10), pair(90, 11, real=True)
    ids = {"g": np.arange(200) // 4, "m": np.arange(90) // 3}
    one = paired_bootstrap({"g": a1, "m": a2}, {"g": b1, "m": b2}, clusters=ids, seed=5)
    two = paired_bootstrap({"m": a2, "g": a1}, {"m": b2, "g": b1}, clusters=dict(reversed(ids.items())), seed=5)
    assert (one.ci, one.pvalue, one.n_clusters) == (two.ci, two.pvalue, 80)
    assert one == paired_bootstrap({"g": a1, "m": a2}, {"g": b1, "m": b2}, clusters=ids, seed=5)


@pytest.mark.parametrize(
    ("scores", "clusters", "message"),
    [
        ([1, 0, 1], [0, 0], "clusters has 2 ids but the benchmark has 3 items"),
        ([1, 0, 1], [[0], [1], [2]], "one cluster id per item"),
        ([1, 0, 1], [0.0, np.nan, 1.0], "clusters contains NaN"),
        ([1, 0, 1], {"g": [0, 1, 2]}, "needs scores given as"),
        ({"g": [1, 0, 1]}, [0, 1, 2], "need clusters as"),
        ({"g": [1, 0, 1]}, {"x": [0, 1, 2]}, "unknown benchmarks \\['x'\\]"),
        ({"g": [1, 0, 1]}, {"g": [0, 1]}, "clusters\\['g'\\] has 2 ids"),
    ],
)
def test_bad_clusters_raise_value_errors_that_say_which(scores, clusters, message):
    with pytest.raises(ValueError, match=message):
        paired_bootstrap(scores, scores, clusters=clusters, n_resamples=10)
