"""Running candidates on text: from their window's start (prefix reuse) or in full.

A window that starts at layer s sees the same hidden state at s as the unlooped model,
and its first pass over layers s..e-1 *is* the unlooped model's, so its output is the
unlooped hidden state at e. ``PrefixEngine`` therefore runs the unlooped layers once
per text batch and window end ``e`` (keeping the states at every start ``e - w`` and at
``e``), computes each window's remaining passes for all (K, beta) at once with
``loopeval.core.operators.window_outputs`` (shared iterates), and runs the outputs through the
remaining layers ``e..N-1`` stacked into batches of up to ``batch_tokens`` tokens.
Candidates that are not a single whole-layer window (an added MLP loop) run through
``apply_loop``'s hooks from their start. ``NaiveEngine`` runs every candidate as a full
forward of the looped model, for comparison.

Every engine yields, per text batch, the final (normed) hidden states of each
candidate; the search scores them. ``PassMeter`` counts the layer passes executed.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from loopeval.core.blocks import RUN_KIND
from loopeval.core.loop import apply_loop, decoder_layers, remove_loop
from loopeval.core.operators import window_outputs
from loopeval.tools.placement.grid import Candidate

_BLOCKS = ("mlp", "self_attn", "linear_attn")


class PassMeter:
    """Counts executed layer passes, in rows: a whole-layer call adds its batch rows, a
    block (attention or MLP) called on its own adds half of them (``PASS_CHARGE``).
    Divide by the rows of text for passes per text position. Loops applied while it
    is active are counted too (its layer-exit hook runs before theirs)."""

    def __init__(self, model: nn.Module):
        self.layers = decoder_layers(model)
        self.rows = 0.0
        self._inside = 0
        self._handles = []

    def __enter__(self) -> PassMeter:
        for layer in self.layers:
            self._handles.append(layer.register_forward_pre_hook(self._enter_layer, with_kwargs=True))
            self._handles.append(layer.register_forward_hook(self._leave_layer, prepend=True))
            for name in _BLOCKS:
                block = getattr(layer, name, None)
                if isinstance(block, nn.Module):
                    self._handles.append(block.register_forward_pre_hook(self._block, with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _enter_layer(self, module, args, kwargs):
        if self._inside == 0:
            self.rows += _rows(args, kwargs)
        self._inside += 1

    def _leave_layer(self, module, args, output):
        self._inside -= 1

    def _block(self, module, args, kwargs):
        if self._inside == 0:
            self.rows += 0.5 * _rows(args, kwargs)


def _rows(args, kwargs) -> int:
    return (args[0] if args else kwargs["hidden_states"]).shape[0]


def _decoder(model: nn.Module) -> nn.Module:
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


class Engine:
    """The unlooped forward every engine shares: final hidden states of a text batch."""

    def __init__(self, model: nn.Module, *, batch_tokens: int):
        self.model = model
        self.decoder = _decoder(model)
        self.layers = decoder_layers(model)
        self.num_layers = len(self.layers)
        self.batch_tokens = batch_tokens

    def unlooped(self, batch: int, ids: torch.Tensor) -> torch.Tensor:
        """The unlooped model's final hidden states of text batch ``batch`` (rows, L, d)."""
        return self.decoder(input_ids=ids, use_cache=False).last_hidden_state

    def round(self, batch: int, ids: torch.Tensor,
              candidates: list[Candidate]) -> Iterator[tuple[list[Candidate], torch.Tensor]]:
        """``(group, finals)`` pairs covering ``candidates`` on text batch ``batch`` (after
        its ``unlooped``): ``finals[i]`` holds ``group[i]``'s final hidden states."""
        raise NotImplementedError


class NaiveEngine(Engine):
    """Every candidate is a full forward of ``apply_loop``'s looped model."""

    def round(self, batch, ids, candidates):
        for c in candidates:
            apply_loop(self.model, c.loop())
            try:
                yield [c], self.decoder(input_ids=ids, use_cache=False).last_hidden_state[None]
            finally:
                remove_loop(self.model)


