"""A study expanded into its evaluations, each with a stable, readable name and folder,
and the checks that run before any compute: tasks lm-eval can find, loops that fit their
models, decoding and lm-eval settings equal on both sides, twins that are twins, and no
output folder made with other settings.

An evaluation's folder is written under ``OUTPUT/evals/.partial/NAME`` and renamed to
``OUTPUT/evals/NAME`` only when lm-eval has saved every result, so a folder that exists
is complete; ``loopeval_evaluation.json`` in it records the settings it was made with.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from loopeval.common.args import as_bool
from loopeval.common.errors import UserError
from loopeval.evaluation.local_data import check_local_tasks
from loopeval.tools.study.spec import DecodingSpec, ModelSpec, Study

SPEC_NAME = "loopeval_evaluation.json"
PARTIAL = ".partial"


@dataclass(frozen=True)
class Evaluation:
    """One lm-eval run of the study: a model under a decoding condition at a budget scale."""

    name: str
    model: ModelSpec
    decoding: DecodingSpec
    scale: float
    folder: Path
    partial: Path
    resume: Path
    log: Path

    def model_args(self, study: Study) -> dict:
        """The ``looped`` model args: the checkpoint, its loop, the decoding rules, the budget,
        the shared and per-model args, and where the trace and the resume store go."""
        args = {"pretrained": self.model.path, **study.lm_eval.get("model_args", {}), **self.model.model_args}
        if self.model.loop is not None:
            args["loop"] = self.model.loop
            args.update({f"loop_{k}": v for k, v in self.model.loop_options.items()})
        for key in ("dtype",):
            if key in study.lm_eval:
                args[key] = study.lm_eval[key]
        args.update(self.decoding.args)
        args.update(budget_scale=self.scale, trace=str(self.partial), resume_dir=str(self.resume))
        return args

    def settings(self, study: Study) -> dict:
        """What the outputs depend on, by content (:mod:`loopeval.evaluation.identity`):
        reusing a finished folder needs every one equal. The output settings, the content of
        everything loaded for the model args as passed (``loaded_fingerprint``: the checkpoint
        and any ``tokenizer``, ``peft`` or ``delta`` folder; the paths themselves do not count,
        so a moved checkpoint is still done) and each task's whole definition (``task_fingerprint``)."""
        from loopeval.evaluation.identity import LOADED_ARGS, loaded_fingerprint

        args = {k: v for k, v in self.model_args(study).items() if k not in ("trace", "resume_dir")}
        shared = {k: v for k, v in study.lm_eval.items() if k not in ("model_args", "dtype")}
        return {"model_args": {k: v for k, v in args.items() if k not in LOADED_ARGS}, "tasks": list(study.tasks),
                "lm_eval": shared, "weights": loaded_fingerprint(args), "task_definitions": task_definitions(study)}


def expand(study: Study) -> list[Evaluation]:
    """Every model under every decoding condition at every budget, in a stable order."""
    root = study.output / "evals"
    out = []
    for m in study.models:
        for d in study.decoding:
            for scale in study.budgets:
                name = f"{m.name}__{d.name}__{scale:g}x"
                out.append(Evaluation(name=name, model=m, decoding=d, scale=scale, folder=root / name,
                                      partial=root / PARTIAL / name, resume=study.output / "resume" / name,
                                      log=study.output / "logs" / f"{name}.log"))
    return out


