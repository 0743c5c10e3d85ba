"""The token exchange rate r(D) and the held-out curves of twins (paper C.2; Fig. 3 and 5).

Torch-free and independent of training code, so the report can use it on manifests.

Paper C.2: "The token exchange rate r(D) is the number of tokens the twin needs to
match the looped model after D tokens, divided by D. The loop pays for its training
compute only if r exceeds its training cost, which is 1.25 counting layers, 1.16
counting FLOPs including the output head, and 1.19 in measured training time."

Curves come from the manifests' ``heldout_curve``: held-out loss (nats per target token)
against the training tokens seen (``tokens``, the input tokens fed). Between
checkpoints, loss is interpolated linearly in log tokens (loss curves are close to power
laws, i.e. straight in log tokens over a checkpoint interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loopeval.training.manifest import read_manifest


@dataclass(frozen=True)
class Curve:
    """Held-out loss against training tokens, in training order."""

    tokens: tuple[float, ...]
    loss: tuple[float, ...]

    def to_dict(self) -> dict:
        return {"tokens": list(self.tokens), "loss": list(self.loss)}


@dataclass(frozen=True)
class ExchangeRate:
    """r(D) at the looped model's checkpoints ``tokens`` (D): ``rate`` (NaN where the
    looped loss lies outside the twin's measured range), ``twin_tokens`` (r·D, the twin's
    tokens to the same loss), the loop's training ``costs`` (``layers``: the paper's
    c = (N+m)/N; ``flops``: training FLOPs per token, looped over twin; ``time``:
    training seconds per token, looped over twin) and, per cost, ``crossings``: the
    smallest D at which r reaches it (``None``: never, within the curves)."""

    tokens: tuple[float, ...]
    rate: tuple[float, ...]
    twin_tokens: tuple[float, ...]
    costs: dict[str, float]
    crossings: dict[str, float | None]

    def to_dict(self) -> dict:
        nan = lambda x: None if isinstance(x, float) and math.isnan(x) else x  # noqa: E731  (JSON has no NaN)
        return {"tokens": list(self.tokens), "rate": [nan(r) for r in self.rate],
                "twin_tokens": [nan(t) for t in self.twin_tokens], "costs": dict(self.costs),
                "crossings": dict(self.crossings)}


@dataclass(frozen=True)
class TrainingCurves:
    """Plot-ready training data of a twin pair: held-out loss against tokens for each
    side (Fig. 3), the looped model's loss at each pass count, the twin's loss at
    ``cost × D`` for each cost (equal training compute), and r(D) with its crossings
    (Fig. 5)."""

    twin: Curve
    looped: Curve
    looped_by_passes: dict[int, Curve]
    twin_at_equal_compute: dict[str, Curve]
    exchange: ExchangeRate

    def to_dict(self) -> dict:
        return {"twin": self.twin.to_dict(), "looped": self.looped.to_dict(),
                "looped_by_passes": {str(k): c.to_dict() for k, c in self.looped_by_passes.items()},
                "twin_at_equal_compute": {k: c.to_dict() for k, c in self.twin_at_equal_compute.items()},
                "exchange": self.exchange.to_dict()}


def _manifest(m: dict | str | Path) -> dict:
    return m if isinstance(m, dict) else read_manifest(m)


def heldout_curve(manifest: dict | str | Path, *, passes: int | None = None) -> Curve:
    """The held-out curve of a manifest (or checkpoint folder): at the model's own loop,
    or with every window run ``passes`` times."""
    m = _manifest(manifest)
    points = m.get("heldout_curve") or []
    if not points:
        raise ValueError(f"manifest of {m.get('base', '?')} ({m.get('role', '?')}) has no held-out curve; "
                         "train with heldout= (--heldout) and save_every (--save-every)")
    if passes is None:
        losses = [p["loss"] for p in points]
    else:
        if any(str(passes) not in p.get("loss_by_passes", {}) for p in points):
            raise ValueError(f"manifest ({m.get('role', '?')}) has no held-out loss at {passes} passes")
        losses = [p["loss_by_passes"][str(passes)] for p in points]
    return Curve(tuple(float(p["tokens"]) for p in points), tuple(float(x) for x in losses))


def _check(curve: Curve, what: str) -> None:
    t = np.asarray(curve.tokens)
    if len(t) == 0 or np.any(t <= 0) or np.any(np.diff(t) <= 0):
        raise ValueError(f"{what}: tokens must be positive and increasing, got {list(curve.tokens)}")


def tokens_to_reach(curve: Curve, loss: float) -> float:
    """The fewest tokens at which ``curve`` reaches ``loss`` (first crossing, linear in
    log tokens between checkpoints); NaN when it never does, or already has at its first
    checkpoint (the crossing lies before the measured range)."""
    _check(curve, "curve")
    t, y = np.log(np.asarray(curve.tokens)), np.asarray(curve.loss)
    below = np.flatnonzero(y <= loss)
    if len(below) == 0 or below[0] == 0:
        return math.nan
    i = below[0]
    frac = (y[i - 1] - loss) / (y[i - 1] - y[i])
    return float(np.exp(t[i - 1] + frac * (t[i] - t[i - 1])))


def loss_at(curve: Curve, tokens: float) -> float:
    """``curve``'s loss at ``tokens`` (linear in log tokens); NaN outside its range."""
    _check(curve, "curve")
    t = np.log(np.asarray(curve.tokens))
    x = math.log(tokens)
    if x < t[0] or x > t[-1]:
        return math.nan
    return float(np.interp(x, t, np.asarray(curve.loss)))


