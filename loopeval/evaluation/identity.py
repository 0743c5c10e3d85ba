"""What makes an evaluation what it is, defined once; every join and reuse of results checks it.

An evaluation's identity is its weights (``checkpoint.weights_fingerprint``), every
output-changing setting (:data:`SETTINGS`: the fields of
:class:`loopeval.evaluation.trace.DecodingSettings`, so a field added there is covered here), and
per task its version, its generation kwargs (stop strings included) and the rendered
prompt of every item (chat template as applied, system instruction, few-shot: all in
lm-eval's ``prompt_hash``). Two sides of a comparison must share everything but the
weights and the loop; a reused result must share everything.

Torch-free: the report, the study and the run loader import it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from loopeval.evaluation.trace import SHARED, DecodingSettings, TraceHeader

SETTINGS: tuple[str, ...] = SHARED
"""The output-changing settings: every field of :class:`DecodingSettings`."""

PROMPTS = "prompts"
GENERATION_KWARGS = "generation_kwargs"
TASK_VERSION = "task_version"
WEIGHTS = "weights"
NOT_OUTPUT = ("cost", "cache_check", "versions", "generation")
"""Trace-header fields that record speed or provenance, not outputs; every other header field is identity."""


@dataclass(frozen=True)
class TaskIdentity:
    version: object
    generation_kwargs: Mapping | None
    prompts: Mapping[int, str]  # doc_id -> prompt hash


@dataclass(frozen=True)
class Identity:
    """One evaluation's identity (``None`` fields: not recorded, e.g. a run without a trace)."""

    weights: str | None
    settings: DecodingSettings | None
    tasks: Mapping[str, TaskIdentity]


def of_run(run) -> Identity:
    """The identity of a loaded :class:`loopeval.analysis.runs.Run`."""
    header = run.header
    versions = run.versions if hasattr(run, "versions") else {}
    tasks = {name: TaskIdentity(versions.get(name), ts.generation_kwargs,
                                dict(zip(ts.doc_ids.tolist(), ts.prompt_hashes)))
             for name, ts in run.tasks.items()}
    return Identity(weights=header.weights if header else None, settings=header.decoding if header else None,
                    tasks=tasks)


def differences(a: Identity, b: Identity, *, weights: bool = False, intended=()) -> list[str]:
    """``"name: a vs b"`` for every part of the identity that differs, skipping the names in
    ``intended`` (a study's ``intended_differences``). ``weights``: compare the weights too
    (a reuse; the two sides of a comparison differ in them by design)."""
    out = []
    if weights and WEIGHTS not in intended and a.weights != b.weights:
        out.append(f"{WEIGHTS}: {a.weights!r} vs {b.weights!r}")
    if a.settings is not None and b.settings is not None:
        out += [d for d in a.settings.differences(b.settings) if d.split(":", 1)[0] not in intended]
    for task in sorted(set(a.tasks) & set(b.tasks)):
        ta, tb = a.tasks[task], b.tasks[task]
        if TASK_VERSION not in intended and ta.version != tb.version:
            out.append(f"{task} {TASK_VERSION}: {ta.version!r} vs {tb.version!r}")
        if GENERATION_KWARGS not in intended and ta.generation_kwargs != tb.generation_kwargs:
            out.append(f"{task} generation kwargs: {ta.generation_kwargs} vs {tb.generation_kwargs}")
        if PROMPTS not in intended:
            differ = sorted(d for d in set(ta.prompts) & set(tb.prompts) if ta.prompts[d] != tb.prompts[d])
            if differ:
                out.append(f"{task} {PROMPTS}: the rendered prompt differs for {len(differ)} of {len(ta.prompts)} "
                           f"items (first doc_id {differ[0]}): chat template, system instruction or few-shot "
                           "differ between the runs")
    return out


def output_identity(header: TraceHeader) -> dict:
    """The header fields that decide outputs (everything but :data:`NOT_OUTPUT`): the resume store's key."""
    d = header.to_dict()
    return {k: v for k, v in d.items() if k not in NOT_OUTPUT}


def parse_model_args(model_args) -> dict:
    """lm-eval's ``model_args`` as recorded in a results file (``"k=v,k=v"`` or a mapping)."""
    if isinstance(model_args, Mapping):
        return dict(model_args)
    if not isinstance(model_args, str):
        return {}
    if model_args.strip().startswith("{"):  # lm-eval reads model args as JSON when they hold a brace
        try:
            parsed = json.loads(model_args)
        except json.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    out = {}
    for part in model_args.split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _same(recorded, given) -> bool:
    if isinstance(recorded, bool):
        return str(given).strip().lower() in (("true", "1", "yes", "on") if recorded else ("false", "0", "no", "off"))
    if isinstance(recorded, (int, float)):
        try:
            return math.isclose(float(recorded), float(given))
        except (TypeError, ValueError):
            return False
    return str(recorded) == str(given)


def header_mismatch(header: TraceHeader, model_args) -> str | None:
    """Why a trace header cannot belong to a run with these ``model_args`` (``None``: it can).

    Checked: the model path, the loop, and every setting of :data:`SETTINGS` that the model
    args name (not the trace folder: a study moves a finished run's folder into place)."""
    args = parse_model_args(model_args)
    if not args:
        return None
    why = []
    if "pretrained" in args and header.model is not None and str(args["pretrained"]) != str(header.model):
        why.append(f"pretrained={header.model} in the trace, {args['pretrained']} in the results")
    if args.get("loop") and "exit_after" not in args:
        traced = (header.loop or {}).get("loop")
        if traced != str(args["loop"]):
            why.append(f"loop={traced} in the trace, {args['loop']} in the results")
    for name in SETTINGS:
        if name == "seed":  # lm-eval's --seed, never a model arg (a model arg of that name is the model's own)
            continue
        recorded = getattr(header.decoding, name)
        given = args.get(name)
        if given is not None and recorded is not None and not str(given).startswith("auto") \
                and not _same(recorded, given):
            why.append(f"{name}={recorded!r} in the trace, {given!r} in the results")
    return "; ".join(why) or None


def checkpoint_fingerprint(path) -> str | None:
    """sha256 of a local checkpoint folder's files (top level: weights, configs, tokenizer), or
    ``None`` for a hub name. A checkpoint retrained into the same folder gets a new fingerprint."""
    folder = Path(path)
    if folder.is_file():
        files = [folder]
    elif folder.is_dir():
        files = sorted(p for p in folder.iterdir() if p.is_file())
    else:
        return None
    stats = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _fingerprint(stats)


@functools.lru_cache(maxsize=64)
def _fingerprint(stats: tuple) -> str:
    digest = hashlib.sha256()
    for name, _, _ in stats:
        digest.update(Path(name).name.encode() + b"\0")
        with open(name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