def status(evaluation: Evaluation, study: Study, *, rerun: bool = True) -> str:
    """"done" (a finished folder with these settings and weights, holding every output the
    report reads: :func:`incomplete`), "todo", or "stale: WHAT CHANGED" (a finished folder
    made with other settings or other weights, e.g. a checkpoint retrained in place, or one
    that lost an output, e.g. a deleted samples file or a trace cut short: it is run again,
    and the old folder kept under ``evals/.replaced``).
    With ``rerun=False`` a stale folder is refused, naming the evaluation and what changed."""
    spec = evaluation.folder / SPEC_NAME
    if not spec.is_file():
        return "todo"
    try:
        recorded = json.loads(spec.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{spec}: not a readable settings record ({exc}); delete {evaluation.folder} to redo it") from None
    wanted = json.loads(json.dumps(evaluation.settings(study), default=str))
    if recorded != wanted:
        diff = _first_difference(recorded, wanted)
        if rerun:
            return f"stale: {diff}"
        raise ValueError(
            f"evaluation {evaluation.name}: {evaluation.folder} was made with other settings ({diff}); "
            "run without --no-rerun to redo it (the old folder is kept), or change the study's output folder"
        )
    lost = incomplete(evaluation, study)
    if lost is not None:
        if rerun:
            return f"stale: outputs incomplete: {lost}"
        raise ValueError(f"evaluation {evaluation.name}: {evaluation.folder} lacks outputs the report needs ({lost}); "
                         "run without --no-rerun to redo it (the old folder is kept)")
    return "done"


def incomplete(evaluation: Evaluation, study: Study) -> str | None:
    """Why a finished folder lacks an output the report reads, or ``None``: its results, a
    samples file per task holding every item, and for each generating task a trace record
    for every item (:func:`loopeval.analysis.runs.load_run`, read as the report reads it)."""
    from loopeval.analysis.runs import load_run

    try:
        run = load_run(evaluation.folder, allow_subset=study.pilot)
        for task in run.tasks.values():
            if task.generative:
                task.passes  # every item joined to its trace records
    except (ValueError, OSError) as exc:
        return str(exc)
    return None


def _first_difference(a, b, where: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else key)
    return f"{where}: {a!r} then, {b!r} now"


def check_before_compute(study: Study, evaluations: list[Evaluation], *, rerun: bool = True) -> None:
    """Everything that can be known before any weights load, on a dry run as on a run: the
    thread setting, the tasks exist, ``statistics.margins`` names their metrics in their
    units, each model's loop fits its config, twins and looped models get the same per-model args (unless the
    study names the difference in ``intended_differences``), twins share their training
    manifest, the data of local tasks (``loopeval local-tasks``) reads, and no finished
    folder was made with other settings."""
    from loopeval.common.threads import requested_threads
    from loopeval.core.loop import resolve_loop
    from loopeval.training.manifest import find_manifest, twin_mismatches

    requested_threads()  # a bad LOOPEVAL_THREADS / OMP_NUM_THREADS, refused on a dry run as on a run
    _check_tasks(study)
    check_local_tasks(study.include_path)
    _check_full_test_sets(study)
    _check_margins(study)
    _check_device(study)
    _check_reserves(study)
    for i, m in enumerate(study.models):
        try:
            loop = resolve_loop(m.path, m.loop, **m.loop_options)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{study.path}: models[{i}] ({m.name}): {exc}") from None
        if m.role == "looped" and loop is None:
            raise ValueError(f"{study.path}: models[{i}] ({m.name}): role looped, but {m.path} has no "
                             "loop_config.json; give base: and loop:, or the looped checkpoint")
        if m.role != "looped" and loop is not None:
            raise ValueError(f"{study.path}: models[{i}] ({m.name}): role {m.role}, but {m.path} is looped ({loop.spec})")
    _check_seeds(study)
    twins = {(m.seed, m.variant): m for m in study.models if m.role == "twin"}
    for m in study.models:
        if m.role != "looped":
            continue
        twin = twins[(m.seed, m.variant)]
        differ = sorted(k for k in set(m.model_args) | set(twin.model_args)
                        if m.model_args.get(k) != twin.model_args.get(k) and k not in study.intended_differences)
        if differ:
            raise ValueError(f"{study.path}: {m.name} and its twin {twin.name} get different model_args ({', '.join(differ)}); "
                             "give both the same, or list the setting in intended_differences")
        a, b = find_manifest(m.path), find_manifest(twin.path)
        if a is not None and b is not None and not study.allow_manifest_mismatch:
            mismatches = twin_mismatches(a, b)
            if mismatches:
                raise ValueError(f"{study.path}: {m.name} and {twin.name} are not twins: {'; '.join(mismatches)} "
                                 "(allow_manifest_mismatch: true to evaluate them anyway)")
    _check_chat_templates(study, evaluations)
    for e in evaluations:
        status(e, study, rerun=rerun)


def _check_seeds(study: Study) -> None:
    """Entries of one role, variant and loop with different seeds are different checkpoints
    by content (:func:`loopeval.evaluation.identity.loaded_fingerprint`): one checkpoint
    listed as two seeds would be counted as two."""
    from loopeval.evaluation.identity import LOADED_ARGS, loaded_fingerprint

    seen = {}
    for i, m in enumerate(study.models):
        if m.seed is None:
            continue
        loaded = {"pretrained": m.path, **{k: v for k, v in m.model_args.items() if k in LOADED_ARGS or
                                           k in ("gguf_file", "subfolder", "revision")}}
        key = (m.role, m.variant, m.loop, tuple(sorted(m.loop_options.items())),
               json.dumps(loaded_fingerprint(loaded), sort_keys=True))
        if key in seen and seen[key][1].seed != m.seed:
            j, other = seen[key]
            raise UserError(f"{study.path}: models[{i}] ({m.name}, seed {m.seed}) is the checkpoint of models[{j}] "
                            f"({other.name}, seed {other.seed}): the same content ({m.path}); one checkpoint is one "
                            "seed: list it once, or give each seed's own checkpoint")
        seen.setdefault(key, (i, m))


def _check_margins(study: Study) -> None:
    """Each of ``statistics.margins`` names the main metric (lm-eval's first) of a task of the
    study, its value in that metric's unit where the unit is known before any score
    (:func:`loopeval.evaluation.metrics.declared_unit`), and a ``statistics.margin`` other than
    A.5's is refused where every task is known to be scored by a continuous metric: the rule
    of :func:`loopeval.analysis.protocol.check_amounts`, which the report applies to the scores."""
    from lm_eval.tasks import get_task_dict

    from loopeval.evaluation.metrics import declared_unit

    from loopeval.analysis.stats.options import DEFAULTS

    margins, margin = study.stat_options.margins, study.stat_options.margin
    if not margins and margin == DEFAULTS.margin:
        return
    mains = {}
    for name, task in _leaf_tasks(get_task_dict(list(study.tasks), task_manager(study))).items():
        listed = getattr(task.config, "metric_list", None) or []
        mains[name] = listed[0].get("metric") if listed and isinstance(listed[0], dict) else None
    known = {m for m in mains.values() if isinstance(m, str)}
    for metric, value in margins.items():
        key = f"{study.path}: statistics.margins.{metric}"
        if metric not in known and None not in mains.values():
            raise UserError(f"{key}: no task of this study reports metric {metric!r} (their metrics: "
                            f"{', '.join(f'{t} {m}' for t, m in sorted(mains.items()))}); name a task's metric")
        unit = declared_unit(metric)
        if unit is not None:
            try:
                unit.check_margin(f"margins.{metric}", value)
            except ValueError as exc:
                raise UserError(f"{key}: {exc}") from None
    units = [declared_unit(m) if isinstance(m, str) else None for m in mains.values()]
    if margin != DEFAULTS.margin and units and None not in units and not any(u.fraction for u in units):
        first = next(iter(mains.values()))
        raise UserError(f"{study.path}: statistics.margin: {margin:g} is the accuracies' margin, and no task of this "
                        f"study is scored by an accuracy ({', '.join(f'{t} {m}' for t, m in sorted(mains.items()))})",
                        fix=f"give the metric's own in its unit (statistics.margins: {{{first}: {margin:g}}}, in "
                        f"{declared_unit(first).name})")


def _check_chat_templates(study: Study, evaluations: list[Evaluation]) -> None:
    """With ``lm_eval.apply_chat_template``, every tokenizer the evaluations load has a chat
    template (the tokenizer is read, not the weights), so none fails after its weights load."""
    from loopeval.core.gguf import check_chat_template

    if not study.lm_eval.get("apply_chat_template", False):  # a bool: the study file is parsed strictly
        return
    checked = set()
    for e in evaluations:
        args = e.model_args(study)
        source = args.get("tokenizer") or args["pretrained"]
        if source in checked:
            continue
        checked.add(source)
        try:
            check_chat_template(source, revision=args.get("revision") or "main",
                                trust_remote_code=as_bool("trust_remote_code", args.get("trust_remote_code", False)),
                                gguf_file=args.get("gguf_file"))
        except ValueError as exc:
            raise ValueError(f"{study.path}: lm_eval.apply_chat_template: {e.model.name}: "
                             f"{str(exc).removeprefix('looped: --apply_chat_template, but ')}") from None


def _check_device(study: Study) -> None:
    device = str(study.lm_eval.get("device") or "")
    if device.startswith("cuda") and study.ray is None:  # on Ray, the cluster's GPUs are checked (ray_backend)
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"{study.path}: lm_eval.device: {device}, but this machine has no CUDA device "
                             "(use device: cpu, or leave it out to use CUDA only where present)")
        index = device.partition(":")[2]
        if index.isdigit() and int(index) >= torch.cuda.device_count():
            raise ValueError(f"{study.path}: lm_eval.device: {device}, but this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")


