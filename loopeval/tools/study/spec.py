"""The study file: one YAML that names every model, task, budget and decoding rule of a
two-test study, validated completely before anything runs.

Every error names the file and the key (``study.yaml: models[2].path: ...``). The
complete format, with an example, is docs/protocol.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from loopeval.common.args import TRUE, as_bool, as_field, as_float, as_int
from loopeval.common.errors import UserError, whole_number
from loopeval.core.spec import LOOP_OPTIONS, option_fields
from loopeval.evaluation.identity import INTENDED
from loopeval.evaluation.settings import DECODING_OPTIONS, DecodingOptions
from loopeval.analysis.stats.options import STAT_OPTIONS, StatOptions

ROLES = ("twin", "looped", "larger")
STUDY_KEYS = ("name", "output", "models", "tasks", "include_path", "budgets", "decoding", "lm_eval", "statistics",
              "report", "intended_differences", "allow_manifest_mismatch", "pilot", "ray")
MODEL_KEYS = ("name", "path", "base", "loop", *LOOP_OPTIONS, "role", "seed", "variant", "model_args")
LM_EVAL_KEYS = ("batch_size", "dtype", "device", "apply_chat_template", "num_fewshot", "system_instruction",
                "fewshot_as_multiturn", "gen_kwargs", "model_args", "limit")
STATISTICS_KEYS = (*STAT_OPTIONS, "default_scale")
REPORT_KEYS = ("title", "sizes", "strict", "latex")
RUNNER_KEYS = ("pretrained", "budget_scale", "trace", "resume_dir")
"""``looped`` model args the runner sets for every evaluation (``plan.Evaluation.model_args``):
from ``path:``, ``budgets:`` and the output folder. Given in a ``model_args`` they would be
overwritten, so they are refused there."""


@dataclass(frozen=True)
class ModelSpec:
    """One model of the study. ``path`` is a checkpoint (a looped one brings its loop);
    ``base`` plus ``loop`` loops an unlooped checkpoint at evaluation time."""

    name: str
    role: str
    path: str
    loop: str | None = None
    loop_options: dict = field(default_factory=dict)  # the given loop options (LOOP_OPTIONS), typed
    seed: int | None = None
    variant: str | None = None
    model_args: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DecodingSpec:
    """A decoding condition given to every model: a name and the ``looped`` model args
    of its rules (budget forcing, reserve, repetition stop ...)."""

    name: str
    args: dict


@dataclass(frozen=True)
class RayOptions:
    """The study's ``ray:`` key (``ray: true`` for the defaults, ``ray: ADDRESS``): where the Ray cluster is
    and what each evaluation asks it for (docs/protocol.md, "On a Ray cluster")."""

    address: str | None = None  # None: RAY_ADDRESS, else a new local Ray; "auto": the cluster of `ray start`
    cpus: float = 1.0  # CPUs per evaluation (its torch threads)
    gpus: float | None = None  # GPUs per engine rank; None: 1 where the evaluation runs on CUDA, else 0
    retries: int = 2  # attempts after the first, for a failed or lost task


RAY_KEYS = tuple(f.name for f in fields(RayOptions))


@dataclass(frozen=True)
class Study:
    path: Path
    name: str
    output: Path
    models: tuple[ModelSpec, ...]
    tasks: tuple[str, ...]
    include_path: tuple[str, ...]
    budgets: tuple[float, ...]
    decoding: tuple[DecodingSpec, ...]
    lm_eval: dict
    stat_options: StatOptions
    default_scale: float
    report: dict
    intended_differences: tuple[str, ...]
    allow_manifest_mismatch: bool
    pilot: bool = False  # lm_eval.limit runs, reported as "pilot: n of N items" with no final verdict
    ray: RayOptions | None = None  # run the evaluations as Ray tasks


class _Where:
    """Error messages that name the file and the key."""

    def __init__(self, file: Path):
        self.file = file

    def error(self, key: str, message: str) -> UserError:
        return UserError(f"{self.file}: {key}: {message}")

    def mapping(self, value, key: str, allowed) -> dict:
        if not isinstance(value, dict):
            raise self.error(key, f"expected a mapping, got {type(value).__name__}")
        unknown = [k for k in value if k not in allowed]
        if unknown:
            home = next((block for block, keys in _BLOCKS.items() if unknown[0] in keys and block != key), None)
            hint = f" ({unknown[0]} belongs under {home}: {home}.{unknown[0]})" if home and not key else ""
            raise self.error(f"{key}.{unknown[0]}" if key else unknown[0],
                             f"unknown key; {key or 'a study'} takes {', '.join(allowed)}{hint}")
        return value

    def typed(self, key: str, fn, *args, **kwargs):
        try:
            return fn(key.rsplit(".", 1)[-1], *args, **kwargs)
        except ValueError as exc:
            raise self.error(key, str(exc)) from None


_BLOCKS = {"statistics": STATISTICS_KEYS, "lm_eval": LM_EVAL_KEYS, "report": REPORT_KEYS, "ray": RAY_KEYS}
"""The study's blocks and their keys: a block's key given at the top level is named with its block."""


def _read_study(path: Path) -> tuple[_Where, dict]:
    """The study file's top-level mapping, its keys known and ``models``, ``tasks`` and ``output`` given."""
    import yaml

    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such study file")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_unique_key_loader())  # noqa: S506 (a SafeLoader)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from None
    except yaml.MarkedYAMLError as exc:
        line = f":{exc.problem_mark.line + 1}" if exc.problem_mark is not None else ""
        raise ValueError(f"{path}{line}: not valid YAML ({exc.problem or exc.context})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from None
    w = _Where(path)
    if raw is None:
        raise ValueError(f"{path}: the study file is empty; it needs at least output, models and tasks (docs/protocol.md)")
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: the study file holds a {type(raw).__name__}, not a mapping of study keys "
                         f"({', '.join(STUDY_KEYS)})")
    raw = w.mapping(raw, "", STUDY_KEYS)
    for key in ("models", "tasks", "output"):
        if key not in raw:
            raise w.error(key, "missing")
    return w, raw


