"""The step loop: one model trained by one recipe under ``accelerate``, with its manifest.

One process on CPU or GPU, or data-parallel under ``accelerate launch`` (or
``torchrun``). Every process builds the same global batch sequence from ``data_seed``
and takes every ``world``-th row of each batch; the loss of a step is the sum over the
global batch's target tokens divided by their number, so the world size and the
micro-batch size do not change what is optimised. Loop draws depend only on ``seed``
and the step, so every process draws the same (checked at the end).
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from loopeval.common.outputs import record_written
from loopeval.core.checkpoint import load_model, save_model
from loopeval.core.cost import loop_cost
from loopeval.core.loop import apply_loop
from loopeval.core.loop_controls import loop_passes
from loopeval.core.spec import LoopConfig
from loopeval.training.manifest import MANIFEST_FORMAT, MANIFEST_NAME
from loopeval.training.config import TrainConfig
from loopeval.training.data import TrainData, batch_order, collate, update_batch_hash
from loopeval.training.hashing import weights_sha256
from loopeval.training.objectives import nll_sum
from loopeval.training.recipes import ADAPTER_FOLDER, Recipe

TWIN, LOOPED = "twin", "looped"
TRAIN_FLOPS_PER_FORWARD = 3  # forward + backward (twice the forward's FLOPs)


@dataclass(frozen=True)
class TrainResult:
    """Where a trained model was saved, and its training manifest."""

    path: Path
    manifest: dict

    @property
    def loss_curve(self) -> list[tuple[int, float]]:
        return [(step, loss) for step, loss in self.manifest["loss_curve"]]

    def __str__(self) -> str:
        """What ``loopeval train`` prints: loss, tokens, FLOPs, blocks, time, the exit gate and held-out curve."""
        m = self.manifest
        loss = " -> ".join(f"{x:.4f}" for _, x in (m["loss_curve"][0], m["loss_curve"][-1])[:len(m["loss_curve"])])
        stopped = m["budget"]["stopped_by"]
        lines = [f"{m['role']:<6}  {self.path}  {m['recipe']}: loss {loss}, {m['tokens']['input']} tokens, "
                 f"{m['flops']['train']:.3g} training FLOPs, {m['blocks']['total']:g} forward blocks, "
                 f"{m['train_time_s']:.1f} s training"
                 + (f", stopped by {stopped} after {m['budget']['steps_run']} step(s)" if stopped else "")]
        if m.get("exit"):
            from loopeval.training.exit_monitor import collapse_notes

            last = ", ".join(f"{x:.3f}" for x in m["exit"]["p"][-1])
            lines.append(f"        exit distribution at the last step: p = [{last}]; mix w = {m['mix']['weight']:.5f}; "
                         f"{m['parameters']['added']} parameters added (exit gate, mix logit)")
            lines += [f"warning: {note}" for note in collapse_notes(m, str(self.path))]
        for point in m["heldout_curve"]:
            by = ", ".join(f"{k}: {v:.4f}" for k, v in point.get("loss_by_passes", {}).items())
            lines.append(f"        held-out loss at step {point['step']}: {point['loss']:.4f}"
                         + (f" (by passes {by})" if by else ""))
        return "\n".join(lines)


class StepCost(NamedTuple):
    """One step's forward FLOPs and forward blocks, the student's and the teacher's."""

    flops: float
    teacher_flops: float
    blocks: float
    teacher_blocks: float