def _check_reserves(study: Study) -> None:
    """Every budget fits each model's context (``max_length``, else the config's positions), and
    every forcing reserve fits every budget it meets (the forcing string's length is checked
    again, exactly, by the model before generating)."""
    from lm_eval.tasks import get_task_dict
    from transformers import AutoConfig

    from loopeval.evaluation.decoding import DEFAULT_RESERVE, effective_reserve, scaled_budget

    budgets = {name: int(task.config.generation_kwargs.get("max_gen_toks", _lm_eval_max_gen_toks()))
               for name, task in _leaf_tasks(get_task_dict(list(study.tasks), task_manager(study))).items()
               if task.OUTPUT_TYPE == "generate_until"}
    for m in study.models:
        given = {**study.lm_eval.get("model_args", {}), **m.model_args}.get("max_length")
        try:
            context = int(given) if given is not None else getattr(AutoConfig.from_pretrained(m.path),
                                                                    "max_position_embeddings", None)
        except (OSError, ValueError, TypeError):
            context = None
        for scale in study.budgets if context else ():
            for task, tokens in budgets.items():
                if scaled_budget(tokens, scale) >= context:
                    raise ValueError(f"{study.path}: model {m.name} at budget {scale:g}x (budget_scale) on task {task}: "
                                     f"max_gen_toks {scaled_budget(tokens, scale)} leaves no room for a prompt within "
                                     f"max_length {context}; drop that budget or raise max_length")
    forcing = [d for d in study.decoding if as_bool("budget_forcing", d.args.get("budget_forcing", False))]
    for d in forcing:
        for scale in study.budgets:
            for task, tokens in budgets.items():
                try:
                    effective_reserve(int(d.args.get("bf_reserve", DEFAULT_RESERVE)), budget=scaled_budget(tokens, scale),
                                      scale=scale, rule=str(d.args.get("bf_reserve_rule", "scaled")))
                except ValueError as exc:
                    raise ValueError(f"{study.path}: decoding {d.name!r} at budget {scale:g}x on task {task}: {exc}") from None


