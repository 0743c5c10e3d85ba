"""The ``joint`` recipe (companion paper 002, "One Model, Two Paths"): one model trained
on its single pass and its looped output at once, with optional distillation.

002: "A pretrained model can be adapted to support both single-pass and looped inference
by reusing middle-layer weights for additional computation. ... We study joint training
strategies using weighted losses on both outputs, with guidance from the frozen original
model." Its methods (Fig. 1: "Joint CE uses labels on both paths, Matched CE increases
the single-pass label weight, and Online KD adds a teacher signal using the current
looped output"), and how they are written here:

* **Joint CE**: ``single_weight * CE_single + loop_weight * CE_loop``. Defaults 0.1 and
  0.9, the fixed coefficients of Table 34 ("Every condition uses the frozen original
  single-pass teacher and total KL weight 0.1"; its single-receiver matched control is
  "(0.2, 0.9)", so the label weights are (0.1, 0.9)).
* **Distillation**: ``teacher`` is ``frozen-original`` ("Frozen-original KD", "the frozen
  original single-pass teacher"), ``online`` (the "current online looped target", with
  stop-gradient) or ``frozen-looped`` (the "Frozen initial looped output"; "frozen
  methods use the corresponding initial predictors"); ``receiver`` is ``single``,
  ``loop`` or ``both``. The term is ``kd_weight * KL(teacher || receiver)``, split evenly
  over the receivers (Table 34: "Guidance to both outputs splits the weight into 0.05 per
  output"); "both label losses remain active" (Fig. 4). The online teacher *is* the
  looped output, so it can only guide the single pass.
* **Matched CE** (:func:`matched_ce`): the control of a KD config. Each receiver's share
  of ``kd_weight`` moves to its own label weight and the teacher goes; Table 34's
  controls "(L_s, L_c)" are (0.2, 0.9) for the single receiver, (0.1, 1.0) for the
  looped output and (0.15, 0.95) for both.
* **Staged schedules** (``stages``, :func:`parse_stages`): ``loop:2048,joint:877`` runs
  loop-only updates (CE on the looped output alone, 002's "Loop-only"), then the joint
  objective, with one optimiser throughout ("Learning rates and optimizer states are
  inherited and retained through stage switches", Table 3). ``single`` stages train the
  single pass alone (ordinary continued training).

**The shared prefix.** The looped path's first pass through its first window *is* the
single pass's, so the two paths agree up to the end of that window's first pass and are
computed once there (:func:`two_path_logits`); only the rest runs twice. 002's budgets
count forward blocks "including teacher computation" (Table 20: "at the 40,960-block
cap including teacher computation") and time "including teacher forward passes, target
construction, and reused prefixes" (Table 21). Its 8-block model looped over blocks 2-5
costs 8 blocks per ordinary update, 12 per loop-only update, 14 per joint update (6
shared + 2 + 6), 22 with the frozen single-pass teacher and 26 with the frozen looped
one: 40,960 blocks give its 5120, 3413 and 2925 updates (Table 1) and "1,575 and 1,861
student updates" for the frozen teachers (Table 20).

**Frozen teachers** are one frozen copy of the initial weights (the looped model starts
from its unlooped base, so the same copy is the original single pass with the loop
disabled and the initial looped model at the loop's depth): one more copy of the
weights in the training dtype, without gradients or optimiser state (a quarter of what
full fine-tuning with AdamW already holds: weights, gradients, two moments). ``online``
needs no copy.

**The twin** is the recipe with both paths one path: ordinary single-pass CE (002's
"ordinary continued training") with each stage's total weight (a joint stage's labels
plus ``kd_weight`` with a teacher, which is its matched control's label total), no
teacher, on the same batches.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext

import torch

from loopeval.core.blocks import whole_layer
from loopeval.core.loop import apply_loop, decoder_layers, loop_config, remove_loop
from loopeval.core.loop_controls import loop_disabled, loop_hooks_paused
from loopeval.training.objectives import kl_and_nll_sums, nll_sum
from loopeval.training.config import RECEIVERS
from loopeval.training.recipes import Forwards, Recipe

def matched_ce(config):
    """The coefficient-matched CE control of a KD ``config`` (002, Fig. 1: "Matched CE
    increases the single-pass label weight"; Table 34 gives each receiver's control): no
    teacher, and each receiver's share of ``kd_weight`` added to its own label weight, so
    the total label weight equals the KD run's total weight (``kd_weight`` stays as it
    was and is unused). ``matched_from`` records the KD config it matches
    (``TEACHER/RECEIVER/KD_WEIGHT``)."""
    from dataclasses import replace

    if config.recipe != "joint" or config.teacher is None:
        raise ValueError("matched-ce: the control is made from a joint KD config; give teacher and receiver "
                         "(--teacher, --receiver)")
    paths = RECEIVERS[config.receiver]
    share = config.kd_weight / len(paths)
    return replace(config, teacher=None, receiver=None,
                   single_weight=config.single_weight + share * ("single" in paths),
                   loop_weight=config.loop_weight + share * ("loop" in paths),
                   matched_from=f"{config.teacher}/{config.receiver}/{config.kd_weight:g}")


def shared_sites(spec, num_layers: int) -> int:
    """How many leading call sites the single pass and the looped path share: every
    first-pass site before the loop's first extra pass (the layers up to the end of the
    first window's first pass). Equal to the layer count when no window repeats."""
    sites = spec.call_sites(num_layers)
    return next((i for i, s in enumerate(sites) if s.pass_index > 1), len(sites))