def _models(w: _Where, value, local) -> list[ModelSpec]:
    """The ``models`` list: each entry's keys and role checked, names unique and usable as
    folder names, every looped model paired with a twin. ``local`` resolves a path against the file's folder."""
    models = []
    if not isinstance(value, list) or not value:
        raise w.error("models", "expected a non-empty list of models")
    for i, m in enumerate(value):
        key = f"models[{i}]"
        m = w.mapping(m, key, MODEL_KEYS)
        for need in ("name", "role"):
            if need not in m:
                raise w.error(f"{key}.{need}", "missing")
        if m["role"] not in ROLES:
            raise w.error(f"{key}.role", f"{m['role']!r}: choose one of {', '.join(ROLES)}")
        if ("path" in m) == ("base" in m):
            raise w.error(key, "give either path (a checkpoint) or base (with loop)")
        if "base" in m and "loop" not in m:
            raise w.error(f"{key}.base", "base needs a loop; a checkpoint without one is a path")
        if "path" in m and any(k in m for k in ("loop", *LOOP_OPTIONS)):
            raise w.error(f"{key}.loop", "a loop goes with base:, not with path: (a looped checkpoint brings its own)")
        models.append(ModelSpec(
            name=str(m["name"]), role=m["role"], path=local(str(m.get("path") or m["base"])),
            loop=None if m.get("loop") is None else str(m["loop"]),
            loop_options={f.name: w.typed(f"{key}.{f.name}", lambda n, v, f=f: as_field(f, n, v), m[f.name])
                          for f in option_fields() if m.get(f.name) is not None},
            seed=None if m.get("seed") is None else w.typed(f"{key}.seed", as_int, m["seed"], minimum=0),
            variant=None if m.get("variant") is None else str(m["variant"]),
            model_args=_model_args(w, m.get("model_args"), f"{key}.model_args"),
        ))
    _check_names(w, "models", [m.name for m in models])
    for i, m in enumerate(models):
        _check_folder_name(w, f"models[{i}].name", m.name)
    _check_pairs(w, models)
    return models