class _Cost:
    """What a step's forwards cost, counted the same way for every recipe and side.

    FLOPs: forward FLOPs of rows of given lengths at a loop depth, the sum over a row's
    positions t = 1..L (position t attends to t tokens) of every call site and the LM
    head. Blocks: layer passes of one forward (``PASS_CHARGE`` per call site; N for the
    unlooped model), per step whatever the batch. Two forwards computed together
    (``Forwards.shared``) count their shared prefix once."""

    def __init__(self, model, loop: LoopConfig | None, max_length: int):
        self.model, self.loop, self.max_length, self.tables, self.costs = model, loop, max_length, {}, {}
        self.positions = np.arange(1, max_length + 1)

    def _cost(self, depth: int | None):
        key = 1 if self.loop is None else depth  # None: the loop's own depth
        if key not in self.costs:
            spec = None if key == 1 else self.loop.spec if key is None else self.loop.spec.at_depth(key)
            self.costs[key] = loop_cost(self.model, spec)
        return key, self.costs[key]

    def flops(self, lengths: np.ndarray, depth: int | None) -> float:
        key, cost = self._cost(depth)
        if key not in self.tables:
            per = cost.flops_per_token(self.positions)
            self.tables[key] = np.concatenate([[0.0], np.cumsum(per)])
        return float(self.tables[key][lengths].sum())

    def blocks(self, depth: int | None) -> float:
        key, cost = self._cost(depth)
        return float(cost.base_passes if key == 1 else cost.passes)

    def _shared(self) -> int:
        from loopeval.training.joint import shared_sites

        return shared_sites(self.loop.spec, self._cost(None)[1].base_passes)

    def step_blocks(self, forwards) -> tuple[float, float]:
        """(student blocks, teacher blocks) of one step."""
        shared = self._shared() if forwards.shared else 0
        return sum(self.blocks(d) for d in forwards.student) - shared, sum(self.blocks(d) for d in forwards.teacher)

    def step(self, lengths: np.ndarray, forwards) -> StepCost:
        flops = sum(self.flops(lengths, d) for d in forwards.student)
        if forwards.shared:
            if "shared" not in self.tables:
                per = self._cost(1)[1].prefix_flops_per_token(self.positions, self._shared())
                self.tables["shared"] = np.concatenate([[0.0], np.cumsum(per)])
            flops -= float(self.tables["shared"][lengths].sum())
        return StepCost(flops, sum(self.flops(lengths, d) for d in forwards.teacher), *self.step_blocks(forwards))

    @property
    def multiplier(self) -> float:
        return loop_cost(self.model, self.loop.spec if self.loop is not None else None).multiplier


def check_first_step(base_config, loop: LoopConfig | None, config: TrainConfig, recipe: Recipe) -> None:
    """Refuse a ``max_blocks`` below the first step's forward blocks (from the base's
    config, before any weights load)."""
    blocks = sum(_Cost(base_config, loop, 2).step_blocks(recipe.plan(0, recipe.depth(0) if loop is not None else None)))
    if blocks > config.max_blocks:
        role = LOOPED if loop is not None else TWIN
        raise ValueError(f"max_blocks {config.max_blocks:g}: one {recipe.name} step of the {role} model costs "
                         f"{blocks:g} forward blocks; nothing would train")


def _budget_stop(config: TrainConfig, blocks_after_next: float, seconds: float, accelerator) -> str | None:
    """Which cap stops training before the next step (``None``: none): ``max_blocks`` if
    the next step would pass it, ``max_seconds`` once the steps so far reach it (the
    run covers the time cap). Every process takes the same decision."""
    if config.max_blocks is not None and blocks_after_next > config.max_blocks:
        return "max_blocks"
    if config.max_seconds is not None:
        over = torch.tensor(float(seconds >= config.max_seconds), device=accelerator.device)
        if accelerator.reduce(over, "sum").item() > 0:
            return "max_seconds"
    return None


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def _versions() -> dict:
    from loopeval import __version__

    return {"loopeval": __version__, "python": platform.python_version(),
            **{name: version(name) for name in ("torch", "transformers", "accelerate", "peft")}}


def heldout_depths(loop: LoopConfig | None, config: TrainConfig) -> list[int]:
    """The pass counts at which a looped model's held-out loss is measured: 1..K, with K
    the deepest of its windows and of the ``passes`` range (none when a window has K = 1)."""
    if loop is None or any(w.times == 1 for w in loop.spec.windows):
        return []
    deepest = max(w.times for w in loop.spec.windows)
    return list(range(1, max(deepest, config.passes[1] if config.passes else 0) + 1))


