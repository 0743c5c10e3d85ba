"""What a task's metric is: its unit, and the size of the test set it is computed on.

One registry for loopeval's own tasks (``tasks/``): the continuous metrics with their
units (:data:`OWN_UNITS`) and each task's full test set (:data:`TEST_SET_SIZES`; the identity
of its items where known, :data:`TEST_SET_ITEMS`). Any other
lm-eval metric is read by content: per-item scores that are all fractions in [0, 1] (a 0/1
accuracy, or its mean over repeats) are shown in percentage points; anything else keeps
its own unit, named after the metric. The direction is lm-eval's ``higher_is_better``.

A comparison never averages two units into one macro, and only a fraction has a default
equivalence margin (A.5: "Equivalence means a 90% interval within ±2 points"); a
continuous metric is shown equivalent only within a margin given in its own unit.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Unit:
    """How a metric's values read: ``name`` as shown ("points", "nats per byte"), ``scale``
    from the stored value to the shown one (100 for a fraction shown in points), ``digits``
    shown, and whether values are ``fraction``s in [0, 1] (margins then fractions too)."""

    name: str
    scale: float = 1.0
    digits: int = 4
    fraction: bool = False

    def show(self, x: float | None, *, signed: bool = False, digits: int | None = None) -> str:
        """``x`` (a stored value) as shown, the one formatter of every table, report and
        message: ``POINTS.show(0.041, signed=True) == '+4.1'``; ``digits`` overrides the
        unit's (``POINTS.show(0.9, digits=0) == '90'``); ``'–'`` for None."""
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return "–"
        digits = self.digits if digits is None else digits
        value = round(self.scale * x, digits) + 0.0  # + 0.0 turns -0.0 into 0.0
        return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"

    def amount(self, x: float, *, signed: bool = False) -> str:
        """``x`` with the unit's name: ``'2.0 points'``, ``'0.0050 nats per byte'``."""
        return f"{self.show(x, signed=signed)} {self.name}"

    def check_margin(self, name: str, value) -> float:
        """A margin (or a difference to detect) in this unit, the one check of every such amount
        (a study's ``statistics.margin``/``margins``, ``--margin``, ``--delta``, the library's
        ``margin``): a fraction in (0, 1) for a fraction, else any positive number."""
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        if ok and (not self.fraction or value < 1):
            return float(value)
        hint = f" (fractions, not points: {value:g} points is {value / 100:g})" if self.fraction and ok else ""
        want = "a fraction in (0, 1)" if self.fraction else f"a positive number in {self.name}"
        raise ValueError(f"{name}={value!r}: expected {want}{hint}")


POINTS = Unit("points", scale=100.0, digits=1, fraction=True)
"""A 0/1 accuracy (or a mean of 0/1 scores): stored as a fraction, shown in points."""

OWN_UNITS: dict[str, Unit] = {
    "nll_per_byte": Unit("nats per byte", digits=4),  # gsm8k_nll: -log p(solution) / UTF-8 bytes
    "loglikelihood": Unit("nats", digits=2),  # gsm8k_nll: log p(solution), summed over its tokens
    "solution_bytes": Unit("bytes", digits=1),
}
"""The continuous metrics of loopeval's own tasks, by lm-eval metric name."""

TEST_SET_SIZES: dict[str, int] = {
    **dict.fromkeys(("gsm8k_boxed", "gsm8k_boxed_think", "gsm8k_nll"), 1319),  # openai/gsm8k main test
    **dict.fromkeys(("math500_boxed", "math500_boxed_think"), 500),
    **dict.fromkeys(("aime24_boxed", "aime24_boxed_think", "aime25_boxed", "aime25_boxed_think"), 30),
    **dict.fromkeys(("gpqa_diamond_boxed", "gpqa_diamond_boxed_think"), 198),
    "mmlu_pro_2k": 2000,  # the fixed subset of tasks/utils.py
    "arc_challenge_letter": 1172,  # ARC-Challenge test
    "commonsenseqa_letter": 1221,  # CommonsenseQA validation
}
"""Items in the full test set of each of loopeval's tasks: a run over fewer (a local file
holding a subset, or ``--limit``) is a pilot of that many."""

TEST_SET_ITEMS: dict[str, tuple[tuple[str, ...], str]] = dict.fromkeys(
    ("gsm8k_boxed", "gsm8k_boxed_think", "gsm8k_nll"), (("question", "answer"), "gsm8k_test_items.txt"))
"""Where the identity of a task's test items is known: the doc fields that make an item (the
first identifies it, the rest are its gold) and the shipped file (``test_items/``, written by
``benchmarks/make_test_items.py``) of two :func:`item_hash` per item of the full test set: of
its first field, and of all its fields (:func:`item_key`)."""


