"""What a loop costs per token: layer passes, forward FLOPs and cache memory (paper A.2).

The paper charges a loop its layer passes, c = (N + m) / N: "We charge the loop its
layer passes, (N+m)/N, which matches the measured slowdown of memory-bound decoding."
A sub-layer call site (an attention-only or MLP-only pass) is charged half a layer pass
(``loopeval.core.spec.PASS_CHARGE``), so the paper's searched Qwen3.5 span ``0:8x2+0:1x3/mlp``
costs 32 -> 41 passes. FLOPs refine that with the usual dense accounting: a forward
pass costs 2 FLOPs per parameter it multiplies by (each call site's parameters, plus the
LM head; embedding look-ups are free), plus the attention term, which depends on the
context length T. A layer's parameters split into its attention block (input norm and
token mixer) and its MLP block (post-attention norm and MLP); a sub-layer call site
counts only its block. A mixture-of-experts MLP multiplies by its *active* parameters:
the router, the ``num_experts_per_tok`` routed experts and the shared expert, not every
expert. The attention term is

* softmax attention: 4 * T' * (heads * head_dim) per call site (Q·K and A·V), with
  T' = T for full attention and min(T, window) for sliding-window layers;
* Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention): a constant
  6 * v_heads * k_dim * v_dim per call site (read, update and query the d_k x d_v
  state of each value head), independent of T.

Extra passes add KV cache per token (attention call sites, whole-layer or
attention-only) and recurrent plus convolution state per sequence (Gated DeltaNet call
sites); an MLP-only pass adds no cache. A sliding-window call site (Gemma 3's local
layers, Mistral, Qwen's sliding layers) holds at most ``window`` tokens of KV, so its
cache stops growing at its window: :meth:`LoopCost.kv_bytes` counts ``min(T, window)``
tokens for it, ``kv_bytes_per_token`` is the growth while every window is still
filling and ``kv_bytes_per_token_past_window`` the growth once all have filled (full
attention only). Bytes per element are the model's dtype's (a config's ``dtype``,
float32 when it names none), unless given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from loopeval.core.blocks import check_sub_layer_support
from loopeval.core.loop import decoder_layers
from loopeval.core.spec import charged_passes, CallSite, LoopSpec


@dataclass(frozen=True)
class _LayerCost:
    attn_params: int  # input norm + token mixer
    mlp_params: int  # post-attention norm + MLP, active per token
    attn_full: float  # FLOPs per unit of context length
    attn_sliding: float  # FLOPs per unit of min(context, window)
    window: int
    attn_const: float  # context-independent attention FLOPs (linear attention)
    kv_elems_per_token: int
    state_elems: int

    def flops(self, kind: str, t: np.ndarray) -> np.ndarray:
        """Forward FLOPs of one call site of ``kind`` at context lengths ``t``."""
        mlp = 2.0 * self.mlp_params if kind != "attn" else 0.0
        if kind == "mlp":
            return np.full_like(t, mlp)
        attention = self.attn_const + self.attn_full * t + self.attn_sliding * np.minimum(t, self.window)
        return mlp + 2.0 * self.attn_params + attention


@dataclass(frozen=True)
class LoopCost:
    """Per-token cost of a looped model and of its unlooped base.

    ``passes`` is the layer-pass count the paper charges (:func:`loopeval.core.spec.charged_passes`,
    a float: a sub-layer block pass is half a layer pass) and ``multiplier`` its
    c = passes / base_passes. ``layer_params`` are each layer's stored parameters and
    ``active_layer_params`` those a token multiplies by (they differ for MoE layers).
    FLOP figures are forward FLOPs; ``bytes_per_element`` (the model's dtype) sizes the
    caches, and a sliding-window call site's KV cache is bounded by its window.
    """

    spec: LoopSpec
    base_passes: int
    passes: float
    layer_params: tuple[int, ...]
    active_layer_params: tuple[int, ...]
    head_params: int
    call_sites: tuple[CallSite, ...]
    bytes_per_element: int
    _layers: tuple[_LayerCost, ...] = field(repr=False)

    @property
    def multiplier(self) -> float:
        return self.passes / self.base_passes

    @property
    def extra_passes(self) -> int | float:
        return self.passes - self.base_passes

    @property
    def schedule(self) -> tuple[int, ...]:
        """The layer of every call site in execution order."""
        return tuple(s.layer for s in self.call_sites)

    def _base_sites(self) -> list[CallSite]:
        return [CallSite(j, 1, j) for j in range(self.base_passes)]

    def _flops(self, sites, context) -> np.ndarray:
        t = np.asarray(context, dtype=np.float64)
        total = np.full_like(t, 2.0 * self.head_params)
        for s in sites:
            total += self._layers[s.layer].flops(s.kind, t)
        return total

    def flops_per_token(self, context_length) -> float | np.ndarray:
        """Forward FLOPs of one generated token at context length T (scalar or array)."""
        out = self._flops(self.call_sites, context_length)
        return float(out) if out.ndim == 0 else out

    def base_flops_per_token(self, context_length) -> float | np.ndarray:
        """The same for the unlooped model."""
        out = self._flops(self._base_sites(), context_length)
        return float(out) if out.ndim == 0 else out

    def prefix_flops_per_token(self, context_length, layers: int) -> float | np.ndarray:
        """Forward FLOPs of one token through the first ``layers`` layers only (their first
        pass, no LM head): what two forwards that share that prefix compute once."""
        out = self._flops(self._base_sites()[:layers], context_length) - 2.0 * self.head_params
        return float(out) if out.ndim == 0 else out

    def generation_flops(self, prompt_tokens: int, generated_tokens: int, *, looped: bool = True) -> float:
        """Forward FLOPs of one cached generation: the prompt's P positions and the
        first G - 1 generated tokens go through every call site (position t attends to
        t tokens), and the LM head runs once per generated token."""
        if prompt_tokens < 0 or generated_tokens < 0:
            raise ValueError(f"token counts must be >= 0, got prompt={prompt_tokens}, generated={generated_tokens}")
        sites = self.call_sites if looped else self._base_sites()
        positions = np.arange(1, prompt_tokens + max(generated_tokens - 1, 0) + 1, dtype=np.float64)
        per_position = self._flops(sites, positions) - 2.0 * self.head_params
        return float(per_position.sum() + 2.0 * self.head_params * generated_tokens)

    def _cached(self) -> list[_LayerCost]:
        return [self._layers[s.layer] for s in self.call_sites if s.kind != "mlp"]

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes added per token over all call sites while every sliding window
        is still filling (context below the smallest window); an upper bound beyond it."""
        return self.bytes_per_element * sum(c.kv_elems_per_token for c in self._cached())

    @property
    def base_kv_bytes_per_token(self) -> int:
        return self.bytes_per_element * sum(c.kv_elems_per_token for c in self._layers)

    @property
    def kv_bytes_per_token_past_window(self) -> int:
        """KV-cache bytes added per token once every sliding window has filled: the
        full-attention call sites' only (equal to ``kv_bytes_per_token`` without sliding layers)."""
        return self.bytes_per_element * sum(c.kv_elems_per_token for c in self._cached() if not c.window)

    def kv_bytes(self, context_length) -> float | np.ndarray:
        """KV-cache bytes held at context length T (scalar or array): T tokens per
        full-attention call site and ``min(T, window)`` per sliding-window one. (HF's
        dynamic sliding cache keeps ``window - 1`` tokens between steps and attends over
        ``window`` with the current one; a static sliding cache preallocates ``window``.)"""
        return self._kv_bytes(self._cached(), context_length)

    def base_kv_bytes(self, context_length) -> float | np.ndarray:
        """The same for the unlooped model."""
        return self._kv_bytes(self._layers, context_length)

    def _kv_bytes(self, layers, context_length) -> float | np.ndarray:
        t = np.asarray(context_length, dtype=np.float64)
        total = np.zeros_like(t)
        for c in layers:
            total += c.kv_elems_per_token * (np.minimum(t, c.window) if c.window else t)
        total *= self.bytes_per_element
        return float(total) if total.ndim == 0 else total

    @property
    def sliding_window(self) -> int | None:
        """The sliding window of the model's sliding-window layers, or ``None`` without any."""
        return next((c.window for c in self._layers if c.window), None)

    @property
    def state_bytes_per_sequence(self) -> int:
        """Recurrent plus convolution state bytes per sequence (Gated DeltaNet call sites)."""
        return self.bytes_per_element * sum(c.state_elems for c in self._cached())

    @property
    def base_state_bytes_per_sequence(self) -> int:
        return self.bytes_per_element * sum(c.state_elems for c in self._layers)

    def summary(self) -> dict:
        """The figures a trace or report records, as plain JSON-able values."""
        return {
            "loop": str(self.spec),
            "base_passes": self.base_passes,
            "passes": self.passes,
            "multiplier": self.multiplier,
            "layer_params": sum(self.layer_params),
            "active_layer_params": sum(self.active_layer_params),
            "head_params": self.head_params,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_past_window": self.kv_bytes_per_token_past_window,
            "sliding_window": self.sliding_window,
            "bytes_per_element": self.bytes_per_element,
            "state_bytes_per_sequence": self.state_bytes_per_sequence,
        }


def _text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters()) if module is not None else 0


