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

    DATA/<repo>/[<config>/]<split>.<ext>        or the hub's shards <split>-00000-of-00002.<ext>, ...

with ``<ext>`` one of ``jsonl``, ``json``, ``parquet``, ``csv``. For GSM8K that is
``DATA/gsm8k/main/test.jsonl`` (the OpenAI release's ``test.jsonl``, or the hub's
``main/test-00000-of-00001.parquet``); :func:`expected_files` lists every task's. Only
these exact names count: a ``test-backup.jsonl`` beside ``test.jsonl`` is not a shard.
The records must have the hub dataset's fields: :func:`check_task_files` reads every
record and runs the task's own ``process_docs`` on it before anything is written, so an
empty file, a bad line (named ``FILE:LINE``) or a missing column is refused up front.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from loopeval.common.jsonl import read_jsonl
from loopeval.common.outputs import check_outputs
from loopeval.common.paths import tasks_path

FORMATS = {"jsonl": "json", "json": "json", "parquet": "parquet", "csv": "csv"}
"""File extension -> the ``datasets`` builder that reads it."""


class _IgnoreTags(yaml.SafeLoader):
    """Reads lm-eval YAML without resolving ``!function`` tags."""


_IgnoreTags.add_multi_constructor("!", lambda loader, suffix, node: None)


def _read(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_IgnoreTags) or {}


class _FunctionTags(yaml.SafeLoader):
    """Reads lm-eval YAML keeping a ``!function module.name`` tag as its text."""


_FunctionTags.add_constructor("!function", lambda loader, node: str(loader.construct_scalar(node)))


def task_sources() -> dict[str, dict]:
    """Every task in ``tasks/`` that reads a dataset: name -> its ``dataset_path``,
    ``dataset_name``, ``test_split`` and ``process_docs`` (read from its YAML)."""
    out = {}
    for file in sorted(tasks_path().glob("*.yaml")):
        config = yaml.load(file.read_text(), Loader=_FunctionTags) or {}
        if isinstance(config.get("task"), str) and config.get("dataset_path"):
            out[config["task"]] = {k: config.get(k) for k in ("dataset_path", "dataset_name", "test_split", "process_docs")}
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


def split_files(folder: Path, split: str, ext: str) -> list[Path]:
    """``folder``'s files of ``split`` in format ``ext``: ``<split>.<ext>`` or the hub's
    shards ``<split>-NNNNN-of-NNNNN.<ext>``, by exact name (no other file matches)."""
    pattern = re.compile(rf"{re.escape(split)}(-\d{{5}}-of-\d{{5}})?\.{re.escape(ext)}")
    return sorted(f for f in folder.glob(f"{split}*.{ext}") if pattern.fullmatch(f.name) and f.is_file())


def find_files(data: str | Path, task: str) -> tuple[str, list[Path]] | None:
    """``(builder, files)`` of ``task``'s split under ``data``, or ``None`` if absent.
    Refuses a split present in two formats (which one is meant is not knowable)."""
    source = _source(task)
    folder = Path(data) / dataset_folder(source)
    split = source["test_split"]
    found = {}
    for ext, builder in FORMATS.items():
        files = split_files(folder, split, ext)
        if files:
            found[ext] = (builder, files)
    if len(found) > 1:
        raise ValueError(f"{folder}: split {split!r} of task {task} is there as {' and '.join(found)}; keep one format")
    return next(iter(found.values()), None)


def _records(file: Path) -> list[tuple[str, dict]]:
    """``(where, record)`` of every record in ``file`` (``where`` is ``FILE:LINE`` or
    ``FILE: row N``); a bad line, a record that is not an object or an empty file is a
    ``ValueError`` naming the file."""
    ext = file.suffix.lstrip(".")

    def an_object(lineno, record):
        if not isinstance(record, dict):
            raise TypeError(f"expected a JSON object, got {type(record).__name__}")
        return record

    if ext == "json":
        try:
            text = file.read_text(encoding="utf-8-sig")
            whole = json.loads(text)
        except (ValueError, UnicodeDecodeError):
            whole = None  # JSON lines, read below
        if isinstance(whole, list):
            rows = [(f"{file}: record {i + 1}", r) for i, r in enumerate(whole)]
            bad = next((where for where, r in rows if not isinstance(r, dict)), None)
            if bad is not None:
                raise ValueError(f"{bad}: expected a JSON object")
            ext = None
        elif whole is not None and (not isinstance(whole, dict) or "\n" in text.strip()):
            raise ValueError(f"{file}: holds a JSON {type(whole).__name__}, not records (JSON lines or a list of objects)")
    if ext in ("jsonl", "json"):
        rows = [(f"{file}:{lineno}", r) for lineno, r in read_jsonl(file, an_object, what="data", byte_order_mark=True)]
    elif ext == "csv":
        with file.open(newline="", encoding="utf-8-sig") as f:  # a spreadsheet's byte-order mark is not a field name
            reader = csv.DictReader(f)
            rows = [(f"{file}:{reader.line_num}", dict(r)) for r in reader]
    elif ext == "parquet":
        import pyarrow.parquet

        try:
            table = pyarrow.parquet.read_table(file)
        except Exception as exc:  # pyarrow's errors have no common base
            raise ValueError(f"{file}: not a readable parquet file ({exc})") from None
        rows = [(f"{file}: row {i + 1}", r) for i, r in enumerate(table.to_pylist())]
    if not rows:
        raise ValueError(f"{file}: holds no records (an empty file)")
    return rows


