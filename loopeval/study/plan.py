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

from loopeval.study.spec import DecodingSpec, ModelSpec, Study

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
            args.update({f"loop_{k}": v for k, v in (("operator", self.model.operator), ("beta", self.model.beta),
                                                      ("mix", self.model.mix)) if v is not None})
        for key in ("dtype",):
            if key in study.lm_eval:
                args[key] = study.lm_eval[key]
        args.update(self.decoding.args)
        args.update(budget_scale=self.scale, trace=str(self.partial), resume_dir=str(self.resume))
        return args

    def settings(self, study: Study) -> dict:
        """What the outputs depend on: reusing a finished folder needs every one equal."""
        args = {k: v for k, v in self.model_args(study).items() if k not in ("trace", "resume_dir")}
        shared = {k: v for k, v in study.lm_eval.items() if k not in ("model_args", "dtype")}
        return {"model_args": args, "tasks": list(study.tasks), "lm_eval": shared}


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


def status(evaluation: Evaluation, study: Study) -> str:
    """"done" (a finished folder with these settings) or "todo". A finished folder made
    with other settings is refused, naming the evaluation and the first setting that differs."""
    spec = evaluation.folder / SPEC_NAME
    if not spec.is_file():
        return "todo"
    recorded = json.loads(spec.read_text())
    wanted = json.loads(json.dumps(evaluation.settings(study)))
    if recorded != wanted:
        diff = _first_difference(recorded, wanted)
        raise ValueError(
            f"evaluation {evaluation.name}: {evaluation.folder} was made with other settings ({diff}); "
            "change the study's output folder, or delete that folder to redo it"
        )
    return "done"


def _first_difference(a, b, where: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else key)
    return f"{where}: {a!r} then, {b!r} now"


def check_before_compute(study: Study, evaluations: list[Evaluation]) -> None:
    """Everything that can be known before any weights load: the tasks exist, each model's
    loop fits its config, twins and looped models get the same per-model args (unless the
    study names the difference in ``intended_differences``), twins share their training
    manifest, and no finished folder was made with other settings."""
    from loopeval.loop import resolve_loop
    from loopeval.manifest import find_manifest, twin_mismatches

    _check_tasks(study)
    for i, m in enumerate(study.models):
        try:
            loop = resolve_loop(m.path, m.loop, operator=m.operator, beta=m.beta, mix=m.mix)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{study.path}: models[{i}] ({m.name}): {exc}") from None
        if m.role == "looped" and loop is None:
            raise ValueError(f"{study.path}: models[{i}] ({m.name}): role looped, but {m.path} has no "
                             "loop_config.json; give base: and loop:, or the looped checkpoint")
        if m.role != "looped" and loop is not None:
            raise ValueError(f"{study.path}: models[{i}] ({m.name}): role {m.role}, but {m.path} is looped ({loop.spec})")
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
    for e in evaluations:
        status(e, study)


def task_manager(study: Study):
    """lm-eval's task manager for the study, one per process and include path: built on
    loopeval's and the study's task folders alone when they hold every task of the study
    (indexing lm-eval's own thousands of task files takes minutes on a small machine),
    else with lm-eval's tasks too."""
    from loopeval.paths import tasks_path

    paths = (str(tasks_path()), *study.include_path)
    small = _task_manager(paths, False)
    return small if set(study.tasks) <= set(small.all_tasks) else _task_manager(paths, True)


@functools.cache
def _task_manager(paths: tuple[str, ...], defaults: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(paths), include_defaults=defaults)


def _check_tasks(study: Study) -> None:
    known = set(task_manager(study).all_tasks)
    for i, task in enumerate(study.tasks):
        if task not in known:
            raise ValueError(f"{study.path}: tasks[{i}]: lm-eval cannot find task or group {task!r} "
                             f"(searched loopeval's tasks{' and ' + ', '.join(study.include_path) if study.include_path else ''})")


def expected_cost(study: Study, evaluations: list[Evaluation]) -> dict[str, float]:
    """Each evaluation's budgeted cost: generated tokens at the full budget × layer passes,
    summed over the items of its tasks (from the tasks' configs and datasets)."""
    from lm_eval.tasks import get_task_dict
    from transformers import AutoConfig

    from loopeval.cost import loop_cost
    from loopeval.loop import resolve_loop

    budgets = {}
    for task_name, task in _leaf_tasks(get_task_dict(list(study.tasks), task_manager(study))).items():
        if task.OUTPUT_TYPE != "generate_until":
            continue
        per_item = int(task.config.generation_kwargs.get("max_gen_toks", 256)) * int(task.config.repeats or 1)
        budgets[task_name] = per_item * len(task.eval_docs)
    passes = {}
    for m in study.models:
        loop = resolve_loop(m.path, m.loop, operator=m.operator, beta=m.beta, mix=m.mix)
        passes[m.name] = loop_cost(AutoConfig.from_pretrained(m.path), loop.spec if loop else None).passes
    return {e.name: sum(budgets.values()) * e.scale * passes[e.model.name] for e in evaluations}


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
