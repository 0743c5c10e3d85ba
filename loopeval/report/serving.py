"""The report's serving section (the paper's Table 10) from ``loopeval serve-cost`` folders."""

from __future__ import annotations

from pathlib import Path

from loopeval.serving import read_serve_cost


def section(folders: list[str | Path]) -> list[dict]:
    """One row per candidate of each ``serve_cost.json``: unlooped -> looped latency,
    throughput (each at its own batch), batch and peak memory, the ratios, c and the FLOP
    multiplier. Read before any other work, so a bad folder fails first."""
    rows = []
    for folder in folders:
        result = read_serve_cost(folder)
        a, s = result.baseline, result.settings
        for i, b in enumerate(result.models[1:], 1):
            rows.append({
                "folder": str(folder), "baseline": a.name, "candidate": b.name,
                "where": f"{s.get('gpu') or s.get('device')}, {s.get('dtype')}, {s.get('cache')} cache"
                         + (", compiled" if s.get("compile") else ""),
                "latency_ms": (1e3 * a.latency_s.median, 1e3 * b.latency_s.median),
                "tokens_per_s": (a.max_throughput, b.max_throughput), "batch": (a.max_batch, b.max_batch),
                "memory_gb": (a.peak_memory_bytes / 1e9, b.peak_memory_bytes / 1e9), **result.ratios(i),
            })
    return rows
