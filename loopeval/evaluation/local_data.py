"""loopeval's tasks from a local copy of their data: ``loopeval local-tasks``.

Every task in ``tasks/`` reads a hub dataset (``dataset_path``, ``dataset_name``,
``test_split``). Offline (a cluster without the hub, a pilot on a downloaded file) the
same task can read local files instead: :func:`write_local_tasks` writes, for each task
whose files it finds, a task of the same name that includes loopeval's YAML (prompt,
scoring, budgets unchanged) and reads the files with the ``datasets`` builder of their
format. Pass the folder to ``lm_eval --include_path``; group YAMLs (``loop_core`` ...)
whose tasks are all present are copied beside them, so groups run locally too.

The expected layout, under the data folder ``DATA``, is the hub repository's own name
(the last part of ``dataset_path``), then the config (``dataset_name``) if the task has
one, then the split::

    DATA/<repo>/[<config>/]<split>.<ext>        or the shards <split>-*.<ext>

with ``<ext>`` one of ``jsonl``, ``json``, ``parquet``, ``csv``. For GSM8K that is
``DATA/gsm8k/main/test.jsonl`` (the OpenAI release's ``test.jsonl``, or the hub's
``main/test-00000-of-00001.parquet``); :func:`expected_files` lists every task's.
The records must have the hub dataset's fields (the task's ``process_docs`` reads them).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from loopeval.common.paths import tasks_path

FORMATS = {"jsonl": "json", "json": "json", "parquet": "parquet", "csv": "csv"}
"""File extension -> the ``datasets`` builder that reads it."""


class _IgnoreTags(yaml.SafeLoader):
    """Reads lm-eval YAML without resolving ``!function`` tags."""


_IgnoreTags.add_multi_constructor("!", lambda loader, suffix, node: None)


def _read(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_IgnoreTags) or {}


def task_sources() -> dict[str, dict]:
    """Every task in ``tasks/`` that reads a dataset: name -> its ``dataset_path``,
    ``dataset_name`` and ``test_split`` (read from its YAML)."""
    out = {}
    for file in sorted(tasks_path().glob("*.yaml")):
        config = _read(file)
        if isinstance(config.get("task"), str) and config.get("dataset_path"):
            out[config["task"]] = {k: config.get(k) for k in ("dataset_path", "dataset_name", "test_split")}
    return out


def dataset_folder(source: dict) -> Path:
    """Where under ``DATA`` a task's files go: ``<repo>`` or ``<repo>/<config>``."""
    repo = Path(str(source["dataset_path"]).rstrip("/").split("/")[-1])
    return repo / source["dataset_name"] if source.get("dataset_name") else repo


def expected_files(task: str) -> str:
    """The layout pattern of ``task``'s local files, relative to ``DATA``."""
    source = _source(task)
    return str(dataset_folder(source) / f"{source['test_split']}.<jsonl|json|parquet|csv>")


def _source(task: str) -> dict:
    sources = task_sources()
    if task not in sources:
        raise ValueError(f"task {task!r}: not a loopeval task that reads a dataset; tasks: {', '.join(sources)}")
    return sources[task]


def find_files(data: str | Path, task: str) -> tuple[str, list[Path]] | None:
    """``(builder, files)`` of ``task``'s split under ``data``, or ``None`` if absent.
    Refuses a split present in two formats (which one is meant is not knowable)."""
    source = _source(task)
    folder = Path(data) / dataset_folder(source)
    split = source["test_split"]
    found = {}
    for ext, builder in FORMATS.items():
        files = sorted({*folder.glob(f"{split}.{ext}"), *folder.glob(f"{split}-*.{ext}")})
        if files:
            found[ext] = (builder, files)
    if len(found) > 1:
        raise ValueError(f"{folder}: split {split!r} of task {task} is there as {' and '.join(found)}; keep one format")
    return next(iter(found.values()), None)


def local_task(task: str, builder: str, files: list[Path], *, cache_dir: str | Path, name: str | None = None,
               **overrides) -> dict:
    """The YAML (as a dict) of loopeval's ``task`` reading ``files`` with ``builder``:
    named ``name`` (default: ``task``), with any other keys of ``overrides`` replaced."""
    source = _source(task)
    return {
        "include": str(tasks_path() / f"{task}.yaml"),
        "task": name or task,
        "dataset_path": builder,
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {source["test_split"]: [str(Path(f).resolve()) for f in files]},
                           "cache_dir": str(Path(cache_dir).resolve())},
        **overrides,
    }


@dataclass(frozen=True)
class LocalTasks:
    """What :func:`write_local_tasks` wrote: per task its files, the copied groups, and
    the tasks left out with the reason."""

    folder: Path
    tasks: dict[str, list[Path]] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"{task}: {', '.join(str(f) for f in files)}" for task, files in self.tasks.items()]
        lines += [f"{group}: group" for group in self.groups]
        lines += [f"skipped {task}: {why}" for task, why in self.skipped.items()]
        lines.append(f"wrote {self.folder}; run lm_eval --include_path {self.folder} --tasks ...")
        return "\n".join(lines)


def write_local_tasks(data: str | Path, out: str | Path, *, tasks: list[str] | None = None) -> LocalTasks:
    """Write into ``out`` a local-data twin of every task (default: every task of
    ``tasks/`` whose files are under ``data``; named ``tasks``: each must be found) and
    every group whose tasks are all written.

    Refused before writing: a missing ``data`` folder, an unknown task name, a named task
    whose files are missing (the message gives the expected path), no task found at all.
    """
    data = Path(data)
    if not data.is_dir():
        raise ValueError(f"--data {data}: no such folder")
    sources = task_sources()
    names = list(sources) if tasks is None else list(tasks)
    for name in names:
        _source(name)
    found, skipped = {}, {}
    for name in names:
        hit = find_files(data, name)
        if hit is None:
            skipped[name] = f"no {data / expected_files(name)}"
        else:
            found[name] = hit
    if tasks is not None and skipped:
        first = next(iter(skipped))
        raise ValueError(f"task {first}: {skipped[first]} (expected layout: DATA/{expected_files(first)})")
    if not found:
        raise ValueError(f"--data {data}: holds no task's files; e.g. GSM8K is DATA/{expected_files('gsm8k_boxed')}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = LocalTasks(out, skipped=skipped)
    for name, (builder, files) in found.items():
        config = local_task(name, builder, files, cache_dir=out / ".hf_cache")
        (out / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        result.tasks[name] = files
    for file in sorted(tasks_path().glob("*.yaml")):
        config = _read(file)
        members = config.get("task") if isinstance(config.get("group"), str) else None
        if isinstance(members, list) and all(isinstance(m, str) and m in found for m in members):
            shutil.copyfile(file, out / file.name)
            result.groups.append(config["group"])
    return result