def _lm_eval(w: _Where, raw: dict) -> tuple[dict, bool]:
    """The ``lm_eval`` block typed (no loop setting shared by both sides; ``limit`` only in a
    pilot), and the study's ``pilot`` flag."""
    lm_eval = dict(w.mapping(raw.get("lm_eval") or {}, "lm_eval", LM_EVAL_KEYS))
    shared_loop = sorted(k for k in _model_args(w, lm_eval.get("model_args"), "lm_eval.model_args")
                         if k == "loop" or k.startswith("loop_") or k == "exit_after")
    if shared_loop:
        raise w.error(f"lm_eval.model_args.{shared_loop[0]}", "a shared loop setting would loop the twin too; "
                      "give the loop in the looped model's entry (base: and loop:)")
    if lm_eval.get("device") is not None:
        lm_eval["device"] = w.typed("lm_eval.device", as_device, lm_eval["device"])
    if lm_eval.get("gen_kwargs") is not None:
        w.typed("lm_eval.gen_kwargs", as_gen_kwargs, lm_eval["gen_kwargs"])
    for key in ("apply_chat_template", "fewshot_as_multiturn"):
        if key in lm_eval:
            lm_eval[key] = w.typed(f"lm_eval.{key}", as_bool, lm_eval[key])
    if lm_eval.get("num_fewshot") is not None:
        lm_eval["num_fewshot"] = w.typed("lm_eval.num_fewshot", as_int, lm_eval["num_fewshot"], minimum=0)
    if lm_eval.get("batch_size") is not None:
        size = lm_eval["batch_size"]
        if not (isinstance(size, str) and size.startswith("auto")):
            lm_eval["batch_size"] = w.typed("lm_eval.batch_size", as_int, size, minimum=1)
    pilot = w.typed("pilot", as_bool, raw.get("pilot", False))
    if "limit" in lm_eval:
        if not pilot:
            raise w.error("lm_eval.limit", "a run of a subset of the items is a pilot; set pilot: true")
        limit = w.typed("lm_eval.limit", as_float, lm_eval["limit"], positive=True)
        lm_eval["limit"] = int(limit) if limit >= 1 and limit == int(limit) else limit
    return lm_eval, pilot


