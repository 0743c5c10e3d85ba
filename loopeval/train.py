"""Twin training: an unlooped twin and a looped model, trained identically (paper §3, A.3).

The equal-parameter test compares a looped model with its twin: the same base checkpoint
fine-tuned on the same data, in the same batches and order, for the same steps, with the
same seeds, without the loop. ``train_twins`` trains both; ``train_model`` trains one
(looped iff ``loop``), so the two can run as separate jobs and still be twins.

Training is full fine-tuning with AdamW through ``accelerate.Accelerator``: one process
on CPU or GPU, or data-parallel under ``accelerate launch``. Every process builds the
same global batch sequence from ``data_seed`` and takes every ``world``-th row of each
batch; the loss of a step is the mean over the global batch's target tokens, so the
world size and the micro-batch size do not change what is optimised.

The loop is ``apply_loop`` on the loaded base model: hooks, no new parameters, and
gradients flow through every pass. Its ``mix`` logit is a fixed hyper-parameter, never
learned, so both twins have exactly the base model's parameters.

Each output folder is a ``save_model`` checkpoint plus ``training_manifest.json``, which
records what a report needs to confirm the twins are twins (hashes of the data, the
initial weights and every batch) and what legitimately differs (loop, FLOPs, losses).
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import cached_property
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from loopeval.checkpoint import load_model, save_model
from loopeval.cost import loop_cost
from loopeval.loop import LoopConfig, LoopSpec, apply_loop, resolve_loop
from loopeval.manifest import MANIFEST_FORMAT, MANIFEST_NAME

TWIN, LOOPED = "twin", "looped"  # sub-folders of train_twins' ``out``
TRAIN_FLOPS_PER_FORWARD = 3  # forward + backward (twice the forward's FLOPs)
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained; twins share all of it.

    ``batch_size`` is the global batch in rows; ``micro_batch_size`` (rows per forward
    on each process; ``None``: all of its share) and ``activation_checkpointing`` only
    trade memory for time, up to float rounding. The
    learning rate warms up linearly for ``warmup`` steps, then follows a cosine to
    ``min_lr_ratio * lr``. Weight decay applies to matrices and embeddings, not to
    norms and biases. ``seed`` seeds dropout and every other random draw in training,
    ``data_seed`` the batch order. ``dtype`` is the dtype the weights load and train in;
    mixed precision is ``accelerate launch --mixed_precision bf16``.
    """

    steps: int = 1000
    batch_size: int = 32
    micro_batch_size: int | None = None
    lr: float = 1e-5
    min_lr_ratio: float = 0.1
    warmup: int = 0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    max_length: int = 2048
    seed: int = 0
    data_seed: int = 0
    dtype: str = "float32"
    activation_checkpointing: bool = False
    log_every: int = 10

    def __post_init__(self):
        def need(ok: bool, what: str):
            if not ok:
                raise ValueError(f"TrainConfig: {what}")

        need(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        need(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        need(self.micro_batch_size is None or self.micro_batch_size >= 1,
             f"micro_batch_size must be >= 1 or None, got {self.micro_batch_size}")
        need(self.lr > 0 and math.isfinite(self.lr), f"lr must be > 0, got {self.lr}")
        need(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
        need(0 <= self.warmup <= self.steps, f"warmup must lie in [0, steps={self.steps}], got {self.warmup}")
        need(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        need(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas), f"betas must be two values in [0, 1), got {self.betas}")
        need(self.grad_clip >= 0, f"grad_clip must be >= 0 (0: no clipping), got {self.grad_clip}")
        need(self.max_length >= 2, f"max_length must be >= 2, got {self.max_length}")
        need(self.dtype in DTYPES, f"dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        need(self.log_every >= 1, f"log_every must be >= 1, got {self.log_every}")

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


# -- data ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainData:
    """Tokenized training rows, packed: row ``i`` is ``tokens[offsets[i]:offsets[i+1]]``
    and its loss covers positions ``starts[i]`` onwards (each predicted from the one before)."""

    path: Path
    sha256: str  # of the file's bytes
    tokens: np.ndarray
    offsets: np.ndarray
    starts: np.ndarray
    chat_rows: int
    text_rows: int
    truncated: int  # rows cut to max_length

    def __len__(self) -> int:
        return len(self.starts)

    @cached_property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @cached_property
    def targets(self) -> np.ndarray:
        """Loss tokens per row."""
        return self.lengths - self.starts

    def row(self, i: int) -> tuple[np.ndarray, int]:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]], int(self.starts[i])

    def summary(self) -> dict:
        return {"path": str(self.path), "sha256": self.sha256, "rows": len(self), "chat_rows": self.chat_rows,
                "text_rows": self.text_rows, "rows_truncated": self.truncated}


def load_data(path: str | Path, tokenizer, *, max_length: int) -> TrainData:
    """Read and tokenize a JSONL file of ``{"prompt", "completion"}`` and ``{"text"}`` rows.

    A chat row is the prompt as one user turn through the chat template (with the
    generation prompt), then the completion and EOS; only the completion and EOS are
    trained on. A text row is tokenized as is and trained on whole. Rows longer than
    ``max_length`` are cut. Raises ``ValueError`` naming the file and line for a bad
    row, or one that keeps no token to train on.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training data {path}: no such file")
    raw = path.read_bytes()
    try:
        lines = raw.decode("utf-8").split("\n")  # not splitlines(): JSON strings may hold U+2028
    except UnicodeDecodeError as exc:
        raise ValueError(f"training data {path}: not UTF-8 ({exc})") from None
    chat, text = [], []  # (line number, row)
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if isinstance(row, dict) and set(row) >= {"prompt", "completion"} and "text" not in row:
            if not (isinstance(row["prompt"], str) and isinstance(row["completion"], str)):
                raise ValueError(f"{path}:{lineno}: 'prompt' and 'completion' must be strings")
            chat.append((lineno, row))
        elif isinstance(row, dict) and "text" in row and not {"prompt", "completion"} & set(row):
            if not isinstance(row["text"], str):
                raise ValueError(f"{path}:{lineno}: 'text' must be a string")
            text.append((lineno, row))
        else:
            raise ValueError(f"{path}:{lineno}: expected an object with 'prompt' and 'completion', or with 'text'; got {line.strip()[:80]!r}")
    if not chat and not text:
        raise ValueError(f"training data {path}: no rows")
    if chat and tokenizer.chat_template is None:
        raise ValueError(f"{path}: prompt/completion rows need a chat template, and the tokenizer has none; use 'text' rows")
    if chat and tokenizer.eos_token_id is None:
        raise ValueError(f"{path}: prompt/completion rows end with EOS, and the tokenizer has no eos_token")

    rows = []  # (line number, ids, start)
    if chat:
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                                 add_generation_prompt=True) for _, r in chat]
        prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer([r["completion"] for _, r in chat], add_special_tokens=False)["input_ids"]
        for (lineno, _), p, c in zip(chat, prompt_ids, completion_ids):
            rows.append((lineno, p + c + [tokenizer.eos_token_id], max(len(p), 1)))
    if text:
        for (lineno, _), ids in zip(text, tokenizer([r["text"] for _, r in text])["input_ids"]):
            rows.append((lineno, ids, 1))
    rows.sort(key=lambda r: r[0])  # file order, whatever the mix of kinds

    truncated = 0
    for lineno, ids, start in rows:
        if len(ids) > max_length:
            truncated += 1
        if min(len(ids), max_length) <= start:
            raise ValueError(f"{path}:{lineno}: no token left to train on ({len(ids)} tokens, loss from token "
                             f"{start}, max_length {max_length})")
    lengths = [min(len(ids), max_length) for _, ids, _ in rows]
    return TrainData(
        path=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        tokens=np.fromiter((t for _, ids, _ in rows for t in ids[:max_length]), dtype=np.int64, count=sum(lengths)),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        starts=np.array([start for _, _, start in rows], dtype=np.int64),
        chat_rows=len(chat),
        text_rows=len(text),
        truncated=truncated,
    )


def batch_order(num_rows: int, *, batch_size: int, steps: int, seed: int) -> torch.Tensor:
    """Row indices of every global batch, ``[steps, batch_size]``: a stream of fresh
    random permutations of the rows (one per epoch, drawn from a ``torch.Generator``
    seeded with ``seed``), cut into consecutive batches."""
    if num_rows < 1:
        raise ValueError(f"batch_order: no rows to draw batches from (num_rows={num_rows})")
    generator = torch.Generator().manual_seed(seed)
    need = steps * batch_size
    epochs = [torch.randperm(num_rows, generator=generator) for _ in range(-(-need // num_rows))]
    return torch.cat(epochs)[:need].view(steps, batch_size)


# -- hashes --------------------------------------------------------------------------


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 of the state dict: every tensor's name, dtype, shape and bytes, by name."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _update_batch_hash(h, data: TrainData, rows: list[int]) -> None:
    for i in rows:
        ids, start = data.row(i)
        h.update(np.array([len(ids), start], dtype="<i8").tobytes())
        h.update(ids.astype("<i8").tobytes())


# -- training ------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainResult:
    """Where a trained model was saved, and its training manifest."""

    path: Path
    manifest: dict

    @property
    def loss_curve(self) -> list[tuple[int, float]]:
        return [(step, loss) for step, loss in self.manifest["loss_curve"]]


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ValueError(f"output folder {out} exists and is not empty; choose another or pass overwrite=True (--overwrite)")


def _resolve(base: str | Path, loop, operator: str, beta: float, mix: float | None) -> LoopConfig | None:
    """The loop to train (``None``: the twin), checked against ``base`` before weights load.
    Twins start from an unlooped checkpoint, so a looped base is refused."""
    stored = resolve_loop(base)
    if stored is not None:
        raise ValueError(f"base checkpoint {base} is looped ({stored.spec}); twins start from an unlooped checkpoint")
    if loop is None:
        return None
    return resolve_loop(base, loop, operator=operator, beta=beta, mix=mix)


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def _loss_sum(model, data: TrainData, rows: list[int], pad_id: int, device) -> torch.Tensor:
    """Summed next-token loss over the target tokens of ``rows``, right-padded to the longest."""
    width = int(max(data.lengths[i] for i in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for r, i in enumerate(rows):
        row, start = data.row(i)
        ids[r, :len(row)] = torch.from_numpy(row)
        mask[r, :len(row)] = 1
        labels[r, start:len(row)] = ids[r, start:len(row)]
    ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100, reduction="sum")


def _versions() -> dict:
    from loopeval import __version__

    return {"loopeval": __version__, "python": platform.python_version(),
            **{name: version(name) for name in ("torch", "transformers", "accelerate")}}


def _train(base, data: TrainData, loop: LoopConfig | None, out: Path, config: TrainConfig, accelerator, progress: bool) -> TrainResult:
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    accelerator = accelerator or Accelerator()
    rank, world = accelerator.process_index, accelerator.num_processes
    if config.batch_size % world:
        raise ValueError(f"batch_size {config.batch_size} is not a multiple of the {world} processes")
    role = LOOPED if loop is not None else TWIN

    model, tokenizer = load_model(base, dtype=getattr(torch, config.dtype))
    base_hash = weights_sha256(model)
    cost = loop_cost(model, loop.spec if loop is not None else None)
    # forward FLOPs of a row of length L: the sum over its positions t = 1..L (position t
    # attends to t tokens), every position through every call site and the LM head.
    prefix_flops = np.concatenate([[0.0], np.cumsum(cost.flops_per_token(np.arange(1, config.max_length + 1)))])
    if loop is not None:
        apply_loop(model, loop)
    if config.activation_checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    model.train()
    set_seed(config.seed, device_specific=True)
    model = accelerator.prepare(model)
    optimizer = accelerator.prepare(torch.optim.AdamW(
        _param_groups(model, config.weight_decay), lr=config.lr, betas=config.betas))

    order = batch_order(len(data), batch_size=config.batch_size, steps=config.steps, seed=config.data_seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    batches_hash = hashlib.sha256()
    input_tokens = loss_tokens = 0
    forward_flops = 0.0
    curve, window = [], []
    bar = tqdm(total=config.steps, desc=role, unit="step", disable=not (progress and accelerator.is_main_process))
    started = time.perf_counter()
    for step in range(config.steps):
        rows = order[step].tolist()
        _update_batch_hash(batches_hash, data, rows)
        n_targets = int(data.targets[rows].sum())
        input_tokens += int(data.lengths[rows].sum())
        loss_tokens += n_targets
        forward_flops += float(prefix_flops[data.lengths[rows]].sum())

        mine = rows[rank::world]
        size = config.micro_batch_size or len(mine)
        chunks = [mine[i:i + size] for i in range(0, len(mine), size)]
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(step)
        step_loss = torch.zeros((), device=accelerator.device)
        for k, chunk in enumerate(chunks):
            # gradients are all-reduced (averaged over processes) only after the last chunk
            with accelerator.no_sync(model) if k < len(chunks) - 1 else nullcontext():
                loss = _loss_sum(model, data, chunk, pad_id, accelerator.device)
                accelerator.backward(loss * (world / n_targets))
            step_loss += loss.detach()
        if config.grad_clip > 0:
            accelerator.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        window.append(accelerator.reduce(step_loss, "sum") / n_targets)
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            curve.append([step + 1, torch.stack(window).mean().item()])
            window = []
            bar.set_postfix(loss=f"{curve[-1][1]:.4f}", refresh=False)
        bar.update()
    train_time = time.perf_counter() - started  # the last step's loss .item() waited for the device
    bar.close()

    model = accelerator.unwrap_model(model)
    if config.activation_checkpointing:
        model.activation_checkpointing_disable()
    model.eval()
    manifest = {
        "format": MANIFEST_FORMAT,
        "role": role,
        "loop": loop.to_dict() if loop is not None else None,
        "base": str(base),
        "base_weights_sha256": base_hash,
        "data": data.summary(),
        "config": asdict(config),
        "batches_sha256": batches_hash.hexdigest(),
        "tokens": {"input": input_tokens, "loss": loss_tokens},
        "flops": {"forward": forward_flops, "train": TRAIN_FLOPS_PER_FORWARD * forward_flops,
                  "multiplier": cost.multiplier},
        "loss_curve": curve,
        "final_weights_sha256": weights_sha256(model),
        "train_time_s": train_time,
        "runtime": {"device": accelerator.device.type, "processes": world, "mixed_precision": str(accelerator.mixed_precision)},
        "versions": _versions(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    manifest = json.loads(json.dumps(manifest))  # what read_manifest will return: lists, not tuples
    if accelerator.is_main_process:
        save_model(model, tokenizer, out)
        (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    accelerator.wait_for_everyone()
    accelerator.free_memory()  # drop the accelerator's references, so twins never share memory
    return TrainResult(out, manifest)


def train_model(base: str | Path, data: str | Path, *, out: str | Path, loop: str | LoopSpec | None = None, operator: str = "repeat",
                beta: float = 0.0, mix: float | None = None, config: TrainConfig | None = None,
                accelerator=None, overwrite: bool = False, progress: bool = True) -> TrainResult:
    """Fully fine-tune the unlooped checkpoint ``base`` on the JSONL file ``data``, looped
    iff ``loop`` (a spec; ``operator``, ``beta`` and the fixed ``mix`` logit as in
    ``apply_loop``), and save it with its manifest to ``out``.

    The loop, ``out`` (must be empty unless ``overwrite``), the base and every data row
    are checked before any weights load.
    """
    config = config or TrainConfig()
    out = Path(out)
    _check_out(out, overwrite)
    looped = _resolve(base, loop, operator, beta, mix)
    from transformers import AutoTokenizer

    rows = load_data(data, AutoTokenizer.from_pretrained(base), max_length=config.max_length)
    return _train(base, rows, looped, out, config, accelerator, progress)


def train_twins(base: str | Path, data: str | Path, *, loop: str | LoopSpec, out: str | Path, operator: str = "repeat",
                beta: float = 0.0, mix: float | None = None, config: TrainConfig | None = None,
                accelerator=None, overwrite: bool = False, progress: bool = True) -> tuple[TrainResult, TrainResult]:
    """Train the unlooped twin into ``out/twin`` and the looped model into ``out/looped``,
    each from a fresh load of ``base``, on the same tokenized rows and batches.
    Returns ``(twin, looped)``. Everything is checked before the twin starts."""
    config = config or TrainConfig()
    out = Path(out)
    for sub in (TWIN, LOOPED):
        _check_out(out / sub, overwrite)
    looped = _resolve(base, loop, operator, beta, mix)
    from transformers import AutoTokenizer

    rows = load_data(data, AutoTokenizer.from_pretrained(base), max_length=config.max_length)
    twin = _train(base, rows, None, out / TWIN, config, accelerator, progress)
    return twin, _train(base, rows, looped, out / LOOPED, config, accelerator, progress)
