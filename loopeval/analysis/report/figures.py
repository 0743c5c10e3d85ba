"""The report's figures, drawn with matplotlib: accuracy against inference cost (the
paper's Figure 2). Each figure is data first (``cost_series``), then drawn
(``draw_cost``), then written inline as SVG and beside the report as PDF and PNG."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from loopeval.analysis.report.evaluations import Evaluation, by_seed, label
from loopeval.analysis.runs import pair_runs
from loopeval.evaluation.metrics import POINTS, Unit

PALETTE = ("#1b6ca8", "#d1495b", "#00798c", "#edae49", "#66a182", "#8d5a97")


def cost_series(groups: dict, extra: Evaluation | None, base_cost: float, *, cost: str, n_resamples: int,
                seed: int, tasks=None) -> list[dict]:
    """One series per (looped, condition, variant) and for the larger model: one point per
    budget, with the macro score of ``tasks`` (one kind of metric; default every task; seeds
    averaged per item) as the metric reports it, its 95% bootstrap interval, and the cost
    of those tasks relative to the reference (``base_cost``)."""
    curves: dict[tuple, list] = {}
    for (lp, cond, variant, scale), members in groups.items():
        curves.setdefault((lp, cond, variant), []).append((scale, by_seed(members)))
    if extra is not None:
        curves[(False, extra.condition, "larger")] = [(extra.scale, [extra.run])]
    series = []
    for i, ((lp, cond, variant), pts) in enumerate(sorted(curves.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0]))):
        name = "larger" + ("" if cond == "plain" else f" + {cond}") if variant == "larger" else label(lp, cond, variant)
        points = []
        for scale, runs in sorted(pts, key=lambda p: p[0]):
            paired = pair_runs({name: runs}, tasks=tasks)
            sign = 1.0 if all((paired.higher_is_better or {}).get(t, True) for t in paired.tasks) else -1.0
            dist = sign * paired.resampler(n_resamples=n_resamples, seed=seed).distribution(name)
            lo, hi = np.percentile(dist, [2.5, 97.5])
            points.append({"scale": scale, "x": float(np.mean([r.cost(tasks, mode=cost) for r in runs])) / base_cost,
                           "y": sign * paired.accuracy(name), "lo": float(lo), "hi": float(hi)})
        series.append({"name": name, "looped": lp, "color": PALETTE[i % len(PALETTE)], "points": points})
    return series


def draw_cost(series: list[dict], *, cost: str, wall_clock: bool = False, unit: Unit = POINTS,
              direction: bool = True):
    """Macro score against cost in its ``unit`` (accuracy in %), 95% bars; looped filled and
    solid, unlooped open and dashed. ``direction``: whether higher is better.
    ``wall_clock``: the costs are measured decode time (``report.serving.on_wall_clock``)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for i, s in enumerate(series):
        pts = s["points"]
        x = [p["x"] for p in pts]
        y = [unit.scale * p["y"] for p in pts]
        err = [[unit.scale * (p["y"] - p["lo"]) for p in pts], [unit.scale * (p["hi"] - p["y"]) for p in pts]]
        bars = ax.errorbar(x, y, yerr=err, color=s["color"], linestyle="-" if s["looped"] else "--", marker="o",
                           markerfacecolor=s["color"] if s["looped"] else "white", capsize=3, label=s["name"])
        bars.lines[0].set_gid(f"series-{i}")
    charge = "measured decode time" if wall_clock else "layer passes" if cost == "passes" else "FLOPs"
    ax.set_xlabel(f"inference cost, {charge} (× the plain twin at the default budget)")
    ax.set_ylabel("macro accuracy (%)" if unit.fraction else
                  f"macro score ({unit.name}, {'higher' if direction else 'lower'} is better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def svg(fig) -> str:
    """The figure as an SVG element to inline in HTML (no XML prolog)."""
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def save(fig, stem: Path) -> list[Path]:
    """Write ``stem.pdf`` and ``stem.png`` (200 dpi), for papers and slides."""
    paths = [stem.with_suffix(".pdf"), stem.with_suffix(".png")]
    for path in paths:
        fig.savefig(path, dpi=200)
    return paths
