"""loopeval.analysis.stats against independent truth: exact enumeration, statsmodels, scipy, the paper."""

import itertools

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.multitest import multipletests

from loopeval.analysis.stats import (
    Resampler,
    best_cheaper,
    ceiling_gain,
    holm,
    item_scores,
    macro,
    mcnemar,
    paired_bootstrap,
    seed_summary,
    tost,
)
from loopeval.analysis.stats.display import points, pvalue


def exact_distribution(a, b):
    """Every one of the n**n equally likely resamples: {candidate − baseline mean: probability}."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = len(a)
    dist = {}
    for idx in itertools.product(range(n), repeat=n):
        d = round(float(b[list(idx)].mean() - a[list(idx)].mean()), 12)
        dist[d] = dist.get(d, 0) + 1 / n**n
    return dist


def exact_pvalue(dist):
    below = sum(p for d, p in dist.items() if d <= 0)
    above = sum(p for d, p in dist.items() if d >= 0)
    return min(1.0, 2 * min(below, above))


def binary_pair(n, pa, pb, seed, flip=0.0):
    """0/1 scores: a with accuracy pa; b independent with accuracy pb, or with ``flip``, a with that share flipped."""
    rng = np.random.default_rng(seed)
    a = (rng.random(n) < pa).astype(float)
    independent = (rng.random(n) < pb).astype(float)
    return a, (np.where(rng.random(n) < flip, 1 - a, independent) if flip else independent)


# ---------------------------------------------------------------- paired bootstrap


@pytest.mark.parametrize("method", ["index", "multinomial"])
def test_pvalue_matches_exact_enumeration_and_counts_ties_conservatively(method):
    # Per-item differences are 0, 1, 0: a resample is never negative and is zero with
    # probability (2/3)**3, so p = 2 * 8/27. Counting ties on one side only would give ~0.
    a, b = [0, 0, 1], [0, 1, 1]
    truth = exact_pvalue(exact_distribution(a, b))
    assert truth == pytest.approx(16 / 27)
    rs = Resampler({"a": a, "b": b}, n_resamples=200_000, seed=1, method=method)
    assert rs.paired_bootstrap("a", "b").pvalue == pytest.approx(truth, abs=0.01)


@pytest.mark.parametrize("method", ["index", "multinomial"])
def test_real_valued_pvalue_and_interval_match_exact_enumeration(method):
    a = np.array([2.31, 1.70, 2.95, 2.20])  # e.g. NLL per block
    b = np.array([2.10, 1.95, 2.40, 2.02])
    dist = exact_distribution(a, b)
    atoms = np.array(sorted(dist))
    cdf = np.cumsum([dist[d] for d in atoms])
    # Percentile interval of the exact distribution (levels chosen away from the CDF's jumps).
    low, high = atoms[np.searchsorted(cdf, 0.025)], atoms[np.searchsorted(cdf, 0.975)]
    assert np.min(np.abs(cdf - 0.025)) > 0.003 and np.min(np.abs(cdf - 0.975)) > 0.003
    res = Resampler({"a": a, "b": b}, n_resamples=200_000, seed=2, method=method).paired_bootstrap("a", "b")
    assert res.delta == pytest.approx(b.mean() - a.mean())
    assert res.pvalue == pytest.approx(exact_pvalue(dist), abs=0.01)
    assert res.ci == pytest.approx((low, high), abs=1e-9)


def test_multinomial_and_index_sampling_give_the_exact_resampling_distribution():
    # Six items, four distinct (a, b) rows, two of them repeated: enumerate all 6**6 resamples.
    a = np.array([1, 1, 0, 0, 1, 0], float)
    b = np.array([1, 0, 1, 1, 1, 0], float)
    dist = exact_distribution(a, b)
    atoms = np.array(sorted(dist))
    probs = np.array([dist[d] for d in atoms])
    keep = probs * 40_000 >= 5  # pool sparse tails for the chi-square test
    expected = np.append(probs[keep], probs[~keep].sum()) * 40_000

    def chi2(draws):
        counts = np.array([np.sum(np.isclose(draws, d)) for d in atoms])
        observed = np.append(counts[keep], counts[~keep].sum())
        return sps.chisquare(observed, expected).pvalue

    for method in ("index", "multinomial"):
        rs = Resampler({"a": a, "b": b}, n_resamples=40_000, seed=3, method=method)
        assert chi2(rs.paired_bootstrap("a", "b").distribution) > 1e-3, method
    # The test has power: drawing the distinct rows with equal (wrong) weights is rejected.
    rows, _ = np.unique(np.c_[a, b], axis=0, return_counts=True)
    wrong = np.random.default_rng(0).multinomial(6, np.ones(len(rows)) / len(rows), size=40_000) @ rows / 6
    assert chi2(wrong[:, 1] - wrong[:, 0]) < 1e-6


def test_identical_inputs_give_zero_difference_p_one_and_a_finite_interval():
    rng = np.random.default_rng(0)
    for x in (rng.integers(0, 2, 300).astype(float), rng.normal(3, 1, 300),
              {"g": rng.integers(0, 2, 200), "m": rng.random(50)}):
        res = paired_bootstrap(x, x)
        assert res.delta == 0 and res.pvalue == 1.0
        assert res.ci == (0.0, 0.0)


def test_pvalue_floor_and_interval_agree_with_scipy_bootstrap():
    a, b = binary_pair(800, 0.55, 0.70, seed=4)
    res = paired_bootstrap(a, b, n_resamples=10_000, seed=0)
    assert res.pvalue == pytest.approx(2 / 10_001)  # every resample favours b: the floor
    ref = sps.bootstrap((a, b), lambda x, y, axis: y.mean(axis) - x.mean(axis), paired=True, vectorized=True,
                        n_resamples=10_000, method="percentile", random_state=1).confidence_interval
    assert res.ci.low == pytest.approx(ref.low, abs=0.008)
    assert res.ci.high == pytest.approx(ref.high, abs=0.008)
    assert res.baseline == pytest.approx(a.mean()) and res.candidate == pytest.approx(b.mean())
    assert res.n == 800 and res.statistic == res.delta and res.confidence_interval == res.ci


def test_real_valued_scores_agree_with_scipy_bootstrap():
    rng = np.random.default_rng(5)
    a = rng.gamma(4, 0.6, 400)
    b = a + rng.normal(-0.05, 0.3, 400)
    res = paired_bootstrap(a, b, n_resamples=10_000)
    ref = sps.bootstrap((a, b), lambda x, y, axis: y.mean(axis) - x.mean(axis), paired=True, vectorized=True,
                        n_resamples=10_000, method="percentile", random_state=1).confidence_interval
    assert res.ci == pytest.approx((ref.low, ref.high), abs=0.006)


def test_macro_resamples_within_benchmarks_and_averages_them():
    a = {"gsm8k": binary_pair(300, 0.6, 0, 1)[0], "math": binary_pair(120, 0.3, 0, 2)[0]}
    b = {"gsm8k": binary_pair(300, 0.6, 0.7, 1, flip=0.2)[1], "math": binary_pair(120, 0.3, 0.4, 2, flip=0.3)[1]}
    rs = Resampler({"a": a, "b": b})
    res = rs.paired_bootstrap("a", "b")
    per = [rs.paired_bootstrap("a", "b", benchmark=k) for k in ("gsm8k", "math")]
    assert res.delta == pytest.approx(np.mean([p.delta for p in per]))
    assert res.baseline == pytest.approx(macro(a)) and res.candidate == pytest.approx(macro(b))
    np.testing.assert_allclose(res.distribution, (per[0].distribution + per[1].distribution) / 2)
    assert res.n == 420
    # The two benchmarks' resamples are independent draws.
    assert abs(np.corrcoef(per[0].distribution, per[1].distribution)[0, 1]) < 0.05


def test_results_do_not_depend_on_dict_order_or_on_other_benchmarks():
    a = {"gsm8k": binary_pair(200, 0.5, 0, 7)[0], "math": np.random.default_rng(8).random(90)}
    b = {"gsm8k": binary_pair(200, 0.5, 0.6, 7, flip=0.3)[1], "math": np.random.default_rng(9).random(90)}
    one = paired_bootstrap(a, b, seed=11)
    two = paired_bootstrap(dict(reversed(a.items())), dict(reversed(b.items())), seed=11)
    assert (one.delta, one.ci, one.pvalue) == (two.delta, two.ci, two.pvalue)
    alone = Resampler({"a": {"gsm8k": a["gsm8k"]}, "b": {"gsm8k": b["gsm8k"]}}, seed=11)
    both = Resampler({"a": a, "b": b}, seed=11)
    np.testing.assert_array_equal(alone.paired_bootstrap("a", "b").distribution,
                                  both.paired_bootstrap("a", "b", benchmark="gsm8k").distribution)


def test_seed_makes_results_deterministic():
    a, b = binary_pair(500, 0.5, 0.55, seed=12)
    assert paired_bootstrap(a, b, seed=3) == paired_bootstrap(a, b, seed=3)
    assert paired_bootstrap(a, b, seed=3).ci != paired_bootstrap(a, b, seed=4).ci


def test_common_random_numbers_across_the_comparisons_of_one_table():
    rng = np.random.default_rng(13)
    twin = rng.integers(0, 2, 400).astype(float)
    systems = {"twin": twin, "loop": np.where(rng.random(400) < 0.2, 1 - twin, twin),
               "long": np.where(rng.random(400) < 0.3, 1 - twin, twin)}
    rs = Resampler(systems, seed=5)
    d1 = rs.paired_bootstrap("twin", "loop").distribution
    d2 = rs.paired_bootstrap("twin", "long").distribution
    d3 = rs.paired_bootstrap("long", "loop").distribution
    np.testing.assert_allclose(d1 - d2, d3, atol=1e-12)  # the same resamples in every row
    np.testing.assert_allclose(rs.distribution("loop") - rs.distribution("twin"), d1, atol=1e-12)
    # TOST and the bootstrap share them too: TOST's interval is the 90% bootstrap interval.
    assert rs.tost("twin", "loop").ci == rs.paired_bootstrap("twin", "loop", confidence=0.90).ci


def test_repeated_samples_are_averaged_per_item():
    rng = np.random.default_rng(14)
    a, b = rng.integers(0, 2, (50, 8)), rng.integers(0, 2, (50, 8))  # AIME-style: 8 answers per problem
    two_d = paired_bootstrap(a, b, seed=2)
    means = paired_bootstrap(a.mean(axis=1), b.mean(axis=1), seed=2)
    assert (two_d.delta, two_d.ci, two_d.pvalue, two_d.n) == (means.delta, means.ci, means.pvalue, 50)
    np.testing.assert_allclose(item_scores(a), a.mean(axis=1))


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        ([1, 0, 1], [1, 0], "a has 3 items and b has 2"),
        ([1, 0, np.nan], [1, 0, 1], "a contains NaN"),
        ([1, 0, 1], [1, np.inf, 1], "b contains NaN or inf"),
        ({"g": [1, 0]}, {"g": [1, 0, 1]}, "on benchmark 'g'"),
        ({"g": [1, 0]}, {"m": [1, 0]}, "different benchmarks"),
        ({"g": [1, 0]}, [1, 0], "both be arrays"),
        ([], [], "a is empty"),
        ([[1, 0], [1]], [1, 0], "a: not a numeric array"),
    ],
)
def test_bad_inputs_raise_value_errors_that_say_which(a, b, message):
    with pytest.raises(ValueError, match=message):
        paired_bootstrap(a, b, n_resamples=10)


def test_bad_options_raise_before_resampling():
    with pytest.raises(ValueError, match="n_resamples"):
        paired_bootstrap([1, 0], [0, 1], n_resamples=0)
    with pytest.raises(ValueError, match="seed"):
        paired_bootstrap([1, 0], [0, 1], seed=-1)
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap([1, 0], [0, 1], confidence=95)
    with pytest.raises(ValueError, match="method"):
        Resampler({"a": [1, 0]}, method="poisson")
    with pytest.raises(ValueError, match="unknown system 'c'"):
        Resampler({"a": [1, 0], "b": [0, 1]}).paired_bootstrap("a", "c")
    with pytest.raises(ValueError, match="unknown benchmark 'x'"):
        Resampler({"a": {"g": [1, 0]}, "b": {"g": [0, 1]}}).paired_bootstrap("a", "b", benchmark="x")


# ---------------------------------------------------------------- TOST


def test_tost_equivalence_is_a_90_percent_interval_inside_the_margin():
    a = binary_pair(4000, 0.6, 0, seed=15)[0]
    b = np.where(np.random.default_rng(16).random(4000) < 0.05, 1 - a, a)  # within about half a point
    res = tost(a, b, margin=0.02, seed=1)
    boot = paired_bootstrap(a, b, confidence=0.90, seed=1)
    assert res.ci == boot.ci
    assert res.equivalent is bool(-0.02 < boot.ci.low and boot.ci.high < 0.02) is True
    d = boot.distribution
    expected = max((1 + np.sum(d <= -0.02)) / 10_001, (1 + np.sum(d >= 0.02)) / 10_001)
    assert res.pvalue == pytest.approx(expected) and res.pvalue < 0.05
    assert res.delta == pytest.approx(b.mean() - a.mean())


def test_tost_is_not_equivalent_for_a_large_or_uncertain_difference():
    a, b = binary_pair(2000, 0.5, 0.6, seed=17)
    far = tost(a, b)
    assert not far.equivalent and far.pvalue > 0.5
    small_a, small_b = binary_pair(40, 0.5, 0.5, seed=18)
    assert not tost(small_a, small_b).equivalent  # 40 items cannot show equivalence within 2 points
    assert tost(a, a).equivalent  # identical: interval [0, 0]
    with pytest.raises(ValueError, match="margin"):
        tost(a, b, margin=0)
    with pytest.raises(ValueError, match="alpha"):
        tost(a, b, alpha=0.5)


# ---------------------------------------------------------------- McNemar, Holm, macro


@pytest.mark.parametrize("seed", range(6))
def test_mcnemar_matches_statsmodels_exact(seed):
    a, b = binary_pair(120 + 40 * seed, 0.5, 0.6, seed=seed)
    res = mcnemar(a, b)
    table = [[np.sum((a == 1) & (b == 1)), np.sum((a == 1) & (b == 0))],
             [np.sum((a == 0) & (b == 1)), np.sum((a == 0) & (b == 0))]]
    ref = sm_mcnemar(table, exact=True)
    assert res.statistic == ref.statistic and res.pvalue == pytest.approx(ref.pvalue, rel=1e-12)
    assert (res.only_baseline, res.only_candidate) == (table[0][1], table[1][0])


def test_mcnemar_edge_cases():
    assert mcnemar([1, 0, 1], [1, 0, 1]).pvalue == 1.0
    res = mcnemar([1] * 10, [0] * 10)  # ten discordant pairs, all one way: 2 / 2**10
    assert (res.only_baseline, res.only_candidate, res.statistic) == (10, 0, 0) and res.pvalue == pytest.approx(2 / 1024)
    with pytest.raises(ValueError, match="0/1 scores; b has 0.5"):
        mcnemar([1, 0], [1, 0.5])
    with pytest.raises(ValueError, match="a has 2 items and b has 3"):
        mcnemar([1, 0], [1, 0, 1])


def test_holm_matches_statsmodels():
    rng = np.random.default_rng(19)
    for p in (rng.random(4) / 10, [0.01, 0.04, 0.03, 0.04], [0.2], [0.001, 0.9, 0.02, 0.5, 0.5]):
        np.testing.assert_allclose(holm(p), multipletests(p, method="holm")[1], rtol=1e-12)
    assert holm([]).shape == (0,)
    with pytest.raises(ValueError, match="must lie in"):
        holm([0.1, np.nan])


def test_macro_is_unweighted_over_benchmarks():
    assert macro({"big": [1, 1, 1, 1, 1, 1], "small": [0, 0]}) == 0.5
    assert macro({"aime": [[1, 0, 0, 0], [1, 1, 1, 1]]}) == 0.625  # repeats averaged per item
    with pytest.raises(ValueError, match="mapping"):
        macro([1, 0])


# ---------------------------------------------------------------- seeds, comparator, ceiling, display


def test_seed_summary_counts_seeds_favouring_the_candidate():
    twin = np.array([[1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 0, 0]], float)  # 3 items x 4 seeds
    loop = np.array([[1, 1, 1, 1], [1, 0, 1, 0], [1, 1, 0, 0]], float)
    res = seed_summary(twin, loop)
    assert res.deltas == pytest.approx((1 / 3, 1 / 3, 0, 0)) and (res.favour, res.n) == (2, 4)
    assert str(res) == "2 of 4"
    macro_res = seed_summary({"g": twin, "m": loop}, {"g": loop, "m": twin})
    assert macro_res.deltas == pytest.approx((0, 0, 0, 0)) and macro_res.favour == 0
    with pytest.raises(ValueError, match="same number of seeds"):
        seed_summary(twin, loop[:, :2])


def test_best_cheaper_is_inclusive_and_none_when_nothing_qualifies():
    evals = {"twin@1x": (1.00, 0.441), "twin@1.5x": (1.25, 0.450), "twin@2x": (1.60, 0.470), "tie": (1.25, 0.450)}
    assert best_cheaper(1.25, evals) == "tie"  # same accuracy and cost as twin@1.5x: the first name
    assert best_cheaper(1.25, {k: v for k, v in evals.items() if k != "tie"}) == "twin@1.5x"  # equal cost counts
    assert best_cheaper(1.10, evals) == "twin@1x"
    assert best_cheaper(0.90, evals) is None
    assert best_cheaper(1.0, {}) is None
    assert best_cheaper(2.0, {"a": (1.0, 0.5), "b": (0.8, 0.5)}) == "b"  # same accuracy: the cheaper one
    with pytest.raises(ValueError, match="candidate 'x'"):
        best_cheaper(1.0, {"x": (float("nan"), 0.5)})


def test_ceiling_gain_reproduces_the_paper():
    # Eq. 4: log 1.29 / log(9B / 4B) x 7.9 points (Table 5 macro: 59.7 -> 67.6) ~ 2.48 points.
    gain = ceiling_gain(1.29, 4e9, 9e9, 0.597, 0.676)
    assert gain == pytest.approx(np.log(1.29) / np.log(2.25) * 0.079)
    assert round(100 * gain, 2) == 2.48
    assert ceiling_gain(1.0, 4e9, 9e9, 0.5, 0.6) == 0
    with pytest.raises(ValueError, match="params_small < params_large"):
        ceiling_gain(1.29, 9e9, 4e9, 0.6, 0.7)


def test_display_formats_points_and_the_resampling_floor():
    assert points(0.041, signed=True) == "+4.1" and points(0.597) == "59.7"
    assert points(-0.0004, signed=True) == "+0.0"
    assert pvalue(2 / 10_001) == "<0.001" and pvalue(0.005) == "0.005" and pvalue(0.55) == "0.55"
    assert pvalue(None) == "–"


def test_units_are_fractions():
    from loopeval.analysis.stats import best_cheaper, ceiling_gain, tost

    with pytest.raises(ValueError, match=r"margin=2: expected a fraction in \(0, 1\) \(fractions, not points: 2 points is 0.02\)"):
        tost([1, 0, 1], [0, 1, 1], margin=2)
    with pytest.raises(ValueError, match=r"acc_small must be a fraction in \[0, 1\], got 59.7 \(fractions, not points"):
        ceiling_gain(1.29, 4e9, 9e9, 59.7, 67.6)
    with pytest.raises(ValueError, match=r"candidate 'a': cost -1 is negative"):
        best_cheaper(1.0, {"a": (-1, 0.5)})


def test_small_samples_are_flagged():
    """Three items that all flip: the bootstrap says p = 0.0002, exact McNemar 0.25; the
    comparison warns and shows both."""
    from loopeval.analysis.protocol import compare
    from loopeval.analysis.runs import PairedRuns

    a, b = np.array([[1.0], [1.0], [1.0]]), np.array([[0.0], [0.0], [0.0]])
    paired = PairedRuns(systems=("a", "b"), tasks=("t",), doc_ids={"t": np.arange(3)},
                        scores={"a": {"t": a}, "b": {"t": b}}, runs={"a": (None,), "b": (None,)})
    row = compare(paired, "a", "b", resampler=paired.resampler(n_resamples=1000)).tasks["t"]
    assert row.pvalue == pytest.approx(2 / 1001) and row.mcnemar_pvalue == pytest.approx(0.25)
    assert any("only 3 items" in w for w in row.warnings)
    assert any("only 3 discordant items: trust the exact McNemar p (0.25)" in w for w in row.warnings)
