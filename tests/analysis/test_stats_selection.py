"""ΔFLOP against the best cheaper system: fixed and re-chosen in every resample, against brute force."""

import numpy as np
import pytest

from loopeval.analysis.stats import Resampler, best_cheaper, best_cheaper_bootstrap


def systems(n_unlooped, n_items=400, seed=0, spread=0.0):
    """A loop and unlooped systems around one base: {benchmark: 0/1 scores}, costs 1.0, 1.1, ..."""
    rng = np.random.default_rng(seed)
    base = {b: (rng.random(n_items) < 0.5).astype(float) for b in ("gsm8k", "math")}

    def variant(flip, lift):
        return {b: np.where(rng.random(len(x)) < flip, 1 - x, np.where(rng.random(len(x)) < lift, 1.0, x))
                for b, x in base.items()}

    scores = {"loop": variant(0.15, 0.02)}
    scores |= {f"u{i}": variant(0.15, spread * i) for i in range(n_unlooped)}
    costs = {f"u{i}": 1.0 + 0.1 * i for i in range(n_unlooped)}
    return scores, costs


def brute_force(rs, candidate, costs, candidate_cost, benchmark=None):
    """Re-choose the comparator with best_cheaper on every resample's accuracies, one resample at a time."""
    acc = {s: rs.distribution(s, benchmark) for s in costs}
    diff = {s: rs.paired_bootstrap(s, candidate, benchmark=benchmark).distribution for s in costs}
    chosen = [best_cheaper(candidate_cost, {s: (c, acc[s][r]) for s, c in costs.items()})
              for r in range(rs.n_resamples)]
    return np.array([diff[s][r] for r, s in enumerate(chosen)]), chosen


@pytest.mark.parametrize("bench", [None, "math"])
def test_resampled_selection_matches_a_brute_force_loop_over_the_shared_resamples(bench):
    scores, costs = systems(8, seed=1)
    rs = Resampler(scores, n_resamples=3000, seed=4)
    res = best_cheaper_bootstrap(rs, "loop", costs, 1.55, selection="resampled", benchmark=bench)
    d, chosen = brute_force(rs, "loop", costs, 1.55, bench)
    np.testing.assert_array_equal(res.distribution, d)
    assert len(set(chosen)) > 2  # the choice really changes between resamples
    assert res.chosen == pytest.approx({s: chosen.count(s) / 3000 for s in [f"u{i}" for i in range(6)]})
    assert res.ci == pytest.approx(tuple(np.quantile(d, [0.025, 0.975])))
    k = min(np.sum(d <= 1e-12), np.sum(d >= -1e-12))  # ties at zero (up to rounding) count for both sides
    assert res.pvalue == pytest.approx(min(1, 2 * (1 + k) / 3001))
    fixed = best_cheaper(1.55, {s: (c, rs.mean(s, bench)) for s, c in costs.items()})
    assert res.comparator == fixed and res.delta == pytest.approx(rs.mean("loop", bench) - rs.mean(fixed, bench))


def test_fixed_selection_is_todays_rule_and_never_above_the_resampled_one():
    scores, costs = systems(10, seed=2)
    rs = Resampler(scores, n_resamples=4000, seed=0)
    fixed = best_cheaper_bootstrap(rs, "loop", costs, 1.95, family=(4, "bonferroni"))
    comparator = best_cheaper(1.95, {s: (c, rs.mean(s)) for s, c in costs.items()})
    boot = rs.paired_bootstrap(comparator, "loop", family=(4, "bonferroni"))
    assert (fixed.comparator, fixed.delta, fixed.ci, fixed.pvalue, fixed.chosen) == (
        comparator, boot.delta, boot.ci, boot.pvalue, {comparator: 1.0})
    np.testing.assert_array_equal(fixed.distribution, boot.distribution)
    resampled = best_cheaper_bootstrap(rs, "loop", costs, 1.95, selection="resampled", family=(4, "bonferroni"))
    # The re-chosen comparator is at least as accurate as the fixed one on every resample.
    assert np.all(resampled.distribution <= fixed.distribution + 1e-12)
    assert resampled.ci.low <= fixed.ci.low and resampled.ci.high <= fixed.ci.high
    assert resampled.delta == fixed.delta and resampled.confidence == pytest.approx(0.9875)


def test_winners_curse_many_equal_comparators_make_the_loop_look_worse():
    # Ten unlooped systems of equal true accuracy: the best of them on the test items is luck.
    scores, costs = systems(10, n_items=600, seed=3)
    rs = Resampler(scores, n_resamples=4000, seed=1)
    fixed = best_cheaper_bootstrap(rs, "loop", costs, 5.0)
    resampled = best_cheaper_bootstrap(rs, "loop", costs, 5.0, selection="resampled")
    shift = np.mean(fixed.distribution) - np.mean(resampled.distribution)
    assert shift > 0.25 * np.std(fixed.distribution) and resampled.pvalue != fixed.pvalue
    assert max(resampled.chosen.values()) < 0.5  # no system wins most resamples


def test_a_dominant_comparator_gives_the_same_answer_both_ways():
    scores, costs = systems(4, seed=5, spread=0.2)  # u3 is far ahead of u0-u2
    rs = Resampler(scores, n_resamples=2000, seed=2)
    fixed = best_cheaper_bootstrap(rs, "loop", costs, 10.0)
    resampled = best_cheaper_bootstrap(rs, "loop", costs, 10.0, selection="resampled")
    assert resampled.chosen["u3"] == 1.0 and fixed.comparator == "u3"
    np.testing.assert_array_equal(resampled.distribution, fixed.distribution)
    assert (resampled.ci, resampled.pvalue) == (fixed.ci, fixed.pvalue)


def test_ties_go_to_the_cheaper_system_then_the_name():
    same = np.array([1, 0, 1, 1, 0, 0, 1, 0], float)
    rs = Resampler({"loop": same[::-1], "b": same, "a": same, "cheap": same}, n_resamples=200)
    res = best_cheaper_bootstrap(rs, "loop", {"b": 1.0, "a": 1.0, "cheap": 0.5}, 1.0, selection="resampled")
    assert res.comparator == "cheap" and res.chosen == {"cheap": 1.0, "a": 0.0, "b": 0.0}
    res = best_cheaper_bootstrap(rs, "loop", {"b": 1.0, "a": 1.0}, 1.0, selection="resampled")
    assert res.comparator == "a" and res.chosen == {"a": 1.0, "b": 0.0}


def test_nothing_cheaper_gives_none_and_bad_input_raises():
    scores, costs = systems(3, n_items=50)
    rs = Resampler(scores, n_resamples=100)
    assert best_cheaper_bootstrap(rs, "loop", costs, 0.5, selection="resampled") is None
    for kwargs, message in [
        (dict(selection="best"), "selection must be one of"),
        (dict(pool_costs={**costs, "loop": 1.0}), "cannot also be in pool_costs"),
        (dict(pool_costs={"twin": 1.0}), "unknown systems \\['twin'\\]"),
        (dict(candidate="looped"), "unknown system 'looped'"),
        (dict(candidate_cost=float("nan")), "loop_cost must be a positive finite number"),
        (dict(confidence=1.5), "confidence"),
    ]:
        args = dict(candidate="loop", pool_costs=costs, candidate_cost=2.0) | kwargs
        with pytest.raises(ValueError, match=message):
            best_cheaper_bootstrap(rs, args.pop("candidate"), args.pop("pool_costs"), args.pop("candidate_cost"),
                                      **args)
