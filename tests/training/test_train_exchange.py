"""The token exchange rate r(D) (paper C.2) on synthetic held-out curves with known
answers, and the torch-free modules the report reads manifests with."""

import math
import subprocess
import sys

import numpy as np
import pytest

from loopeval.training.exchange import (Curve, exchange_rate, exchange_rate_of_curves, heldout_curve, loss_at, tokens_to_reach,
                               training_curves)

D = [100.0 * 2**i for i in range(10)]


def twin_loss(d):
    return 5.0 - math.log(d)  # straight in log tokens, so interpolation is exact


def manifest(role, tokens, losses, *, by_passes=None, multiplier=1.0, flops=1.0, seconds=1.0):
    points = [{"step": i + 1, "tokens": t, "loss": l} for i, (t, l) in enumerate(zip(tokens, losses))]
    if by_passes:
        for i, p in enumerate(points):
            p["loss_by_passes"] = {str(k): v[i] for k, v in by_passes.items()}
    return {"format": "loopeval-training/2", "recipe": "cpt", "role": role,
            "loop": {"loop": "1:3x2"} if role == "looped" else None, "heldout_curve": points,
            "tokens": {"input": tokens[-1]}, "flops": {"train": flops * tokens[-1], "multiplier": multiplier},
            "train_time_s": seconds * tokens[-1]}


def test_a_constant_exchange_rate_is_recovered_exactly():
    twin = Curve(tuple(D), tuple(twin_loss(d) for d in D))
    looped = Curve(tuple(D), tuple(twin_loss(1.5 * d) for d in D))
    result = exchange_rate_of_curves(twin, looped, costs={"layers": 1.25, "high": 2.0})
    finite = [r for r in result.rate if not math.isnan(r)]
    assert finite == pytest.approx([1.5] * 9, rel=1e-12)
    assert math.isnan(result.rate[-1])  # 1.5 D lies past the twin's last checkpoint
    assert result.twin_tokens[:9] == pytest.approx([1.5 * d for d in D[:9]], rel=1e-12)
    assert result.crossings == {"layers": D[0], "high": None}  # above 1.25 from the first checkpoint


def test_a_rising_exchange_rate_and_its_crossing():
    """r(D) = 0.9 + 0.1 ln(D / 100), straight in log D like the curves: every value and the
    crossing of c = 1.25 at D = 100 e^3.5 are exact."""
    rate = lambda d: 0.9 + 0.1 * math.log(d / 100)  # noqa: E731
    twin = Curve(tuple(d for d in np.geomspace(10, 1e6, 40)), tuple(twin_loss(d) for d in np.geomspace(10, 1e6, 40)))
    looped = Curve(tuple(D), tuple(twin_loss(rate(d) * d) for d in D))
    result = exchange_rate_of_curves(twin, looped, costs={"layers": 1.25, "flops": 1.16})
    assert result.rate == pytest.approx([rate(d) for d in D], rel=1e-9)
    assert result.crossings["layers"] == pytest.approx(100 * math.exp(3.5), rel=1e-9)
    assert result.crossings["flops"] == pytest.approx(100 * math.exp(2.6), rel=1e-9)
    assert result.rate[0] == pytest.approx(0.9)  # the twin reaches the looped loss with fewer tokens


def test_first_crossing_of_a_non_monotone_curve_and_out_of_range_losses():
    curve = Curve((1.0, 10.0, 100.0, 1000.0), (4.0, 2.0, 3.0, 1.0))
    assert tokens_to_reach(curve, 3.0) == pytest.approx(math.sqrt(10))  # halfway in log tokens
    assert tokens_to_reach(curve, 2.5) == pytest.approx(10 ** 0.75)
    assert math.isnan(tokens_to_reach(curve, 0.5)) and math.isnan(tokens_to_reach(curve, 4.5))
    assert loss_at(curve, 10 ** 1.5) == pytest.approx(2.5) and math.isnan(loss_at(curve, 2000.0))
    with pytest.raises(ValueError, match="increasing"):
        tokens_to_reach(Curve((10.0, 5.0), (2.0, 1.0)), 1.5)


def test_from_manifests_costs_and_plot_data():
    twin = manifest("twin", D, [twin_loss(d) for d in D], flops=6.0, seconds=2.0)
    looped_losses = [twin_loss(1.2 * d) for d in D]
    looped = manifest("looped", D, looped_losses, multiplier=1.25, flops=7.08, seconds=2.5,
                      by_passes={1: [x + 0.1 for x in looped_losses], 2: looped_losses})
    result = exchange_rate(twin, looped)
    assert result.costs == pytest.approx({"layers": 1.25, "flops": 1.18, "time": 1.25})
    assert result.rate[0] == pytest.approx(1.2) and result.crossings["flops"] == pytest.approx(D[0])
    assert result.crossings["layers"] is None
    curves = training_curves(twin, looped)
    assert curves.looped_by_passes[1].loss[0] == pytest.approx(looped_losses[0] + 0.1)
    assert curves.twin_at_equal_compute["layers"].loss[0] == pytest.approx(twin_loss(1.25 * D[0]))
    data = curves.to_dict()
    assert data["exchange"]["rate"][-1] is None  # NaN becomes null for JSON
    assert heldout_curve(looped, passes=2).loss == tuple(looped_losses)
    with pytest.raises(ValueError, match="pass the twin first"):
        exchange_rate(looped, twin)
    with pytest.raises(ValueError, match="no held-out curve"):
        exchange_rate(twin, {**looped, "heldout_curve": []})
    with pytest.raises(ValueError, match="no held-out loss at 3 passes"):
        heldout_curve(looped, passes=3)


def test_manifest_and_exchange_modules_load_no_torch():
    code = ("import sys, loopeval.training.manifest, loopeval.training.exchange, loopeval.training; "
            "loopeval.training.TrainConfig; loopeval.training.exchange_rate; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
