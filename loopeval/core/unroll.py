"""The unrolled copy of a looped model: the reference that a loop must equal exactly."""

from __future__ import annotations

import copy

import torch
from torch import nn

from loopeval.core.loop import decoder_layers
from loopeval.core.spec import LoopSpec


class _Zero(nn.Module):
    """A block that contributes nothing: ``h + _Zero()(x) == h`` exactly."""

    def __init__(self, returns_tuple: bool):
        super().__init__()
        self.returns_tuple = returns_tuple

    def forward(self, hidden_states, *args, **kwargs):
        zero = torch.zeros_like(hidden_states)
        return (zero, None) if self.returns_tuple else zero


def _block_only(layer: nn.Module, kind: str) -> nn.Module:
    """``layer`` with the other block replaced by zeros, so that the layer's own HF
    forward computes only ``kind``'s residual update."""
    if kind == "attn":
        layer.mlp = _Zero(returns_tuple=False)
    elif getattr(layer, "block_type", None) == "linear_attention":
        layer.linear_attn = _Zero(returns_tuple=False)
    else:
        layer.self_attn = _Zero(returns_tuple=True)
    return layer


def unrolled_copy(model: nn.Module, spec: str | LoopSpec) -> nn.Module:
    """A deep copy of the unlooped ``model`` whose layer list is the spec's call sites.

    Every call site becomes its own copied layer, with its own ``layer_idx`` and hence
    its own cache slot, so a plain HF forward of the copy computes the ``repeat`` loop
    with independent weights and no hooks. A sub-layer call site is a copy whose other
    block outputs zeros. The copy has more parameters than the looped model; it is for
    checking, not for use.
    """
    spec = LoopSpec.parse(spec)
    if getattr(model, "_loopeval", None) is not None:
        raise ValueError("unrolled_copy needs the unlooped model; call loopeval.remove_loop first")
    sites = spec.call_sites(len(decoder_layers(model)))
    twin = copy.deepcopy(model)
    layers = decoder_layers(twin)
    unrolled = nn.ModuleList()
    for site in sites:
        layer = copy.deepcopy(layers[site.layer])
        unrolled.append(layer if site.kind == "layer" else _block_only(layer, site.kind))
    for i, layer in enumerate(unrolled):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = i
    twin.get_decoder().layers = unrolled
    config = twin.get_decoder().config
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[s.layer] for s in sites]
    config.num_hidden_layers = len(sites)
    return twin
