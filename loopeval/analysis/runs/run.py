"""One loaded lm-eval run: :class:`TaskScores` per leaf task, the :class:`Run`, and what a
run answers on its own or beside another (costs, budget forcing, decoding differences,
whether it is a pilot)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loopeval.analysis.stats.options import COST_MODES
from loopeval.evaluation.metrics import POINTS, Unit, full_size
from loopeval.evaluation.trace import TraceHeader, TraceItem


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
