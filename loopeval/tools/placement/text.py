"""The held-out text a placement search scores: read, split by tokens, tokenized into rows.

Each JSON line holds one document, ``{"text": "..."}``. Whole documents go to the
validation part (temperature fitting) or the test part (scoring), balanced by tokens:
taken in the order of their text's SHA-256 (so the split does not depend on file order),
each goes to the part that brings the validation share of the tokens closest to
``val_fraction``; the parts then differ from their shares by at most one document's
tokens. (A split by document alone gave 1,599 validation and 440 test tokens on 2,048
tokens of GSM8K.) Each part is one token stream (every document followed by EOS, when
the tokenizer has one) cut into rows of ``seq_len`` tokens; a row's first token is
context only, and the last row is right-padded (padding is never scored, and a causal
model never attends to it). ``Part.docs`` keeps each position's document, the unit the
confidence intervals resample.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from loopeval.common.jsonl import read_jsonl

SPLITS = ("val", "test")


def split_documents(texts: list[str], lengths: list[int], val_fraction: float) -> list[str]:
    """``"val"`` or ``"test"`` for each document, token-balanced (module docstring):
    ``|val tokens - val_fraction * all tokens| <= max(val_fraction, 1 - val_fraction) *
    the longest document``."""
    order = sorted(range(len(texts)), key=lambda i: (hashlib.sha256(texts[i].encode("utf-8")).digest(), i))
    out = [""] * len(texts)
    val = total = 0
    for i in order:
        total += lengths[i]
        target = val_fraction * total
        if abs(val + lengths[i] - target) <= abs(val - target):
            out[i], val = "val", val + lengths[i]
        else:
            out[i] = "test"
    return out


@dataclass(frozen=True)
class Part:
    """One part of the text: ``ids`` and ``labels`` are ``(rows, seq_len)``; a label of
    -100 is not scored (padding, and each row's first position's predecessor)."""

    ids: torch.Tensor
    labels: torch.Tensor
    documents: int
    docs: torch.Tensor  # (rows, seq_len): each position's document, 0..documents-1 (-1: padding)

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


def _rows(stream: list[int], owners: list[int], seq_len: int, pad_id: int) -> tuple[torch.Tensor, ...]:
    n = max(1, -(-len(stream) // seq_len))
    ids = torch.full((n, seq_len), pad_id, dtype=torch.long)
    ids.view(-1)[: len(stream)] = torch.tensor(stream, dtype=torch.long)
    labels = torch.full((n, seq_len), -100, dtype=torch.long)
    labels.view(-1)[: len(stream)] = ids.view(-1)[: len(stream)]
    labels[:, 0] = -100  # a row's first token has no context in that row
    docs = torch.full((n, seq_len), -1, dtype=torch.long)
    docs.view(-1)[: len(owners)] = torch.tensor(owners, dtype=torch.long)
    return ids, labels, docs


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
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    budget = max_tokens
    kept, tokens = [], []
    for doc, ids in zip(documents, tokenizer(documents)["input_ids"]):
        if budget is not None and budget <= 0:
            break
        ids = list(ids) + eos
        if budget is not None:
            ids, budget = ids[:budget], budget - len(ids)
        kept.append(doc)
        tokens.append(ids)
    streams = {s: [] for s in SPLITS}
    owners = {s: [] for s in SPLITS}
    counts = {s: 0 for s in SPLITS}
    for split, ids in zip(split_documents(kept, [len(t) for t in tokens], val_fraction), tokens):
        streams[split] += ids
        owners[split] += [counts[split]] * len(ids)
        counts[split] += 1
    parts = {}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or [0])[0]
    for split in SPLITS:
        if len(streams[split]) < 2:
            raise ValueError(
                f"text {path}: too short; the {split} part has {len(streams[split])} token(s) from "
                f"{counts[split]} of {sum(counts.values())} document(s) (documents are split by tokens, "
                f"val_fraction {val_fraction}); each part needs at least 2 tokens: give more documents"
            )
        ids, labels, docs = _rows(streams[split], owners[split], seq_len, pad)
        parts[split] = Part(ids, labels, counts[split], docs)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return ScoringText(path, sha, parts["val"], parts["test"])
