"""Looping a trained Hugging Face decoder: ``LoopSpec`` and ``apply_loop``.

A loop re-applies windows of consecutive decoder layers with shared weights. The model
is looped in place with forward hooks, so its module tree, ``parameters()``,
``state_dict()`` and ``config`` stay those of the base model, and HF ``forward`` and
``generate()`` work unchanged.

A window re-applies whole layers, or only their attention blocks (``/attn``) or only
their MLP blocks (``/mlp``): sub-layer call sites.

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

import copy
import dataclasses
import math
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from loopeval.core.spec import LOOP_CONFIG_NAME, LOOP_OPTIONS, LoopConfig, LoopSpec, Window, read_loop_config


def check_source(path: str | Path, *, revision: str | None = None, trust_remote_code: bool = False,
                 gguf_file: str | None = None) -> None:
    """Refuse, before any weights load, a checkpoint that is neither a local folder nor a hub
    model whose config can be read. A path that looks local is named as a missing folder,
    not as a malformed hub id. With ``gguf_file`` (a GGUF file inside the folder, as
    transformers' ``from_pretrained(path, gguf_file=...)`` takes it) a local folder must
    hold that file, it must be GGUF, and a ``config.json`` beside it must describe its model
    (:func:`loopeval.core.gguf.check_gguf_folder`)."""
    text = str(path)
    if Path(text).is_dir():
        if gguf_file is not None:
            from loopeval.core.gguf import check_gguf_folder

            check_gguf_folder(text, gguf_file)
        return
    if text.startswith((".", "/", "~")) or text.count("/") != 1 or "\\" in text:
        raise ValueError(f"{text}: no such local folder (a hub id has the form org/name)")
    from transformers import AutoConfig

    kwargs = {k: v for k, v in (("revision", revision), ("gguf_file", gguf_file)) if v is not None}
    try:
        AutoConfig.from_pretrained(text, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{text}: neither a local folder nor a hub model whose config can be read ({first})") from None


def resolve_loop(source, loop: str | LoopSpec | LoopConfig | None = None, *, arg_prefix: str = "", revision: str | None = None,
                 trust_remote_code: bool = False, gguf_file: str | None = None,
                 **options) -> LoopConfig | None:
    """The loop to apply to ``source``: a checkpoint path or hub id, a model, or a model config.

    The one rule for every entry point (``load_model``, lm-eval's ``looped``, training,
    ``check-cache``, ``place``): a path or hub id must exist (:func:`check_source`); a
    source that already has a loop (``loop_config.json``, or an applied loop) keeps it,
    and giving ``loop`` as well is an error; otherwise ``loop`` with its options is the
    loop, checked against the source's layer count. Nothing but the config is read, so
    a bad spec fails before any weights load. Option names in errors carry
    ``arg_prefix`` (lm-eval's args are ``loop_operator`` ...). ``options`` are the loop
    options (:data:`loopeval.core.spec.LOOP_OPTIONS`; ``None`` means not given). ``gguf_file``:
    the source is that GGUF file in the folder ``source`` (its config is read from the file).
    """
    if isinstance(source, (str, Path)):
        check_source(source, revision=revision, trust_remote_code=trust_remote_code, gguf_file=gguf_file)
    unknown = sorted(set(options) - set(LOOP_OPTIONS))
    if unknown:
        raise ValueError(f"unknown loop option(s) {', '.join(arg_prefix + k for k in unknown)}")
    if loop is None:
        given = [f"{arg_prefix}{k}" for k, v in options.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} given without loop=")
    if isinstance(source, nn.Module):
        stored = loop_config(source)
    elif isinstance(source, (str, Path)) and Path(source).is_dir():
        stored = read_loop_config(source)
    else:
        stored = None
    if loop is None:
        if stored is not None and isinstance(source, (str, Path)):
            try:  # a stored loop_config.json is checked against the config before any weights load too
                layers = count_layers(source, revision=revision, trust_remote_code=trust_remote_code)
            except (OSError, ValueError):
                layers = None  # no readable config: the loaded model is checked when the loop is applied
            if layers is not None:
                try:
                    stored.validate(layers)
                except ValueError as exc:
                    raise ValueError(f"{Path(source) / LOOP_CONFIG_NAME}: {exc}") from None
        return stored
    if stored is not None:
        raise ValueError(
            f"{source if not isinstance(source, nn.Module) else 'the model'} already has the loop {stored.spec} "
            f"({LOOP_CONFIG_NAME}); drop loop={loop!s} or load the base checkpoint"
        )
    if isinstance(loop, LoopConfig):
        given = [f"{arg_prefix}{k}" for k, v in options.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} given beside a whole LoopConfig; put them inside it")
        wanted = loop
    else:
        wanted = LoopConfig.from_options(loop, **options)
    return wanted.validate(count_layers(source, revision=revision, trust_remote_code=trust_remote_code,
                                        gguf_file=gguf_file))


def count_layers(source, **config_kwargs) -> int:
    """The decoder layer count of a model, a model config, or a checkpoint path or hub id
    (whose config alone is read)."""
    if isinstance(source, nn.Module):
        return len(decoder_layers(source))
    if isinstance(source, (str, Path)):
        from transformers import AutoConfig

        kwargs = {k: v for k, v in config_kwargs.items() if v is not None}
        source = AutoConfig.from_pretrained(source, **kwargs)
    text = source.get_text_config(decoder=True) if hasattr(source, "get_text_config") else source
    return int(text.num_hidden_layers)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder's layer list (``model.model.layers`` or the text decoder's layers)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(
            f"unsupported architecture {type(model).__name__}: loopeval loops decoders whose layers "
            "are an nn.ModuleList at model.model.layers (Llama, Qwen2/3, Mistral, Qwen3.5, Qwen3-Next, Gemma 3)"
        )
    return layers


def apply_loop(model: nn.Module, loop: str | LoopSpec | LoopConfig, **options):
    """Loop ``model`` in place and return it. No parameters are added or copied.

    ``loop`` is a spec with the loop ``options`` (``operator``, ``beta``, ``mix``,
    ``mix_source``: :class:`LoopConfig`'s fields, defaults there) or a whole
    :class:`LoopConfig`. Raises ``ValueError`` for a malformed spec, bad options, an
    unsupported architecture or an already looped model, before anything is changed.
    """
    if isinstance(loop, LoopConfig):
        if any(v is not None for v in options.values()):
            raise ValueError("apply_loop: give the operator options inside the LoopConfig, not beside it")
        config = loop
    else:
        config = LoopConfig.from_options(loop, **options)
    layers = decoder_layers(model)
    config.validate(len(layers))
    check_sub_layer_support(layers, config.spec)
    if getattr(model, "_loopeval", None) is not None:
        raise ValueError(
            f"model is already looped with {model._loopeval.config.spec}; call loopeval.remove_loop(model) first"
        )
    model._loopeval = _LoopRuntime(model, layers, config)
    return model


def remove_loop(model: nn.Module) -> nn.Module:
    """Undo ``apply_loop``; the model is the unlooped base model again."""
    runtime = getattr(model, "_loopeval", None)
    if runtime is not None:
        runtime.remove()
        model._loopeval = None
    return model


def loop_config(model: nn.Module) -> LoopConfig | None:
    """The loop applied to ``model``, or ``None``; a mix logit being learned
    (:func:`set_learned_mix`) appears with its current value."""
    runtime = getattr(model, "_loopeval", None)
    if runtime is None:
        return None
    if runtime.learned_mix is not None:
        return dataclasses.replace(runtime.config, mix=float(runtime.learned_mix.detach()))
    return runtime.config


# -- the depth of one forward (training: the curriculum, random depth, a teacher) ------


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


# -- the operators ------------------------------------------------------------------


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


# -- sub-layer blocks ----------------------------------------------------------------

PRE_NORM_LAYERS = frozenset({
    "LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen2MoeDecoderLayer", "Qwen3DecoderLayer",
    "Qwen3MoeDecoderLayer", "Qwen3_5DecoderLayer", "Qwen3_5MoeDecoderLayer", "Qwen3NextDecoderLayer",
})
"""Decoder layers whose forward is exactly ``h = h + mixer(input_layernorm(h))`` then
``h = h + mlp(post_attention_layernorm(h))``, the mixer being ``self_attn`` or, on Gated
DeltaNet layers (``block_type == "linear_attention"``), ``linear_attn`` (transformers
5.24). Only these can run their blocks alone."""


def check_sub_layer_support(layers: nn.ModuleList, spec: LoopSpec) -> None:
    """Raise ``ValueError`` if ``spec`` has a sub-layer window over a layer whose blocks
    loopeval cannot call separately."""
    for w in spec.windows:
        if w.kind == "layer":
            continue
        for j in range(w.start, w.end):
            name = type(layers[j]).__name__
            if name not in PRE_NORM_LAYERS:
                raise ValueError(
                    f"loop spec {str(spec)!r}: window {w} re-applies only the {w.kind} block of layer {j}, a {name}; "
                    f"loopeval can run the blocks of {', '.join(sorted(PRE_NORM_LAYERS))} alone, not of {name}"
                )


def attention_block(layer: nn.Module, h: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """``h + mixer(input_layernorm(h))``, called as the layer's own forward calls it."""
    x = layer.input_layernorm(h)
    if getattr(layer, "block_type", None) == "linear_attention":
        rest = {k: v for k, v in kwargs.items() if k not in ("position_embeddings", "position_ids")}
        return h + layer.linear_attn(hidden_states=x, **rest)
    return h + layer.self_attn(hidden_states=x, **kwargs)[0]


def mlp_block(layer: nn.Module, h: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """``h + mlp(post_attention_layernorm(h))`` (an MoE block's router logits dropped)."""
    out = layer.mlp(layer.post_attention_layernorm(h))
    return h + (out[0] if isinstance(out, tuple) else out)


def whole_layer(layer: nn.Module, h: torch.Tensor, kwargs: dict) -> torch.Tensor:
    out = layer(h, **kwargs)
    return out[0] if isinstance(out, tuple) else out


RUN_KIND = {"layer": whole_layer, "attn": attention_block, "mlp": mlp_block}
"""How a call site of each kind runs: ``RUN_KIND[kind](layer, h, kwargs)``, where
``kwargs`` are the layer call's keyword arguments without ``hidden_states``."""


# -- the runtime ---------------------------------------------------------------------


def _cache_of(kwargs: dict):
    return kwargs.get("cache", kwargs.get("past_key_values"))


def _with_cache(kwargs: dict, cache) -> dict:
    key = "past_key_values" if "past_key_values" in kwargs and "cache" not in kwargs else "cache"
    return {**kwargs, key: cache}


class _LoopRuntime:
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
