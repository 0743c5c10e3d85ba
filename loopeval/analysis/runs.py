"""Read lm-eval runs (``--output_path`` folders written with ``--log_samples``) and pair them.

:func:`load_run` gives one run's per-item scores for each leaf task, its configuration
and, where the ``looped`` model wrote one, its per-item cost trace. :func:`pair_runs`
aligns several runs item by item (``doc_id``, checked by ``doc_hash`` and
``target_hash``) for the paired statistics of :mod:`loopeval.analysis.stats`.

Every evaluation must cover all of its items: a run cut by ``--limit``, a run over a
local data file holding fewer than the task's full test set (:data:`loopeval.evaluation.metrics.TEST_SET_SIZES`),
a run with items that are not in that test set (where its items are known,
:data:`loopeval.evaluation.metrics.TEST_SET_ITEMS`), a samples file missing items, a corrupt samples line or runs of different items are
refused with a ``ValueError`` that names the task, the file or the counts. A pilot is the
explicit exception: ``load_run(..., allow_subset=True)`` accepts such a run, and
:func:`pilot_label` then says "pilot: n of N items", N the benchmark's size, wherever its
results are shown.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from loopeval.analysis.stats import Resampler
from loopeval.common.jsonl import read_jsonl
from loopeval.evaluation.metrics import POINTS, Unit, check_items, full_size, unit_of
from loopeval.evaluation.trace import TraceHeader, TraceItem, find_traces
from loopeval.analysis.stats.options import COST_MODES, DEFAULTS

_RESERVED = {"alias", "name", "sample_len", "sample_count"}


@dataclass(frozen=True, eq=False)
class TaskScores:
    """One leaf task of a run: per-item scores of one metric, items sorted by ``doc_id``.

    ``scores[i]`` is the metric of item ``doc_ids[i]`` (the mean of a list-valued metric).
    ``trace[i]`` holds the item's cost-trace records (empty where none joined); ``trace``
    is ``None`` when no trace covers the task. ``higher_is_better`` is the metric's
    direction as lm-eval reports it (``False`` for ``gsm8k_nll``'s ``nll_per_byte``);
    ``scores`` are as reported, and :func:`pair_runs` orients them. ``unit`` is the
    metric's (:func:`loopeval.evaluation.metrics.unit_of`); ``output_type`` lm-eval's
    (only ``generate_until`` tasks have a generation trace).
    """

    task: str
    metric: str
    doc_ids: np.ndarray
    scores: np.ndarray
    doc_hashes: tuple[str, ...]
    target_hashes: tuple[str, ...]
    prompt_hashes: tuple[str, ...]
    n_original: int
    n_effective: int
    generation_kwargs: Mapping | None
    samples_path: Path
    trace: tuple[tuple[TraceItem, ...], ...] | None
    clusters: tuple | None = None  # per-item cluster ids (load_run's cluster_field)
    answered: np.ndarray | None = None  # per item, share of responses with a scored answer (boxed-answer tasks)
    foreign_traces: Mapping[tuple, str] = None  # keys of traces written outside this run -> why
    higher_is_better: bool = True
    unit: Unit = POINTS
    output_type: str | None = None
    foreign_items: tuple[int, ...] = ()  # doc_ids not items of the task's full test set (metrics.check_items)
    duplicate_items: tuple[int, ...] = ()  # doc_ids repeating an earlier item, left out (counted once)

    @property
    def n(self) -> int:
        return len(self.doc_ids)

    @property
    def n_full(self) -> int:
        """Items of the task's full test set (:func:`loopeval.evaluation.metrics.full_size`)."""
        return full_size(self.task, self.n_original)

    @property
    def generative(self) -> bool:
        """Whether the task generates text (lm-eval's ``generate_until``), so a trace records its cost."""
        return self.output_type in (None, "generate_until")

    @property
    def accuracy(self) -> float:
        return float(self.scores.mean())

    def _traced(self) -> tuple[tuple[TraceItem, ...], ...]:
        if self.trace is None:
            why = next((self.foreign_traces[(self.task, int(d), h)] for d, h in zip(self.doc_ids, self.prompt_hashes)
                        if (self.task, int(d), h) in (self.foreign_traces or {})), None)
            raise ValueError(
                f"{self.samples_path.parent}: task {self.task}: no loopeval cost trace covers it "
                + (f"({why})" if why else "(the looped model writes one for generation requests)")
            )
        missing = [(int(d), h) for d, h, recs in zip(self.doc_ids, self.prompt_hashes, self.trace) if not recs]
        if missing:
            doc_id, prompt = missing[0]
            why = (self.foreign_traces or {}).get((self.task, doc_id, prompt))
            raise ValueError(
                f"{self.samples_path.parent}: task {self.task}: {len(missing)} of {self.n} items have no trace "
                f"record joined on (task, doc_id, prompt_hash), e.g. doc_id {doc_id}"
                + (f"; {why}" if why else "; the trace lost their lines (cut or edited), or a model other than "
                   "loopeval's looped generated them: evaluate again (loopeval protocol re-runs a study's evaluation)")
            )
        return self.trace

    @property
    def passes(self) -> np.ndarray:
        """Per-item layer passes of generation: generated tokens × passes per token, from the trace."""
        return np.array([sum(r.generated_tokens * r.passes_per_token for r in recs) for recs in self._traced()])

    @property
    def finished(self) -> np.ndarray:
        """Per item, whether every generation of it finished within its budget: ended by
        end-of-sequence or a stop string (from the trace). Not whether it gave an answer
        (:attr:`answered`)."""
        return np.array([all(r.finished for r in recs) for recs in self._traced()])

    @property
    def flops(self) -> np.ndarray:
        """Per-item FLOPs from the trace (summed over an item's requests and repeats)."""
        return np.array([sum(r.flops for r in recs) for recs in self._traced()])

    @property
    def tokens(self) -> np.ndarray:
        """Per-item prompt plus generated tokens from the trace."""
        return np.array([sum(r.prompt_tokens + r.generated_tokens for r in recs) for recs in self._traced()])



@dataclass(frozen=True, eq=False)
class Run:
    """One lm-eval run: its results file, leaf tasks, groups, configuration and traces.

    ``trace_headers`` are the headers of the traces that supplied records, oldest first (of a
    scoring-only run, its traces without records);
    ``trace_error`` says why the folder's traces could not be read (costs then raise it,
    accuracies work).
    """

    path: Path
    name: str
    tasks: Mapping[str, TaskScores]
    groups: Mapping[str, tuple[str, ...]]
    config: Mapping
    trace_headers: tuple[TraceHeader, ...]
    trace_error: str | None = None
    versions: Mapping = None  # lm-eval's task versions

    @property
    def identity(self):
        """What this evaluation is (:class:`loopeval.evaluation.identity.Identity`)."""
        from loopeval.evaluation.identity import of_run

        return of_run(self)

    @property
    def model_args(self):
        return self.config.get("model_args")

    @property
    def label(self) -> str:
        """The model's name plus its loop, from the trace header: ``SmolLM2-135M (loop 6:8x2
        repeat)`` or ``SmolLM2-135M (unlooped)``; lm-eval's model name without a trace."""
        h = self.header
        if h is None:
            return self.name
        args = self.model_args
        if isinstance(args, Mapping):
            gguf = args.get("gguf_file")
        else:
            gguf = next((a.split("=", 1)[1] for a in str(args or "").split(",") if a.startswith("gguf_file=")), None)
        model = Path(gguf).stem if gguf else Path(str(h.model or self.name).rstrip("/")).name
        if not h.looped:
            return f"{model} (unlooped)"
        loop = h.loop
        operator = loop.get("operator", "")
        if operator == "damped":
            operator += f" beta={loop.get('beta')}"
        exit_after = f", exit after {h.exit_after}" if h.exit_after else ""
        return f"{model} (loop {loop.get('loop')} {operator}{exit_after})".replace("  ", " ")

    @property
    def header(self) -> TraceHeader | None:
        """The newest trace header that supplied records, or ``None`` without a trace."""
        return self.trace_headers[-1] if self.trace_headers else None

    def accuracy(self, tasks: Sequence[str] | None = None) -> float:
        """Macro accuracy: unweighted mean over the (leaf) tasks."""
        return float(np.mean([self.tasks[t].accuracy for t in self._leaves(tasks)]))

    def cost(self, tasks: Sequence[str] | None = None, *, mode: str = "passes",
             flops_per_token: float | None = None) -> float:
        """Total inference cost of the tasks' items, from the trace.

        ``mode="passes"`` (the paper's charge, A.2: "We charge the loop its layer passes,
        (N+m)/N"): generated tokens × layer passes per token, in units of the model's
        average layer (:attr:`pass_unit`), so runs of one base model compare by layer
        passes exactly and a larger model is charged its larger layers. ``mode="flops"``:
        the traced forward FLOPs (LM head, prompt and attention included); with
        ``flops_per_token``, that figure times the traced prompt and generated tokens.
        Only generative tasks are charged. Tasks that generate nothing (log-likelihood
        scoring: ``gsm8k_nll``, letter logits) have no generation trace; when none of the
        tasks generates, the cost is the loop's nominal charge: c layer passes per scored
        item (:meth:`nominal_cost`), so a loop costs c times its twin.
        """
        if mode not in COST_MODES:
            raise ValueError(f"cost mode {mode!r}: choose one of {', '.join(COST_MODES)}")
        leaves = self._leaves(tasks)
        if self.trace_error:
            raise ValueError(self.trace_error)
        generative = [t for t in leaves if self.tasks[t].generative]
        if not generative:
            return self.nominal_cost(leaves)
        leaves = generative
        if mode == "passes":
            return float(self.pass_unit * sum(self.tasks[t].passes.sum() for t in leaves))
        if flops_per_token is None:
            return float(sum(self.tasks[t].flops.sum() for t in leaves))
        if not flops_per_token > 0:
            raise ValueError(f"flops_per_token must be positive, got {flops_per_token!r}")
        return float(flops_per_token * sum(self.tasks[t].tokens.sum() for t in leaves))

    def forcing(self, tasks: Sequence[str] | None = None) -> dict[str, float]:
        """Budget forcing in the trace of the tasks' generation: the requests it fired on
        (``forced``) of all (``requests``), the generated tokens (``tokens``) and those from
        the forced answer on (``tokens_after``: the inserted answer string and what followed
        it), and the layer-pass cost of those (``cost_after``, in :meth:`cost`'s ``passes`` unit)."""
        leaves = [t for t in self._leaves(tasks) if self.tasks[t].generative]
        recs = [r for t in leaves for item in self.tasks[t]._traced() for r in item]
        forced = [r for r in recs if r.forced_at is not None]
        return {"forced": len(forced), "requests": len(recs), "tokens": sum(r.generated_tokens for r in recs),
                "tokens_after": sum(max(0, r.generated_tokens - r.forced_at) for r in forced),
                "cost_after": self.pass_unit * sum(max(0, r.generated_tokens - r.forced_at) * r.passes_per_token
                                                   for r in forced)}

    def nominal_cost(self, tasks: Sequence[str] | None = None) -> float:
        """c layer passes (of :attr:`pass_unit`) per item of the tasks: the loop's charge
        where no generation is traced. Needs the trace header that every ``looped`` run writes."""
        if self.header is None:
            raise ValueError(f"{self.path.parent}: no loopeval trace header, so the loop's cost c is unknown "
                             "(evaluate with `lm_eval --model looped --model_args ...,trace=OUTPUT_PATH`)")
        return float(self.pass_unit * self.header.multiplier * sum(self.tasks[t].n for t in self._leaves(tasks)))

    @property
    def pass_unit(self) -> float:
        """Parameters of the model's average layer (layer parameters / N) from the trace
        header, the unit of a layer pass; 1 when the trace does not record them."""
        cost = self.header.cost if self.header is not None else {}
        if cost.get("layer_params") and cost.get("base_passes"):
            return float(cost["layer_params"]) / float(cost["base_passes"])
        return 1.0

    def _leaves(self, tasks: Sequence[str] | None) -> list[str]:
        return list(self.tasks) if tasks is None else _expand(tasks, self.groups, self.tasks, self.path)


def decoding_differences(a: Run, b: Run, *, intended=(), traces: bool = True, settings: bool = True) -> list[str]:
    """What differs between two runs besides their weights and loop (:func:`loopeval.evaluation.identity.differences`):
    the shared settings of their traces, each shared task's version and generation kwargs, and
    each item's rendered prompt (empty: none). ``intended`` names differences to allow. A run
    without a readable trace is one difference, with the reason (``traces=False``: not
    listed; ``settings=False``: only those)."""
    from loopeval.evaluation.identity import differences, of_run

    diffs = []
    for run in (a, b) if traces else ():
        if run.header is None:
            diffs.append(f"{run.path.parent}: no loopeval trace" + (f" ({run.trace_error})" if run.trace_error else ""))
    return diffs + (differences(of_run(a), of_run(b), intended=intended) if settings else [])


def forcing_shares(runs: Sequence[Run], tasks: Sequence[str]) -> dict:
    """:meth:`Run.forcing` of ``runs`` (seeds) summed, with their total layer-pass cost and
    the share of their generated tokens after the forced answer."""
    parts = [run.forcing(tasks) for run in runs]
    f = {k: sum(p[k] for p in parts) for k in parts[0]}
    f["total"] = sum(run.cost(tasks, mode="passes") for run in runs)
    f["tokens_after_share"] = f["tokens_after"] / f["tokens"] if f["tokens"] else 0.0
    return f


def cost_split(f: dict, base: float) -> dict:
    """Forcing shares with the realised cost split before / after the forced answer, over ``base``."""
    return {**f, "before": (f["total"] - f["cost_after"]) / base, "after": f["cost_after"] / base}


def _expand(names: Sequence[str], groups: Mapping[str, Sequence[str]], leaves, where) -> list[str]:
    out: list[str] = []
    for name in names:
        if name in groups:
            out += [t for t in _expand(groups[name], groups, leaves, where) if t not in out]
        elif name in leaves:
            if name not in out:
                out.append(name)
        else:
            raise ValueError(
                f"{where}: no task or group {name!r}; it has tasks {sorted(leaves)} and groups {sorted(groups)}"
            )
    return out


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


def _load_task(task: str, results: dict, results_file: Path, metric: str | None, traces: tuple[dict, dict, tuple],
               cluster_field: str | None, allow_subset: bool = False) -> TaskScores:
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
    key = _metric_key(task, results["results"].get(task, {}), metric)
    direction = results.get("higher_is_better", {}).get(task, {}).get(key.split(",", 1)[0], True)
    if direction is None:
        raise ValueError(f"{results_file}: task {task}: metric {key} has no direction (higher_is_better: null), "
                         "so it cannot be compared; pick another metric")
    samples_path = results_file.with_name(f"samples_{task}_{_stamp(results_file)}.jsonl")
    if not samples_path.exists():
        raise ValueError(
            f"task {task}: no samples file {samples_path.name} beside {results_file} (deleted, or lm_eval ran without "
            "--log_samples); evaluate again with --log_samples (loopeval protocol re-runs a study's evaluation)"
        )
    items = _read_samples(samples_path, key)
    config = results["configs"].get(task) or {}
    if len(items) != effective:
        present = set(items)
        missing = sorted(set(range(effective)) - present)[:5]
        raise ValueError(
            f"task {task}: {samples_path} has {len(items)} of {effective} items"
            + (f" (missing doc_id {', '.join(map(str, missing))}...)" if missing else "")
            + "; every evaluation must cover all of its items"
        )
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
    prompt_hashes = tuple(r["hashes"][2] for r in recs)
    index, foreign, _ = traces
    joined = tuple(index.get((task, int(d), h), (None, None, ()))[2] for d, h in zip(doc_ids, prompt_hashes))
    clusters = None
    if cluster_field is not None:
        missing = [int(d) for d, r in zip(doc_ids, recs) if not isinstance(r["doc"], dict) or cluster_field not in r["doc"]]
        if missing:
            raise ValueError(f"task {task}: {samples_path}: doc_id {missing[0]} has no doc field {cluster_field!r} "
                             f"to cluster on ({len(missing)} of {len(recs)} items lack it)")
        clusters = tuple(str(r["doc"][cluster_field]) for r in recs)
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


def pilot_label(runs: Sequence[Run], tasks: Sequence[str] | None = None) -> str | None:
    """``"pilot: n of N items"`` when any of the runs covers fewer items of its tasks than
    their full test sets hold (a ``--limit`` run, or a local file with a subset, accepted
    with ``allow_subset``), N counted as :attr:`TaskScores.n_full`, else ``None``; said per
    task, never summed over tasks (``"... in each of 2 tasks (a, b)"``, or ``"n of N items
    of a, m of M items of b"``). Items
    that are not in their task's test set (:attr:`TaskScores.foreign_items`, accepted with
    ``allow_subset`` too) make it a pilot whatever the counts, and the label says how many."""
    chosen = [(t, ts) for r in runs for t, ts in r.tasks.items() if tasks is None or t in tasks]
    foreign = [(t, d) for t, ts in chosen for d in ts.foreign_items]
    repeated = [(t, d) for t, ts in chosen for d in ts.duplicate_items]
    if not runs or (not foreign and not repeated and all(ts.n == ts.n_full for _, ts in chosen)):
        return None
    counts = {t: (ts.n, ts.n_full) for t, ts in sorted(runs[0].tasks.items()) if tasks is None or t in tasks}
    if len(set(counts.values())) == 1:
        (n, total), = set(counts.values())
        label = f"pilot: {n} of {total} items" + (f" in each of {len(counts)} tasks ({', '.join(counts)})"
                                                  if len(counts) > 1 else "")
    else:
        label = "pilot: " + ", ".join(f"{n} of {total} items of {t}" for t, (n, total) in counts.items())
    if foreign:
        label += (f", {len(foreign)} of the runs' items not in their task's test set "
                  f"(e.g. {foreign[0][0]} doc_id {foreign[0][1]})")
    if repeated:
        label += (f", {len(repeated)} duplicated item(s) counted once (e.g. {repeated[0][0]} doc_id {repeated[0][1]})")
    return label


@dataclass(frozen=True, eq=False)
class PairedRuns:
    """Runs aligned item by item: ``scores[system][task]`` is ``(n_items, n_seeds)``.

    Scores are oriented so that higher is better: a task whose metric is lower-is-better
    (``higher_is_better[task]`` is ``False``, e.g. ``gsm8k_nll``'s NLL) enters negated,
    so every difference candidate − baseline is positive when the candidate is better,
    and the paired bootstrap, TOST and both tests read it the right way round."""

    systems: tuple[str, ...]
    tasks: tuple[str, ...]
    doc_ids: Mapping[str, np.ndarray]
    scores: Mapping[str, Mapping[str, np.ndarray]]
    runs: Mapping[str, tuple[Run, ...]]
    clusters: Mapping[str, tuple] | None = None  # per task, the item clusters all runs agree on
    higher_is_better: Mapping[str, bool] | None = None  # per task, the metric's direction (None: all higher)
    units: Mapping[str, Unit] | None = None  # per task, the metric's unit (None: all points)

    def unit(self, task: str) -> Unit:
        return (self.units or {}).get(task, POINTS)

    def kinds(self) -> dict[str, tuple[str, ...]]:
        """The tasks by kind of metric (:func:`kind`), fractions first: each kind has a macro
        of its own, since a macro never averages two units."""
        out: dict[str, list[str]] = {}
        for t in sorted(self.tasks, key=lambda t: not self.unit(t).fraction):
            out.setdefault(kind(self.unit(t), (self.higher_is_better or {}).get(t, True)), []).append(t)
        return {k: tuple(ts) for k, ts in out.items()}

    def metric_name(self, task: str) -> str | None:
        """lm-eval's name of the task's metric (``nll_per_byte``) in the first run (``None`` without runs)."""
        first = next(iter((self.runs or {}).values()), None)
        return first[0].tasks[task].metric.split(",", 1)[0] if first and first[0] is not None else None

    def resampler(self, *, n_resamples: int = DEFAULTS.n_resamples, seed: int = 0) -> Resampler:
        """Shared bootstrap resamples for every comparison among these runs (seeds averaged per
        item; clusters resampled whole where the runs were loaded with ``cluster_field``)."""
        return Resampler(self.scores, n_resamples=n_resamples, seed=seed, clusters=self.clusters or None)

    @property
    def pilot(self) -> str | None:
        """``"pilot: n of N items"`` when a run is a subset (:func:`pilot_label`), else ``None``."""
        return pilot_label([r for rs in self.runs.values() for r in rs if r is not None], self.tasks)

    def accuracy(self, system: str, task: str | None = None) -> float:
        """Seed-averaged accuracy on one task, or the macro over tasks for ``None``."""
        tasks = self.tasks if task is None else (task,)
        return float(np.mean([self.scores[system][t].mean() for t in tasks]))

    def binary(self, task: str, *systems: str) -> bool:
        """Whether the systems (default: all) score this task 0/1 with one seed run (McNemar applies)."""
        return all(
            self.scores[s][task].shape[1] == 1 and np.isin(self.scores[s][task], (0.0, 1.0)).all()
            for s in systems or self.systems
        )


def kind(unit: Unit, higher_is_better: bool = True) -> str:
    """A kind of metric: its unit, and its direction where lower is better ("nats per byte, lower is better")."""
    return unit.name + ("" if higher_is_better else ", lower is better")


def pair_runs(runs: Mapping[str, Run | Sequence[Run]], *, tasks: Sequence[str] | None = None) -> PairedRuns:
    """Align runs item by item on their common leaf tasks.

    ``runs`` maps a system name to a run or to one run per training seed. ``tasks``
    (leaf tasks or groups) defaults to the tasks of the first run, and every run must
    hold exactly those. Items pair on ``doc_id``; a different item set, ``doc_hash`` or
    ``target_hash`` raises ``ValueError`` naming the task and the counts.
    """
    if not runs:
        raise ValueError("no runs to pair")
    seeds = {str(name): (r,) if isinstance(r, Run) else tuple(r) for name, r in runs.items()}
    for name, rs in seeds.items():
        if not rs or not all(isinstance(r, Run) for r in rs):
            raise ValueError(f"{name}: expected a Run or a non-empty sequence of Runs")
    labelled = [(f"{name}" + (f" (seed run {i})" if len(rs) > 1 else ""), r)
                for name, rs in seeds.items() for i, r in enumerate(rs)]
    _refuse_repeats(labelled)
    first_label, first = labelled[0]
    selected = first._leaves(tasks)
    for label, run in labelled:
        leaves = run._leaves(tasks)
        if set(leaves) != set(selected):
            raise ValueError(
                f"{first_label} and {label} cover different tasks ({sorted(selected)} vs {sorted(leaves)}); "
                "pick common ones with tasks="
            )
    for task in selected:
        ref = first.tasks[task]
        for label, run in labelled[1:]:
            _check_items(task, first_label, ref, label, run.tasks[task])
    clusters = {t: first.tasks[t].clusters for t in selected if first.tasks[t].clusters is not None}
    for label, run in labelled[1:]:
        theirs = {t: run.tasks[t].clusters for t in selected if run.tasks[t].clusters is not None}
        if theirs and theirs != clusters:
            raise ValueError(f"{first_label} and {label} cluster the items differently; load both with one cluster_field")
    direction = {t: first.tasks[t].higher_is_better for t in selected}
    for label, run in labelled[1:]:
        odd = [t for t in selected if run.tasks[t].higher_is_better != direction[t]]
        if odd:
            raise ValueError(f"task {odd[0]}: {first_label} and {label} score it with metrics of opposite direction "
                             f"({first.tasks[odd[0]].metric} and {run.tasks[odd[0]].metric})")
    units = {t: first.tasks[t].unit for t in selected}
    for label, run in labelled[1:]:
        odd = [t for t in selected if run.tasks[t].unit != units[t]]
        if odd:
            raise ValueError(f"task {odd[0]}: {first_label} scores it in {units[odd[0]].name} and {label} in "
                             f"{run.tasks[odd[0]].unit.name} ({first.tasks[odd[0]].metric} and "
                             f"{run.tasks[odd[0]].metric}); compare one metric")
    sign = {t: 1.0 if up else -1.0 for t, up in direction.items()}
    scores = {
        name: {t: sign[t] * np.column_stack([r.tasks[t].scores for r in rs]) for t in selected}
        for name, rs in seeds.items()
    }
    return PairedRuns(
        systems=tuple(seeds),
        tasks=tuple(selected),
        doc_ids={t: first.tasks[t].doc_ids for t in selected},
        scores=scores,
        runs=seeds,
        clusters=clusters or None,
        higher_is_better=direction,
        units=units,
    )


def _refuse_repeats(labelled: list[tuple[str, Run]]) -> None:
    """The same run twice (one results file, or a copy of it) would count as two seeds or systems."""
    seen: dict[str, str] = {}
    for label, run in labelled:
        digest = hashlib.sha256(run.path.read_bytes()).hexdigest()
        if digest in seen:
            raise ValueError(f"{seen[digest]} and {label} are the same run ({run.path}); give each evaluation once")
        seen[digest] = label


def _check_items(task: str, la: str, a: TaskScores, lb: str, b: TaskScores) -> None:
    if not np.array_equal(a.doc_ids, b.doc_ids):
        only_a = np.setdiff1d(a.doc_ids, b.doc_ids)
        only_b = np.setdiff1d(b.doc_ids, a.doc_ids)
        raise ValueError(
            f"task {task}: {la} has {a.n} items and {lb} has {b.n} "
            f"({len(only_a)} doc_ids only in {la}, {len(only_b)} only in {lb}); the runs evaluated different items"
        )
    for attr in ("doc_hashes", "target_hashes"):
        differ = [int(d) for d, x, y in zip(a.doc_ids, getattr(a, attr), getattr(b, attr)) if x != y]
        if differ:
            raise ValueError(
                f"task {task}: {attr[:-2]} differs for {len(differ)} of {a.n} items "
                f"(first doc_id {differ[0]}) between {la} and {lb}; the runs evaluated different data"
            )
