"""The gate-collapse monitor (paper 004, section 3.3 and Appendix B), torch-free: training
uses it step by step and the report reads it from manifests.

004: "The failure is a gate collapse: early in training the gate learns to exit after
the first loop, later iterations stop receiving gradient, and the model trains on as a
plain transformer. ... Notably, the language-modelling loss does not reveal the
collapse while it occurs, so the exit distribution must be monitored directly." Its
collapsed regime is "p_0 > 0.95". A collapse is reported when the first-step exit
probability stays above the threshold for more than ``patience`` consecutive steps.
"""

from __future__ import annotations

COLLAPSE_THRESHOLD = 0.95
"""004, Appendix B: "it keeps the gate out of the collapsed regime (p_0 > 0.95)"."""

COLLAPSE_PATIENCE = 50
"""Consecutive steps above the threshold before a warning; 004's sweep reads its peak
p_0 "after the first 50 steps", treating the first 50 as a start-up transient."""


def collapse_episodes(p0: list[float], *, threshold: float = COLLAPSE_THRESHOLD,
                      patience: int = COLLAPSE_PATIENCE) -> list[tuple[int, int]]:
    """``(first, last)`` 1-based steps of every run of consecutive steps with
    ``p0 > threshold`` longer than ``patience`` steps."""
    out, start = [], None
    for i, p in enumerate([*p0, float("-inf")]):
        if p > threshold and start is None:
            start = i
        elif not p > threshold and start is not None:
            if i - start > patience:
                out.append((start + 1, i))
            start = None
    return out


class CollapseMonitor:
    """Streams ``p_0`` per step; :meth:`update` returns a warning the first step an
    episode lasts more than ``patience`` steps (once per episode)."""

    def __init__(self, *, threshold: float = COLLAPSE_THRESHOLD, patience: int = COLLAPSE_PATIENCE):
        self.threshold, self.patience = threshold, patience
        self.run = 0

    def update(self, step: int, p0: float) -> str | None:
        self.run = self.run + 1 if p0 > self.threshold else 0
        if self.run == self.patience + 1:
            return (f"exit-gate collapse: the first-step exit probability p0 has stayed above {self.threshold:g} for "
                    f"{self.run} consecutive steps (step {step + 1 - self.run + 1} to {step + 1}, now {p0:.3f}); later "
                    "loop steps get almost no training signal (004, section 3.3: a larger --exit-beta or a learning-rate "
                    "warmup helps the gate recover)")
        return None


def collapse_notes(manifest: dict, name: str) -> list[str]:
    """The report's notes for one training manifest: each collapse episode in its
    recorded exit distribution (``exit.p``), under its own threshold and patience."""
    exit_record = manifest.get("exit") or {}
    p = exit_record.get("p")
    if not p:
        return []
    config = manifest.get("config", {})
    threshold = config.get("collapse_threshold", COLLAPSE_THRESHOLD)
    patience = config.get("collapse_patience", COLLAPSE_PATIENCE)
    episodes = collapse_episodes([row[0] for row in p], threshold=threshold, patience=patience)
    return [f"{name}: exit-gate collapse, p0 > {threshold:g} for steps {a}-{b} ({b - a + 1} steps; patience "
            f"{patience}); the loss curve does not show it (004, section 3.3)" for a, b in episodes]