def task_manager(study: Study):
    """lm-eval's task manager for the study, one per process and include path: built on
    loopeval's and the study's task folders alone when they hold every task of the study
    (indexing lm-eval's own thousands of task files takes minutes on a small machine),
    else with lm-eval's tasks too."""
    from loopeval.common.paths import tasks_path

    paths = (str(tasks_path()), *study.include_path)
    small = _task_manager(paths, False)
    return small if set(study.tasks) <= set(small.all_tasks) else _task_manager(paths, True)


@functools.cache
def _task_manager(paths: tuple[str, ...], defaults: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(paths), include_defaults=defaults)


def task_definitions(study: Study) -> dict[str, str]:
    """Each leaf task's :func:`loopeval.evaluation.identity.task_fingerprint`. Kept within a
    process while no file it was made from changed (the task folders' files, the data files)."""
    from lm_eval.tasks import get_task_dict

    from loopeval.common.paths import tasks_path
    from loopeval.evaluation.identity import task_fingerprint

    key = (study.tasks, study.include_path)
    kept = _DEFINITIONS.get(key)
    if kept is not None and _stamp(kept[0]) == kept[1]:
        return dict(kept[2])
    leaves = _leaf_tasks(get_task_dict(list(study.tasks), task_manager(study)))
    files = sorted({str(f) for folder in (tasks_path(), *study.include_path) if Path(folder).is_dir()
                    for f in Path(folder).rglob("*") if f.is_file()}
                   | {f for task in leaves.values() for f in _data_files(task.config)})
    definitions = {name: task_fingerprint(task) for name, task in leaves.items()}
    _DEFINITIONS[key] = (files, _stamp(files), definitions)
    return dict(definitions)


_DEFINITIONS: dict = {}