class PrefixEngine(Engine):
    """Candidates run from their window's start on the unlooped model's hidden states."""

    def __init__(self, model, *, batch_tokens):
        super().__init__(model, batch_tokens=batch_tokens)
        self.kwargs: list[dict] | None = None
        self.embedded: dict[int, torch.Tensor] = {}

    def capture(self, row: torch.Tensor) -> None:
        """Record every layer's keyword inputs (masks, rotary embeddings) on one row of
        text; with no padding mask they depend only on the sequence length and broadcast
        over any batch, so candidates can be stacked."""
        recorded = [None] * self.num_layers

        def recorder(j):
            def hook(module, args, kwargs):
                recorded[j] = {k: v for k, v in kwargs.items() if k != "hidden_states"}

            return hook

        handles = [layer.register_forward_pre_hook(recorder(j), with_kwargs=True) for j, layer in enumerate(self.layers)]
        try:
            self.decoder(input_ids=row, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        self.kwargs = recorded

    def unlooped(self, batch, ids):
        """Also keeps the batch's input to layer 0 (its embeddings), for ``round``."""

        def hook(module, args, kwargs):
            self.embedded[batch] = args[0] if args else kwargs["hidden_states"]

        handle = self.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
        try:
            return super().unlooped(batch, ids)
        finally:
            handle.remove()

    def _run(self, h: torch.Tensor, start: int, end: int) -> torch.Tensor:
        for j in range(start, end):
            h = RUN_KIND["layer"](self.layers[j], h, self.kwargs[j])
        return h

    def round(self, batch, ids, candidates):
        if self.kwargs is None:
            self.capture(ids[:1])
        h0 = self.embedded[batch]
        plain = [c for c in candidates if not c.mlp_loop]
        hooked = [c for c in candidates if c.mlp_loop]
        if plain:
            yield from self._windows(h0, plain)
        if hooked:
            yield from self._hooked(h0, hooked)

    def _prefix(self, h0: torch.Tensor, end: int, keep: set[int]) -> dict[int, torch.Tensor]:
        states = {0: h0} if 0 in keep else {}
        h = h0
        for j in range(end):
            h = self._run(h, j, j + 1)
            if j + 1 in keep:
                states[j + 1] = h
        return states

    def _windows(self, h0, candidates):
        ends = sorted({c.end for c in candidates})
        if len(ends) != 1:
            raise ValueError(f"a prefix round shares one window end; got ends {ends}")
        e = ends[0]
        widths = sorted({c.width for c in candidates})
        states = self._prefix(h0, e, {e - w for w in widths} | {e})
        for w in widths:
            group = [c for c in candidates if c.width == w]
            s = e - w
            outputs = window_outputs(lambda h, t: self._run(h, s, e), states[s], states[e],
                                     times={c.times for c in group}, operator=group[0].operator,
                                     betas=sorted({c.beta for c in group}))
            yield group, self._suffix([outputs[(c.times, c.beta)] for c in group], e)

    def _suffix(self, outputs: list[torch.Tensor], start: int) -> torch.Tensor:
        """Layers ``start..N-1`` and the final norm for each output, stacked into calls of
        at most ``batch_tokens`` tokens; returns (candidates, rows, L, d)."""
        rows, length = outputs[0].shape[:2]
        per_call = max(1, self.batch_tokens // (rows * length))
        finals = []
        for i in range(0, len(outputs), per_call):
            h = self._run(torch.cat(outputs[i:i + per_call]), start, self.num_layers)
            finals.append(self.decoder.norm(h).view(-1, rows, *h.shape[1:]))
        return torch.cat(finals)

    def _hooked(self, h0, candidates):
        starts = {c.start for c in candidates}
        states = self._prefix(h0, max(starts), starts)
        for c in candidates:
            apply_loop(self.model, c.loop())
            try:
                h = self._run(states[c.start], c.start, self.num_layers)
            finally:
                remove_loop(self.model)
            yield [c], self.decoder.norm(h)[None]
