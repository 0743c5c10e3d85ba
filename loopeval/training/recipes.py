"""The recipes (paper A.3): what each one checks, trains, draws and saves.

A recipe is named by ``TrainConfig.recipe`` and carries no state of its own beyond the
run it serves. The runner (:mod:`loopeval.training.runner`) asks it, in order:
``preflight`` (before any weights load), ``prepare`` (the trainable module),
``depth`` (the loop's passes at a step; ``None``: the loop's own), ``plan`` (the
step's forwards, which its FLOPs and blocks are counted from), ``losses`` (a
micro-batch's summed objective and its terms), ``finish`` (the model to save) and
``record`` (its manifest fields).

* ``full``: full fine-tuning on the NLL.
* ``convert``: LoRA through the loop with a KL to the unmodified model, a recurrence
  curriculum, and the adapters merged at the end.
* ``cpt``: continued pretraining on packed text, optionally at a random depth per batch.
* ``joint`` (:mod:`loopeval.training.joint`): the single pass and the looped output of one
  model, with optional distillation and staged objectives.
* ``loop-convert`` (paper 004): every weight trains through a whole-decoder loop with a
  learned mix logit and an exit gate, on the smoothed exit loss; the twin is the same
  data and steps on the plain NLL.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from loopeval.core.loop import decoder_layers
from loopeval.core.loop_controls import loop_disabled
from loopeval.core.spec import LoopConfig
from loopeval.training.config import ALL_LINEAR, TrainConfig, format_passes
from loopeval.training.hashing import weights_sha256
from loopeval.training.objectives import kl_and_nll_sums, nll_sum

ADAPTER_FOLDER = "adapter"  # convert's unmerged adapters, inside the output folder, if kept
_CURRICULUM_STREAM, _DEPTH_STREAM = 1, 2  # separate random streams of the loop draws


def curriculum_probability(step: int, *, steps: int, curriculum: float) -> float:
    """p(step): the probability of applying the loop at optimizer step ``step`` (0-based),
    rising linearly from 0 at step 0 to 1 at ``curriculum * steps`` and 1 after."""
    ramp = curriculum * steps
    return 1.0 if ramp <= 0 else min(1.0, step / ramp)


def loop_draw(seed: int, step: int, stream: int) -> np.random.Generator:
    """The random generator of one step's loop draw: a function of the seed and the step
    only, so every process draws the same and a draw does not depend on earlier ones."""
    return np.random.default_rng([seed, stream, step])


@dataclass(frozen=True)
class Forwards:
    """The forwards of one training step, for counting its cost the same way on both
    sides: the ``student``'s and the ``teacher``'s depths (``None``: the loop's own, ``1``:
    unlooped). ``shared``: the student's two forwards (single pass and looped) are
    computed together, their common prefix once (:func:`loopeval.training.joint.shared_sites`)."""

    student: tuple[int | None, ...] = (None,)
    teacher: tuple[int | None, ...] = ()
    shared: bool = False


class Recipe:
    """A recipe's part of training; these defaults are ``full``'s: every parameter trains
    on the next-token NLL at the loop's own depth, and the trained model is saved as is."""

    name = ""

    def __init__(self, config: TrainConfig, loop: LoopConfig | None):
        self.config, self.loop = config, loop

    def preflight(self, base, *, heldout) -> None:
        """Checks that need the base's config, before any weights load."""

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def depth(self, step: int) -> int | None:
        return None

    def draws(self, depths: list[int | None]) -> dict | None:
        """The manifest's record of the loop draws (``None``: the recipe draws nothing)."""
        return None

    def losses(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        nll = nll_sum(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits,
                      batch["labels"])
        return nll, {}

    def plan(self, step: int, depth: int | None) -> Forwards:
        """Step ``step``'s forwards, ``depth`` from :meth:`depth`. The runner plans every step
        once, in order, after the previous step's losses (a recipe may keep the step's
        objective from here); the preflight plans step 0 once more."""
        return Forwards((depth,))

    def finish(self, model: torch.nn.Module, out: Path, *, keep_adapters: bool) -> torch.nn.Module:
        return model

    def record(self) -> dict:
        return {}

    def checkpoint(self, trained: torch.nn.Module) -> torch.nn.Module:
        """The model an intermediate checkpoint saves, from the unwrapped trainable module."""
        return trained

    def end_step(self, step: int, reduce) -> None:
        """Called after every optimizer step; ``reduce(t)`` is a tensor summed over the
        step's target tokens on this process, as a mean over the global batch's."""

    def added_parameters(self) -> int:
        """Parameters the recipe adds beside the base model's (kept outside it)."""
        return 0


class Full(Recipe):
    """``full``: full fine-tuning (paper A.3, the short and long fine-tunes)."""

    name = "full"


class Convert(Recipe):
    """``convert`` (paper A.3): "We train LoRA adapters on every linear layer through the
    looped computation. All iterations share the adapters, and we merge them afterwards,
    so the model gains no parameters."

    The adapters go on the looped model, so every pass uses them. The teacher is the
    unmodified base model computed by the same weights: adapters disabled (PEFT) and
    the loop switched off (:func:`loopeval.core.loop_controls.loop_disabled`), in eval mode, without
    gradients. The twin runs the same recipe without the loop: the same data order,
    LoRA initialisation (seeded by ``seed``) and teacher.
    """

    name = "convert"

    def preflight(self, base, *, heldout) -> None:
        self.modules = lora_modules(base, self.config.lora_targets)

    def prepare(self, model):
        from peft import LoraConfig, get_peft_model

        c = self.config
        torch.manual_seed(c.seed)  # the adapters' initialisation, the same for both twins
        self.peft = get_peft_model(model, LoraConfig(r=c.lora_rank, lora_alpha=c.lora_alpha, lora_dropout=c.lora_dropout,
                                                     target_modules=list(self.modules), bias="none"))
        self.core = model
        adapters = {n: p for n, p in self.peft.named_parameters() if p.requires_grad}
        self._record = {"lora": {"modules": len(self.modules), "trainable": sum(p.numel() for p in adapters.values()),
                                 "init_sha256": weights_sha256(adapters)}}
        return self.peft

    def depth(self, step: int) -> int | None:
        c = self.config
        p = curriculum_probability(step, steps=c.steps, curriculum=c.curriculum)
        return None if loop_draw(c.seed, step, _CURRICULUM_STREAM).random() < p else 1

    def draws(self, depths):
        return {"kind": "curriculum", "curriculum": self.config.curriculum, "applied": [int(d is None) for d in depths]}

    @contextmanager
    def _teacher(self):
        training = self.peft.training
        self.peft.eval()
        try:
            with torch.no_grad(), self.peft.disable_adapter(), loop_disabled(self.core):
                yield
        finally:
            self.peft.train(training)

    def losses(self, model, batch):
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "use_cache": False}
        with self._teacher():
            teacher = model(**inputs).logits
        kl, nll = kl_and_nll_sums(teacher, model(**inputs).logits, batch["labels"])
        return self.config.kl_weight * kl + self.config.nll_weight * nll, {"kl": kl, "nll": nll}

    def plan(self, step, depth):
        return Forwards((depth,), (1,))

    def finish(self, model, out, *, keep_adapters):
        if keep_adapters:
            model.save_pretrained(out / ADAPTER_FOLDER)
        return model.merge_and_unload()

    def record(self) -> dict:
        return self._record


