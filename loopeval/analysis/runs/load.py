"""Read one lm-eval run (:func:`load_run`): its results file, each task's samples file and the
cost traces written while it was evaluating, refusing a run that does not cover its items."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

import numpy as np

from loopeval.analysis.runs.run import Run, TaskScores, _expand
from loopeval.common.jsonl import read_jsonl
from loopeval.evaluation.metrics import check_items, full_size, unit_of
from loopeval.evaluation.trace import find_traces

_RESERVED = {"alias", "name", "sample_len", "sample_count"}


def _results_file(path: Path) -> Path:
    """The results file for a results file, a model folder or an ``--output_path`` folder."""
    if not path.exists():
        raise FileNotFoundError(f"no such run: {path}")
    if path.is_file():
        return path
    files = sorted(path.glob("results_*.json"))
    if not files:
        models = sorted(d for d in path.iterdir() if d.is_dir() and any(d.glob("results_*.json")))
        if len(models) > 1:
            raise ValueError(f"{path} holds several model folders ({', '.join(d.name for d in models)}); name one")
        if not models:
            raise FileNotFoundError(f"no lm-eval results_*.json in {path} or its model folders")
        files = sorted(models[0].glob("results_*.json"))
    return max(files, key=_stamp)  # ISO timestamps sort as text


def _versions(results: dict, results_file: Path) -> dict:
    versions = results.get("versions") or {}
    if not isinstance(versions, dict):
        raise ValueError(f"{results_file}: field 'versions' is a {type(versions).__name__}, expected a mapping of task -> version")
    return dict(versions)


def _stamp(results_file: Path) -> str:
    """lm-eval's timestamp in a results file name (after the last "_"), shared by its samples files."""
    return results_file.stem.rsplit("_", 1)[-1]


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable lm-eval results file ({exc})") from None


def _metric_key(task: str, reported: Mapping, requested: str | None) -> str:
    # lm-eval reports "metric,filter" keys in metric_list order under each filter; the first is the main one.
    keys = [k for k in reported if "," in k and k not in _RESERVED and "_stderr," not in k]
    if requested is None:
        if not keys:
            raise ValueError(f"task {task}: lm-eval reported no metric")
        return keys[0]
    if requested in keys:
        return requested
    matches = [k for k in keys if k.split(",", 1)[0] == requested]
    if not matches:
        raise ValueError(f"task {task}: no metric {requested!r}; it has {keys}")
    return matches[0]


def _number(value, path: Path, lineno: int, metric: str) -> float:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        raise ValueError(f"{path}:{lineno}: metric {metric!r} is {value!r}, not a per-item number")
    return float(np.mean(values))


def _read_samples(path: Path, metric: str) -> dict[int, dict]:
    """``{doc_id: {"value", "hashes": (doc_hash, target_hash, prompt_hash), "line", "doc"}}`` for the
    metric's filter. A doc recorded twice is refused unless the two records agree."""
    name, filt = metric.split(",", 1)

    def parse(lineno: int, rec: dict):
        if rec["filter"] != filt:
            return None
        return (int(rec["doc_id"]), (rec["doc_hash"], rec["target_hash"], rec["prompt_hash"]), rec[name],
                rec.get("doc"), _answered(rec))

    items: dict[int, dict] = {}
    for lineno, (doc_id, hashes, value, doc, answered) in read_jsonl(path, parse, what="lm-eval samples"):
        number = _number(value, path, lineno, name)
        if doc_id in items:
            first = items[doc_id]
            if (first["hashes"], first["value"]) != (hashes, number):
                raise ValueError(f"{path}:{lineno}: doc_id {doc_id} is recorded twice with different "
                                 f"{'hashes' if first['hashes'] != hashes else 'scores'} (first on line {first['line']})")
            continue  # an identical duplicate record adds nothing
        items[doc_id] = {"value": number, "hashes": hashes, "line": lineno, "doc": doc, "answered": answered}
    return items


def _answered(rec: dict) -> float | None:
    """The share of an item's responses that gave a scored answer (loopeval's boxed-answer
    tasks record the extracted answer, ``None`` for none); ``None`` for other tasks."""
    if "extracted" not in rec:
        return None
    answers = rec["extracted"] if isinstance(rec["extracted"], list) else [rec["extracted"]]
    return sum(a is not None for a in answers) / len(answers) if answers else 0.0


