"""Training data: reading and tokenising JSONL rows, packing plain text, the batch order,
padded micro-batches, and keeping held-out rows out of training."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from loopeval.training.decontamination import decontamination_record


@dataclass(frozen=True)
class TrainData:
    """Tokenised training rows: row ``i`` is ``tokens[offsets[i]:offsets[i+1]]`` and its
    loss covers positions ``starts[i]`` onwards (each predicted from the one before).
    Packed data (``packed``) is one token stream cut into rows of ``max_length``."""

    path: Path
    sha256: str  # of the file's bytes
    tokens: np.ndarray
    offsets: np.ndarray
    starts: np.ndarray
    chat_rows: int
    text_rows: int
    truncated: int  # rows cut to max_length (0 when packed)
    packed: bool
    decontamination: dict | None  # the record of `loopeval decontaminate` that made this file, if any

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
                "text_rows": self.text_rows, "rows_truncated": self.truncated, "packed": self.packed,
                "tokens": int(self.offsets[-1]), "decontamination": self.decontamination}


def _read_rows(path: Path) -> tuple[bytes, list[tuple[int, dict]], list[tuple[int, dict]]]:
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
    return raw, chat, text


def load_data(path: str | Path, tokenizer, *, max_length: int, pack: bool = False) -> TrainData:
    """Read and tokenise a JSONL file of ``{"prompt", "completion"}`` and ``{"text"}`` rows.

    A chat row is the prompt as one user turn through the chat template (with the
    generation prompt), then the completion and EOS; only the completion and EOS are
    trained on. A text row is tokenised as is and trained on whole. Rows longer than
    ``max_length`` are cut. ``pack=True`` (continued pretraining) takes text rows only,
    ends each with EOS, joins them into one stream and cuts it into rows of
    ``max_length`` tokens (the last one shorter), trained on every token after the
    first. Raises ``ValueError`` naming the file and line for a bad row, or one that
    keeps no token to train on.
    """
    path = Path(path)
    raw, chat, text = _read_rows(path)
    if pack and chat:
        raise ValueError(f"{path}:{chat[0][0]}: continued pretraining packs plain text; got a prompt/completion row")
    if chat and tokenizer.chat_template is None:
        raise ValueError(f"{path}: prompt/completion rows need a chat template, and the tokenizer has none; use 'text' rows")
    if (chat or pack) and tokenizer.eos_token_id is None:
        raise ValueError(f"{path}: {'packed' if pack else 'prompt/completion'} rows end with EOS, and the tokenizer has no eos_token")
    sha256 = hashlib.sha256(raw).hexdigest()
    record = decontamination_record(path, sha256)

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
            if not ids:
                raise ValueError(f"{path}:{lineno}: no token left to train on (the text tokenises to no tokens)")
            rows.append((lineno, ids, 1))
    rows.sort(key=lambda r: r[0])  # file order, whatever the mix of kinds

    if pack:
        stream = np.concatenate([np.array([*ids, tokenizer.eos_token_id], dtype=np.int64) for _, ids, _ in rows])
        offsets = np.append(np.arange(0, len(stream), max_length), len(stream))
        if offsets[-1] - offsets[-2] < 2:  # a one-token tail has nothing to predict
            offsets = np.delete(offsets, -2)
        return TrainData(path=path, sha256=sha256, tokens=stream, offsets=offsets.astype(np.int64),
                         starts=np.ones(len(offsets) - 1, dtype=np.int64), chat_rows=0, text_rows=len(text),
                         truncated=0, packed=True, decontamination=record)

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
        sha256=sha256,
        tokens=np.fromiter((t for _, ids, _ in rows for t in ids[:max_length]), dtype=np.int64, count=sum(lengths)),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        starts=np.array([start for _, _, start in rows], dtype=np.int64),
        chat_rows=len(chat),
        text_rows=len(text),
        truncated=truncated,
        packed=False,
        decontamination=record,
    )


def check_separate(data: str | Path, heldout: str | Path) -> None:
    """Raise ``ValueError`` if a held-out row (a JSONL line, compared after stripping
    whitespace around it) is also a training row: held-out loss must be on unseen rows."""
    def rows(p):
        if not Path(p).is_file():
            raise FileNotFoundError(f"held-out data {p}: no such file")
        return {line.strip(): n for n, line in enumerate(Path(p).read_text().split("\n"), start=1) if line.strip()}

    train, held = rows(data), rows(heldout)
    shared = sorted(held[line] for line in held.keys() & train.keys())
    if shared:
        raise ValueError(f"held-out data {heldout}: {len(shared)} row(s) also in the training data {data} "
                         f"(first at line {shared[0]}); held-out loss must be measured on unseen rows")


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


def update_batch_hash(h, data: TrainData, rows: list[int]) -> None:
    """Feed one batch (each row's length, loss start and token ids) into the rolling hash ``h``."""
    for i in rows:
        ids, start = data.row(i)
        h.update(np.array([len(ids), start], dtype="<i8").tobytes())
        h.update(ids.astype("<i8").tobytes())


def collate(data: TrainData, rows: list[int], pad_id: int, device) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``labels`` (-100 off the targets) of ``rows``,
    right-padded to the longest."""
    width = int(max(data.lengths[i] for i in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for r, i in enumerate(rows):
        row, start = data.row(i)
        ids[r, :len(row)] = torch.from_numpy(row)
        mask[r, :len(row)] = 1
        labels[r, start:len(row)] = ids[r, start:len(row)]
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}
