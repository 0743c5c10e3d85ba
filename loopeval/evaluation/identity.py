"""What makes an evaluation what it is, defined once; every join and reuse of results checks it.

An evaluation's identity is its weights (``checkpoint.weights_fingerprint``), every
output-changing setting (:data:`SETTINGS`: the fields of
:class:`loopeval.evaluation.trace.DecodingSettings`, so a field added there is covered here), and
per task its version, its generation kwargs (stop strings included) and the rendered
prompt of every item (chat template as applied, system instruction, few-shot: all in
lm-eval's ``prompt_hash``). Two sides of a comparison must share everything but the
weights and the loop; a reused result must share everything.

Before any compute, a result is reusable (a study's done-check, ``place``'s and the demo's
resume, the resume store's key) only if it was made from the same inputs, by content:
:func:`loaded_fingerprint` (every file loaded for the model args as passed, but
:data:`NOT_OUTPUT_FILES`), :func:`task_fingerprint` (the task's config after includes, its
functions' source files, its documents) and the output settings.

Torch-free: the report, the study and the run loader import it.
"""

from __future__ import annotations

import contextlib
import fnmatch
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
INTENDED = (*SETTINGS, PROMPTS, GENERATION_KWARGS, TASK_VERSION, WEIGHTS)
"""The identity parts that may be named as an intended difference between two sides
(a study's ``intended_differences``, ``compare``/``report --intended``)."""


def check_intended(names, flag: str = "--intended", extra=()) -> None:
    """Refuse a name in ``names`` that is neither in :data:`INTENDED` nor in ``extra``."""
    known = (*INTENDED, *extra)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"{flag} {unknown[0]}: not a part of an evaluation that can differ; choose from "
                         f"{', '.join(known)}")


NOT_OUTPUT = ("cost", "cache_check", "versions", "generation", "model")
"""Trace-header fields that record speed or provenance (the model's path: its content is in
``weights`` and ``files``), not outputs; every other header field is identity."""


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


NOT_OUTPUT_FILES: tuple[str, ...] = ("README*", "*.md", "LICENSE*", "NOTICE*", "CITATION*", ".git*", "*.log",
                                     "*.png", "*.jpg", "*.pdf", "*.html", "training_manifest.json")
"""Files of a checkpoint folder that no model or tokenizer loader reads (documentation,
licences, logs, figures, loopeval's training manifest: provenance, not weights). Every
other top-level file counts, an unknown one too (a stray file may re-run an evaluation,
never let a changed one be reused). Subfolders never count: an output folder, the
intermediate checkpoints and adapters training keeps beside the weights."""

LOADED_ARGS: tuple[str, ...] = ("pretrained", "tokenizer", "peft", "delta")
"""The model args whose folders lm-eval's ``hf`` (and so ``looped``) model loads: the
checkpoint (in its ``subfolder``, or only its ``gguf_file``), a separate tokenizer, a
PEFT adapter and delta weights."""


WEIGHT_FILES: tuple[str, ...] = ("*.safetensors", "*.bin", "*.pt", "*.pth")
"""Weight files of a checkpoint folder: what a loaded model's own fingerprint
(``checkpoint.weights_fingerprint``) covers, so a running evaluation need not hash them again."""


def checkpoint_fingerprint(path, *, gguf_file: str | None = None, subfolder: str | None = None,
                           weights: bool = True) -> str | None:
    """sha256 of what a local checkpoint folder gives a loader: the content of its top-level
    files but :data:`NOT_OUTPUT_FILES` (weights, configs, tokenizer, chat template, loop and
    exit gate), or of the one GGUF file ``gguf_file`` in it; ``None`` for a hub name or a
    path that does not exist. Decided by content: a checkpoint retrained in place gets a new
    fingerprint, a copy in another folder the same one. ``weights=False`` leaves out
    :data:`WEIGHT_FILES` (configs, tokenizer, chat template and loop only)."""
    folder = Path(path) / subfolder if subfolder else Path(path)
    if gguf_file is not None and folder.is_dir():
        folder = folder / gguf_file
    if folder.is_file():
        files = [folder]
    elif folder.is_dir():
        files = sorted(p for p in folder.iterdir()
                       if p.is_file() and not any(fnmatch.fnmatch(p.name, pattern) for pattern in
                                                  NOT_OUTPUT_FILES + (() if weights else WEIGHT_FILES)))
    else:
        return None
    stats = tuple((str(p), s.st_size, s.st_mtime_ns, s.st_ino) for p in files for s in [p.stat()])
    return _fingerprint(stats)


