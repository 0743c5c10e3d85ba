"""Clusters of items: which items resample together (e.g. questions on one source problem).

A benchmark's clusters are a per-item id array; the items of a cluster need not be
adjacent. Clusters are numbered in order of first appearance, so singleton clusters
(all ids distinct) are the items themselves in their own order, whatever the ids.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from loopeval.analysis.stats.scores import SINGLE


def cluster_index(ids, n_items: int, *, name: str = "clusters") -> np.ndarray:
    """Per item, the number of its cluster (0, 1, ... in order of first appearance)."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected one cluster id per item (1-D), got shape {arr.shape}")
    if len(arr) != n_items:
        raise ValueError(f"{name} has {len(arr)} ids but the benchmark has {n_items} items")
    if arr.dtype.kind == "f" and np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN (item {int(np.argmax(np.isnan(arr)))})")
    if arr.dtype.kind == "O":
        arr = arr.astype(str)
    _, first, inverse = np.unique(arr, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.intp)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse.reshape(-1)]


def cluster_table(clusters, table: Mapping[str, np.ndarray]) -> dict[str, np.ndarray | None]:
    """``{benchmark: cluster index per item, or None for items as their own clusters}``.

    ``clusters`` is ``None``, one id array (scores given as arrays), or ``{benchmark: ids}``
    (scores given as mappings); benchmarks it leaves out resample items.
    """
    if clusters is None:
        return dict.fromkeys(table)
    if isinstance(clusters, Mapping):
        if SINGLE in table and len(table) == 1:
            raise ValueError("clusters: a {benchmark: ids} mapping needs scores given as {benchmark: array} mappings")
        unknown = sorted(str(k) for k in clusters if str(k) not in table)
        if unknown:
            raise ValueError(f"clusters name unknown benchmarks {unknown}; the scores have {sorted(table)}")
        given = {str(k): v for k, v in clusters.items()}
        return {b: None if b not in given else cluster_index(given[b], len(x), name=f"clusters[{b!r}]")
                for b, x in table.items()}
    if set(table) != {SINGLE}:
        raise ValueError("clusters: scores given as {benchmark: array} need clusters as {benchmark: ids}")
    return {SINGLE: cluster_index(clusters, len(table[SINGLE]))}


def cluster_sums(x: np.ndarray, index: np.ndarray | None) -> np.ndarray:
    """``(n_clusters, n_systems + 1)``: each cluster's score sums per system, then its size.

    For ``index=None`` every item is its own cluster: ``[x | 1]``.
    """
    if index is None:
        return np.column_stack([x, np.ones(len(x))])
    k = int(index.max()) + 1
    columns = [np.bincount(index, weights=x[:, j], minlength=k) for j in range(x.shape[1])]
    return np.column_stack([*columns, np.bincount(index, minlength=k).astype(float)])
