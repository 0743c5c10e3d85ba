"""The held-out text a placement search scores: read, split by hash, tokenized into rows.

Each JSON line holds one document, ``{"text": "..."}``. A document goes to the
validation part (temperature fitting) or the test part (scoring) by a hash of its text,
so the split does not depend on file order, ``--max-tokens`` or the tokenizer. Each part
is one token stream (every document followed by EOS, when the tokenizer has one) cut
into rows of ``seq_len`` tokens; a row's first token is context only, and the last row
is right-padded (padding is never scored, and a causal model never attends to it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from loopeval.common.jsonl import read_jsonl

SPLITS = ("val", "test")


def split_of(text: str, val_fraction: float) -> str:
    """``"val"`` or ``"test"``: the document's SHA-256, read as a fraction in [0, 1), against ``val_fraction``."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "val" if int.from_bytes(digest[:8], "big") / 2**64 < val_fraction else "test"


@dataclass(frozen=True)
class Part:
    """One part of the text: ``ids`` and ``labels`` are ``(rows, seq_len)``; a label of
    -100 is not scored (padding, and each row's first position's predecessor)."""

    ids: torch.Tensor
    labels: torch.Tensor
    documents: int

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    @property
    def tokens(self) -> int:
        """Scored tokens."""
        return int((self.labels != -100).sum())


@dataclass(frozen=True)
class ScoringText:
    path: Path
    sha256: str
    val: Part
    test: Part

    def part(self, split: str) -> Part:
        return self.val if split == "val" else self.test


def _read_documents(path: Path) -> list[str]:
    def parse(lineno, row):
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ValueError("expected an object with a 'text' string")
        return row["text"]

    return [text for _, text in read_jsonl(path, parse, what="text")]


def _rows(stream: list[int], seq_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(1, -(-len(stream) // seq_len))
    ids = torch.full((n, seq_len), pad_id, dtype=torch.long)
    ids.view(-1)[: len(stream)] = torch.tensor(stream, dtype=torch.long)
    labels = torch.full((n, seq_len), -100, dtype=torch.long)
    labels.view(-1)[: len(stream)] = ids.view(-1)[: len(stream)]
    labels[:, 0] = -100  # a row's first token has no context in that row
    return ids, labels


def load_text(path: str | Path, tokenizer, *, seq_len: int = 1024, val_fraction: float = 0.5,
              max_tokens: int | None = None) -> ScoringText:
    """Read, split and tokenize ``path``. Documents are taken in file order until the two
    parts hold ``max_tokens`` tokens in all (the last one cut). Raises ``ValueError``
    naming the file for an empty file, a bad line (with its number) or a part with no
    token to score."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"text {path}: no such file")
    if seq_len < 2:
        raise ValueError(f"seq_len {seq_len}: must be >= 2 (a row scores seq_len - 1 tokens)")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction {val_fraction}: must lie strictly between 0 and 1")
    if max_tokens is not None and max_tokens < 4:
        raise ValueError(f"max_tokens {max_tokens}: must be >= 4 (two tokens in each part)")
    documents = _read_documents(path)
    if not documents:
        raise ValueError(f"text {path}: no documents; expected JSON lines such as {{\"text\": \"...\"}}")
    streams = {s: [] for s in SPLITS}
    counts = {s: 0 for s in SPLITS}
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    budget = max_tokens
    for doc, ids in zip(documents, tokenizer(documents)["input_ids"]):
        if budget is not None and budget <= 0:
            break
        ids = list(ids) + eos
        if budget is not None:
            ids, budget = ids[:budget], budget - len(ids)
        split = split_of(doc, val_fraction)
        streams[split] += ids
        counts[split] += 1
    parts = {}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or [0])[0]
    for split in SPLITS:
        if len(streams[split]) < 2:
            raise ValueError(
                f"text {path}: too short; the {split} part has {len(streams[split])} token(s) from "
                f"{counts[split]} of {sum(counts.values())} document(s) (documents are split by hash, "
                f"val_fraction {val_fraction}); each part needs at least 2 tokens: give more documents"
            )
        ids, labels = _rows(streams[split], seq_len, pad)
        parts[split] = Part(ids, labels, counts[split])
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return ScoringText(path, sha, parts["val"], parts["test"])
