"""The model args of lm-eval's ``looped`` model, and what it reads from the ``lm_eval`` command line.

The loopeval model args are the fields of :class:`LoopedArgs`: the loop's, the decoding
options' and :class:`AdapterArgs`; every other model arg goes to the backend that loads
the model (docs/lm_eval_model.md, docs/engine.md).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path

from loopeval.common.args import as_field, as_int, as_text
from loopeval.core.spec import option_fields
from loopeval.evaluation.serving import CACHES
from loopeval.evaluation.settings import DECODING_OPTIONS, DecodingOptions

def _folder(name: str, value) -> str:
    """A folder to write into, created now, so a bad path fails before any work."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}={value!r}: expected a folder path")
    try:
        Path(value).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{name}={value}: cannot create the folder ({exc.strerror or exc})") from None
    if not os.access(value, os.W_OK):
        raise ValueError(f"{name}={value}: the folder is not writable")
    return value


@dataclass(frozen=True)
class AdapterArgs:
    """The model args of ``looped`` itself (beside the loop's and the decoding options').

    ``exit_after``: run the loop's first k steps and read the output there (004's fixed
    exit; :meth:`loopeval.core.spec.LoopConfig.exit_after`), exactly cached and charged as
    k steps. ``check_cache``: check cached looped decoding against full recomputation on
    the first batch (the HF backend). ``trace``: a folder for the per-item cost trace.
    ``resume_dir``: a folder of finished generations; a rerun serves them
    (:mod:`loopeval.evaluation.responses`). ``cache_implementation`` (``dynamic`` or
    ``static``) and ``compile`` (the decode step under ``torch.compile``, which needs
    ``static``) set transformers' ``generate`` (:func:`loopeval.evaluation.serving.generation_options`);
    they change speed, not outputs, so the trace records them beside, not among, the shared
    decoding settings. ``truncation``: the tokenizer truncates prompts to the model's length
    (HFLM's arg; recorded among the shared settings). ``engine``: the backend, one of
    :data:`loopeval.model_adapters.looped.BACKENDS` (the shell checks it before the session opens).
    """

    exit_after: int | None = field(default=None, metadata={"parse": lambda n, v: as_int(n, v, minimum=1)})
    check_cache: bool = True
    trace: str | None = field(default=None, metadata={"parse": lambda n, v: _folder(n, v)})
    resume_dir: str | None = field(default=None, metadata={"parse": lambda n, v: _folder(n, v)})
    cache_implementation: str = field(default="dynamic", metadata={"choices": CACHES})
    compile: bool = False
    truncation: bool = False
    engine: str = field(default="hf", metadata={"parse": as_text})


HF_ONLY = {"cache_implementation": "generate", "compile": "generate", "truncation": "tokenizer"}
"""``looped`` args that set transformers' ``generate`` or tokenizer (the value says which): only the
``hf`` backend takes them other than at their defaults."""


def _loop_fields() -> list:
    """``loop`` and ``loop_<option>`` for every loop option, all ``None`` when not given."""
    spec = [("loop", str | None, field(default=None, metadata={"parse": as_text}))]
    return spec + [(f"loop_{f.name}", f.type, field(default=None, metadata=f.metadata)) for f in option_fields()]


def _copied(cls) -> list:
    return [(f.name, f.type, field(default=f.default, default_factory=f.default_factory, metadata=f.metadata))
            for f in fields(cls)]


def _parse(cls, raw: dict):
    """Every ``looped`` arg in ``raw`` checked and typed (popped); errors name the arg.
    ``raw`` keeps the backend's args."""
    values = {f.name: as_field(f, f.name, raw.pop(f.name)) for f in fields(cls)
              if f.name in raw and raw[f.name] is not None}
    for f in fields(cls):
        raw.pop(f.name, None)
    return cls(**values)


def _decoding(self) -> DecodingOptions:
    return DecodingOptions(**{name: getattr(self, name) for name in DECODING_OPTIONS})


LoopedArgs = make_dataclass("LoopedArgs", [*_loop_fields(), *_copied(DecodingOptions), *_copied(AdapterArgs)],
                            frozen=True, namespace={"parse": classmethod(_parse), "decoding": property(_decoding)})
LoopedArgs.__doc__ = """The model args ``looped`` adds to its backend's: the loop (``loop`` and
``loop_<option>`` for each field of :class:`loopeval.core.spec.LoopConfig`), the decoding
options (the fields of :class:`loopeval.evaluation.settings.DecodingOptions`, as ``.decoding``)
and the adapter's own (:class:`AdapterArgs`). Derived from those definitions, so a new field
there is a new model arg here. ``LoopedArgs.parse(raw)`` types them."""


def pilot_warning(argv: list[str]) -> str | None:
    """The warning for an ``lm_eval ... --limit N`` command line, else ``None``."""
    for i, arg in enumerate(argv):
        if arg in ("--limit", "-L") and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--limit="):
            value = arg.split("=", 1)[1]
        else:
            continue
        return (f"looped: lm_eval --limit {value} evaluates a subset of each task, so this run is a pilot: loopeval "
                "compare, report and score-audit read it only with --allow-subset, label it 'pilot: n of N items' "
                "and state no final verdict")
    return None


def chat_template_requested(argv: list[str]) -> bool:
    """Whether an ``lm_eval`` command line asks for ``--apply_chat_template``."""
    return any(a == "--apply_chat_template" or a.startswith("--apply_chat_template=") for a in argv)


def requested_local_tasks(argv: list[str]) -> tuple[str, set[str]] | None:
    """``(include_path, task names)`` of an ``lm_eval ... --include_path DIR --tasks T`` command line, else ``None``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--include_path")
    parser.add_argument("--tasks", "-t", nargs="+")
    known, _ = parser.parse_known_args(argv[1:])
    if known.include_path and known.tasks and Path(known.include_path).is_dir():
        return known.include_path, {t for arg in known.tasks for t in arg.split(",") if t}
    return None


def explicit_flag(argv: list[str], name: str) -> str | None:
    """The value of ``--<name>`` when the ``lm_eval`` command line gives it, else ``None`` (lm-eval
    passes its own default for some flags, e.g. ``device``, even when the command line does not)."""
    for i, arg in enumerate(argv):
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None