def loaded_fingerprint(model_args: Mapping, *, weights: bool = True) -> dict[str, str | None]:
    """The content identity of everything loaded for these ``hf``/``looped`` model args
    (after every override: the args as passed): per arg of :data:`LOADED_ARGS` that is
    given, its :func:`checkpoint_fingerprint` (``weights=False``: without its weight files),
    or its name for a hub id (``name@revision``)."""
    out = {}
    for name in LOADED_ARGS:
        value = model_args.get(name)
        if value is None or not isinstance(value, (str, Path)):
            continue
        kwargs = {"gguf_file": model_args.get("gguf_file"), "subfolder": model_args.get("subfolder")} \
            if name == "pretrained" else {}
        local = Path(value).exists()
        out[name] = checkpoint_fingerprint(value, weights=weights, **kwargs) if local else \
            f"{value}@{model_args.get('revision') or 'main'}"
    return out


TASK_PATHS = ("data_files", "cache_dir")
"""``dataset_kwargs`` that name where a task's data lies, not what it holds (its documents are hashed)."""
TASK_METADATA_PATHS = ("config_source",)
"""``metadata`` keys lm-eval adds that name where a task's YAML lies (its content is hashed)."""


def task_fingerprint(task) -> str:
    """sha256 of an lm-eval task's whole definition, as loaded: its config after includes
    and overrides (functions as their source; without the data's and the YAML's paths, :data:`TASK_PATHS`
    and :data:`TASK_METADATA_PATHS`),
    the source files of its functions (the ``utils.py`` they live in) and of the modules those
    import from their own folder or from loopeval (:func:`_local_sources`: the scorer behind
    a task's ``process_results``), and the content of every evaluation and few-shot document
    (after ``process_docs``), so an edited data file, YAML or scorer changes it, a moved data
    file or task folder does not."""
    import inspect

    digest = hashlib.sha256()
    config = task.config.to_dict(keep_callable=True)
    config["dataset_kwargs"] = {k: v for k, v in (config.get("dataset_kwargs") or {}).items()
                                if k not in TASK_PATHS}
    if isinstance(config.get("metadata"), Mapping):
        config["metadata"] = {k: v for k, v in config["metadata"].items() if k not in TASK_METADATA_PATHS}
    files = set()

    def plain(value):
        if callable(value):
            with contextlib.suppress(TypeError):  # a builtin has no source file
                files.add(inspect.getsourcefile(value))
            return task.config.serialize_function(value)
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    digest.update(json.dumps(plain(config), sort_keys=True, default=str).encode())
    for file in _local_sources(f for f in files if f and Path(f).is_file()):
        digest.update(Path(file).read_bytes())
    fewshot = task.fewshot_docs() if getattr(getattr(task, "fewshot_cfg", None), "split", None) is not None else None
    for docs in (task.eval_docs, fewshot or ()):
        digest.update(b"\0docs")
        for doc in docs:
            digest.update(json.dumps(doc, sort_keys=True, default=str).encode() + b"\n")
    return digest.hexdigest()


def _local_sources(files) -> list[str]:
    """``files`` and, transitively, the source files of the modules (and of the functions and
    classes) they import that live beside one of ``files`` or inside loopeval; sorted.
    Installed third-party code is left out: its version is recorded apart."""
    import inspect
    import sys

    import loopeval

    package = Path(loopeval.__file__).resolve().parent
    folders = {Path(f).resolve().parent for f in files}
    by_file = {Path(m.__file__).resolve(): m for m in list(sys.modules.values())
               if isinstance(getattr(m, "__file__", None), str)}
    seen, todo = set(), [Path(f).resolve() for f in files]
    while todo:
        file = todo.pop()
        if file in seen or not file.is_file():
            continue
        seen.add(file)
        module = by_file.get(file)
        for value in vars(module).values() if module is not None else ():
            with contextlib.suppress(TypeError):
                source = inspect.getsourcefile(value if inspect.ismodule(value) else inspect.getmodule(value))
                source = Path(source).resolve() if source else None
                if source and (source.parent in folders or source.is_relative_to(package)):
                    todo.append(source)
    return sorted(str(f) for f in seen)


@functools.lru_cache(maxsize=64)
def _fingerprint(stats: tuple) -> str:
    digest = hashlib.sha256()
    for name, *_ in stats:
        digest.update(Path(name).name.encode() + b"\0")
        with open(name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