def _run_window(results: dict, results_file: Path) -> tuple[float, float] | None:
    """When the run was evaluating, in Unix seconds: lm-eval's start ``date`` to the results file's timestamp.

    The file name holds local wall-clock time; read in another time zone it falls outside
    the run, and ``date`` plus ``total_evaluation_time_seconds`` bounds the end instead.
    """
    if results.get("date") is None:
        return None
    start = float(results["date"])
    longest = start + float(results.get("total_evaluation_time_seconds") or 0)
    day, _, clock = _stamp(results_file).partition("T")
    try:
        end = datetime.fromisoformat(f"{day}T{clock.replace('-', ':')}").timestamp()
    except ValueError:
        return start, longest
    return start, end if start <= end <= longest else longest


def _trace_index(folders: Sequence[Path], window: tuple[float, float] | None, model_args=None,
                 results_file: Path | None = None) -> tuple[dict, dict, tuple]:
    """``{(task, doc_id, prompt_hash): (trace order, header, records)}`` over the folders' traces,
    ``{key: why}`` for the keys held only by traces written outside the run, and the headers
    of the run's traces (what a scoring-only selection reads: loglikelihood generates nothing).

    Only traces created while the run was evaluating, by a model with the run's
    ``model_args`` (:func:`loopeval.evaluation.identity.header_mismatch`), count: folders are often shared
    by several runs, even at once. The newest trace holding a key supplies all of that key's records.
    """
    from loopeval.evaluation.identity import header_mismatch

    index, foreign = {}, {}
    inside = []
    for trace in sorted((t for d in folders for t in find_traces(d)), key=lambda t: t.created):
        mismatch = header_mismatch(trace.header, model_args)
        if mismatch:
            why = (f"{trace.path} holds it but was written by another run than {results_file} ({mismatch}); "
                   "refusing to join them")
            foreign.update({(i.task, i.doc_id, i.prompt_hash): why for i in trace.items})
            continue
        if window is None or window[0] <= trace.created <= window[1]:
            inside.append(trace)
            continue
        when = datetime.fromtimestamp(trace.created).isoformat(timespec="seconds")
        why = (f"{trace.path} holds it but was written at {when}, outside this run's evaluation "
               f"({datetime.fromtimestamp(window[0]).isoformat(timespec='seconds')} to "
               f"{datetime.fromtimestamp(window[1]).isoformat(timespec='seconds')}), so it belongs to another run")
        foreign.update({(i.task, i.doc_id, i.prompt_hash): why for i in trace.items})
    for order, trace in enumerate(inside):
        grouped = defaultdict(list)
        for item in trace.items:
            grouped[(item.task, item.doc_id, item.prompt_hash)].append(item)
        index.update({k: (order, trace.header, tuple(v)) for k, v in grouped.items()})
    return index, foreign, tuple(t.header for t in inside)


def _item_counts(task: str, results: dict, results_file: Path, allow_subset: bool) -> tuple[int, int, int]:
    """The task's items as lm-eval counted them (``n-samples``: original, effective) and its
    full test set's; a run short of the full test set is refused unless ``allow_subset``."""
    n_samples = results.get("n-samples", {})
    if not isinstance(n_samples, dict):
        raise ValueError(f"{results_file}: field 'n-samples' is a {type(n_samples).__name__}, expected a mapping "
                         "of task -> {original, effective}")
    counts = n_samples.get(task)
    if counts is None:
        raise ValueError(f"{results_file}: task {task} has no n-samples entry")
    if not isinstance(counts, dict) or not all(
            isinstance(counts.get(k), int) and not isinstance(counts.get(k), bool) for k in ("original", "effective")):
        raise ValueError(f"{results_file}: field 'n-samples.{task}' is {counts!r}, expected "
                         "{'original': int, 'effective': int}")
    original, effective = counts["original"], counts["effective"]
    full = full_size(task, original)
    if effective < full and not allow_subset:
        how = (f"the run was cut by --limit ({effective} of {original} items)" if effective < original
               else f"its data holds {original} of the task's {full} test items (a local file with a subset?)")
        if effective < original < full:
            how += f", of a data file holding {original} of the task's {full} test items"
        raise ValueError(
            f"{results_file}: task {task}: {how}; every evaluation must cover all of its items (a pilot: --allow-subset)"
        )
    return original, effective, full


