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
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from loopeval.checkpoint import load_model, save_model
from loopeval.cost import loop_cost
from loopeval.loop import LoopConfig, apply_loop, loop_passes
from loopeval.manifest import MANIFEST_FORMAT, MANIFEST_NAME
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


class _Flops:
    """Forward FLOPs of rows of given lengths at a loop depth: the sum over a row's
    positions t = 1..L (position t attends to t tokens) of every call site and the LM head."""

    def __init__(self, model, loop: LoopConfig | None, max_length: int):
        self.model, self.loop, self.max_length, self.tables = model, loop, max_length, {}

    def __call__(self, lengths: np.ndarray, depth: int | None) -> float:
        key = 1 if self.loop is None else depth  # None: the loop's own depth
        if key not in self.tables:
            spec = None if key == 1 else self.loop.spec if key is None else self.loop.spec.at_depth(key)
            per = loop_cost(self.model, spec).flops_per_token(np.arange(1, self.max_length + 1))
            self.tables[key] = np.concatenate([[0.0], np.cumsum(per)])
        return float(self.tables[key][lengths].sum())

    @property
    def multiplier(self) -> float:
        return loop_cost(self.model, self.loop.spec if self.loop is not None else None).multiplier


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


def train_one(base, data: TrainData, heldout: TrainData | None, loop: LoopConfig | None, out: Path, config: TrainConfig,
              recipe: Recipe, *, accelerator=None, progress: bool = True, keep_adapters: bool = False) -> TrainResult:
    """Train one model (looped iff ``loop``) by ``recipe`` and save it to ``out``;
    everything has been checked by the caller."""
    from accelerate import Accelerator
    from accelerate.utils import gather_object, set_seed
    from tqdm.auto import tqdm

    accelerator = accelerator or Accelerator()
    rank, world = accelerator.process_index, accelerator.num_processes
    if config.batch_size % world:
        raise ValueError(f"batch_size {config.batch_size} is not a multiple of the {world} processes")
    role = LOOPED if loop is not None else TWIN

    model, tokenizer = load_model(base, dtype=getattr(torch, config.dtype))
    base_hash = weights_sha256(model)
    base_params = sum(p.numel() for p in model.parameters())
    flops = _Flops(model, loop, config.max_length)
    if loop is not None:
        apply_loop(model, loop)
    core = model
    if config.activation_checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    model.train()
    trainable = recipe.prepare(model)
    set_seed(config.seed, device_specific=True)
    wrapped = accelerator.prepare(trainable)
    optimizer = accelerator.prepare(torch.optim.AdamW(
        _param_groups(wrapped, config.weight_decay), lr=config.lr, betas=config.betas))

    order = batch_order(len(data), batch_size=config.batch_size, steps=config.steps, seed=config.data_seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    depths_measured = [None, *heldout_depths(loop, config)] if loop is not None else [None]
    batches_hash = hashlib.sha256()
    input_tokens = loss_tokens = 0
    forward_flops = teacher_flops = 0.0
    draws, curve, terms_curve, heldout_curve, checkpoints = [], [], {}, [], []
    window, terms_window = [], {}
    bar = tqdm(total=config.steps, desc=f"{recipe.name} {role}", unit="step",
               disable=not (progress and accelerator.is_main_process))
    started = time.perf_counter()
    eval_time = 0.0
    for step in range(config.steps):
        rows = order[step].tolist()
        update_batch_hash(batches_hash, data, rows)
        n_targets = int(data.targets[rows].sum())
        input_tokens += int(data.lengths[rows].sum())
        loss_tokens += n_targets
        depth = recipe.depth(step) if loop is not None else None
        draws.append(depth)
        forward_flops += flops(data.lengths[rows], depth)
        teacher_flops += recipe.teacher_forwards() * flops(data.lengths[rows], 1)

        mine = rows[rank::world]
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

        recipe.end_step(step, lambda t: accelerator.reduce(t, "sum") / n_targets)
        window.append(accelerator.reduce(step_loss, "sum") / n_targets)
        for name, value in step_terms.items():
            terms_window.setdefault(name, []).append(accelerator.reduce(value, "sum") / n_targets)
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            curve.append([step + 1, torch.stack(window).mean().item()])
            for name, values in terms_window.items():
                terms_curve.setdefault(name, []).append([step + 1, torch.stack(values).mean().item()])
            window, terms_window = [], {}
            bar.set_postfix(loss=f"{curve[-1][1]:.4f}", refresh=False)

        last = step + 1 == config.steps
        if heldout is not None and (last or (config.save_every and (step + 1) % config.save_every == 0)):
            t0 = time.perf_counter()
            size = config.micro_batch_size or -(-len(heldout) // world)
            losses = _heldout_loss(wrapped, core, heldout, depths_measured, size, pad_id, accelerator)
            point = {"step": step + 1, "tokens": input_tokens, "loss": losses[None]}
            if len(depths_measured) > 1:
                point["loss_by_passes"] = {str(d): losses[d] for d in depths_measured[1:]}
            heldout_curve.append(point)
            eval_time += time.perf_counter() - t0
        if config.save_every and (step + 1) % config.save_every == 0 and not last:
            t0 = time.perf_counter()
            name = f"checkpoint-{step + 1}"
            if accelerator.is_main_process:
                save_model(recipe.checkpoint(accelerator.unwrap_model(wrapped)), tokenizer, out / name)
            accelerator.wait_for_everyone()
            checkpoints.append({"step": step + 1, "tokens": input_tokens, "path": name})
            eval_time += time.perf_counter() - t0
        bar.update()
    train_time = time.perf_counter() - started - eval_time  # the last .item() waited for the device
    bar.close()

    everyone = gather_object([draws])
    if any(d != draws for d in everyone):
        raise RuntimeError(f"loop draws differ between processes: {everyone}")
    trained = accelerator.unwrap_model(wrapped)
    if config.activation_checkpointing:
        core.activation_checkpointing_disable()
    out.mkdir(parents=True, exist_ok=True)
    final = recipe.finish(trained, out, keep_adapters=keep_adapters and accelerator.is_main_process).eval()
    final_params = sum(p.numel() for p in final.parameters())
    if final_params != base_params:
        raise RuntimeError(f"the trained model has {final_params} parameters, the base {base_params}")
    manifest = {
        "format": MANIFEST_FORMAT,
        "recipe": config.recipe,
        "role": role,
        "loop": loop.to_dict() if loop is not None else None,
        "loop_draws": recipe.draws(draws) if loop is not None else None,
        "base": str(base),
        "base_weights_sha256": base_hash,
        "parameters": {"base": base_params, "final": final_params, "added": recipe.added_parameters()},
        **recipe.record(),
        "data": data.summary(),
        "heldout": heldout.summary() if heldout is not None else None,
        "config": asdict(config),
        "batches_sha256": batches_hash.hexdigest(),
        "tokens": {"input": input_tokens, "loss": loss_tokens},
        "flops": {"forward": forward_flops, "teacher_forward": teacher_flops,
                  "train": TRAIN_FLOPS_PER_FORWARD * forward_flops + teacher_flops, "multiplier": flops.multiplier},
        "loss_curve": curve,
        **({"loss_terms": terms_curve} if terms_curve else {}),
        "heldout_curve": heldout_curve,
        "checkpoints": checkpoints,
        "adapters": ADAPTER_FOLDER if keep_adapters and config.recipe == "convert" else None,
        "final_weights_sha256": weights_sha256(final),
        "train_time_s": train_time,
        "runtime": {"device": accelerator.device.type, "processes": world, "mixed_precision": str(accelerator.mixed_precision)},
        "versions": _versions(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    manifest = json.loads(json.dumps(manifest))  # what read_manifest will return: lists, not tuples
    if accelerator.is_main_process:
        save_model(final, tokenizer, out)
        (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    accelerator.wait_for_everyone()
    accelerator.free_memory()  # drop the accelerator's references, so twins never share memory
    return TrainResult(out, manifest)

