"""What a placement search records: one ``PlacementRow`` per candidate, in
``placements.jsonl``, ranked by a metric and correlated with benchmark accuracy."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from loopeval.common.jsonl import append_jsonl, read_jsonl, repair_tail

PLACEMENTS_NAME = "placements.jsonl"
SETTINGS_NAME = "search.json"
RANK_BY = ("ppl_t", "ppl", "kl")
"""Metrics a search can rank by; lower is better for each."""


@dataclass(frozen=True)
class PlacementRow:
    """One scored candidate. ``loop`` is ``None`` for the unlooped model. ``ppl`` is the
    plain test perplexity, ``ppl_t`` the test perplexity at ``temperature`` (T*, fitted
    on the validation part), ``kl`` the mean KL(unlooped || candidate) over test tokens,
    ``tokens`` the test tokens scored and ``tokens_val`` the validation tokens;
    ``ppl_t_ci`` is PPL_T's 95% bootstrap interval over the ``test_documents`` test
    documents and ``ratio_ci`` that of PPL_T / the unlooped PPL_T on the same resamples
    (``loopeval.tools.placement.noise``)."""

    loop: str | None
    operator: str | None
    beta: float | None
    times: int | None
    width: int | None
    start: int | None
    mlp_loop: bool
    passes: int | float
    multiplier: float
    ppl: float
    ppl_t: float
    temperature: float
    kl: float
    tokens: int
    tokens_val: int
    ppl_t_ci: list[float] | None = None
    ratio_ci: list[float] | None = None
    test_documents: int | None = None

    @property
    def distinguishable(self) -> bool | None:
        """Whether PPL_T's ratio to the unlooped model's has an interval excluding 1
        (:func:`loopeval.tools.placement.noise.distinguishable`); ``None`` for the unlooped
        row, rows written without intervals, and too few test documents to tell."""
        from loopeval.tools.placement.noise import distinguishable

        return None if self.loop is None else distinguishable(self.ratio_ci, self.test_documents)

    @property
    def key(self) -> tuple:
        return (self.loop, self.operator, self.beta)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PlacementRow:
        if not isinstance(d, dict):
            raise TypeError(f"expected an object, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in d and n not in _OPTIONAL]
        if missing:
            raise KeyError(f"missing {', '.join(missing)}")
        row = cls(**{n: d[n] for n in names if n in d})
        for name in ("ppl", "ppl_t", "temperature", "kl", "multiplier"):
            if not isinstance(getattr(row, name), (int, float)) or isinstance(getattr(row, name), bool):
                raise TypeError(f"{name} {getattr(row, name)!r} is not a number")
        return row


_OPTIONAL = ("ppl_t_ci", "ratio_ci", "test_documents")
"""Fields rows written before the intervals existed lack."""


def read_placements(path: str | Path) -> list[PlacementRow]:
    """The rows of a ``placements.jsonl``; a bad line is a ``ValueError`` naming the file and line,
    but a last line cut by a crash is moved to ``placements.jsonl.cut`` (that candidate is scored again)."""
    repair_tail(path)
    return [row for _, row in read_jsonl(path, lambda lineno, d: PlacementRow.from_dict(d), what="placements")]


def append_placement(path: Path, row: PlacementRow) -> None:
    append_jsonl(path, [row.to_dict()])


def ranked(rows: list[PlacementRow], rank_by: str = "ppl_t") -> list[PlacementRow]:
    """The looped rows, best (lowest ``rank_by``) first; ties keep file order."""
    if rank_by not in RANK_BY:
        raise ValueError(f"rank_by {rank_by!r}: choose one of {', '.join(RANK_BY)}")
    return sorted((r for r in rows if r.loop is not None), key=lambda r: getattr(r, rank_by))


@dataclass(frozen=True)
class Correlation:
    """Spearman's rank correlation between benchmark accuracy and a score's ranking
    (``statistic`` > 0: the score ranks placements in the accuracy's order)."""

    metric: str
    statistic: float
    pvalue: float
    n: int


def read_accuracies(path: str | Path, rows: list[PlacementRow]) -> dict[tuple, float]:
    """Benchmark accuracies per placement from a JSONL of ``{"loop", "accuracy"}`` rows
    (``"operator"`` and ``"beta"`` optional where the spec alone is unambiguous;
    ``"loop": null`` is the unlooped model), keyed like ``PlacementRow.key``."""
    by_spec: dict[str | None, list[tuple]] = {}
    for r in rows:
        by_spec.setdefault(r.loop, []).append(r.key)

    def parse(lineno, d):
        if not isinstance(d, dict) or "loop" not in d or "accuracy" not in d:
            raise KeyError("expected an object with 'loop' and 'accuracy'")
        accuracy = d["accuracy"]
        if isinstance(accuracy, bool) or not isinstance(accuracy, (int, float)) or not math.isfinite(accuracy):
            raise ValueError(f"accuracy {accuracy!r} is not a number")
        loop = None if d["loop"] in (None, "none") else str(d["loop"])
        if loop is not None:
            from loopeval.core.spec import LoopSpec

            loop = str(LoopSpec.parse(loop))
        keys = [k for k in by_spec.get(loop, [])
                if all(d.get(name) is None or d[name] == k[i] for i, name in ((1, "operator"), (2, "beta")))]
        if len(keys) != 1:
            raise ValueError(f"loop {d['loop']!r}" + (" matches no placement" if not keys else
                             f" matches {len(keys)} placements; give 'operator' and 'beta'"))
        return keys[0], float(accuracy)

    out = {}
    for lineno, (key, accuracy) in read_jsonl(path, parse, what="results"):
        if key in out:
            raise ValueError(f"{path}:{lineno}: a second accuracy for placement {key[0] or 'unlooped'}")
        out[key] = accuracy
    return out


def correlate(rows: list[PlacementRow], accuracies: dict[tuple, float]) -> list[Correlation]:
    """Spearman rho between accuracy and each of PPL_T, PPL and KL (lower score, higher
    rank), over the placements that have an accuracy, as in paper D.1: "PPL_T ranks the
    17 placements in the same order as their benchmark mean (Spearman rho=0.90)"."""
    from scipy.stats import spearmanr

    matched = [r for r in rows if r.key in accuracies]
    if len(matched) < 3:
        raise ValueError(f"correlate: {len(matched)} placement(s) have an accuracy; Spearman's rho needs at least 3")
    acc = [accuracies[r.key] for r in matched]
    out = []
    for metric in RANK_BY:
        result = spearmanr(acc, [-getattr(r, metric) for r in matched])
        out.append(Correlation(metric, float(result.statistic), float(result.pvalue), len(matched)))
    return out