def _samples(task: str, results_file: Path, key: str, effective: int) -> tuple[Path, dict[int, dict]]:
    """The task's samples file beside ``results_file`` and its items (:func:`_read_samples`), all ``effective`` of them."""
    samples_path = results_file.with_name(f"samples_{task}_{_stamp(results_file)}.jsonl")
    if not samples_path.exists():
        raise ValueError(
            f"task {task}: no samples file {samples_path.name} beside {results_file} (deleted, or lm_eval ran without "
            "--log_samples); evaluate again with --log_samples (loopeval protocol re-runs a study's evaluation)"
        )
    items = _read_samples(samples_path, key)
    if len(items) != effective:
        present = set(items)
        missing = sorted(set(range(effective)) - present)[:5]
        raise ValueError(
            f"task {task}: {samples_path} has {len(items)} of {effective} items"
            + (f" (missing doc_id {', '.join(map(str, missing))}...)" if missing else "")
            + "; every evaluation must cover all of its items"
        )
    return samples_path, items


def _benchmark_items(task: str, samples_path: Path, items: dict[int, dict], full: int,
                     allow_subset: bool) -> tuple[np.ndarray, list[dict], tuple[int, ...], tuple[int, ...]]:
    """The items sorted by ``doc_id`` (a repeated item kept once), the doc_ids not in the
    task's test set and those repeating an earlier item (:func:`loopeval.evaluation.metrics.check_items`);
    either kind is refused unless ``allow_subset``."""
    doc_ids = np.array(sorted(items))
    recs = [items[d] for d in doc_ids]
    check = check_items(task, [r["doc"] for r in recs])
    outside = tuple(int(doc_ids[i]) for i in check.not_benchmark) if check else ()
    duplicated = tuple(int(doc_ids[i]) for i, _ in check.duplicates) if check else ()
    if (outside or duplicated) and not allow_subset:
        raise ValueError(
            f"{samples_path}: task {task}: of its {len(recs)} items, "
            f"{check.describe(lambda i: f'doc_id {int(doc_ids[i])}')}: this run is not the benchmark of {full} items "
            "(another file, an edited one, or train items?); a pilot over them: --allow-subset")
    if duplicated:  # a repeated item is one item: counted once, in every statistic
        keep = [i for i, d in enumerate(doc_ids) if int(d) not in set(duplicated)]
        doc_ids, recs = doc_ids[keep], [recs[i] for i in keep]
    return doc_ids, recs, outside, duplicated


def _clusters(task: str, samples_path: Path, doc_ids: np.ndarray, recs: list[dict],
              cluster_field: str | None) -> tuple[str, ...] | None:
    """Each item's value of the doc field ``cluster_field`` (``None`` without one); every item must have it."""
    if cluster_field is None:
        return None
    missing = [int(d) for d, r in zip(doc_ids, recs) if not isinstance(r["doc"], dict) or cluster_field not in r["doc"]]
    if missing:
        raise ValueError(f"task {task}: {samples_path}: doc_id {missing[0]} has no doc field {cluster_field!r} "
                         f"to cluster on ({len(missing)} of {len(recs)} items lack it)")
    return tuple(str(r["doc"][cluster_field]) for r in recs)


