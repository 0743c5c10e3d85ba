"""The loop's operators: a window's output from its passes, one implementation for the
HF hooks (:mod:`loopeval.core.loop_runtime`), placement's shared iterates and the vLLM engine.

Operators (``g`` is the window applied once, ``K`` its total number of passes,
``x0`` the window's input; pass 1 is always the model's own pass through the whole
layers, and a sub-layer window's ``g`` at passes ``t >= 2`` is its chain of blocks):

* ``repeat``: ``h <- g(h)``, ``K`` times.
* ``damped`` (paper A.1): ``F(x) = x + (g(x) - x) / K`` and the output is
  ``beta * g(x0) + (1 - beta) * F^K(x0)``.
* ``mix`` (input mixing, "Closing the Loop"): before every pass ``t >= 2`` the input
  of ``g`` is ``w * s + (1 - w) * h`` with ``w = sigmoid(mix)``, where ``h`` is the
  current iterate and ``s`` the mixing source: the window's input ``x0``
  (``mix_source="window"``) or the token embedding ``e``, the input of layer 0
  (``"embedding"``, 004's Eq. 1: "z_t = w e + (1 - w) h_{t-1}, w = sigma(a)"). For a
  window starting at layer 0 the two are the same tensor. It combines with either operator.
"""

from __future__ import annotations

import math

import torch


def mix_weight(mix):
    """``w = sigmoid(mix)``, the weight of the mixing source in the input of passes ``t >= 2``;
    a float for a stored logit, a tensor (with its gradient) for a learned one."""
    if mix is None:
        return None
    return torch.sigmoid(mix) if isinstance(mix, torch.Tensor) else 1.0 / (1.0 + math.exp(-mix))


def window_outputs(g, x0: torch.Tensor, y1: torch.Tensor, *, times, operator: str = "repeat", betas=(0.0,),
                   mix=None, mix_input: torch.Tensor | None = None,
                   iterates: list | None = None) -> dict[tuple[int, float], torch.Tensor]:
    """A window's output for every ``K`` in ``times`` (and, ``damped``, every ``beta`` in
    ``betas``), keyed ``(K, beta)``; ``repeat`` keys use ``beta = 0.0``.

    ``g(h, t)`` applies the window's pass ``t >= 2`` to ``h``; ``x0`` is the window's
    input and ``y1`` its first-pass output. ``mix`` (a logit, float or tensor) mixes
    ``mix_input`` (default ``x0``) into the input of every pass ``t >= 2``. Iterates are
    shared where the operator allows: ``repeat`` runs one chain to the largest ``K`` and
    reads every smaller ``K`` off it (``max(times) - 1`` calls of ``g``); ``damped`` runs
    one chain per ``K`` (its step ``1/K`` differs) and reads every ``beta`` off it
    (``sum(K - 1)`` calls). ``iterates`` (``repeat`` only) receives the output after
    every pass ``1..max(times)``.
    """
    w = mix_weight(mix)
    source = x0 if mix_input is None else mix_input

    def mixed(h):
        return h if w is None else w * source + (1.0 - w) * h

    times = sorted(set(int(k) for k in times))
    out = {}
    if operator == "repeat":
        h = y1
        for t in range(1, times[-1] + 1):
            if t > 1:
                h = g(mixed(h), t)
            if iterates is not None:
                iterates.append(h)
            if t in times:
                out[(t, 0.0)] = h
        return out
    if iterates is not None:
        raise ValueError("window_outputs: the damped operator's passes are not its outputs at smaller K; "
                         "per-pass iterates exist for the repeat operator only")
    for K in times:
        f = x0 + (y1 - x0) / K
        for t in range(2, K + 1):
            f = f + (g(mixed(f), t) - f) / K
        for beta in betas:
            out[(K, float(beta))] = beta * y1 + (1.0 - beta) * f
    return out