class _Records:
    """The few ``datasets.Dataset`` operations the tasks' ``process_docs`` use, over plain
    records, so an error names the record's file and line."""

    def __init__(self, rows: list[tuple[str, dict]], task: str):
        self.rows, self.task = rows, task

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, column: str) -> list:
        for where, record in self.rows:
            if column not in record:
                raise ValueError(f"{where}: no field {column!r} (task {self.task} reads it; fields: {', '.join(record)})")
        return [record[column] for _, record in self.rows]

    def select(self, indices) -> _Records:
        return _Records([self.rows[i] for i in indices], self.task)

    def map(self, function) -> _Records:
        out = []
        for where, record in self.rows:
            try:
                out.append((where, function(record)))
            except KeyError as exc:
                raise ValueError(f"{where}: no field {exc} (task {self.task} reads it; fields: {', '.join(record)})") from None
            except (TypeError, ValueError, AttributeError, IndexError) as exc:
                raise ValueError(f"{where}: task {self.task} cannot read this record ({type(exc).__name__}: {exc})") from None
        return _Records(out, self.task)


def _process_docs(task: str):
    """The task's own ``process_docs`` function, loaded from ``tasks/utils.py``."""
    module_name, _, function = str(_source(task)["process_docs"]).rpartition(".")
    spec = importlib.util.spec_from_file_location(f"loopeval_tasks_{module_name}", tasks_path() / f"{module_name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def check_task_files(task: str, files: list[Path]) -> int:
    """Read every record of ``files`` and run ``task``'s ``process_docs`` over them;
    return the record count. Refused with the file (and line) named: an empty file, a
    line that is not JSON (or not an object), a record without a field the task reads,
    a value the task cannot read."""
    rows = [row for file in files for row in _records(Path(file))]
    _process_docs(task)(_Records(rows, task))
    return len(rows)


def check_local_tasks(folders, *, tasks=None) -> list[str]:
    """Check the data of every local task in the task ``folders`` (a YAML written by
    :func:`local_task`: it includes a loopeval task and names its ``data_files``), or of
    those named in ``tasks``, with :func:`check_task_files`, before lm-eval loads anything;
    return the tasks checked."""
    sources, checked = task_sources(), []
    for folder in folders:
        for file in sorted(Path(folder).glob("*.yaml")):
            config = _read(file)
            base = Path(str(config.get("include") or "")).stem
            data_files = (config.get("dataset_kwargs") or {}).get("data_files") if isinstance(
                config.get("dataset_kwargs"), dict) else None
            if base not in sources or not isinstance(data_files, dict) or (
                    tasks is not None and config.get("task") not in tasks):
                continue
            files = data_files.get(sources[base]["test_split"]) or []
            files = [files] if isinstance(files, str) else files
            for f in files:
                if not Path(f).is_file():
                    raise ValueError(f"{file}: task {config.get('task')} reads {f}, which does not exist")
            try:
                check_task_files(base, [Path(f) for f in files])
            except ValueError as exc:
                raise ValueError(f"{exc} (task {config.get('task')}, {file})") from None
            checked.append(str(config.get("task")))
    return checked


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
    whose files are missing (the message gives the expected path), no task found at all,
    a found file whose records the task cannot read (:func:`check_task_files`), and an
    ``out`` that is ``data`` or one of loopeval's installed folders.
    """
    data = Path(data)
    if not data.is_dir():
        raise ValueError(f"--data {data}: no such folder")
    check_outputs({"--out": out}, [data])
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
    for name, (builder, files) in found.items():
        check_task_files(name, files)
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
