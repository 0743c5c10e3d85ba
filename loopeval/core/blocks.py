"""Sub-layer call sites: the blocks of a decoder layer run alone.

A window re-applies whole layers, or only their attention blocks (``/attn``) or only
their MLP blocks (``/mlp``). Only pre-norm layers (:data:`PRE_NORM_LAYERS`) can run their
blocks alone (:func:`check_sub_layer_support`); :data:`RUN_KIND` runs a call site of each kind.
"""

from __future__ import annotations

import torch
from torch import nn

from loopeval.core.spec import LoopSpec

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

