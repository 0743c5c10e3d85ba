"""The unrolled copy of a looped model: the reference that a loop must equal exactly."""

from __future__ import annotations

import copy

from torch import nn

from loopeval.loop import LoopSpec, decoder_layers


def unrolled_copy(model: nn.Module, spec: str | LoopSpec) -> nn.Module:
    """A deep copy of the unlooped ``model`` whose layer list is the spec's schedule.

    Every call site becomes its own copied layer, with its own ``layer_idx`` and hence
    its own cache slot, so a plain HF forward of the copy computes the ``repeat`` loop
    with independent weights and no hooks. The copy has more parameters than the
    looped model; it is for checking, not for use.
    """
    spec = LoopSpec.parse(spec)
    if getattr(model, "_loopeval", None) is not None:
        raise ValueError("unrolled_copy needs the unlooped model; call loopeval.remove_loop first")
    schedule = spec.schedule(len(decoder_layers(model)))
    twin = copy.deepcopy(model)
    layers = decoder_layers(twin)
    unrolled = nn.ModuleList(copy.deepcopy(layers[j]) for j in schedule)
    for i, layer in enumerate(unrolled):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = i
    twin.get_decoder().layers = unrolled
    config = twin.get_decoder().config
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[j] for j in schedule]
    config.num_hidden_layers = len(schedule)
    return twin
