"""Family levels, order intervals and unpaired summaries against the companion papers and scipy."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from loopeval.analysis.stats import Resampler, family_level, order_interval, paired_bootstrap, unpaired_from_summary

# ---------------------------------------------------------------- family-adjusted levels


@pytest.mark.parametrize(
    ("k", "level"),
    # 002: "98.75%" (four effects), "99.375%" (eight), "99.5833%" (twelve), "97.5%" (two),
    # "99.1667%" (six) and "99.5%" (ten), all Bonferroni at 95%.
    [(4, 98.75), (8, 99.375), (12, 99.5833), (2, 97.5), (6, 99.1667), (10, 99.5)],
)
def test_bonferroni_levels_of_the_companion_paper(k, level):
    assert round(100 * family_level(0.95, (k, "bonferroni")), 4) == level


def test_a_family_widens_the_interval_and_leaves_the_p_value():
    rng = np.random.default_rng(0)
    a = (rng.random(2000) < 0.5).astype(float)
    b = np.where(rng.random(2000) < 0.2, 1 - a, a)
    rs = Resampler({"a": a, "b": b}, seed=1)
    fam = rs.paired_bootstrap("a", "b", family=(4, "bonferroni"))
    plain = rs.paired_bootstrap("a", "b", confidence=0.9875)
    assert fam.ci == plain.ci and fam.confidence == pytest.approx(0.9875) and fam.family == (4, "bonferroni")
    assert fam.pvalue == plain.pvalue
    d = fam.distribution
    assert fam.ci == tuple(np.quantile(d, [0.00625, 0.99375]))
    unadjusted = rs.paired_bootstrap("a", "b")
    assert fam.ci.low < unadjusted.ci.low and unadjusted.ci.high < fam.ci.high
    assert paired_bootstrap(a, b, seed=1, family=(1, "bonferroni")).ci == paired_bootstrap(a, b, seed=1).ci


@pytest.mark.parametrize(
    ("family", "message"),
    [((0, "bonferroni"), "positive integer"), ((2.5, "bonferroni"), "positive integer"),
     ((4, "holm"), "must be one of"), (4, "must be \\(k, method\\)")],
)
def test_bad_families_raise_before_resampling(family, message):
    with pytest.raises(ValueError, match=message):
        paired_bootstrap([1, 0], [0, 1], family=family)
    with pytest.raises(ValueError, match="confidence"):
        family_level(1.0, (4, "bonferroni"))


# ---------------------------------------------------------------- order intervals

# 002, Table 6: parent C and D mean ± SD of three paired differences, and the published
# equal-parent 95% interval (nats per target).
TABLE_6 = [
    ((-0.010778, 0.000162), (-0.010213, 0.000516), (-0.011073, -0.009918)),
    ((+0.001354, 0.000254), (+0.001454, 0.000368), (+0.001027, +0.001781)),
    ((-0.012991, 0.000440), (-0.012517, 0.000593), (-0.013366, -0.012142)),
    ((+0.000537, 0.000271), (+0.000554, 0.000070), (+0.000234, +0.000857)),
    ((+0.028809, 0.001039), (+0.027372, 0.000813), (+0.027009, +0.029173)),
    ((-0.208401, 0.006421), (-0.218805, 0.011257), (-0.225142, -0.202064)),
]


def three_values(mean, sd):
    """Three values with this mean and sample SD: mean − sd, mean, mean + sd."""
    return np.array([mean - sd, mean, mean + sd])


@pytest.mark.parametrize(("c", "d", "published"), TABLE_6)
def test_order_interval_reproduces_the_published_welch_intervals(c, d, published):
    res = order_interval({"C": three_values(*c), "D": three_values(*d)})
    assert res.means == pytest.approx({"C": c[0], "D": d[0]}) and res.sds == pytest.approx({"C": c[1], "D": d[1]})
    assert res.delta == pytest.approx((c[0] + d[0]) / 2)
    # The table prints six decimals of rounded means and SDs.
    assert res.ci == pytest.approx(published, abs=1.5e-6)
    assert 2 <= res.df <= 4 and res.n == {"C": 3, "D": 3} and res.confidence == 0.95


def test_one_parent_is_the_one_sample_t_interval():
    x = np.array([0.012, 0.009, 0.015, 0.011, 0.004])
    for level in (0.95, 0.9):
        res = order_interval({"C": x}, confidence=level)
        ref = sps.ttest_1samp(x, 0).confidence_interval(confidence_level=level)
        assert res.ci == pytest.approx((ref.low, ref.high), rel=1e-12)
        assert res.df == pytest.approx(4) and res.statistic == pytest.approx(x.mean())


def test_two_parents_of_unequal_size_match_scipys_welch_interval():
    # Welch's interval for mean(C) − mean(−D) is twice the equal-parent interval around twice the mean.
    c, d = np.array([0.8, 1.1, 0.95, 1.3]), np.array([0.2, 0.7, 0.1])
    ref = sps.ttest_ind(c, -d, equal_var=False)
    res = order_interval({"C": c, "D": d})
    low, high = ref.confidence_interval(0.95)
    assert res.ci == pytest.approx((low / 2, high / 2), rel=1e-12) and res.df == pytest.approx(ref.df)


def test_order_interval_edge_cases_and_bad_input():
    res = order_interval({"C": [0.1, 0.1], "D": [0.3, 0.3]})
    assert res.ci == (pytest.approx(0.2), pytest.approx(0.2)) and math.isnan(res.df) and res.se == 0
    for groups, message in [({}, "at least one parent"), ({"C": [0.1]}, "at least two orders"),
                            ({"C": [0.1, np.nan]}, "NaN"), ({"C": [[0.1, 0.2]]}, "1-D"), ([0.1, 0.2], "map each")]:
        with pytest.raises(ValueError, match=message):
            order_interval(groups)
    with pytest.raises(ValueError, match="confidence"):
        order_interval({"C": [0.1, 0.2]}, confidence=95)


# ---------------------------------------------------------------- summaries without items


def test_unpaired_from_summary_by_hand():
    res = unpaired_from_summary(0.60, 500, 0.66, 400)
    se = math.sqrt(0.00048 + 0.000561)  # 0.6 x 0.4 / 500 + 0.66 x 0.34 / 400
    assert res.delta == pytest.approx(0.06) and res.se == pytest.approx(se) and se == pytest.approx(0.032265, abs=1e-6)
    assert res.clear is False  # 0.06 < 2 x 0.0323
    assert unpaired_from_summary(0.60, 500, 0.68, 400).clear is True  # 0.08 > 0.0645
    assert unpaired_from_summary(0.68, 400, 0.60, 500).delta == pytest.approx(-0.08)
    assert unpaired_from_summary(0.68, 400, 0.60, 500).clear is True  # a clear loss is clear too
    assert res.note.startswith("unpaired")


@pytest.mark.parametrize(
    ("name", "n", "twin", "looped", "clear"),
    # 004, Table 4: Qwen3-1.7B-Base† vs Looped Qwen (shared), accuracy ± standard error (%).
    [("GSM8K", 1319, (66.64, 1.30), (70.96, 1.25), True),
     ("ARC-Challenge", 1172, (53.84, 1.46), (55.46, 1.45), False),
     ("ARC-Easy", 2376, (79.97, 0.82), (80.13, 0.82), False),
     ("HellaSwag", 10042, (63.35, 0.48), (64.13, 0.48), False),
     ("Winogrande", 1267, (62.90, 1.36), (63.61, 1.35), False)],
)
def test_unpaired_from_summary_reproduces_the_two_standard_error_rule_of_004(name, n, twin, looped, clear):
    res = unpaired_from_summary(twin[0] / 100, n, looped[0] / 100, n)
    assert (round(100 * res.se_a, 2), round(100 * res.se_b, 2)) == (twin[1], looped[1])
    assert res.clear is clear  # "+4.3 points on GSM8K ... exceeding two standard errors of the difference"


def test_unpaired_from_summary_rejects_points_and_bad_counts():
    with pytest.raises(ValueError, match="acc_a must be an accuracy in \\[0, 1\\]"):
        unpaired_from_summary(66.6, 1319, 0.7, 1319)
    with pytest.raises(ValueError, match="n_b must be a positive integer"):
        unpaired_from_summary(0.6, 100, 0.7, 0)