def _stamp(files) -> tuple:
    return tuple((f, p.stat().st_size, p.stat().st_mtime_ns) if (p := Path(f)).is_file() else (f, None) for f in files)


def _data_files(config) -> set[str]:
    """The local files a task's dataset is read from (``dataset_kwargs.data_files``, or a local ``dataset_path``)."""
    given = (config.dataset_kwargs or {}).get("data_files")
    values = given.values() if isinstance(given, dict) else [given]
    out = set()
    for value in values:
        for item in [value] if isinstance(value, (str, Path)) else (value or ()):
            out.add(str(item))
    local = Path(str(config.dataset_path or ""))
    if config.dataset_path and local.exists():
        out |= {str(f) for f in ([local] if local.is_file() else local.rglob("*")) if f.is_file()}
    return out


def _check_tasks(study: Study) -> None:
    known = set(task_manager(study).all_tasks)
    for i, task in enumerate(study.tasks):
        if task not in known:
            raise ValueError(f"{study.path}: tasks[{i}]: lm-eval cannot find task or group {task!r} "
                             f"(searched loopeval's tasks{' and ' + ', '.join(study.include_path) if study.include_path else ''})")


def _check_full_test_sets(study: Study) -> None:
    """Without ``pilot: true``, every task must read its full test set: a local data file holding a
    subset, or items that are not the test set's by question and answer, or repeated
    (:func:`loopeval.evaluation.metrics.check_items`),
    makes a pilot, which the report would refuse after every evaluation had run."""
    if study.pilot:
        return
    from lm_eval.tasks import get_task_dict

    from loopeval.evaluation.metrics import check_items, full_size

    for name, task in _leaf_tasks(get_task_dict(list(study.tasks), task_manager(study))).items():
        docs = list(task.eval_docs)
        n = len(docs)
        if n < full_size(name, n):
            raise ValueError(f"{study.path}: tasks: {name}: its data holds {n} of the task's {full_size(name, n)} test "
                             "items (a local file with a subset?); a run of a subset of the items is a pilot; set pilot: true")
        check = check_items(name, docs)
        if check is not None and (check.not_benchmark or check.duplicates):
            raise ValueError(f"{study.path}: tasks: {name}: of its {n} items, {check.describe()}: not the benchmark "
                             "(another file, an edited one, or train items?); a run of other items is a pilot; set pilot: true")


def expected_cost(study: Study, evaluations: list[Evaluation]) -> dict[str, float]:
    """Each evaluation's budgeted cost: generated tokens at the full budget × layer passes,
    summed over the items of its tasks (from the tasks' configs and datasets)."""
    from lm_eval.tasks import get_task_dict
    from transformers import AutoConfig

    from loopeval.core.cost import loop_cost
    from loopeval.core.loop import resolve_loop

    budgets = {}
    for task_name, task in _leaf_tasks(get_task_dict(list(study.tasks), task_manager(study))).items():
        if task.OUTPUT_TYPE != "generate_until":
            continue
        per_item = int(task.config.generation_kwargs.get("max_gen_toks", _lm_eval_max_gen_toks())) * int(task.config.repeats or 1)
        budgets[task_name] = per_item * len(task.eval_docs)
    passes = {}
    for m in study.models:
        loop = resolve_loop(m.path, m.loop, **m.loop_options)
        passes[m.name] = loop_cost(AutoConfig.from_pretrained(m.path), loop.spec if loop else None).passes
    return {e.name: sum(budgets.values()) * e.scale * passes[e.model.name] for e in evaluations}


def _lm_eval_max_gen_toks() -> int:
    """lm-eval's own budget for a task that sets none: ``HFLM.max_gen_toks``, a constant
    property in lm-eval 0.4.13 (read from lm-eval, not restated)."""
    from lm_eval.models.huggingface import HFLM

    return int(HFLM.max_gen_toks.fget(None))


def _leaf_tasks(tree) -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_leaf_tasks(value))
        else:
            out[getattr(key, "group_name", key) if not isinstance(key, str) else key] = value
    return out


def record(evaluation: Evaluation, study: Study) -> None:
    """Write the settings record into the partial folder, the last file before the rename."""
    (evaluation.partial / SPEC_NAME).write_text(json.dumps(evaluation.settings(study), indent=2, default=str))