def _heldout_loss(model, core, data: TrainData, depths: list[int | None], size: int, pad_id: int, accelerator) -> dict:
    """Mean held-out NLL per target token at each depth. Every process runs the same
    number of forwards (padding rows carry no targets), as wrapped models require."""
    rank, world = accelerator.process_index, accelerator.num_processes
    mine = list(range(rank, len(data), world))
    share = -(-len(data) // world)
    mine += [-1] * (share - len(mine))
    training = model.training
    model.eval()
    sums = torch.zeros(len(depths), device=accelerator.device)
    with torch.no_grad():
        for d, depth in enumerate(depths):
            with loop_passes(core, depth) if depth is not None else nullcontext():
                for i in range(0, share, size):
                    chunk = mine[i:i + size]
                    batch = collate(data, [max(r, 0) for r in chunk], pad_id, accelerator.device)
                    batch["labels"][torch.tensor(chunk, device=accelerator.device) < 0] = -100
                    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
                    sums[d] += nll_sum(logits, batch["labels"])
    model.train(training)
    means = (accelerator.reduce(sums, "sum") / int(data.targets.sum())).tolist()
    return dict(zip(depths, means))


@dataclass
class _Tally:
    """What the step loop accumulates for the manifest."""

    batches: object = field(default_factory=hashlib.sha256)  # the rows of every step, in order
    input_tokens: int = 0
    loss_tokens: int = 0
    forward_flops: float = 0.0
    teacher_flops: float = 0.0
    teacher_blocks: float = 0.0
    step_blocks: list = field(default_factory=list)
    step_seconds: list = field(default_factory=list)
    draws: list = field(default_factory=list)
    stopped_by: str | None = None
    curve: list = field(default_factory=list)
    terms_curve: dict = field(default_factory=dict)
    heldout_curve: list = field(default_factory=list)
    checkpoints: list = field(default_factory=list)
    window: list = field(default_factory=list)  # step losses since the last logged point
    terms_window: dict = field(default_factory=dict)

    def count(self, data: TrainData, rows: list[int], depth, step_cost: StepCost) -> int:
        """Count a step's rows, draw and cost; its number of target tokens."""
        update_batch_hash(self.batches, data, rows)
        n_targets = int(data.targets[rows].sum())
        self.input_tokens += int(data.lengths[rows].sum())
        self.loss_tokens += n_targets
        self.draws.append(depth)
        self.forward_flops += step_cost.flops
        self.teacher_flops += step_cost.teacher_flops
        self.step_blocks.append(step_cost.blocks + step_cost.teacher_blocks)
        self.teacher_blocks += step_cost.teacher_blocks
        return n_targets

    def add_loss(self, loss: torch.Tensor, terms: dict) -> None:
        self.window.append(loss)
        for name, value in terms.items():
            self.terms_window.setdefault(name, []).append(value)

    def check_draws(self) -> None:
        """Every process drew the same loop depths (they depend on the seed and step alone)."""
        from accelerate.utils import gather_object

        everyone = gather_object([self.draws])
        if any(d != self.draws for d in everyone):
            raise RuntimeError(f"loop draws differ between processes: {everyone}")

    def log(self, step: int) -> dict:
        """A point of the loss curve (and of each term's) at ``step``: the mean since the last; the bar's postfix."""
        self.curve.append([step, torch.stack(self.window).mean().item()])
        for name, values in self.terms_window.items():
            self.terms_curve.setdefault(name, []).append([step, torch.stack(values).mean().item()])
        self.window, self.terms_window = [], {}
        return dict(loss=f"{self.curve[-1][1]:.4f}",
                    **{name: f"{values[-1][1]:.4f}" for name, values in self.terms_curve.items()})


def _train_step(wrapped, core, recipe: Recipe, optimizer, rows: list[int], data: TrainData, *, step: int,
                depth, n_targets: int, pad_id: int, config: TrainConfig, accelerator) -> tuple[torch.Tensor, dict]:
    """One optimizer step on this process's share of the global batch ``rows`` (every
    ``world``-th row, in micro-batches) at loop depth ``depth``: this process's summed loss
    and loss terms (detached)."""
    world = accelerator.num_processes
    mine = rows[accelerator.process_index::world]
    size = config.micro_batch_size or len(mine)
    chunks = [mine[i:i + size] for i in range(0, len(mine), size)]
    for group in optimizer.param_groups:
        group["lr"] = config.lr_at(step)
    step_loss = torch.zeros((), device=accelerator.device)
    step_terms = {}
    with loop_passes(core, depth) if depth is not None else nullcontext():
        for k, chunk in enumerate(chunks):
            # gradients are all-reduced (averaged over processes) only after the last chunk
            with accelerator.no_sync(wrapped) if k < len(chunks) - 1 else nullcontext():
                loss, terms = recipe.losses(wrapped, collate(data, chunk, pad_id, accelerator.device))
                accelerator.backward(loss * (world / n_targets))
            step_loss += loss.detach()
            for name, value in terms.items():
                step_terms[name] = step_terms.get(name, 0.0) + value.detach()
    if config.grad_clip > 0:
        accelerator.clip_grad_norm_(wrapped.parameters(), config.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if accelerator.device.type == "cuda":
        torch.cuda.synchronize()
    return step_loss, step_terms


def _heldout_and_checkpoint(step: int, last: bool, tally: _Tally, *, wrapped, core, recipe: Recipe, tokenizer,
                            heldout: TrainData | None, depths: list, pad_id: int, out: Path, config: TrainConfig,
                            accelerator) -> float:
    """After ``step``: the held-out losses (at the last step and every ``save_every``) and an
    intermediate checkpoint (every ``save_every``); the seconds they took."""
    seconds = 0.0
    saving = bool(config.save_every) and (step + 1) % config.save_every == 0
    if heldout is not None and (last or saving):
        t0 = time.perf_counter()
        size = config.micro_batch_size or -(-len(heldout) // accelerator.num_processes)
        losses = _heldout_loss(wrapped, core, heldout, depths, size, pad_id, accelerator)
        point = {"step": step + 1, "tokens": tally.input_tokens, "loss": losses[None]}
        if len(depths) > 1:
            point["loss_by_passes"] = {str(d): losses[d] for d in depths[1:]}
        tally.heldout_curve.append(point)
        seconds += time.perf_counter() - t0
    if saving and not last:
        t0 = time.perf_counter()
        name = f"checkpoint-{step + 1}"
        if accelerator.is_main_process:
            record_written(out, name)
            save_model(recipe.checkpoint(accelerator.unwrap_model(wrapped)), tokenizer, out / name)
        accelerator.wait_for_everyone()
        tally.checkpoints.append({"step": step + 1, "tokens": tally.input_tokens, "path": name})
        seconds += time.perf_counter() - t0
    return seconds


def _load_base(base, loop: LoopConfig | None, config: TrainConfig):
    """The base model, looped iff ``loop`` and in training mode; its tokenizer, weights hash,
    parameter count and training cost."""
    model, tokenizer = load_model(base, dtype=getattr(torch, config.dtype))
    base_hash = weights_sha256(model)
    base_params = sum(p.numel() for p in model.parameters())
    cost = _Cost(model, loop, config.max_length)
    if loop is not None:
        apply_loop(model, loop)
    if config.activation_checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    model.train()
    return model, tokenizer, base_hash, base_params, cost


def _final_model(core, trained, recipe: Recipe, out: Path, *, base_params: int, keep_adapters: bool,
                 config: TrainConfig, accelerator):
    """The model ``recipe`` makes of ``trained`` (in eval mode; ``core``, the looped model inside
    it, without activation checkpointing), and its parameter count, which must be the base's."""
    if config.activation_checkpointing:
        core.activation_checkpointing_disable()
    out.mkdir(parents=True, exist_ok=True)
    if keep_adapters and config.recipe == "convert" and accelerator.is_main_process:
        record_written(out, ADAPTER_FOLDER)
    final = recipe.finish(trained, out, keep_adapters=keep_adapters and accelerator.is_main_process).eval()
    final_params = sum(p.numel() for p in final.parameters())
    if final_params != base_params:
        raise RuntimeError(f"the trained model has {final_params} parameters, the base {base_params}")
    return final, final_params


def train_one(base, data: TrainData, heldout: TrainData | None, loop: LoopConfig | None, out: Path, config: TrainConfig,
              recipe: Recipe, *, accelerator=None, progress: bool = True, keep_adapters: bool = False,
              bar_position: int = 0) -> TrainResult:
    """Train one model (looped iff ``loop``) by ``recipe`` and save it to ``out``;
    everything has been checked by the caller. ``bar_position``: the progress bar's line."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    accelerator = accelerator or Accelerator()
    world = accelerator.num_processes
    if config.batch_size % world:
        raise ValueError(f"batch_size {config.batch_size} is not a multiple of the {world} processes")
    role = LOOPED if loop is not None else TWIN

    core, tokenizer, base_hash, base_params, cost = _load_base(base, loop, config)
    trainable = recipe.prepare(core)
    set_seed(config.seed, device_specific=True)
    wrapped = accelerator.prepare(trainable)
    optimizer = accelerator.prepare(torch.optim.AdamW(
        _param_groups(wrapped, config.weight_decay), lr=config.lr, betas=config.betas))

    order = batch_order(len(data), batch_size=config.batch_size, steps=config.steps, seed=config.data_seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    depths_measured = [None, *heldout_depths(loop, config)] if loop is not None else [None]
    tally = _Tally()

    def plan(step: int):
        depth = recipe.depth(step) if loop is not None else None
        return depth, cost.step(data.lengths[order[step].numpy()], recipe.plan(step, depth))

    depth, step_cost = plan(0)
    bar = tqdm(total=config.steps, desc=f"{recipe.name} {role}", unit="step", position=bar_position,
               disable=not (progress and accelerator.is_main_process))
    started = time.perf_counter()
    eval_time = 0.0
    for step in range(config.steps):
        step_started = time.perf_counter()
        rows = order[step].tolist()
        n_targets = tally.count(data, rows, depth, step_cost)
        step_loss, step_terms = _train_step(wrapped, core, recipe, optimizer, rows, data, step=step, depth=depth,
                                            n_targets=n_targets, pad_id=pad_id, config=config, accelerator=accelerator)
        tally.step_seconds.append(time.perf_counter() - step_started)
        if step + 1 < config.steps:
            next_plan = plan(step + 1)  # the recipe plans its steps once each, in order
            following = next_plan[1].blocks + next_plan[1].teacher_blocks
            tally.stopped_by = _budget_stop(config, sum(tally.step_blocks) + following, sum(tally.step_seconds),
                                            accelerator)

        recipe.end_step(step, lambda t: accelerator.reduce(t, "sum") / n_targets)
        step_loss = accelerator.reduce(step_loss, "sum") / n_targets
        tally.add_loss(step_loss, {name: accelerator.reduce(value, "sum") / n_targets
                                   for name, value in step_terms.items()})
        last = step + 1 == config.steps or tally.stopped_by is not None
        if (step + 1) % config.log_every == 0 or last:
            bar.set_postfix(**tally.log(step + 1), refresh=False)
        eval_time += _heldout_and_checkpoint(step, last, tally, wrapped=wrapped, core=core, recipe=recipe,
                                             tokenizer=tokenizer, heldout=heldout, depths=depths_measured,
                                             pad_id=pad_id, out=out, config=config, accelerator=accelerator)
        bar.update()
        if last:
            break
        depth, step_cost = next_plan
    train_time = time.perf_counter() - started - eval_time  # the last .item() waited for the device
    bar.close()

    tally.check_draws()
    final, final_params = _final_model(core, accelerator.unwrap_model(wrapped), recipe, out, base_params=base_params,
                                       keep_adapters=keep_adapters, config=config, accelerator=accelerator)
    manifest = _manifest(tally, base=base, role=role, loop=loop, config=config, recipe=recipe, data=data,
                         heldout=heldout, cost=cost, final=final,
                         parameters={"base": base_params, "final": final_params, "added": recipe.added_parameters()},
                         base_hash=base_hash, keep_adapters=keep_adapters, train_time=train_time,
                         accelerator=accelerator)
    if accelerator.is_main_process:
        save_model(final, tokenizer, out)
        (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    accelerator.wait_for_everyone()
    accelerator.free_memory()  # drop the accelerator's references, so twins never share memory
    return TrainResult(out, manifest)


def _manifest(tally: _Tally, *, base, role: str, loop: LoopConfig | None, config: TrainConfig, recipe: Recipe,
              data: TrainData, heldout: TrainData | None, cost: _Cost, final, parameters: dict, base_hash: str,
              keep_adapters: bool, train_time: float, accelerator) -> dict:
    """The training manifest (:mod:`loopeval.training.manifest`), as ``read_manifest`` will return it."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "recipe": config.recipe,
        "role": role,
        "loop": loop.to_dict() if loop is not None else None,
        "loop_draws": recipe.draws(tally.draws) if loop is not None else None,
        "base": str(base),
        "base_weights_sha256": base_hash,
        "parameters": parameters,
        **recipe.record(),
        "data": data.summary(),
        "heldout": heldout.summary() if heldout is not None else None,
        "config": asdict(config),
        "batches_sha256": tally.batches.hexdigest(),
        "tokens": {"input": tally.input_tokens, "loss": tally.loss_tokens},
        "flops": {"forward": tally.forward_flops, "teacher_forward": tally.teacher_flops,
                  "train": TRAIN_FLOPS_PER_FORWARD * tally.forward_flops + tally.teacher_flops,
                  "multiplier": cost.multiplier},
        "blocks": {"total": sum(tally.step_blocks), "teacher": tally.teacher_blocks, "per_step": tally.step_blocks},
        "step_seconds": tally.step_seconds,
        "budget": {"steps_run": len(tally.step_blocks), "stopped_by": tally.stopped_by},
        "loss_curve": tally.curve,
        **({"loss_terms": tally.terms_curve} if tally.terms_curve else {}),
        "heldout_curve": tally.heldout_curve,
        "checkpoints": tally.checkpoints,
        "adapters": ADAPTER_FOLDER if keep_adapters and config.recipe == "convert" else None,
        "final_weights_sha256": weights_sha256(final),
        "train_time_s": train_time,
        "runtime": {"device": accelerator.device.type, "processes": accelerator.num_processes,
                    "mixed_precision": str(accelerator.mixed_precision)},
        "versions": _versions(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return json.loads(json.dumps(manifest))  # what read_manifest will return: lists, not tuples

