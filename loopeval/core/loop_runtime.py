"""The hooks that execute a loop (:class:`LoopRuntime`, made by :func:`loopeval.core.loop.apply_loop`).

Exact cached decoding: every *call site* (a layer, or one of its blocks, at one of its
passes) that attends owns a cache slot. The first pass of layer ``j`` uses slot ``j``,
as in the unlooped model; extra passes use slots ``N, N+1, ...`` in execution order,
appended to the cache before they are first written. A re-applied layer or attention
block is handed a view of the cache whose ``layers`` list points its own index at its
call site's slot, so attention KV caches and the Gated DeltaNet recurrent and
convolution states of Qwen3.5 are kept per call site, whatever cache method the layer
calls. An MLP-only pass reads no cache and has no slot. A ``StaticCache`` (HF's
``cache_implementation="static"``) gets its extra slots the same way, as copies of the
static layers, so each is preallocated to ``max_cache_len`` like the model's own (a
copy of an already allocated layer keeps its fixed-address mark for ``torch.compile``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from loopeval.core.blocks import RUN_KIND
from loopeval.core.operators import window_outputs
from loopeval.core.spec import LoopConfig, Window


def _cache_of(kwargs: dict):
    return kwargs.get("cache", kwargs.get("past_key_values"))


def _with_cache(kwargs: dict, cache) -> dict:
    key = "past_key_values" if "past_key_values" in kwargs and "cache" not in kwargs else "cache"
    return {**kwargs, key: cache}


class LoopRuntime:
    """The hooks that execute a loop, and the per-forward state they share."""

    def __init__(self, model: nn.Module, layers: nn.ModuleList, config: LoopConfig):
        self.config = config
        self.layers = layers
        self.num_layers = len(layers)
        self.windows = [w for w in config.spec.windows if w.times > 1]
        self.sites = config.spec.call_sites(self.num_layers)
        self.num_slots = self.num_layers + sum(s.slot is not None and s.slot >= self.num_layers for s in self.sites)
        # slot_maps[w][t] maps each layer of window w to its slot at pass t (t >= 2).
        self.slot_maps = {w: {} for w in self.windows}
        for w in self.windows:
            for s in self.sites:
                if s.kind == w.kind and s.slot is not None and w.start <= s.layer < w.end and s.pass_index > 1:
                    self.slot_maps[w].setdefault(s.pass_index, {})[s.layer] = s.slot
        self.replaying = False
        self.passes = None  # loop_passes: every window's K for now (None: the spec's own)
        self.recording: list | None = None  # record_iterates: (window, iterates) per window per forward
        self.learned_mix: torch.Tensor | None = None  # set_learned_mix: a trained logit used instead of config.mix
        self.embedding: torch.Tensor | None = None  # mix_source "embedding": the input of layer 0 in this forward
        self.exit_gate: nn.Module | None = None  # loopeval.core.exit_gate.attach_gate: kept with the loop, not a submodule
        self.recorded: dict[int, dict] = {}  # layer -> kwargs of its first-pass call in this forward
        self.x0: dict[Window, torch.Tensor] = {}
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.handles = [decoder.register_forward_pre_hook(self._prepare_cache, with_kwargs=True)]
        looped_layers = sorted({j for w in self.windows for j in range(w.start, w.end)})
        if config.mix_source == "embedding" and self.windows:
            self.handles.append(layers[0].register_forward_pre_hook(self._embedding_recorder, with_kwargs=True))
        # the window that runs last in a forward (nested windows run before their enclosing one)
        self.last_window = max(self.windows, key=lambda w: (w.end, w.kind == "layer")) if self.windows else None
        for j in looped_layers:
            self.handles.append(layers[j].register_forward_pre_hook(self._recorder(j), with_kwargs=True))
        for j in range(self.num_layers):
            for w in config.spec.windows_ending_at(j):
                if w.times > 1:
                    self.handles.append(layers[j].register_forward_hook(self._looper(w), with_kwargs=True))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    # -- cache slots -----------------------------------------------------------------

    def _prepare_cache(self, module, args, kwargs):
        cache = _cache_of(kwargs)
        if cache is not None and len(cache.layers) < self.num_slots and cache.get_seq_length() > 0:
            raise ValueError(
                f"the cache already holds {cache.get_seq_length()} tokens from a forward without the loop "
                f"({len(cache.layers)} slots, the loop needs {self.num_slots}); start from an empty cache"
            )
        if cache is not None:
            self._ensure_slots(cache)

    def _ensure_slots(self, cache) -> None:
        """Append one fresh cache layer per extra call site that has a slot. Called while
        the layers it copies are still empty: before the first forward, or, for a cache
        the model creates itself, before the window's first layer runs."""
        if len(cache.layers) >= self.num_slots:
            return
        if getattr(cache, "layer_class_to_replicate", None) is not None:
            while len(cache.layers) < self.num_slots:
                cache.layers.append(cache.layer_class_to_replicate())
            return
        if len(cache.layers) != self.num_layers:
            raise ValueError(
                f"cache has {len(cache.layers)} layers; a looped model with {self.num_layers} layers "
                f"needs {self.num_layers} (fresh) or {self.num_slots}"
            )
        extra = [s for s in self.sites if s.slot is not None and s.slot >= self.num_layers]
        cache.layers.extend(copy.deepcopy(cache.layers[s.layer]) for s in sorted(extra, key=lambda s: s.slot))

    def _view(self, cache, slot_map: dict[int, int]):
        view = copy.copy(cache)
        view.layers = list(cache.layers)
        for layer, slot in slot_map.items():
            view.layers[layer] = cache.layers[slot]
        return view

    # -- hooks -----------------------------------------------------------------------

    def _embedding_recorder(self, module, args, kwargs):
        if not self.replaying:
            self.embedding = args[0] if args else kwargs["hidden_states"]

    def _recorder(self, j: int):
        starting = [w for w in self.windows if w.start == j]

        def hook(module, args, kwargs):
            if self.replaying:
                return None
            cache = _cache_of(kwargs)
            if cache is not None and starting:
                self._ensure_slots(cache)
            self.recorded[j] = kwargs
            for w in starting:
                self.x0[w] = args[0] if args else kwargs["hidden_states"]
            return None

        return hook

    def _looper(self, window: Window):
        run = RUN_KIND[window.kind]

        def g(h: torch.Tensor, t: int) -> torch.Tensor:
            for j in range(window.start, window.end):
                kwargs = dict(self.recorded[j])
                kwargs.pop("hidden_states", None)
                cache = _cache_of(kwargs)
                if cache is not None and window.kind != "mlp":
                    if t not in self.slot_maps[window]:
                        raise ValueError(f"loop_passes({t}) deepens window {window} past its own K, which has no "
                                         "cache slots; run that forward with use_cache=False")
                    kwargs = _with_cache(kwargs, self._view(cache, self.slot_maps[window][t]))
                h = run(self.layers[j], h, kwargs)
            return h

        def hook(module, args, kwargs, output):
            if self.replaying:
                return None
            y1 = output[0] if isinstance(output, tuple) else output
            config = self.config
            K = window.times if self.passes is None else self.passes
            iterates = [] if self.recording is not None else None
            self.replaying = True
            try:
                if K == 1:  # loop_disabled: the base model's output, untouched
                    self.x0.pop(window)
                    if iterates is not None:
                        self.recording.append((window, [y1]))
                    return None
                mix = self.learned_mix if self.learned_mix is not None else config.mix
                source = self.embedding if config.mix_source == "embedding" else None
                h = window_outputs(g, self.x0.pop(window), y1, times=(K,), operator=config.operator,
                                   betas=(config.beta,), mix=mix, mix_input=source, iterates=iterates)[(K, config.beta)]
                if iterates is not None:
                    self.recording.append((window, iterates))
            finally:
                self.replaying = False
                if window is self.last_window:
                    self.embedding = None
                if not any(w.kind == "layer" and w.start <= window.start and window.end <= w.end
                           for w in self.windows if w is not window):  # an enclosing window still needs them
                    for j in range(window.start, window.end):
                        self.recorded.pop(j, None)
            return (h, *output[1:]) if isinstance(output, tuple) else h

        return hook
