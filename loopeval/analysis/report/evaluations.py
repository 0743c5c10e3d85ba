"""Which evaluation is which: a run, read with its trace header and training manifest.

A report is given lm-eval runs as folders. Each run's trace says whether the model was
looped, which budget scale and decoding rules it used, and which checkpoint it was; the
checkpoint's manifest gives its training seed and how long it was trained. An
evaluation therefore belongs to a *variant* (looped or not, decoding condition,
training variant) at one budget scale, and within it to one training seed. Seeds come
from manifests or are given explicitly: two runs of one variant and budget without
seeds are refused, never averaged as if they were seeds. Nothing here computes a
statistic.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from loopeval.training.manifest import find_manifest
from loopeval.analysis.runs import Run, load_run
from loopeval.evaluation.trace import DecodingSettings, TraceHeader


@dataclass(frozen=True)
class RunSpec:
    """A run with what its manifest cannot say: its training ``seed`` and a ``variant``
    label (e.g. "3x FT"), which override the manifest's."""

    path: str | Path
    seed: int | None = None
    variant: str | None = None


@dataclass(frozen=True)
class Evaluation:
    """One lm-eval run with what its trace and manifest (or its :class:`RunSpec`) say."""

    where: Path  # the folder the user gave (or the run's model folder)
    run: Run
    header: TraceHeader
    seed: int | None
    variant: str
    manifest: dict | None

    @property
    def looped(self) -> bool:
        return self.header.looped

    @property
    def condition(self) -> str:
        return condition(self.header.decoding)

    @property
    def forcing(self) -> bool:
        return self.header.decoding.budget_forcing

    @property
    def scale(self) -> float:
        return float(self.header.decoding.budget_scale)

    @property
    def group(self) -> tuple[bool, str, str]:
        """(looped, decoding condition, training variant): one curve of the figure."""
        return (self.looped, self.condition, self.variant)

    @property
    def key(self) -> tuple[bool, str, str, float]:
        """The group at one budget scale: the evaluations one point averages over seeds."""
        return (*self.group, self.scale)


def condition(decoding: DecodingSettings) -> str:
    """The decoding condition: which free decoding rules a run used ("plain" for none)."""
    rules = [name for on, name in ((decoding.budget_forcing, "budget forcing"),
                                   (decoding.repetition_stop, "repetition stop")) if on]
    return " + ".join(rules) or "plain"


