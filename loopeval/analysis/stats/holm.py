"""Holm's step-down correction for a family of tests (e.g. one per token budget)."""

from __future__ import annotations

import numpy as np


def holm(pvalues) -> np.ndarray:
    """Holm-adjusted p-values, in the input order; reject where ``adjusted < alpha``.

    The ``i``-th smallest of ``m`` p-values becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``
    (statsmodels' ``multipletests(method="holm")``, which the tests compare with; it is not
    called here because it runs ``gc.collect()``, seconds per call in a process holding
    lm-eval's task index).
    """
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"holm needs a 1-D sequence of p-values, got shape {p.shape}")
    if p.size and not ((p >= 0) & (p <= 1)).all():
        raise ValueError(f"p-values must lie in [0, 1] (no NaN); got {p.tolist()}")
    if not p.size:
        return np.empty(0)
    order = np.argsort(p, kind="stable")
    m = p.size
    stepped = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = stepped
    return out
