"""What a looped model does in the forwards of a block, for training: its depth
(:func:`loop_passes`, :func:`loop_disabled`), hooks paused for layers called by hand,
per-pass outputs recorded, and a learned mix logit.

Each takes the looped model or a wrapper whose attribute lookups reach it (a PEFT model)
and acts on the loop's runtime (:class:`loopeval.core.loop_runtime.LoopRuntime`).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch
from torch import nn

from loopeval.core.spec import LoopConfig


@contextmanager
def loop_passes(model: nn.Module, passes: int):
    """Run every window of ``model``'s loop ``passes`` times in total for the forwards
    inside the block, then restore the loop's own depth.

    ``passes=1`` computes the unlooped base model exactly (:func:`loop_disabled`); an
    unlooped model accepts only 1. A window's extra call sites own cache slots only up
    to its own ``K``, so a deeper forward must run with ``use_cache=False``. Windows
    written with ``K = 1`` carry no hooks and cannot be deepened. ``model`` is the looped
    model or a wrapper whose attribute lookups reach it (a PEFT model).
    """
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"loop_passes: passes must be an integer >= 1, got {passes!r}")
    runtime = getattr(model, "_loopeval", None)
    if runtime is None:
        if passes != 1:
            raise ValueError(f"loop_passes({passes}): the model has no loop")
        yield model
        return
    flat = [w for w in runtime.config.spec.windows if w.times == 1]
    if flat and passes != 1:
        raise ValueError(f"loop_passes({passes}): window {flat[0]} has K = 1 and no hooks; loop it (K >= 2) to vary its depth")
    previous, runtime.passes = runtime.passes, passes
    try:
        yield model
    finally:
        runtime.passes = previous


def loop_disabled(model: nn.Module):
    """The base model for the forwards inside the block: ``loop_passes(model, 1)``."""
    return loop_passes(model, 1)


@contextmanager
def loop_hooks_paused(model: nn.Module):
    """Layers called by hand inside the block (outside a decoder forward, on hidden states
    kept from one) run as the base model's layers: the loop's hooks do nothing. For
    running the unlooped rest of a forward from a kept state (``loopeval.training.joint``)."""
    runtime = getattr(model, "_loopeval", None)
    if runtime is None:
        yield model
        return
    previous, runtime.replaying = runtime.replaying, True
    try:
        yield model
    finally:
        runtime.replaying = previous


@contextmanager
def record_iterates(model: nn.Module):
    """Record, for the forwards inside the block, every window's output after each of
    its passes: yields a list that gets one ``(window, [h_1, ..., h_K])`` entry per
    window per forward, in execution order (``h_1`` is the first-pass output, ``h_K``
    the window's output). ``repeat`` loops only (a ``damped`` pass is not an output).
    A window run once (:func:`loop_disabled`) records ``[h_1]``. ``model`` is the looped
    model or a wrapper whose attribute lookups reach it."""
    runtime = getattr(model, "_loopeval", None)
    if runtime is None:
        raise ValueError("record_iterates: the model has no loop")
    if runtime.config.operator != "repeat":
        raise ValueError(f"record_iterates: loop operator {runtime.config.operator!r}: per-pass outputs exist for "
                         "the repeat operator only")
    if runtime.recording is not None:
        raise ValueError("record_iterates: already recording this model")
    runtime.recording = []
    try:
        yield runtime.recording
    finally:
        runtime.recording = None


def set_learned_mix(model: nn.Module, logit: torch.Tensor | None) -> None:
    """Use the tensor ``logit`` (e.g. an ``nn.Parameter`` being trained) as the loop's mix
    logit instead of the stored float, or go back to the stored float (``None``). The
    model's own parameters are unchanged: the logit lives wherever the caller keeps it."""
    runtime = getattr(model, "_loopeval", None)
    if runtime is None:
        raise ValueError("set_learned_mix: the model has no loop")
    if logit is not None and runtime.config.mix is None:
        raise ValueError("set_learned_mix: the loop has no mix; give the loop a mix logit (its initial value) first")
    runtime.learned_mix = logit


def store_mix(model: nn.Module, value: float) -> LoopConfig:
    """Make ``value`` the loop's stored mix logit (what ``save_model`` writes) and stop
    using any learned tensor; returns the new config."""
    runtime = getattr(model, "_loopeval", None)
    if runtime is None:
        raise ValueError("store_mix: the model has no loop")
    runtime.config = dataclasses.replace(runtime.config, mix=float(value))
    runtime.learned_mix = None
    return runtime.config
