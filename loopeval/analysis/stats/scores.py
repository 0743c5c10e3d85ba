"""Per-item score inputs: validation, per-item averaging and the macro average.

Axis 0 of a score array is the test item; any further axes (repeated samples of an
item, training seeds) are averaged per item, so the item stays the resampling unit.
A ``{benchmark: array}`` mapping stands for a macro over benchmarks.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# The benchmark name under which a plain array (no mapping) is resampled.
SINGLE = ""


def numeric_array(x, *, name: str = "scores") -> np.ndarray:
    """``x`` as a float array with an item axis; ``ValueError`` naming ``name`` for a
    scalar or a ragged or non-numeric input."""
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not a numeric array of per-item scores ({exc})") from None
    if arr.ndim == 0:
        raise ValueError(f"{name}: expected per-item scores, got a scalar")
    return arr


def item_scores(x, *, name: str = "scores") -> np.ndarray:
    """``x`` as a 1-D float array of per-item scores, averaging every axis after the first.

    Raises ``ValueError`` naming ``name`` for a scalar, an empty, ragged or non-numeric
    input, or NaN/inf values.
    """
    arr = numeric_array(x, name=name)
    if arr.shape[0] == 0 or arr.size == 0:
        raise ValueError(f"{name} is empty")
    bad = ~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1)
    if bad.any():
        raise ValueError(f"{name} contains NaN or inf (item {int(np.argmax(bad))})")
    return arr.reshape(len(arr), -1).mean(axis=1)


def as_benchmarks(x, *, name: str = "scores") -> dict[str, np.ndarray]:
    """``{benchmark: per-item scores}`` for a mapping, or ``{SINGLE: scores}`` for one array."""
    if isinstance(x, Mapping):
        if not x:
            raise ValueError(f"{name}: no benchmarks")
        return {str(k): item_scores(v, name=f"{name}[{k!r}]") for k, v in x.items()}
    return {SINGLE: item_scores(x, name=name)}


def score_table(systems: Mapping[str, object]) -> dict[str, np.ndarray]:
    """``{benchmark: (n_items, n_systems) matrix}`` for ``{system: scores}``.

    Every system must give the same benchmarks with the same number of items; a
    mismatch raises ``ValueError`` naming the systems, the benchmark and the counts.
    """
    if not systems:
        raise ValueError("no systems to compare")
    parsed = {str(s): as_benchmarks(v, name=str(s)) for s, v in systems.items()}
    names = list(parsed)
    first = names[0]
    benchmarks = list(parsed[first])
    for s in names[1:]:
        if set(parsed[s]) != set(benchmarks):
            only_first = sorted(set(benchmarks) - set(parsed[s]))
            only_s = sorted(set(parsed[s]) - set(benchmarks))
            raise ValueError(
                f"{first} and {s} cover different benchmarks "
                f"(only in {first}: {only_first or 'none'}; only in {s}: {only_s or 'none'})"
            )
    table = {}
    for bench in benchmarks:
        for s in names[1:]:
            n0, n1 = len(parsed[first][bench]), len(parsed[s][bench])
            if n0 != n1:
                where = f" on benchmark {bench!r}" if bench != SINGLE else ""
                raise ValueError(f"{first} has {n0} items and {s} has {n1}{where}; paired scores need equal lengths")
        table[bench] = np.column_stack([parsed[s][bench] for s in names])
    return table


def macro(scores: Mapping[str, object]) -> float:
    """Macro accuracy: the unweighted mean over benchmarks of each benchmark's mean item score."""
    if not isinstance(scores, Mapping):
        raise ValueError("macro needs a {benchmark: scores} mapping")
    return float(np.mean([v.mean() for v in as_benchmarks(scores).values()]))