class ContinuedPretraining(Recipe):
    """``cpt`` (paper A.3): "The looped model applies the loop a random 1–3 times per
    batch." With ``passes``, every window's pass count is drawn per step, uniformly from
    the range; held-out loss is measured at every checkpoint for every pass count."""

    name = "cpt"

    def preflight(self, base, *, heldout) -> None:
        if heldout is None:
            raise ValueError("recipe cpt measures held-out loss at every checkpoint; give heldout= (--heldout FILE), "
                             "plain-text rows kept out of training")
        if self.config.passes is not None and self.loop is not None:
            flat = [w for w in self.loop.spec.windows if w.times == 1]
            if flat:
                raise ValueError(f"passes {format_passes(self.config.passes)}: window {flat[0]} of the loop has K = 1; "
                                 "random depth needs every window looped (K >= 2)")

    def depth(self, step: int) -> int | None:
        if self.config.passes is None:
            return None
        lo, hi = self.config.passes
        return int(loop_draw(self.config.seed, step, _DEPTH_STREAM).integers(lo, hi + 1))

    def draws(self, depths):
        if self.config.passes is None:
            return None
        return {"kind": "random_depth", "range": list(self.config.passes), "passes": depths}


class LoopConvert(Recipe):
    """``loop-convert`` (paper 004, section 4, "a minimal recipe for converting pretrained
    dense models into looped ones: a single learned input-mixing scalar and a smoothed exit
    loss, with no step-specific parameters"). "The pretrained decoder, embeddings,
    vocabulary, and LM head are preserved and remain trainable. We add recurrent
    execution, a shared exit gate, scalar embedding injection".

    The twin runs the same recipe without the loop: one step, p_0 = 1 and H(p) = 0, so
    its loss is the plain NLL, 004's "Qwen3-1.7B-Base continued on exactly the same data
    for the same number of steps". The p_t of every step go into the manifest
    (``exit.p``) and the collapse monitor warns on the console.
    """

    name = "loop-convert"

    def preflight(self, base, *, heldout) -> None:
        from loopeval.core.loop import count_layers
        from loopeval.training.loop_convert import check_loop, initial_loop

        if self.loop is not None:
            check_loop(self.loop, count_layers(base))
            self.loop = initial_loop(self.loop, self.config.mix_init)

    def prepare(self, model):
        if self.loop is None:
            return model
        from loopeval.training.exit_monitor import CollapseMonitor
        from loopeval.training.loop_convert import LoopConvertModel, added_parameters

        c = self.config
        self.module = LoopConvertModel(model, mix_init=c.mix_init, seed=c.seed)
        self.added = added_parameters(model)
        self.monitor = CollapseMonitor(threshold=c.collapse_threshold, patience=c.collapse_patience)
        self.p_sum, self.p_steps = None, []
        return self.module

    def losses(self, model, batch):
        if self.loop is None:
            return super().losses(model, batch)
        from loopeval.core.exit_gate import exit_loss_sums

        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        sums = exit_loss_sums(out["step_nll"], out["halt"], beta=self.config.exit_beta,
                              smoothing=self.config.exit_smoothing)
        self.p_sum = sums["p"] if self.p_sum is None else self.p_sum + sums["p"]
        return sums["loss"], {"lm": sums["lm"], "entropy": sums["entropy"]}

    def end_step(self, step, reduce):
        if self.loop is None:
            return
        import warnings

        p = reduce(self.p_sum).tolist()
        self.p_sum = None
        self.p_steps.append(p)
        message = self.monitor.update(step, p[0])
        if message is not None:
            warnings.warn(message, stacklevel=2)

    def checkpoint(self, trained):
        return trained.model if self.loop is not None else trained  # the learned mix is saved at its current value

    def finish(self, model, out, *, keep_adapters):
        return model.finish() if self.loop is not None else model

    def added_parameters(self) -> int:
        return self.added if self.loop is not None else 0

    def record(self) -> dict:
        if self.loop is None:
            return {}
        from loopeval.training.exit_monitor import collapse_episodes
        from loopeval.core.operators import mix_weight

        c = self.config
        trained = float(self.module.mix.detach())
        episodes = collapse_episodes([p[0] for p in self.p_steps], threshold=c.collapse_threshold,
                                     patience=c.collapse_patience)
        return {"exit": {"steps": len(self.p_steps[0]) if self.p_steps else None, "p": self.p_steps,
                         "collapses": [list(e) for e in episodes]},
                "mix": {"init": c.mix_init, "trained": trained, "weight": mix_weight(trained)}}


def lora_modules(base, targets: str | tuple[str, ...]) -> tuple[str, ...]:
    """The names of the modules of ``base`` (a checkpoint path, hub id, config or model)
    that LoRA adapts: for ``all-linear``, every ``nn.Linear`` inside the decoder layers;
    otherwise PEFT's matching of ``target_modules``. The model is built on the meta
    device from its config, so no weights load. Raises ``ValueError`` if none match."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    model = _meta_model(base)
    prefix = {id(m) for m in decoder_layers(model).modules()}
    if targets == ALL_LINEAR:
        names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and id(m) in prefix]
    else:
        probe = LoraConfig(target_modules=targets if isinstance(targets, str) else list(targets))
        names = [n for n, _ in model.named_modules() if n and check_target_module_exists(probe, n)]
    if not names:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"lora_targets {targets!r} match no module of {_name(base)}; its linear layers are named "
                         f"{', '.join(linear)}")
    return tuple(names)


def _name(base) -> str:
    return str(base) if isinstance(base, (str, Path)) else type(base).__name__


def _meta_model(base):
    if isinstance(base, torch.nn.Module):
        return base
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base) if isinstance(base, (str, Path)) else base
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)