def _split_params(layer, cfg) -> tuple[int, int]:
    """(attention-block, active MLP-block) parameters of a decoder layer. A layer without
    an ``mlp`` attribute counts whole as its attention block (whole-layer specs only)."""
    mlp = getattr(layer, "mlp", None)
    if mlp is None:
        return _numel(layer), 0
    stored = _numel(mlp) + _numel(getattr(layer, "post_attention_layernorm", None))
    active = stored
    experts = getattr(mlp, "experts", None)
    if experts is not None:
        total, top_k = getattr(cfg, "num_experts", None), getattr(cfg, "num_experts_per_tok", None)
        if not total or not top_k:
            raise ValueError(f"loop_cost: {type(mlp).__name__} has experts, but the config gives no "
                             "num_experts and num_experts_per_tok to count the active ones")
        routed = _numel(experts)
        active = stored - routed + routed // total * top_k
    return _numel(layer) - stored, active


def _layer_costs(config, layers) -> list[_LayerCost]:
    cfg = _text_config(config)
    n = len(layers)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    types = getattr(cfg, "layer_types", None)
    if types is None:
        sliding = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
        types = ["sliding_attention" if sliding else "full_attention"] * n
    window = getattr(cfg, "sliding_window", None) or 0
    out = []
    for j in range(n):
        attn_params, mlp_params = _split_params(layers[j], cfg)
        kind = types[j]
        if kind == "linear_attention":
            v_heads, k_dim, v_dim = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
            conv_dim = 2 * cfg.linear_num_key_heads * k_dim + v_heads * v_dim
            out.append(
                _LayerCost(
                    attn_params=attn_params,
                    mlp_params=mlp_params,
                    attn_full=0.0,
                    attn_sliding=0.0,
                    window=0,
                    attn_const=6.0 * v_heads * k_dim * v_dim,
                    kv_elems_per_token=0,
                    state_elems=v_heads * k_dim * v_dim + conv_dim * cfg.linear_conv_kernel_dim,
                )
            )
        elif kind in ("full_attention", "sliding_attention", "chunked_attention"):
            per_t = 4.0 * heads * head_dim
            slide = kind != "full_attention"
            out.append(
                _LayerCost(
                    attn_params=attn_params,
                    mlp_params=mlp_params,
                    attn_full=0.0 if slide else per_t,
                    attn_sliding=per_t if slide else 0.0,
                    window=window if slide else 0,
                    attn_const=0.0,
                    kv_elems_per_token=2 * kv_heads * head_dim,
                    state_elems=0,
                )
            )
        else:
            raise ValueError(f"loop_cost: layer {j} has layer type {kind!r}, which loopeval cannot cost")
    return out