def _load_task(task: str, results: dict, results_file: Path, metric: str | None, traces: tuple[dict, dict, tuple],
               cluster_field: str | None, allow_subset: bool = False) -> TaskScores:
    original, effective, full = _item_counts(task, results, results_file, allow_subset)
    key = _metric_key(task, results["results"].get(task, {}), metric)
    direction = results.get("higher_is_better", {}).get(task, {}).get(key.split(",", 1)[0], True)
    if direction is None:
        raise ValueError(f"{results_file}: task {task}: metric {key} has no direction (higher_is_better: null), "
                         "so it cannot be compared; pick another metric")
    samples_path, items = _samples(task, results_file, key, effective)
    config = results["configs"].get(task) or {}
    doc_ids, recs, outside, duplicated = _benchmark_items(task, samples_path, items, full, allow_subset)
    prompt_hashes = tuple(r["hashes"][2] for r in recs)
    index, foreign, _ = traces
    joined = tuple(index.get((task, int(d), h), (None, None, ()))[2] for d, h in zip(doc_ids, prompt_hashes))
    clusters = _clusters(task, samples_path, doc_ids, recs, cluster_field)
    return TaskScores(
        task=task,
        metric=key,
        doc_ids=doc_ids,
        scores=np.array([r["value"] for r in recs]),
        doc_hashes=tuple(r["hashes"][0] for r in recs),
        target_hashes=tuple(r["hashes"][1] for r in recs),
        prompt_hashes=prompt_hashes,
        n_original=original,
        n_effective=effective,
        generation_kwargs=config.get("generation_kwargs"),
        samples_path=samples_path,
        trace=joined if any(joined) else None,
        clusters=clusters,
        foreign_traces=foreign,
        answered=None if any(r["answered"] is None for r in recs) else np.array([r["answered"] for r in recs]),
        higher_is_better=bool(direction),
        unit=unit_of(key, [r["value"] for r in recs]),
        output_type=config.get("output_type"),
        foreign_items=outside,
        duplicate_items=duplicated,
    )


def load_run(path: str | Path, *, metric: str | Mapping[str, str] | None = None,
             tasks: Sequence[str] | None = None, cluster_field: str | None = None, allow_subset: bool = False) -> Run:
    """Load an lm-eval run: a results file, a model folder or an ``--output_path`` folder.

    A folder gives its latest results file. ``metric`` overrides each task's main metric
    (lm-eval's first reported ``metric,filter``): ``"exact_match"`` (first filter),
    ``"exact_match,flexible-extract"``, or ``{task: metric}``. ``tasks`` selects leaf
    tasks or groups (expanded to their leaf tasks); default: every leaf task. Cost traces
    are read from the model folder and its parent; of those created while the run was
    evaluating, the newest holding an item's (task, doc_id, prompt_hash) supplies its records.
    ``cluster_field`` names a doc field whose value clusters items (e.g. the source problem
    of items that share one) for the cluster bootstrap. ``allow_subset`` accepts a run cut by
    ``--limit`` (a pilot; :func:`pilot_label`).
    """
    results_file = _results_file(Path(path))
    results = _read_json(results_file)
    if not isinstance(results, dict) or not isinstance(results.get("configs"), dict) \
            or not isinstance(results.get("results"), dict):
        raise ValueError(f"{results_file}: not an lm-eval results file (no 'results' and 'configs')")
    leaves = list(results["configs"])
    groups = {g: tuple(s) for g, s in results.get("group_subtasks", {}).items() if g not in results["configs"]}
    selected = leaves if tasks is None else _expand(tasks, groups, leaves, results_file)
    model_dir = results_file.parent
    try:
        traces = _trace_index([model_dir, model_dir.parent], _run_window(results, results_file),
                              (results.get("config") or {}).get("model_args"), results_file)
        trace_error = None
    except ValueError as exc:  # a crashed run's trace in a shared folder must not block accuracies
        traces, trace_error = ({}, {}, ()), f"cannot read the cost traces: {exc}"
    per_task = {}
    for task in selected:
        wanted = metric.get(task) if isinstance(metric, Mapping) else metric
        per_task[task] = _load_task(task, results, results_file, wanted, traces, cluster_field, allow_subset)
    keys = [(s.task, d, h) for s in per_task.values() for d, h in zip(s.doc_ids.tolist(), s.prompt_hashes)]
    used = dict(traces[0][k][:2] for k in keys if k in traces[0])  # trace order -> header
    members = {g: tuple(_expand([g], groups, leaves, results_file)) for g in groups}
    return Run(
        path=results_file,
        name=str(results.get("model_name_sanitized") or model_dir.name),
        tasks=per_task,
        groups={g: m for g, m in members.items() if set(m) <= set(per_task)},
        config=results.get("config", {}),
        trace_headers=tuple(used[order] for order in sorted(used)) or traces[2],
        trace_error=trace_error,
        versions=_versions(results, results_file),
    )