def load_study(path: str | Path) -> Study:
    """Read and validate a study file. Raises ``ValueError`` naming the file and key for an
    unknown key, a missing value, a duplicate name, a looped model without a twin, or a
    value of the wrong type. Paths are resolved against the file's folder."""
    path = Path(path)
    w, raw = _read_study(path)
    here = path.parent

    def local(value: str) -> str:
        candidate = here / value
        return str(candidate.resolve()) if candidate.exists() else value

    models = _models(w, raw["models"], local)

    tasks = raw["tasks"]
    tasks = [tasks] if isinstance(tasks, str) else tasks
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise w.error("tasks", "expected a task or group name, or a list of them")
    include = raw.get("include_path") or []
    include = [include] if isinstance(include, str) else include
    include = [local(str(p)) for p in include]
    for i, folder in enumerate(include):
        if not Path(folder).is_dir():
            raise w.error(f"include_path[{i}]", f"{folder}: no such folder (relative paths are read from {here})")

    statistics = dict(w.mapping(raw.get("statistics") or {}, "statistics", STATISTICS_KEYS))
    default_scale = w.typed("statistics.default_scale", as_float, statistics.get("default_scale", 1.0), positive=True)
    budgets = raw.get("budgets", [default_scale])
    budgets = [budgets] if not isinstance(budgets, list) else budgets
    budgets = [w.typed(f"budgets[{i}]", as_float, b, positive=True) for i, b in enumerate(budgets)]
    if default_scale not in budgets:
        raise w.error("budgets", f"must include the default budget scale {default_scale:g} (statistics.default_scale)")
    _check_names(w, "budgets", [f"{b:g}" for b in budgets])

    decoding = _decoding(w, raw.get("decoding") or [{"name": "plain"}])
    for i, d in enumerate(decoding):
        _check_folder_name(w, f"decoding[{i}].name", d.name)
    lm_eval, pilot = _lm_eval(w, raw)
    report = dict(w.mapping(raw.get("report") or {}, "report", REPORT_KEYS))
    for flag in ("strict", "latex"):
        if flag in report:
            report[flag] = w.typed(f"report.{flag}", as_bool, report[flag])
    if "sizes" in report:
        sizes = report["sizes"]
        if not (isinstance(sizes, list) and len(sizes) == 2):
            raise w.error("report.sizes", "expected [small, large] parameter counts")
        report["sizes"] = tuple(w.typed(f"report.sizes[{i}]", as_float, s, positive=True) for i, s in enumerate(sizes))
    intended = raw.get("intended_differences") or []
    if not isinstance(intended, list):
        raise w.error("intended_differences", "expected a list of setting names")
    known = (*INTENDED, *sorted({k for m in models for k in m.model_args}))
    for i, name in enumerate(intended):
        if name not in known:
            raise w.error(f"intended_differences[{i}]", f"{name!r} is not a setting that can differ; "
                          f"choose from {', '.join(known)}")
    output = (here / str(raw["output"])).resolve()
    if output.exists() and not output.is_dir():
        raise w.error("output", f"{output} is a file; give a folder for the study's evaluations and report")
    return Study(
        path=path, name=str(raw.get("name") or path.stem), output=output,
        models=tuple(models), tasks=tuple(tasks), include_path=tuple(include), budgets=tuple(budgets),
        decoding=decoding, lm_eval=lm_eval, default_scale=default_scale, report=report,
        stat_options=StatOptions(**{f.name: w.typed(f"statistics.{f.name}", lambda n, v, f=f: as_field(f, n, v),
                                                    statistics[f.name]) for f in fields(StatOptions) if f.name in statistics}),
        intended_differences=tuple(str(x) for x in intended),
        allow_manifest_mismatch=w.typed("allow_manifest_mismatch", as_bool, raw.get("allow_manifest_mismatch", False)),
        pilot=pilot, ray=_ray(w, raw.get("ray", False)),
    )


def _model_args(w: _Where, value, key: str) -> dict:
    """A ``model_args`` mapping; a key the runner sets itself (:data:`RUNNER_KEYS`) is refused."""
    args = dict(w.mapping(value or {}, key, _ANY))
    owned = [k for k in RUNNER_KEYS if k in args]
    if owned:
        source = {"pretrained": "the model's path:", "budget_scale": "budgets:"}.get(owned[0], "the study's output folder")
        raise w.error(f"{key}.{owned[0]}", f"set by the runner for every evaluation (from {source}); "
                      "it would be overwritten, so it cannot be given here")
    return args


def _unique_key_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """YAML's safe loader, refusing a key given twice in one mapping (YAML keeps the last silently)."""

        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    return Loader


class _Anything(tuple):
    def __contains__(self, item) -> bool:
        return True


_ANY = _Anything()


def _check_names(w: _Where, key: str, names: list[str]) -> None:
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            raise w.error(f"{key}[{i}]", f"duplicate {name!r}")
        seen.add(name)


def _check_folder_name(w: _Where, key: str, name: str) -> None:
    """Names become folder names (``MODEL__DECODING__SCALEx``): no separators, no "..", no "__"."""
    if not name or name.startswith(".") or any(c in name for c in "/\\\0") or "__" in name:
        raise w.error(key, f"{name!r} cannot name a folder: use letters, digits, '-', '_' or '.', without '/', "
                           "a leading '.', or '__' (which separates the parts of an evaluation's name)")


def _check_pairs(w: _Where, models: list[ModelSpec]) -> None:
    """Every looped model has a twin of the same training seed and variant."""
    twins = {(m.seed, m.variant) for m in models if m.role == "twin"}
    for i, m in enumerate(models):
        if m.role == "looped" and (m.seed, m.variant) not in twins:
            raise w.error(f"models[{i}]", f"the looped model {m.name!r} has no twin with seed {m.seed} and "
                                          f"variant {m.variant!r}; Δparam needs one")