def _itemsize(model_or_config) -> int:
    """Bytes per element of a model's parameters, or of a config's ``dtype`` (float32,
    what ``from_config`` builds, when the config names none)."""
    if isinstance(model_or_config, torch.nn.Module):
        return next(model_or_config.parameters()).element_size()
    cfg = _text_config(model_or_config)
    dtype = getattr(cfg, "dtype", None) or getattr(model_or_config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype.itemsize if isinstance(dtype, torch.dtype) else 4


def loop_cost(model_or_config, spec: str | LoopSpec | None, *, bytes_per_element: int | None = None) -> LoopCost:
    """The cost of looping the unlooped ``model_or_config`` (a model, or its config, which
    is instantiated on the meta device to count parameters) with ``spec`` (``None``: no loop).
    ``bytes_per_element`` sizes the caches; default: the model's dtype (:func:`_itemsize`)."""
    spec = LoopSpec.parse(spec) if spec is not None else LoopSpec(())
    if bytes_per_element is None:
        bytes_per_element = _itemsize(model_or_config)
    if isinstance(model_or_config, torch.nn.Module):
        model = model_or_config
    else:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_or_config)
    layers = decoder_layers(model)
    sites = tuple(spec.call_sites(len(layers)))
    check_sub_layer_support(layers, spec)
    costs = _layer_costs(model.config, layers)
    head = model.get_output_embeddings()
    return LoopCost(
        spec=spec,
        base_passes=len(layers),
        passes=charged_passes(len(layers), spec),
        layer_params=tuple(_numel(layer) for layer in layers),
        active_layer_params=tuple(c.attn_params + c.mlp_params for c in costs),
        head_params=head.weight.numel() if head is not None else 0,
        call_sites=sites,
        bytes_per_element=bytes_per_element,
        _layers=tuple(costs),
    )
