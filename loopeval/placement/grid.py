"""The candidates of a placement search, and how many layer passes scoring them takes.

Paper D.1: "On Qwen3-8B we score all 2,016 single-window configurations by PPL_T,
covering every start, widths 2–8, K∈{2,3,4} and every anchor." With the defaults below
(damped operator, three anchors beta) that grid has 224 windows x 3 K x 3 beta = 2,016
configurations on 36 layers. "Adding one MLP loop inside the best windows gives G-best":
``mlp_loop_candidates`` adds "one MLP loop (K=3) at its first layer" (A.1) to a window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loopeval.loop import DEFAULT_OPERATOR, OPERATORS, LoopConfig, LoopSpec

DEFAULT_WIDTHS = tuple(range(2, 9))
DEFAULT_TIMES = (2, 3, 4)
DEFAULT_BETAS = (0.0, 0.25, 0.5)
MLP_LOOP_TIMES = 3
""""plus one MLP loop (K=3) at its first layer" (paper A.1)."""


@dataclass(frozen=True)
class Candidate:
    """One configuration: a window ``start:start+width`` run ``times`` times with
    ``operator`` and ``beta``, optionally with an MLP loop at its first layer. The
    unlooped model is ``Candidate()``."""

    start: int | None = None
    width: int | None = None
    times: int | None = None
    operator: str | None = None
    beta: float | None = None
    mlp_loop: bool = False

    @property
    def end(self) -> int | None:
        return None if self.start is None else self.start + self.width

    @property
    def spec(self) -> LoopSpec | None:
        if self.start is None:
            return None
        text = f"{self.start}:{self.end}x{self.times}"
        if self.mlp_loop:
            text += f"+{self.start}:{self.start + 1}x{MLP_LOOP_TIMES}/mlp"
        return LoopSpec.parse(text)

    @property
    def key(self) -> tuple:
        """What identifies a candidate in ``placements.jsonl``."""
        return (None if self.spec is None else str(self.spec), self.operator, self.beta)

    def loop(self) -> LoopConfig | None:
        return None if self.spec is None else LoopConfig(self.spec, self.operator, self.beta)


def build_grid(num_layers: int, *, widths=DEFAULT_WIDTHS, times=DEFAULT_TIMES, betas=DEFAULT_BETAS,
               operator: str = DEFAULT_OPERATOR, starts=None) -> list[Candidate]:
    """Every window of the grid that fits ``num_layers`` layers, ordered by window end,
    then width, K and beta. Raises ``ValueError`` for a bad option or an empty grid."""
    widths, times, betas = list(widths), list(times), list(betas)
    if operator not in OPERATORS:
        raise ValueError(f"operator {operator!r}: unknown; choose one of {', '.join(OPERATORS)}")
    for name, values in (("widths", widths), ("times", times), ("betas", betas)):
        if not values:
            raise ValueError(f"{name}: empty")
    if any(not isinstance(w, int) or w < 1 for w in widths):
        raise ValueError(f"widths {widths}: a window width is a whole number of layers >= 1")
    if any(not isinstance(k, int) or k < 2 for k in times):
        raise ValueError(f"times {times}: K must be >= 2 (K = 1 is the unlooped model, which is always the first row)")
    for b in betas:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or not 0.0 <= b <= 1.0:
            raise ValueError(f"betas {betas}: beta {b!r} must lie in [0, 1]")
    if operator == "repeat" and any(b != 0.0 for b in betas):
        raise ValueError(f"betas {betas}: only the 'damped' operator has an anchor beta; give --betas 0 with repeat")
    if starts is not None:
        starts = sorted(set(starts))
        bad = [s for s in starts if not isinstance(s, int) or not 0 <= s < num_layers]
        if bad:
            raise ValueError(f"starts {bad}: a window start is a layer index in 0..{num_layers - 1}")
    allowed = set(range(num_layers)) if starts is None else set(starts)
    grid = [
        Candidate(e - w, w, k, operator, float(b))
        for e in range(1, num_layers + 1)
        for w in sorted(set(widths))
        if e - w in allowed
        for k in sorted(set(times))
        for b in sorted(set(float(b) for b in betas))
    ]
    if not grid:
        raise ValueError(
            f"no window fits: widths {sorted(set(widths))}"
            + (f" at starts {starts}" if starts is not None else "")
            + f" on a {num_layers}-layer model (windows must end by layer {num_layers - 1})"
        )
    return grid


def mlp_loop_candidates(windows: list[Candidate]) -> list[Candidate]:
    """``windows`` with one added MLP-only loop at each window's first layer."""
    return [Candidate(c.start, c.width, c.times, c.operator, c.beta, mlp_loop=True) for c in windows if not c.mlp_loop]


def window_chain_passes(width: int, times, operator: str) -> int:
    """Layer passes that compute a window's outputs for every K in ``times`` once its first
    pass is known: ``repeat`` shares one chain, ``damped`` runs one chain per K."""
    times = set(times)
    return width * (max(times) - 1) if operator == "repeat" else width * sum(k - 1 for k in times)


def rounds(candidates: list[Candidate], max_candidates: int | None = None) -> list[list[Candidate]]:
    """The search's units of work, in order. Whole-layer windows sharing their end form a
    round (they share the prefix); MLP-loop candidates follow. A round holds at most
    ``max_candidates`` candidates (each keeps its validation hidden states until its
    temperature is fitted), but never splits a window's (K, beta) outputs."""
    cap = max_candidates or len(candidates) or 1
    plain = [c for c in candidates if c.start is not None and not c.mlp_loop]
    out = []
    for e in sorted({c.end for c in plain}):
        current = []
        for w in sorted({c.width for c in plain if c.end == e}):
            window = [c for c in plain if c.end == e and c.width == w]
            if current and len(current) + len(window) > cap:
                out.append(current)
                current = []
            current += window
        out.append(current)
    hooked = [c for c in candidates if c.start is not None and c.mlp_loop]
    out += [hooked[i:i + cap] for i in range(0, len(hooked), cap)]
    return out


def planned_passes(candidates: list[Candidate], num_layers: int, *, reuse: bool = True, text_rows: int = 1,
                   max_candidates: int | None = None) -> float:
    """Layer passes per text position that scoring ``candidates`` (the unlooped model
    excluded; it is always scored) executes; ``text_rows`` is the number of rows of text
    and ``max_candidates`` the round size of ``rounds``.

    Naive (``reuse=False``): every candidate is a full forward of the looped model,
    ``N + m``, after the unlooped model's ``N``.

    Prefix reuse: the unlooped forward ``N``, plus ``N / text_rows`` for capturing the
    layers' inputs on one row; then, per round of windows ending at ``e``, the unlooped
    prefix ``e`` (it yields the hidden state at every start and, at ``e``, every
    window's first pass), and per window its chain (``window_chain_passes``) and one
    suffix ``N - e`` per output (K, beta); per round of MLP-loop candidates, which run
    through ``apply_loop``'s hooks, the prefix to the round's largest start and
    ``(N - s) + m`` each.
    """
    n = num_layers
    looped = [c for c in candidates if c.start is not None]
    if not reuse:
        return float(n + sum(n + c.spec.extra_passes for c in looped))
    total = n + n / text_rows
    for group in rounds(looped, max_candidates):
        if group[0].mlp_loop:
            total += max(c.start for c in group) + sum((n - c.start) + c.spec.extra_passes for c in group)
            continue
        e = group[0].end
        total += e
        for w in sorted({c.width for c in group}):
            window = [c for c in group if c.width == w]
            total += window_chain_passes(w, {c.times for c in window}, window[0].operator) + len(window) * (n - e)
    return float(total)
