"""The per-item cost trace: written by the ``looped`` lm-eval model, read by ``runs``.

Its format lives here only. A trace is a JSON-lines file named
``loopeval_trace_<timestamp>[_rank<k>].jsonl``. The first line is a header::

    {"kind": "header", "format": 1, "created": <unix seconds>, "settings": {...}}

``settings`` holds the run's decoding settings and loop (budget forcing, reserve,
string, repetition stop, budget scale, loop spec, operator, cost multiplier,
dtype, batch size, chat template ...), so reports can check both sides of a
comparison used the same rules. Every following line is one generation request::

    {"kind": "item", "task": str, "doc_id": int, "idx": int, "prompt_hash": str,
     "prompt_tokens": int, "generated_tokens": int, "max_gen_toks": int,
     "finished": bool, "forced_at": int | null, "repetition_stop_at": int | null,
     "passes_per_token": int, "flops": float}

``prompt_hash`` is lm-eval's own (sha256 of the request context), so records join
lm-eval's ``samples_*.jsonl`` on ``(task, doc_id, prompt_hash)``. ``forced_at`` and
``repetition_stop_at`` are generated-token positions where the rule inserted its
string. Records are flushed per batch so a crash never loses finished work.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loopeval.jsonl import read_jsonl

FORMAT = 1
PREFIX = "loopeval_trace_"


def prompt_hash(context: str) -> str:
    """lm-eval's ``prompt_hash`` of a request context (``lm_eval.utils.hash_string``)."""
    return hashlib.sha256(context.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TraceItem:
    task: str
    doc_id: int
    idx: int
    prompt_hash: str
    prompt_tokens: int
    generated_tokens: int
    max_gen_toks: int
    finished: bool
    forced_at: int | None
    repetition_stop_at: int | None
    passes_per_token: int
    flops: float

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.task, self.doc_id, self.idx)


@dataclass
class Trace:
    path: Path
    created: float
    settings: dict
    items: list[TraceItem] = field(default_factory=list)


class TraceWriter:
    """Appends trace items to ``folder/loopeval_trace_<timestamp>[_rank<k>].jsonl``."""

    def __init__(self, folder: str | Path, settings: dict, *, rank: int = 0, world_size: int = 1):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%dT%H-%M-%S")
        suffix = f"_rank{rank}" if world_size > 1 else ""
        self.path = self.folder / f"{PREFIX}{stamp}{suffix}.jsonl"
        n = 1
        while self.path.exists():  # two runs within one second
            n += 1
            self.path = self.folder / f"{PREFIX}{stamp}.{n}{suffix}.jsonl"
        header = {"kind": "header", "format": FORMAT, "created": time.time(), "settings": settings}
        with self.path.open("w", encoding="utf-8") as f:
            f.write(json.dumps(header, sort_keys=True) + "\n")

    def write(self, items: list[TraceItem]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            for item in items:
                f.write(json.dumps({"kind": "item", **asdict(item)}, sort_keys=True) + "\n")


def read_trace(path: str | Path) -> Trace:
    """Read one trace file; a corrupt line raises ``ValueError`` naming the file and line."""
    path = Path(path)

    def parse(lineno: int, rec: dict):
        if lineno == 1:
            if rec.get("kind") != "header" or rec.get("format") != FORMAT:
                raise ValueError(f"not a loopeval trace header (format {FORMAT} expected)")
            return Trace(path=path, created=float(rec["created"]), settings=dict(rec["settings"]))
        rec.pop("kind")
        return TraceItem(**rec)

    trace = None
    for lineno, value in read_jsonl(path, parse, what="loopeval trace"):
        if lineno == 1:
            trace = value
        else:
            trace.items.append(value)
    if trace is None:
        raise ValueError(f"{path}: empty loopeval trace file")
    return trace


def find_traces(folder: str | Path) -> list[Trace]:
    """All trace files in ``folder`` (not recursive), oldest first."""
    return sorted((read_trace(p) for p in Path(folder).glob(f"{PREFIX}*.jsonl")), key=lambda t: t.created)
