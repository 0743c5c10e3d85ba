"""The model side of ``loop-convert`` (paper 004, section 4): the looped model with its
learned mix logit and exit gate, and the per-step losses it is trained on.

004 converts "the full decoder recurrently for T = 3 steps": a step is one pass of
every decoder layer, so its output is the last layer's output and the LM head and the
exit gate read it through the model's final norm. A loop of only some layers has no
such per-step output (the layers after the window would have to run once per step),
so the recipe refuses it (:func:`check_loop`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from loopeval.core.exit_gate import ExitGate, attach_gate, gate_parameters
from loopeval.core.loop_controls import record_iterates, set_learned_mix, store_mix
from loopeval.core.spec import LoopConfig

MIX_SOURCE = "embedding"
"""004 Eq. 1: "Let e denote the token embedding ... z_t = w e + (1 - w) h_{t-1}". For the
whole-decoder loop the recipe requires, the window's input is that embedding."""
OPERATOR = "repeat"
"""The recipe's operator, used when none is given: 004's steps are plain repeats ("h_t = B(z_t)")."""


def check_loop(loop: LoopConfig, num_layers: int) -> None:
    """Refuse, with the reason, a loop the exit gate cannot read after every step: not
    one whole-layer window over all ``num_layers`` layers run ``K >= 2`` times with the
    ``repeat`` operator, or a fixed mix (the recipe learns it from ``mix_init``)."""
    spec = loop.spec
    whole = f"0:{num_layers}xK (e.g. 0:{num_layers}x3, 004's T = 3)"
    if len(spec.windows) != 1:
        raise ValueError(f"recipe loop-convert: loop {spec} has {len(spec.windows)} windows; its exit gate reads the "
                         f"output of every pass of the whole decoder, so the loop must be one window {whole}")
    w = spec.windows[0]
    if w.kind != "layer" or w.start != 0 or w.end != num_layers:
        raise ValueError(f"recipe loop-convert: loop {spec} re-applies only {'the ' + w.kind + ' blocks of ' if w.kind != 'layer' else ''}"
                         f"layers {w.start}..{w.end - 1} of {num_layers}; 004's conversion loops the whole decoder, and an "
                         f"exit gate after a partial window would need the layers after it run once per step. Use {whole}")
    if w.times < 2:
        raise ValueError(f"recipe loop-convert: loop {spec} runs once; an exit gate needs K >= 2 steps")
    if loop.operator != OPERATOR:
        raise ValueError(f"recipe loop-convert: loop operator {loop.operator!r}; 004's steps are plain repeats "
                         f"(h_t = B(z_t)), use operator {OPERATOR!r}")
    if loop.mix is not None:
        raise ValueError(f"recipe loop-convert: a fixed mix={loop.mix:g} was given; the recipe learns the mix logit, "
                         "set its initial value with mix_init (--mix-init, default 4.6)")


def initial_loop(loop: LoopConfig, mix_init: float) -> LoopConfig:
    """The loop training starts from: the mix logit at ``mix_init``, mixing the embedding."""
    return dataclasses.replace(loop, mix=float(mix_init), mix_source=MIX_SOURCE)


def added_parameters(model: nn.Module) -> int:
    """What the recipe adds to the base model: the exit gate and the mix logit."""
    return gate_parameters(model.config.get_text_config(decoder=True).hidden_size) + 1


class LoopConvertModel(nn.Module):
    """The trainable module: the looped ``model``, its exit gate and its mix logit ``a``
    (an ``nn.Parameter``, used by the loop through :func:`loopeval.core.loop_controls.set_learned_mix`).

    ``forward(input_ids, attention_mask, labels=None)`` is the model's forward; with
    ``labels`` it also returns, for the target tokens, every step's next-token NLL and
    halt logit (``step_nll``, ``halt``: ``[n, T]``): 004 "L_t is the next-token
    cross-entropy produced by the shared LM head from h_t", each ``h_t`` through the
    final norm.
    """

    def __init__(self, model: nn.Module, *, mix_init: float, seed: int):
        super().__init__()
        self.model = model
        torch.manual_seed(seed)
        parameter = next(model.parameters())
        hidden = model.config.get_text_config(decoder=True).hidden_size
        self.gate = ExitGate(hidden).to(parameter.device)
        self.mix = nn.Parameter(torch.tensor(float(mix_init), device=parameter.device))
        set_learned_mix(model, self.mix)
        attach_gate(model, self.gate)

    def forward(self, input_ids, attention_mask=None, labels=None, use_cache=False, **kwargs):
        if labels is None:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache, **kwargs)
        with record_iterates(self.model) as recorded:
            self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache, logits_to_keep=1, **kwargs)
        (_, iterates), = recorded
        keep = labels[:, 1:] != -100
        tokens = labels[:, 1:][keep]
        norm = self.model.get_decoder().norm
        nll, halt = [], []
        for h in iterates:
            normed = norm(h[:, :-1][keep])
            logits = self.model.get_output_embeddings()(normed).float()
            nll.append(F.cross_entropy(logits, tokens, reduction="none"))
            halt.append(self.gate(normed.to(self.gate.linear.weight.dtype)))
        return {"step_nll": torch.stack(nll, -1), "halt": torch.stack(halt, -1)}

    def finish(self) -> nn.Module:
        """The looped model to save: the trained logit becomes the loop's stored mix and
        the gate stays attached (``save_model`` writes both)."""
        store_mix(self.model, float(self.mix.detach()))
        return self.model
