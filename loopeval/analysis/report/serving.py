"""The report's serving section (the paper's Table 10) from ``loopeval serve-cost`` folders."""

from __future__ import annotations

import math
from pathlib import Path

from loopeval.evaluation.serving import read_serve_cost


def section(folders: list[str | Path]) -> list[dict]:
    """One row per candidate of each ``serve_cost.json``: the engine that measured it, unlooped -> looped latency,
    throughput (each at its own batch), batch and peak memory, the ratios, c and the FLOP
    multiplier. Read before any other work, so a bad folder fails first."""
    rows = []
    for folder in folders:
        result = read_serve_cost(folder)
        a, s = result.baseline, result.settings
        for i, b in enumerate(result.models[1:], 1):
            rows.append({
                "folder": str(folder), "baseline": a.name, "candidate": b.name, "loop": b.loop,
                "engine": result.engine, "engine_version": result.engine_version,
                "where": f"{s.get('gpu') or s.get('device')}, {s.get('dtype')}, {s.get('cache')} cache"
                         + (", compiled" if s.get("compile") else ""),
                "latency_ms": (1e3 * a.latency_s.median, 1e3 * b.latency_s.median),
                "tokens_per_s": (a.max_throughput, b.max_throughput), "batch": (a.max_batch, b.max_batch),
                "memory_gb": (a.peak_memory_bytes / 1e9, b.peak_memory_bytes / 1e9), **result.ratios(i),
                "spread": {k: (v.low, v.high) for k, v in result.ratio_spreads(i).items()},
                "notes": [c.note for c in result.checks(i) if c.note],
                "reliable": all(c.reliable for c in result.checks(i)),
                "unreliable": {c.name: c.note for c in result.checks(i) if not c.reliable},
            })
    return rows


def wall_clock_scale(rows: list[dict], *, loop: str, multiplier: float, cost: str, larger: bool) -> float:
    """The factor that puts a looped point of Figure 2 on measured time: the measured
    latency ratio over c (the figure charges a looped token c unlooped tokens; the clock
    charges it the latency ratio). Needs the layer-pass charge, no larger model (whose
    latency was not measured) and exactly one measurement of this loop, at the same c."""
    if cost != "passes":
        raise ValueError("--wall-clock rescales the layer-pass charge; drop --cost flops")
    if larger:
        raise ValueError("--wall-clock: the larger model's latency is not measured; drop --larger or --wall-clock")
    matching = [r for r in rows if r["loop"] == loop]
    if len(matching) != 1:
        raise ValueError(f"--wall-clock needs one --serve-cost measurement of the loop {loop}; "
                         f"{len(matching)} of the {len(rows)} given measure it")
    row = matching[0]
    if "latency" in row["unreliable"]:
        raise ValueError(f"--wall-clock: {row['folder']}'s latency is {row['unreliable']['latency']}")
    if not math.isclose(row["multiplier"], multiplier, rel_tol=1e-9):
        raise ValueError(f"--wall-clock: {row['folder']} measured c = {row['multiplier']:.4g}, the report's loop has "
                         f"c = {multiplier:.4g}")
    return row["latency"] / row["multiplier"]


def on_wall_clock(series: list[dict], scale: float) -> list[dict]:
    """Figure 2's series with every looped point's cost multiplied by ``scale``."""
    return [{**s, "points": [{**p, "x": p["x"] * scale} for p in s["points"]] if s["looped"] else s["points"]}
            for s in series]
