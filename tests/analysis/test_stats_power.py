"""Power and minimum detectable effect: statsmodels, simulation with our bootstrap, and the CLI."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from statsmodels.stats.power import NormalIndPower

from loopeval.cli import main
from loopeval.analysis.runs import load_run, pair_runs
from loopeval.analysis.stats import paired_bootstrap, power

RUNS = Path(__file__).parents[1] / "fixtures" / "runs"
TWIN, LOOPED = str(RUNS / "twin"), str(RUNS / "looped")


def pilot(n, p_only_b, p_only_a, p_both=0.4):
    """Paired 0/1 scores with exact shares of items only b (only a, both) gets right."""
    k_b, k_a, k_both = round(n * p_only_b), round(n * p_only_a), round(n * p_both)
    a = np.r_[np.zeros(k_b), np.ones(k_a), np.ones(k_both), np.zeros(n - k_b - k_a - k_both)]
    b = np.r_[np.ones(k_b), np.zeros(k_a), np.ones(k_both), np.zeros(n - k_b - k_a - k_both)]
    return a, b


def test_normal_approximation_agrees_with_statsmodels():
    a, b = pilot(1000, 0.15, 0.10)
    sd = np.std(b - a, ddof=1)
    res = power(a, b, delta=0.02)
    assert res.sd == pytest.approx(sd) and res.n == res.n_pilot == 1000 and res.se == pytest.approx(sd / math.sqrt(1000))
    one_sample = NormalIndPower()  # ratio=0: the one-sample z-test
    assert one_sample.power(res.mde / sd, nobs1=1000, alpha=0.05, ratio=0) == pytest.approx(0.8, abs=1e-5)
    needed = one_sample.solve_power(0.02 / sd, alpha=0.05, power=0.8, ratio=0)
    assert res.n_needed == math.ceil(needed)
    at = power(a, b, n=4000, alpha=0.01, power=0.9)
    assert one_sample.power(at.mde / sd, nobs1=4000, alpha=0.01, ratio=0) == pytest.approx(0.9, abs=1e-5)


def test_items_needed_give_the_stated_power_with_our_own_bootstrap():
    # Population: 15% of items only b gets right, 10% only a: delta 0.05, per-item variance 0.2475.
    a, b = pilot(2000, 0.15, 0.10)
    plan = power(a, b, delta=0.05)
    assert 760 <= plan.n_needed <= 800
    rng = np.random.default_rng(0)
    rows = np.array([[0, 1], [1, 0], [1, 1], [0, 0]], float)
    hits = 0
    sims = 300
    for s in range(sims):
        counts = rng.multinomial(plan.n_needed, [0.15, 0.10, 0.40, 0.35])
        x = np.repeat(rows, counts, axis=0)
        hits += paired_bootstrap(x[:, 0], x[:, 1], n_resamples=1000, seed=s).pvalue < 0.05
    assert hits / sims == pytest.approx(0.8, abs=0.07)  # 3 standard errors of 300 simulations


def test_macro_standard_error_is_the_bootstraps_and_keeps_the_pilots_proportions():
    (a1, b1), (a2, b2) = pilot(800, 0.2, 0.1), pilot(200, 0.05, 0.15, p_both=0.3)
    a, b = {"gsm8k": a1, "math": a2}, {"gsm8k": b1, "math": b2}
    res = power(a, b, delta=0.03)
    assert res.n_pilot == 1000
    boot = paired_bootstrap(a, b, n_resamples=20_000, seed=3)
    assert res.se == pytest.approx(np.std(boot.distribution), rel=0.03)
    doubled = paired_bootstrap({k: np.tile(v, 2) for k, v in a.items()}, {k: np.tile(v, 2) for k, v in b.items()},
                               n_resamples=20_000, seed=3)
    assert power(a, b, n=2000).se == pytest.approx(np.std(doubled.distribution), rel=0.03)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [(dict(alpha=0), "alpha"), (dict(power=1.0), "power"), (dict(n=0), "n must be a positive integer"),
     (dict(n=10.5), "n must be"), (dict(delta=0), "delta"), (dict(delta=float("nan")), "delta")],
)
def test_bad_options_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        power([1, 0, 1], [1, 1, 1], **kwargs)


def test_bad_pilots_raise():
    with pytest.raises(ValueError, match="at least two items on benchmark 'm'"):
        power({"g": [1, 0], "m": [1]}, {"g": [1, 1], "m": [0]})
    with pytest.raises(ValueError, match="pilot_a has 3 items and pilot_b has 2"):
        power([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="both be arrays"):
        power({"g": [1, 0]}, [1, 0])


def test_cli_prints_the_power_of_every_task_and_the_macro(capsys):
    assert main(["power", TWIN, LOOPED, "--delta", "0.02", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    paired = pair_runs({"a": load_run(TWIN), "b": load_run(LOOPED)})
    a, b = paired.scores["a"], paired.scores["b"]
    assert set(out["tasks"]) == set(paired.tasks) == {"toy_arith", "toy_mc", "toy_aime"}
    for task, row in out["tasks"].items():
        d = b[task].mean(axis=1) - a[task].mean(axis=1)
        sd = np.std(d, ddof=1)
        assert row["sd"] == pytest.approx(sd) and row["n"] == len(d)
        assert row["mde"] == pytest.approx(2.8015852 * sd / math.sqrt(len(d)), rel=1e-6)
        assert row["n_needed"] == math.ceil((2.8015852 * sd / 0.02) ** 2)
    assert out["macro"]["n_pilot"] == 102 and out["macro"]["delta"] == 0.02

    assert main(["power", TWIN, LOOPED, "--n", "500"]) == 0
    text = capsys.readouterr().out
    assert "MDE: minimum detectable difference at 500 items;" in text
    assert [line.split()[0] for line in text.splitlines()[-4:]] == ["toy_aime", "toy_arith", "toy_mc", "macro"]
    assert main(["power", TWIN, LOOPED, "--power", "2"]) == 2
    assert "power must lie in (0, 1)" in capsys.readouterr().err


def test_a_named_metrics_delta_and_margin_apply_to_that_metric_only(capsys):
    """``--delta acc=0.05`` sizes the task scored by acc; ``--margin acc=0.05`` widens only its
    equivalence margin; the others keep the bare (accuracy) values, and each row names its unit."""
    assert main(["power", TWIN, LOOPED, "--delta", "acc=0.05", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"]["toy_mc"]["delta"] == 0.05 and out["tasks"]["toy_mc"]["unit"] == "fraction"
    assert out["tasks"]["toy_arith"]["delta"] is None and out["macro"]["delta"] is None  # kinds share no delta
    assert main(["compare", TWIN, LOOPED, "--margin", "acc=0.05", "--margin", "0.03", "--n-resamples", "500",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {t: r["margin"] for t, r in out["tasks"].items()} == {"toy_mc": 0.05, "toy_arith": 0.03, "toy_aime": 0.03}
    with pytest.raises(SystemExit) as exit_:
        main(["compare", TWIN, LOOPED, "--margin", "acc=abc"])
    assert exit_.value.code == 2 and "expected a number or METRIC=NUMBER" in capsys.readouterr().err
