"""Which evaluation is which: a run, read with its trace header and training manifest.

A report is given lm-eval runs as folders; each run's trace says whether the model was
looped, which budget scale and decoding rules it used, and which checkpoint it was, and
the checkpoint's manifest gives its training seed. Nothing here computes a statistic.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from loopeval.manifest import find_manifest
from loopeval.runs import Run, load_run
from loopeval.trace import TraceHeader


@dataclass(frozen=True)
class Evaluation:
    """One lm-eval run with what its trace and manifest say about it."""

    where: Path  # the folder the user gave (or the run's model folder)
    run: Run
    header: TraceHeader
    seed: int
    manifest: dict | None

    @property
    def looped(self) -> bool:
        return self.header.looped

    @property
    def forcing(self) -> bool:
        return self.header.decoding.budget_forcing

    @property
    def scale(self) -> float:
        return float(self.header.decoding.budget_scale)

    @property
    def key(self) -> tuple[bool, bool, float]:
        """(looped, budget forcing, budget scale): the evaluations one curve point averages over seeds."""
        return (self.looped, self.forcing, self.scale)


def describe(source: str | Path | Run) -> Evaluation:
    """Load (if needed) and classify one run; a run without a trace is refused."""
    run = source if isinstance(source, Run) else load_run(source)
    where = run.path.parent if isinstance(source, Run) else Path(source)
    if run.header is None:
        reason = f" ({run.trace_error})" if run.trace_error else ""
        raise ValueError(
            f"run {where}: no loopeval trace{reason}; evaluate with "
            "`lm_eval --model looped --model_args ...,trace=OUTPUT_PATH` so its cost and settings are known"
        )
    manifest = find_manifest(run.header.model)
    seed = int(manifest["config"]["seed"]) if manifest else 0
    return Evaluation(where=where, run=run, header=run.header, seed=seed, manifest=manifest)


def label(looped: bool, forcing: bool, scale: float | None = None) -> str:
    """``"twin"``, ``"looped + BF"``, ``"looped + BF @ 1.5×"`` ..."""
    name = ("looped" if looped else "twin") + (" + BF" if forcing else "")
    return name if scale is None else f"{name} @ {scale:g}×"


def by_seed(evals: list[Evaluation]) -> list[Run]:
    """The runs of one group, ordered by training seed (so seed runs pair by position)."""
    return [e.run for e in sorted(evals, key=lambda e: e.seed)]


def group(evals: list[Evaluation]) -> dict[tuple[bool, bool, float], list[Evaluation]]:
    """Evaluations by (looped, budget forcing, budget scale)."""
    groups: dict[tuple[bool, bool, float], list[Evaluation]] = defaultdict(list)
    for e in evals:
        groups[e.key].append(e)
    return dict(groups)


def classify(twin: list, looped: list, larger=None) -> tuple[list[Evaluation], Evaluation | None]:
    """Describe every run and check that each is what it was given as: the twin's runs
    unlooped, the looped model's runs looped with one loop, all on the same tasks."""
    evals = [describe(r) for r in (*twin, *looped)]
    for e, wanted in zip(evals, [False] * len(twin) + [True] * len(looped)):
        if e.looped != wanted:
            kind = "a loop" if e.looped else "no loop"
            raise ValueError(f"run {e.where}: given as {'looped' if wanted else 'unlooped'} but its trace records {kind}")
    extra = describe(larger) if larger is not None else None
    task_sets = {tuple(sorted(e.run.tasks)) for e in evals + ([extra] if extra else [])}
    if len(task_sets) > 1:
        detail = "; ".join(f"{e.where.name}: {', '.join(sorted(e.run.tasks))}" for e in evals)
        raise ValueError(f"runs cover different tasks ({detail})")
    loops = sorted({e.header.loop["loop"] for e in evals if e.looped})
    if len(loops) != 1:
        raise ValueError(f"the looped runs must share one loop, found {loops or 'none'}")
    return evals, extra