def _tokens(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"


def describe(source: str | Path | Run | RunSpec, *, allow_subset: bool = False,
             unfinished_fallback: str = "credit") -> Evaluation:
    """Load (if needed) and classify one run; a run without a trace is refused. ``allow_subset``
    accepts a ``--limit`` run (a pilot); ``unfinished_fallback="wrong"`` reads the run with
    number-fallback verdicts from unfinished responses counted wrong."""
    from loopeval.analysis.score_audit import read_runs

    spec = source if isinstance(source, RunSpec) else None
    target = spec.path if spec else source
    run = target if isinstance(target, Run) else load_run(target, allow_subset=allow_subset)
    run = read_runs({"run": run}, unfinished_fallback)["run"]
    where = run.path.parent if isinstance(target, Run) else Path(target)
    if run.header is None:
        reason = f" ({run.trace_error})" if run.trace_error else ""
        raise ValueError(
            f"run {where}: no loopeval trace{reason}; evaluate with "
            "`lm_eval --model looped --model_args ...,trace=OUTPUT_PATH` so its cost and settings are known"
        )
    manifest = find_manifest(run.header.model)
    seed = spec.seed if spec and spec.seed is not None else (int(manifest["config"]["seed"]) if manifest else None)
    variant = spec.variant if spec and spec.variant is not None else (
        f"FT {_tokens(manifest['tokens']['input'])} tokens" if manifest else "")
    return Evaluation(where=where, run=run, header=run.header, seed=seed, variant=variant, manifest=manifest)


def label(looped: bool, condition_: str, variant: str = "", scale: float | None = None) -> str:
    """``"twin"``, ``"looped + budget forcing"``, ``"looped, FT 2M tokens + budget forcing @ 1.5×"`` ..."""
    name = ("looped" if looped else "twin") + (f", {variant}" if variant else "")
    name += "" if condition_ == "plain" else f" + {condition_}"
    return name if scale is None else f"{name} @ {scale:g}×"


def condition_label(condition_: str, variant: str = "") -> str:
    """A decoding condition of one training variant: ``"plain decoding"``, ``"3x FT + budget forcing"`` ..."""
    parts = [variant] if variant else []
    parts += [] if condition_ == "plain" else [condition_]
    return " + ".join(parts) or "plain decoding"


def by_seed(evals: list[Evaluation]) -> list[Run]:
    """The runs of one group, ordered by training seed (so seed runs pair by position)."""
    return [e.run for e in sorted(evals, key=lambda e: (e.seed is None, e.seed or 0))]


def group(evals: list[Evaluation]) -> dict[tuple[bool, str, str, float], list[Evaluation]]:
    """Evaluations by (looped, condition, variant, budget scale). Several runs of one key
    are seeds of one evaluation, so each needs a distinct, known seed and its own weights
    (by the trace's weights fingerprint: one checkpoint is never counted as two seeds)."""
    groups: dict[tuple, list[Evaluation]] = defaultdict(list)
    for e in evals:
        groups[e.key].append(e)
    for key, members in groups.items():
        if len(members) < 2:
            continue
        unknown = [str(e.where) for e in members if e.seed is None]
        if unknown:
            raise ValueError(
                f"{len(members)} runs of {label(*key)} but {', '.join(unknown)} has no training seed (no "
                "training_manifest.json beside its checkpoint); give it one (--seed RUN=N, or RunSpec(seed=...)), "
                "or a distinct --variant if it is another training variant"
            )
        seeds = [e.seed for e in members]
        if len(set(seeds)) < len(seeds):
            raise ValueError(f"runs of {label(*key)} share a training seed: "
                             + ", ".join(f"{e.where} (seed {e.seed})" for e in members))
        by_weights: dict[str, Evaluation] = {}
        for e in members:
            first = by_weights.setdefault(e.header.weights, e) if e.header.weights else e
            if first is not e:
                raise ValueError(f"runs of {label(*key)}: {first.where} (seed {first.seed}) and {e.where} (seed {e.seed}) "
                                 f"evaluated the same weights (fingerprint {e.header.weights[:12]}): one checkpoint is "
                                 "one seed; give each seed's own evaluation")
    return dict(groups)


def classify(twin: list, looped: list, larger=None, **reading) -> tuple[list[Evaluation], Evaluation | None]:
    """Describe every run and check that each is what it was given as: the twin's runs
    unlooped, the looped model's runs looped with one loop, a larger comparator unlooped,
    no run twice, all on the same tasks. ``reading`` goes to :func:`describe`."""
    evals = [describe(r, **reading) for r in (*twin, *looped)]
    for e, wanted in zip(evals, [False] * len(twin) + [True] * len(looped)):
        if e.looped != wanted:
            kind = "a loop" if e.looped else "no loop"
            raise ValueError(f"run {e.where}: given as {'looped' if wanted else 'unlooped'} but its trace records {kind}")
    if len({e.variant for e in evals}) == 1:  # one training variant: no label to tell variants apart
        evals = [replace(e, variant="") for e in evals]
    extra = describe(larger, **reading) if larger is not None else None
    if extra is not None and extra.looped:
        raise ValueError(f"run {extra.where}: given as --larger, but its trace records a loop "
                         f"({extra.header.loop['loop']}); the larger comparator is an unlooped model")
    seen: dict[Path, Path] = {}
    for e in evals + ([extra] if extra else []):
        where = e.run.path.resolve()
        if where in seen:
            raise ValueError(f"run {e.where} is given twice (also as {seen[where]}); give each evaluation once")
        seen[where] = e.where
    task_sets = {tuple(sorted(e.run.tasks)) for e in evals + ([extra] if extra else [])}
    if len(task_sets) > 1:
        detail = "; ".join(f"{e.where.name}: {', '.join(sorted(e.run.tasks))}" for e in evals)
        raise ValueError(f"runs cover different tasks ({detail})")
    loops = sorted({e.header.loop["loop"] for e in evals if e.looped})
    if len(loops) != 1:
        raise ValueError(f"the looped runs must share one loop, found {loops or 'none'}")
    return evals, extra