def _output(out):
    return out[0] if isinstance(out, tuple) else out


def two_path_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                    core=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(single, looped)`` logits of a looped ``model`` from one shared-prefix forward.

    One forward of the looped model keeps the hidden state where the paths part (the
    output of layer ``f``, the last shared call site, before the loop's hook replaces
    it) and every later layer's keyword inputs (masks, rotary embeddings); the single
    pass then runs layers ``f+1..N-1``, the final norm and the LM head on that state.
    Equal to ``loop_disabled`` and looped forwards run separately, gradients included
    (tested). ``model`` is what to call (the looped model, or a wrapper such as DDP's) and
    ``core`` the looped model itself (default ``model``).
    """
    core = model if core is None else core
    config = loop_config(core)
    if config is None:
        raise ValueError("two_path_logits: the model has no loop")
    layers = decoder_layers(core)
    fork = shared_sites(config.spec, len(layers)) - 1
    kept: dict = {}

    def keep_state(module, args, kwargs, output):  # runs before the loop's own hook on this layer
        kept.setdefault("h", _output(output))

    def keep_kwargs(j):
        def hook(module, args, kwargs):
            kept.setdefault(j, {k: v for k, v in kwargs.items() if k != "hidden_states"})
        return hook

    handles = [layers[fork].register_forward_hook(keep_state, with_kwargs=True, prepend=True)]
    handles += [layers[j].register_forward_pre_hook(keep_kwargs(j), with_kwargs=True)
                for j in range(fork + 1, len(layers))]
    try:
        looped = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    finally:
        for h in handles:
            h.remove()
    h = kept["h"]
    with loop_hooks_paused(core):
        for j in range(fork + 1, len(layers)):
            h = whole_layer(layers[j], h, kept[j])
    decoder = core.get_decoder() if hasattr(core, "get_decoder") else core.model
    return core.get_output_embeddings()(decoder.norm(h)), looped


class Joint(Recipe):
    """``joint``: every weight trains (as 002's continued training) on the single pass and
    the looped output of one model; see the module docstring for the objective, stages,
    teachers and the twin."""

    name = "joint"

    def __init__(self, config, loop):
        super().__init__(config, loop)
        self.stages = config.stages or (("joint", config.steps),)
        self.frozen = None
        self._stage = self.stages[0][0]

    def stage(self, step: int) -> str:
        """The stage of optimizer step ``step`` (0-based)."""
        end = 0
        for name, steps in self.stages:
            end += steps
            if step < end:
                return name
        return self.stages[-1][0]

    def prepare(self, model):
        self.core = model  # the looped model itself; losses() gets it wrapped (DDP does not pass attributes through)
        if self.loop is not None and self.config.teacher in ("frozen-original", "frozen-looped"):
            remove_loop(model)
            self.frozen = copy.deepcopy(model).eval().requires_grad_(False)
            apply_loop(self.frozen, self.loop)
            apply_loop(model, self.loop)
        return model

    def finish(self, model, out, *, keep_adapters):
        self.core = self.frozen = None  # the caller may keep the recipe while the other twin trains
        return model

    def _stage_weight(self, stage: str) -> float:
        c = self.config
        if stage != "joint":
            return 1.0
        return c.single_weight + c.loop_weight + (c.kd_weight if c.teacher else 0.0)

    def plan(self, step, depth):
        self._stage = stage = self.stage(step)
        if self.loop is None or stage == "single":
            return Forwards((1,))
        if stage == "loop":
            return Forwards((None,))
        teacher = {"frozen-original": (1,), "frozen-looped": (None,)}.get(self.config.teacher, ())
        return Forwards((1, None), teacher, shared=True)

    def _teacher_logits(self, inputs, looped):
        if self.config.teacher == "online":
            return looped.detach()
        frozen = self.frozen.to(inputs["input_ids"].device)
        with torch.no_grad():
            if self.config.teacher == "frozen-original":
                with loop_disabled(frozen):
                    return frozen(**inputs, use_cache=False).logits
            return frozen(**inputs, use_cache=False).logits

    def losses(self, model, batch):
        c, stage, labels = self.config, self._stage, batch["labels"]
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if self.loop is None or stage != "joint":
            # the twin (one path), or a single- or loop-only stage
            with loop_disabled(self.core) if self.loop is not None and stage == "single" else nullcontext():
                ce = nll_sum(model(**inputs, use_cache=False).logits, labels)
            name = "ce_single" if self.loop is None or stage == "single" else "ce_loop"
            return self._stage_weight(stage) * ce, {name: ce}
        outputs = dict(zip(("single", "loop"), two_path_logits(model, **inputs, core=self.core)))
        teacher = self._teacher_logits(inputs, outputs["loop"]) if c.teacher else None
        receivers = RECEIVERS[c.receiver] if c.teacher else ()
        terms, loss = {}, 0.0
        for path, weight in (("single", c.single_weight), ("loop", c.loop_weight)):
            if path in receivers:
                kl, ce = kl_and_nll_sums(teacher, outputs[path], labels)
                terms[f"kl_{path}"] = kl
                loss = loss + c.kd_weight / len(receivers) * kl
            else:
                ce = nll_sum(outputs[path], labels)
            terms[f"ce_{path}"] = ce
            loss = loss + weight * ce
        return loss, terms

