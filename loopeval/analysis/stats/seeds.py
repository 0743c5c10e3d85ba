"""Per-seed differences: how many training seeds favour the candidate."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from loopeval.analysis.stats.scores import SINGLE, item_scores, numeric_array


@dataclass(frozen=True)
class SeedSummary:
    """``favour`` of ``n`` seeds have ``delta > 0``; ``deltas`` are candidate − baseline per seed."""

    deltas: tuple[float, ...]
    favour: int
    n: int

    def __str__(self) -> str:
        return f"{self.favour} of {self.n}"


def _by_seed(x, name: str) -> dict[str, np.ndarray]:
    # Returns {benchmark: (n_items, n_seeds)}; axes after the seed axis are averaged per item.
    parts = x if isinstance(x, Mapping) else {SINGLE: x}
    out = {}
    for bench, v in parts.items():
        label = f"{name}[{bench!r}]" if bench != SINGLE else name
        arr = numeric_array(v, name=label)
        arr = arr.reshape(arr.shape[0], arr.shape[1] if arr.ndim > 1 else 1, -1)
        out[str(bench)] = np.column_stack(
            [item_scores(arr[:, s], name=f"{label} seed {s}") for s in range(arr.shape[1])]
        )
    return out


def seed_summary(a, b) -> SeedSummary:
    """Per-seed macro differences ``b − a``; axis 1 of every array is the training seed.

    ``a`` and ``b`` are ``(n_items, n_seeds[, ...])`` arrays or ``{benchmark: array}``
    mappings; seed ``s`` of ``b`` is paired with seed ``s`` of ``a``.
    """
    sa, sb = _by_seed(a, "a"), _by_seed(b, "b")
    if set(sa) != set(sb):
        raise ValueError(f"a and b cover different benchmarks: {sorted(sa)} vs {sorted(sb)}")
    seeds = {x.shape[1] for x in (*sa.values(), *sb.values())}
    if len(seeds) != 1:
        raise ValueError(f"a and b need the same number of seeds on every benchmark, got {sorted(seeds)}")
    for bench in sa:
        if len(sa[bench]) != len(sb[bench]):
            raise ValueError(f"a has {len(sa[bench])} items and b has {len(sb[bench])} on benchmark {bench!r}")
    (k,) = seeds
    deltas = tuple(
        float(np.mean([sb[bench][:, s].mean() - sa[bench][:, s].mean() for bench in sa])) for s in range(k)
    )
    return SeedSummary(deltas=deltas, favour=sum(d > 0 for d in deltas), n=k)
