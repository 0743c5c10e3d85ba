"""The per-item cost trace: written by the ``looped`` lm-eval model, read by ``runs``.

Its format lives here only. A trace is a JSON-lines file named
``loopeval_trace_<timestamp>[_rank<k>].jsonl``. The first line is the header::

    {"kind": "header", "format": 2, "created": <unix seconds>, "model": str,
     "loop": {"loop", "operator", "beta", "mix"[, "mix_source"]} | null, "exit_after": int | null,
     "cost": {...LoopCost.summary()},
     "decoding": {...DecodingSettings}, "cache_check": {"ok", "max_abs_diff", "error", "decided_in",
     "rounding_gap"} | null,
     "versions": {...}, "generation": {"cache_implementation", "compile"}, "files": {arg: sha256}}

``decoding`` holds exactly the settings both sides of a comparison must share
(:class:`DecodingSettings`); the loop and its cost are what legitimately differ.
``exit_after`` (004's fixed exit) is part of the looped side's loop, not a shared
setting (a twin has no loop): ``loop`` is the loop as evaluated, every window at
``K = exit_after``, and ``cost`` is that of those k steps.

``files`` is the content of the loaded files besides the weights (configs, tokenizer, chat
template, loop: :func:`loopeval.evaluation.identity.loaded_fingerprint` without weight files),
per model arg that loads some (``pretrained``, ``tokenizer``, ``peft``, ``delta``).
``generation`` records how ``generate`` ran (cache implementation, compiled decoding):
settings that change speed but not outputs, so they are recorded, not compared.
Every following line is one generation request::

    {"kind": "item", "task": str, "doc_id": int, "idx": int, "prompt_hash": str,
     "prompt_tokens": int, "generated_tokens": int, "max_gen_toks": int,
     "finished": bool, "forced_at": int | null, "repetition_stop_at": int | null,
     "passes_per_token": float, "flops": float, "bf_reserve": int | null,
     "forcing_skipped": str | null}

``prompt_hash`` is lm-eval's own (sha256 of the request context), so records join
lm-eval's ``samples_*.jsonl`` on ``(task, doc_id, prompt_hash)``. ``forced_at`` and
``repetition_stop_at`` are generated-token positions where the rule inserted its
string; ``bf_reserve`` is the reserve budget forcing applied to the request, and
``forcing_skipped`` says why it left a row alone at its threshold ("answered": the row
had already boxed an answer). Records are flushed per batch so a crash never loses finished work.

Format 1 traces (one flat ``settings`` object in the header) still load.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from loopeval.common.jsonl import read_jsonl
from loopeval.common.schema import check_fields
from loopeval.evaluation.settings import DecodingOptions

FORMAT = 2
PREFIX = "loopeval_trace_"


@dataclass(frozen=True)
class DecodingSettings(DecodingOptions):
    """How one evaluation decodes: its :class:`DecodingOptions` as recorded (forcing
    options ``None`` without forcing) and what it recorded about itself. Every field is a
    setting that both sides of a comparison must share (:data:`SHARED`): a difference is
    a fairness failure."""

    dtype: str | None = None
    batch_size: str | None = None
    chat_template_sha: str | None = None  # the chat template as applied (None: prompts were not templated)
    chat_template_args: dict = field(default_factory=dict)
    seed: int | None = None  # torch's seed for the run (sampled tasks draw from it)
    max_length: int | None = None  # the model's context length: longer prompts are cut
    truncation: bool | None = None
    engine: str | None = None  # the engine that generated ("vllm"); None: transformers' generate (the HF path)
    engine_version: str | None = None

    def __post_init__(self):
        if not self.budget_forcing:
            for f in fields(DecodingOptions):
                if f.metadata.get("forcing"):
                    object.__setattr__(self, f.name, None)

    @classmethod
    def record(cls, options: DecodingOptions, **recorded) -> DecodingSettings:
        """The settings of an evaluation run with ``options``."""
        return cls(**asdict(options), **recorded)

    def differences(self, other: DecodingSettings) -> list[str]:
        """``"name: mine vs theirs"`` for every shared setting that differs."""
        return [f"{name}: {getattr(self, name)!r} vs {getattr(other, name)!r}"
                for name in SHARED if getattr(self, name) != getattr(other, name)]

    @classmethod
    def from_dict(cls, d: dict) -> DecodingSettings:
        if not isinstance(d, dict):
            raise ValueError(f"decoding settings are {d!r}, not a mapping")
        return cls(**check_fields(cls, {name: d[name] for name in SHARED if name in d}))


SHARED: tuple[str, ...] = tuple(f.name for f in fields(DecodingSettings))
"""The decoding settings that both sides of a comparison must share."""


@dataclass(frozen=True)
class TraceHeader:
    """What an evaluation was: the model, its loop and cost, and its decoding settings."""

    model: str | None
    loop: dict | None  # LoopConfig.to_dict() of the applied loop (at K = exit_after, if given)
    cost: dict  # LoopCost.summary()
    decoding: DecodingSettings
    cache_check: dict | None = None
    versions: dict = field(default_factory=dict)
    weights: str | None = None  # checkpoint.weights_fingerprint of the evaluated weights
    exit_after: int | None = None  # the fixed exit (steps run of a longer trained loop), or None
    generation: dict = field(default_factory=dict)  # speed-only: cache_implementation, compile (not compared)
    files: dict = field(default_factory=dict)  # identity.loaded_fingerprint(..., weights=False): configs, tokenizer

    @property
    def looped(self) -> bool:
        return self.loop is not None

    @property
    def multiplier(self) -> float:
        """The layer-pass cost multiplier c = (N + m) / N of the evaluated model."""
        return float(self.cost.get("multiplier", 1.0))

    def to_dict(self) -> dict:
        return {**asdict(self), "decoding": asdict(self.decoding)}

    @classmethod
    def from_record(cls, rec: dict) -> TraceHeader:
        """A header line of either format."""
        if rec.get("format") == 1:
            return cls._from_format_1(dict(rec["settings"]))
        if rec.get("format") != FORMAT:
            raise ValueError(f"unknown loopeval trace format {rec.get('format')!r} (this loopeval reads 1 and {FORMAT})")
        check_fields(cls, rec)
        return cls(model=rec["model"], loop=rec["loop"], cost=dict(rec["cost"]),
                   decoding=DecodingSettings.from_dict(rec["decoding"]), cache_check=rec.get("cache_check"),
                   versions=dict(rec.get("versions") or {}), weights=rec.get("weights"),
                   exit_after=rec.get("exit_after"), generation=dict(rec.get("generation") or {}),
                   files=dict(rec.get("files") or {}))

    @classmethod
    def _from_format_1(cls, s: dict) -> TraceHeader:
        loop = None
        if s.get("loop") is not None:
            loop = {"loop": s["loop"], "operator": s.get("loop_operator") or "repeat",
                    "beta": s.get("loop_beta") or 0.0, "mix": s.get("loop_mix")}
        cost = dict(s.get("cost") or {})
        if "cost_multiplier" in s:
            cost.setdefault("multiplier", s["cost_multiplier"])
        return cls(model=s.get("model"), loop=loop, cost=cost, decoding=DecodingSettings.from_dict(s),
                   cache_check=s.get("cache_check"), versions=dict(s.get("versions") or {}))


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
    passes_per_token: float  # core.spec.charged_passes: a sub-layer loop charges half passes
    flops: float
    bf_reserve: int | None = None  # the reserve budget forcing used for this request, in tokens
    forcing_skipped: str | None = None  # why budget forcing left an unfinished row alone

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.task, self.doc_id, self.idx)


@dataclass
class Trace:
    path: Path
    created: float
    header: TraceHeader
    items: list[TraceItem] = field(default_factory=list)


class TraceWriter:
    """Appends trace items to ``folder/loopeval_trace_<timestamp>[_rank<k>].jsonl``."""

    def __init__(self, folder: str | Path, header: TraceHeader, *, rank: int = 0, world_size: int = 1):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%dT%H-%M-%S")
        suffix = f"_rank{rank}" if world_size > 1 else ""
        self.path = self.folder / f"{PREFIX}{stamp}{suffix}.jsonl"
        n = 1
        while self.path.exists():  # two runs within one second
            n += 1
            self.path = self.folder / f"{PREFIX}{stamp}.{n}{suffix}.jsonl"
        record = {"kind": "header", "format": FORMAT, "created": time.time(), **header.to_dict()}
        with self.path.open("w", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def write(self, items: list[TraceItem]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            for item in items:
                f.write(json.dumps({"kind": "item", **asdict(item)}, sort_keys=True) + "\n")


def read_trace(path: str | Path) -> Trace:
    """Read one trace file; a corrupt line raises ``ValueError`` naming the file and line, and
    how to get rid of it (move the file out of its folder, or evaluate again)."""
    path = Path(path)

    def parse(lineno: int, rec: dict):
        if lineno == 1:
            if rec.get("kind") != "header":
                raise ValueError("not a loopeval trace header")
            return Trace(path=path, created=float(rec["created"]), header=TraceHeader.from_record(rec))
        kind = rec.pop("kind", None)
        if kind != "item":
            raise ValueError(f"kind {kind!r}: every line after the header is an item")
        return TraceItem(**check_fields(TraceItem, rec))

    trace = None
    fix = f"; not a trace as loopeval writes it: move {path.name} out of {path.parent}, or evaluate again"
    try:
        for lineno, value in read_jsonl(path, parse, what="loopeval trace"):
            if lineno == 1:
                trace = value
            else:
                trace.items.append(value)
    except ValueError as exc:
        raise ValueError(f"{exc}{fix}") from None
    if trace is None:
        raise ValueError(f"{path}: empty loopeval trace file{fix}")
    check_against_loop(trace)
    return trace


def check_against_loop(trace: Trace) -> None:
    """Refuse a trace whose passes, cost and loop disagree (an edited trace, or one written by
    another tool): the header's ``cost`` must be that of its ``loop`` (spec, passes
    :func:`loopeval.core.spec.charged_passes` on its ``base_passes`` layers, multiplier
    passes / base passes) and every item must charge those passes per token. The error
    names the file and both values."""
    from loopeval.core.spec import LoopSpec, charged_passes

    header, cost = trace.header, trace.header.cost
    given = (header.loop or {}).get("loop")
    spec = LoopSpec.parse(given) if given else None
    name = str(spec) if spec else "none (unlooped)"

    def refuse(what: str, found, expected) -> ValueError:
        return ValueError(f"{trace.path}: {what} is {found!r}, but the trace's loop {name} gives {expected!r}; "
                          "the trace was edited or does not belong to its loop: evaluate again")

    if "loop" in cost and (cost["loop"] or None) != (str(spec) if spec else None):
        raise refuse("the cost's loop", cost["loop"], str(spec) if spec else None)
    base = cost.get("base_passes")
    passes = charged_passes(int(base), spec) if isinstance(base, (int, float)) and base > 0 else cost.get("passes")
    if passes is None:
        return
    if "passes" in cost and not math.isclose(float(cost["passes"]), passes):
        raise refuse(f"the cost's layer passes per token (of {base} layers)", cost["passes"], passes)
    if base and "multiplier" in cost and not math.isclose(float(cost["multiplier"]), passes / base):
        raise refuse("the cost multiplier c", cost["multiplier"], passes / base)
    for item in trace.items:
        if not math.isclose(float(item.passes_per_token), passes):
            raise refuse(f"passes_per_token of item (task {item.task}, doc_id {item.doc_id})", item.passes_per_token,
                         passes)


def find_traces(folder: str | Path) -> list[Trace]:
    """All trace files in ``folder`` (not recursive), oldest first."""
    return sorted((read_trace(p) for p in Path(folder).glob(f"{PREFIX}*.jsonl")), key=lambda t: t.created)
