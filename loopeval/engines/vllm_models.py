"""Looped variants of vLLM's own model classes: exact loops on vLLM's paged KV cache.

A looped model (:mod:`loopeval.engines.vllm_looped`: ``LoopedLlamaForCausalLM``,
``LoopedMistralForCausalLM``, ``LoopedQwen2ForCausalLM``, ``LoopedQwen3ForCausalLM``,
``LoopedGemma3ForCausalLM``) is its base class with the decoder forward replaced by the loop's call sites (:meth:`loopeval.core.spec.LoopSpec.call_sites`, the one
schedule of a loop). Every extra call site that attends gets its own vLLM ``Attention`` named
``model.loop_sites.<slot>.attn`` (one integer, its cache slot), built like the layer's own
(its scale, sliding window, logits soft cap and type: a Gemma 3 sliding layer's sites slide),
so vLLM allocates, counts and prefix-caches its own paged KV cache, as the HF path gives it
its own cache slot; the site shares the layer's projections, norms, rotary embedding and MLP.
A pass re-applies a layer's residual branches as :data:`BASES` names their norms. The
operators are :func:`loopeval.core.loop.window_outputs`, the HF path's own, and sub-layer
windows run where the HF path runs them (:func:`loopeval.core.loop.check_sub_layer_support`:
not on Gemma 3).

vLLM runs the registered ``Looped<Base>`` architecture when the engine passes
``hf_overrides={"architectures": [...], "loopeval_loop": LoopConfig.to_dict()}``
(:func:`engine_overrides`), so a base checkpoint, or one saved by loopeval, runs looped
without editing its config. Registered by the ``vllm.general_plugins`` entry point
(:func:`register`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from loopeval.core.loop import check_sub_layer_support
from loopeval.core.operators import window_outputs
from loopeval.core.spec import LoopConfig

PRE_NORM = (("input_layernorm", None), ("post_attention_layernorm", None))
"""Llama's decoder layer, ``h + self_attn(input_layernorm(h))`` then ``h + mlp(post_attention_layernorm(h))``,
as the norms before and after each residual branch (attention, MLP)."""

SANDWICH_NORM = (("input_layernorm", "post_attention_layernorm"),
                 ("pre_feedforward_layernorm", "post_feedforward_layernorm"))
"""Gemma 3's, ``h + post_attention_layernorm(self_attn(input_layernorm(h)))`` then
``h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))``."""

BASES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM")
"""The vLLM classes with a looped variant, ``Looped<Base>`` in :mod:`loopeval.engines.vllm_looped`
(written out there, with their decoder layers' norms). The embedding (Gemma 3's scaled by
sqrt(hidden)) is the model's own ``embed_input_ids``, the final norm and logits (Gemma 3's
soft cap) its own."""

PREFIX = "Looped"
CONFIG_KEY = "loopeval_loop"


def looped_architecture(architecture: str) -> str:
    """The registered looped architecture for a checkpoint's ``architecture``; refuses the others."""
    if architecture not in BASES:
        raise ValueError(
            f"the vLLM engine has no looped variant of {architecture}; it loops {', '.join(BASES)} "
            "(Qwen3.5 and Qwen3-Next with Gated DeltaNet, and exit gates run on the HF path: drop engine=vllm)")
    return PREFIX + architecture


def engine_overrides(architecture: str, loop: LoopConfig) -> dict:
    """vLLM's ``hf_overrides`` that run ``architecture`` looped by ``loop``."""
    return {"architectures": [looped_architecture(architecture)], CONFIG_KEY: loop.to_dict()}


def register() -> None:
    """The ``vllm.general_plugins`` entry point: register every looped class (lazily, by name:
    vLLM imports :mod:`loopeval.engines.vllm_looped` when it builds one)."""
    from vllm import ModelRegistry

    for base in BASES:
        ModelRegistry.register_model(PREFIX + base, f"loopeval.engines.vllm_looped:{PREFIX}{base}")


class _LoopSites(nn.Module):
    """The extra call sites' attention modules, one per cache slot (``loop_sites.<slot>.attn``)."""


def _site_attention(layer: nn.Module, slot: int, prefix: str, cache_config) -> tuple[nn.Module, nn.Module]:
    """A new ``Attention`` for ``slot`` built like ``layer``'s (every argument that changes its
    outputs), and a shallow copy of ``layer.self_attn`` that calls it (same projection, norm and
    rotary modules, so the same weights and positions)."""
    from vllm.model_executor.layers.attention import Attention

    own = layer.self_attn.attn
    if type(own) is not Attention or own.has_sink or own.impl.alibi_slopes is not None \
            or own.kv_sharing_target_layer_name is not None:
        raise ValueError(f"{own.layer_name} ({type(own).__name__}): the engine loops plain attention, "
                         "without ALiBi, sinks or a KV cache shared with another layer")
    attn = Attention(own.num_heads, own.head_size, own.impl.scale, num_kv_heads=own.num_kv_heads,
                     cache_config=cache_config, quant_config=own.quant_config,
                     logits_soft_cap=own.impl.logits_soft_cap, per_layer_sliding_window=own.sliding_window,
                     attn_type=own.attn_type, head_size_v=own.head_size_v,
                     mm_prefix_clamp_sliding_window=own.mm_prefix_clamp_sliding_window,
                     prefix=f"{prefix}.loop_sites.{slot}.attn")
    site = copy.copy(layer.self_attn)
    site._modules = dict(layer.self_attn._modules, attn=attn)
    return attn, site