def _decoding(w: _Where, entries) -> tuple[DecodingSpec, ...]:
    if not isinstance(entries, list) or not entries:
        raise w.error("decoding", "expected a list of decoding conditions, e.g. [{name: plain}, {name: bf, budget_forcing: true}]")
    out = []
    for i, d in enumerate(entries):
        key = f"decoding[{i}]"
        d = dict(w.mapping(d, key, ("name", *DECODING_OPTIONS)))
        if "name" not in d:
            raise w.error(f"{key}.name", "missing")
        name = str(d.pop("name"))
        try:
            DecodingOptions.parse(dict(d))
        except ValueError as exc:
            raise w.error(key, str(exc)) from None
        out.append(DecodingSpec(name, d))
    _check_names(w, "decoding", [d.name for d in out])
    return tuple(out)


DEVICE = re.compile(r"cpu|mps|(cuda|xpu)(:[0-9]+)?")


def as_device(name: str, value) -> str:
    """A torch device lm-eval can be given: ``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``xpu[:N]``."""
    if not isinstance(value, str) or not DEVICE.fullmatch(value.strip()):
        raise ValueError(f"{name}={value!r}: expected a device: cpu, cuda, cuda:N, mps or xpu[:N]")
    return value.strip()


def as_gen_kwargs(name: str, value) -> dict | str:
    """lm-eval's ``gen_kwargs``: a mapping of names to numbers, text or booleans, or its
    ``name=value,...`` text."""
    pairs = list(value.items()) if isinstance(value, dict) else None
    if isinstance(value, str):
        pairs = [part.partition("=")[::2] if "=" in part else (None, part) for part in value.split(",") if part.strip()]
    if not pairs or any(not isinstance(k, str) or not k.strip() or not isinstance(v, (str, int, float, bool))
                        for k, v in pairs):
        raise ValueError(f"{name}={value!r}: expected a mapping of generation settings, or NAME=VALUE,... "
                         "(e.g. {temperature: 0, max_gen_toks: 256})")
    return value


RAY_ADDRESS_FORMS = "auto, local, HOST:PORT or ray://HOST:PORT"


def as_ray_address(name: str, value) -> str:
    """A Ray cluster address (:data:`RAY_ADDRESS_FORMS`), checked before Ray parses it (Ray's
    own parser fails at connect time, naming neither the file nor the variable)."""
    text = value.strip() if isinstance(value, str) else None
    if text in ("auto", "local"):
        return text
    rest = text[len("ray://"):] if text and text.startswith("ray://") else text
    host, sep, port = (rest or "").rpartition(":")
    number = whole_number(port) if sep else None
    if not host or any(c.isspace() or c in "/@?#" for c in host) or number is None or not 1 <= number <= 65535:
        hint = (" (a yes is not an address: the study's ray: true, or --ray alone, uses RAY_ADDRESS or a new "
                "local Ray)" if isinstance(value, str) and value.strip().lower() in TRUE else "")
        raise ValueError(f"{name}={value!r}: expected a Ray address: {RAY_ADDRESS_FORMS}{hint}")
    return text


def _ray(w: _Where, value) -> RayOptions | None:
    if isinstance(value, bool) or value is None:
        return RayOptions() if value else None
    if isinstance(value, str):
        return RayOptions(address=w.typed("ray", as_ray_address, value))
    if not isinstance(value, dict):
        raise w.error("ray", f"{value!r}: expected true, an address ({RAY_ADDRESS_FORMS}) or a mapping of "
                      f"{', '.join(RAY_KEYS)}")
    given = {k: v for k, v in w.mapping(value, "ray", RAY_KEYS).items() if v is not None}
    parse = {"address": as_ray_address, "cpus": lambda n, v: as_float(n, v, positive=True),
             "gpus": _non_negative, "retries": lambda n, v: as_int(n, v, minimum=0)}
    return RayOptions(**{k: w.typed(f"ray.{k}", parse[k], v) for k, v in given.items()})


def _non_negative(name: str, value) -> float:
    number = as_float(name, value)
    if number < 0:
        raise ValueError(f"{name}={value!r}: must be >= 0")
    return number
