"""The report's figure: macro accuracy against inference cost (the paper's Figure 2),
laid out in pixels so the template only draws it as inline SVG."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from loopeval.report.evaluations import Evaluation, by_seed, label
from loopeval.runs import pair_runs

PALETTE = ("#1b6ca8", "#d1495b", "#00798c", "#edae49", "#66a182", "#8d5a97")


def cost_figure(groups: dict, extra: Evaluation | None, base_cost: float, *, n_resamples: int, seed: int) -> dict:
    """Accuracy (macro, %) against cost (x the plain twin at the default budget): one
    curve per model and decoding rule, one point per budget, 95% bootstrap error bars."""
    curves = defaultdict(list)
    for (lp, forcing, scale), members in groups.items():
        curves[label(lp, forcing)].append((scale, by_seed(members)))
    if extra is not None:
        curves["larger" + (" + BF" if extra.forcing else "")].append((extra.scale, [extra.run]))
    series = []
    for i, (name, pts) in enumerate(sorted(curves.items())):
        points_ = []
        for scale, runs in sorted(pts):
            paired = pair_runs({name: runs})
            dist = paired.resampler(n_resamples=n_resamples, seed=seed).distribution(name)
            lo, hi = np.percentile(dist, [2.5, 97.5])
            points_.append({"scale": scale, "x": float(np.mean([r.cost() for r in runs])) / base_cost,
                            "y": paired.accuracy(name), "lo": float(lo), "hi": float(hi)})
        series.append({"name": name, "color": PALETTE[i % len(PALETTE)], "points": points_,
                       "dashed": "twin" in name or "larger" in name})
    return _layout(series)


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo or 1.0
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 2.5, 5, 10):
        if span / (step * m) <= n:
            step *= m
            break
    start = math.floor(lo / step) * step
    return [round(start + k * step, 10) for k in range(int(math.ceil((hi - start) / step)) + 1)]


def _layout(series: list[dict], width: int = 640, height: int = 380) -> dict:
    """Pixel coordinates for the SVG figure, so the template only draws."""
    left, right, top, bottom = 64, 180, 20, 48
    xs = [p["x"] for s in series for p in s["points"]]
    ys = [v for s in series for p in s["points"] for v in (p["lo"], p["hi"])]
    xt = _nice_ticks(min(xs), max(xs))
    yt = _nice_ticks(100 * min(ys), 100 * max(ys))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def px(x):
        return left + (x - x0) / ((x1 - x0) or 1) * (width - left - right)

    def py(y):
        return height - bottom - (100 * y - y0) / ((y1 - y0) or 1) * (height - top - bottom)

    for s in series:
        for p in s["points"]:
            p.update(px=px(p["x"]), py=py(p["y"]), py_lo=py(p["lo"]), py_hi=py(p["hi"]))
        s["path"] = " ".join(f"{'M' if i == 0 else 'L'}{p['px']:.1f},{p['py']:.1f}" for i, p in enumerate(s["points"]))
    return {
        "width": width,
        "height": height,
        "plot": {"left": left, "right": width - right, "top": top, "bottom": height - bottom},
        "xticks": [{"px": px(t), "label": f"{t:g}"} for t in xt],
        "yticks": [{"py": py(t / 100), "label": f"{t:g}"} for t in yt],
        "series": series,
    }