class Loop(nn.Module):
    """The looped decoder forward of one vLLM decoder model (``model``: its ``.layers``), with
    its decoder layers' ``norms`` (:data:`PRE_NORM`, :data:`SANDWICH_NORM`). A module without
    parameters of its own: it reaches ``model`` (not a submodule, so no weight is named twice)
    and the call sites' attention modules (``model.loop_sites``). vLLM compiles it as it
    compiles the base's decoder model: :class:`loopeval.engines.vllm_looped.CompiledLoop`."""

    def __init__(self, *, model: nn.Module, norms: tuple, config: LoopConfig, vllm_config, prefix: str):
        from vllm.distributed import get_pp_group

        super().__init__()
        if get_pp_group().world_size > 1:
            raise ValueError("the vLLM engine's looped models do not support pipeline parallelism; "
                             "use tensor_parallel_size or data_parallel_size")
        object.__setattr__(self, "model", model)
        self.norms = norms
        self.config = config
        layers = model.layers
        self.num_layers = len(layers)
        names = ("self_attn", "mlp", *(n for branch in norms for n in branch if n is not None))
        for j, layer in enumerate(layers):
            if not all(hasattr(layer, a) for a in names):
                raise ValueError(f"layer {j} ({type(layer).__name__}) lacks one of {', '.join(names)}: "
                                 "not a decoder layer the engine can loop")
        spec = config.spec.validate(self.num_layers)
        check_sub_layer_support(layers, spec)  # vLLM's decoder layers have transformers' class names
        looped = [w for w in spec.windows if w.times > 1]
        # per layer, fixed at build: the windows starting and ending there (a traced forward runs no spec code)
        self.starting = [[w for w in looped if w.start == j] for j in range(self.num_layers)]
        self.ending = [[w for w in spec.windows_ending_at(j) if w.times > 1] for j in range(self.num_layers)]
        self.sites = {}  # (layer, pass, kind) -> the self_attn copy holding that call site's Attention
        holder = _LoopSites()
        for s in spec.call_sites(self.num_layers):
            if s.pass_index > 1 and s.slot is not None:
                attn, site = _site_attention(layers[s.layer], s.slot, prefix, vllm_config.cache_config)
                holder.add_module(str(s.slot), nn.Module())
                holder._modules[str(s.slot)].attn = attn
                self.sites[(s.layer, s.pass_index, s.kind)] = site
        model.loop_sites = holder

    def _pass(self, window, positions: torch.Tensor, h: torch.Tensor, t: int) -> torch.Tensor:
        """Pass ``t >= 2`` of ``window`` on the whole hidden state ``h`` (the residual stream)."""
        (attn_in, attn_out), (mlp_in, mlp_out) = self.norms
        for j in range(window.start, window.end):
            layer = self.model.layers[j]
            if window.kind != "mlp":
                x = self.sites[(j, t, window.kind)](positions=positions, hidden_states=getattr(layer, attn_in)(h))
                h = h + _norm(layer, attn_out, x)
            if window.kind != "attn":
                h = h + _norm(layer, mlp_out, layer.mlp(getattr(layer, mlp_in)(h)))
        return h

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        model = self.model
        hidden = inputs_embeds if inputs_embeds is not None else model.embed_input_ids(input_ids)
        residual = None
        config = self.config
        embedding = hidden.clone() if config.mix_source == "embedding" else None
        x0 = {}
        for j, layer in enumerate(model.layers):
            for w in self.starting[j]:
                x0[w] = _whole(hidden, residual)
            hidden, residual = layer(positions, hidden, residual)
            for w in self.ending[j]:
                y1 = _whole(hidden, residual)
                hidden = window_outputs(lambda h, t, w=w: self._pass(w, positions, h, t), x0.pop(w), y1,
                                        times=(w.times,), operator=config.operator, betas=(config.beta,),
                                        mix=config.mix, mix_input=embedding)[(w.times, config.beta)]
                residual = None
        if residual is None:
            return model.norm(hidden)
        hidden, _ = model.norm(hidden, residual)
        return hidden


def _norm(layer: nn.Module, name: str | None, x: torch.Tensor) -> torch.Tensor:
    """``layer.<name>(x)``, or ``x`` where the branch has no norm there (``name`` None)."""
    return x if name is None else getattr(layer, name)(x)


def _whole(hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """The residual stream of vLLM's fused ``(hidden, residual)`` pair, as a new tensor (vLLM's
    fused norms update their inputs in place)."""
    return hidden.clone() if residual is None else hidden + residual