def item_hash(text: str) -> str:
    """An item's short identity: the first 12 hex digits of the SHA-256 of its UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def item_key(doc, fields: tuple[str, ...]) -> str | None:
    """The :func:`item_hash` of ``doc``'s ``fields`` (joined by a NUL), ``None`` when one is not text."""
    values = [doc.get(f) for f in fields] if isinstance(doc, dict) else [None]
    return item_hash("\0".join(values)) if all(isinstance(v, str) for v in values) else None


@functools.cache
def test_items(task: str) -> tuple[tuple[str, ...], frozenset[str], frozenset[str]] | None:
    """``(doc fields, hashes of the first field, hashes of all fields)`` of ``task``'s full test
    set (:data:`TEST_SET_ITEMS`), ``None`` where unknown."""
    if task not in TEST_SET_ITEMS:
        return None
    fields, name = TEST_SET_ITEMS[task]
    rows = (Path(__file__).parent / "test_items" / name).read_text(encoding="ascii").splitlines()
    pairs = [row.split() for row in rows]
    return fields, frozenset(p[0] for p in pairs), frozenset(p[1] for p in pairs)


@dataclass(frozen=True)
class ItemCheck:
    """A task's docs against its full test set, by content (:func:`check_items`): positions of
    docs whose identifying field is no test item (``outside``), whose identifying field is one
    but whose gold differs (``edited``), that repeat an earlier doc's item (``duplicates``,
    each with the position it repeats), and how many test items no doc holds (``missing``)."""

    fields: tuple[str, ...]
    outside: tuple[int, ...]
    edited: tuple[int, ...]
    duplicates: tuple[tuple[int, int], ...]
    missing: int

    @property
    def not_benchmark(self) -> tuple[int, ...]:
        """Positions of docs that are not items of the test set as it is."""
        return tuple(sorted(self.outside + self.edited))

    def describe(self, name=lambda i: f"item {i}") -> str:
        """What differs from the test set, ``name`` naming a position (e.g. by its doc_id)."""
        parts = []
        if self.outside:
            parts.append(f"{len(self.outside)} item(s) not in the test set (their {self.fields[0]!r} is none of its "
                         f"items', e.g. {name(self.outside[0])})")
        if self.edited:
            parts.append(f"{len(self.edited)} item(s) with a test item's {self.fields[0]!r} but another "
                         f"{'/'.join(self.fields[1:])!r} than the test set's (e.g. {name(self.edited[0])})")
        if self.duplicates:
            i, j = self.duplicates[0]
            parts.append(f"{len(self.duplicates)} duplicated item(s) ({name(i)} repeats {name(j)})")
        if self.missing:
            parts.append(f"{self.missing} test item(s) missing")
        return "; ".join(parts)


def check_items(task: str, docs) -> ItemCheck | None:
    """``docs`` (lm-eval docs of ``task``) against its full test set (:func:`test_items`), by
    content; ``None`` where the test set's items are not known."""
    known = test_items(task)
    if known is None:
        return None
    fields, questions, items = known
    outside, edited, duplicates, first = [], [], [], {}
    for i, doc in enumerate(docs):
        key = item_key(doc, fields)
        if key is not None and key in first:
            duplicates.append((i, first[key]))
            continue
        if key is not None:
            first[key] = i
        if key in items:
            continue
        (edited if key is not None and item_key(doc, fields[:1]) in questions else outside).append(i)
    found = sum(1 for key in first if key in items)
    return ItemCheck(fields, tuple(outside), tuple(edited), tuple(duplicates), len(items) - found)


FRACTION_METRICS = frozenset({"acc", "acc_norm", "exact_match", "boxed"})
"""lm-eval's and loopeval's 0/1 metrics (means of 0/1 scores): fractions, shown in points."""


def declared_unit(metric: str) -> Unit | None:
    """The unit of lm-eval metric ``metric`` known before any score is read: loopeval's
    registry, points for a 0/1 metric (:data:`FRACTION_METRICS`); ``None`` where only the
    scores tell (:func:`unit_of`)."""
    name = metric.split(",", 1)[0]
    return OWN_UNITS.get(name) or (POINTS if name in FRACTION_METRICS else None)


def unit_of(metric: str, scores) -> Unit:
    """The unit of lm-eval metric ``metric`` ("name" or "name,filter") given its per-item
    ``scores``: loopeval's registry, else points for fractions in [0, 1], else the metric's own."""
    name = metric.split(",", 1)[0]
    if name in OWN_UNITS:
        return OWN_UNITS[name]
    values = np.asarray(scores, dtype=float)
    if values.size and np.all((values >= 0) & (values <= 1)):
        return POINTS
    return Unit(name)


def full_size(task: str, n_original: int) -> int:
    """Items of ``task``'s full test set: the registry's count for loopeval's tasks, else
    what lm-eval found (``n_original``: all a local file or dataset held)."""
    return max(TEST_SET_SIZES.get(task, 0), n_original)