def _crossing(tokens: np.ndarray, rate: np.ndarray, cost: float) -> float | None:
    ok = np.isfinite(rate)
    t, r = np.log(tokens[ok]), rate[ok]
    above = np.flatnonzero(r >= cost)
    if len(above) == 0:
        return None
    i = above[0]
    if i == 0:
        return float(tokens[ok][0])
    frac = (cost - r[i - 1]) / (r[i] - r[i - 1])
    return float(np.exp(t[i - 1] + frac * (t[i] - t[i - 1])))


def _costs(twin: dict, looped: dict) -> dict[str, float]:
    costs = {"layers": float(looped["flops"]["multiplier"])}
    per_token = lambda m, v: v / m["tokens"]["input"]  # noqa: E731
    if twin["flops"]["train"] > 0:
        costs["flops"] = per_token(looped, looped["flops"]["train"]) / per_token(twin, twin["flops"]["train"])
    if twin.get("train_time_s", 0) > 0 and looped.get("train_time_s", 0) > 0:
        costs["time"] = per_token(looped, looped["train_time_s"]) / per_token(twin, twin["train_time_s"])
    return costs


def exchange_rate(twin_manifest: dict | str | Path, looped_manifest: dict | str | Path) -> ExchangeRate:
    """r(D) of a looped model against its twin (baseline first), from their manifests'
    held-out curves (or from curves: pass :class:`Curve` objects via
    :func:`exchange_rate_of_curves`)."""
    twin, looped = _manifest(twin_manifest), _manifest(looped_manifest)
    if looped.get("loop") is None:
        raise ValueError("exchange_rate(twin, looped): the second manifest has no loop; pass the twin first")
    return exchange_rate_of_curves(heldout_curve(twin), heldout_curve(looped), costs=_costs(twin, looped))


def exchange_rate_of_curves(twin: Curve, looped: Curve, *, costs: dict[str, float]) -> ExchangeRate:
    """r(D) from two held-out curves and the loop's training costs."""
    _check(twin, "twin curve")
    _check(looped, "looped curve")
    tokens = np.asarray(looped.tokens)
    needed = np.array([tokens_to_reach(twin, loss) for loss in looped.loss])
    rate = needed / tokens
    return ExchangeRate(tokens=tuple(tokens.tolist()), rate=tuple(rate.tolist()), twin_tokens=tuple(needed.tolist()),
                        costs=dict(costs), crossings={k: _crossing(tokens, rate, c) for k, c in costs.items()})


def training_curves(twin_manifest: dict | str | Path, looped_manifest: dict | str | Path) -> TrainingCurves:
    """Everything the report plots for a twin pair's training (baseline first)."""
    twin, looped = _manifest(twin_manifest), _manifest(looped_manifest)
    exchange = exchange_rate(twin, looped)
    twin_curve, looped_curve = heldout_curve(twin), heldout_curve(looped)
    passes = sorted(int(k) for k in (looped["heldout_curve"][0].get("loss_by_passes") or {}))
    equal = {name: Curve(looped_curve.tokens, tuple(loss_at(twin_curve, cost * d) for d in looped_curve.tokens))
             for name, cost in exchange.costs.items()}
    return TrainingCurves(twin=twin_curve, looped=looped_curve,
                          looped_by_passes={k: heldout_curve(looped, passes=k) for k in passes},
                          twin_at_equal_compute=equal, exchange=exchange)
