"""``loopeval protocol STUDY.yaml``: every evaluation that both tests need, run resumably
and in parallel, then the two-test report.

* :mod:`~loopeval.tools.study.spec`: the study file, validated completely before anything runs;
* :mod:`~loopeval.tools.study.plan`: the evaluations, their folders and the checks before compute;
* :mod:`~loopeval.tools.study.execute`: lm-eval runs, in one process or parallel workers;
* :mod:`~loopeval.tools.study.ray_backend`: the same runs as Ray tasks, on a cluster.

A rerun skips every evaluation already done, restarts a killed one from its resume
store, and rebuilds the report; ``--report-only`` rebuilds only the report.
"""

from __future__ import annotations

import fnmatch
from contextlib import nullcontext
import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from loopeval.analysis.stats.options import DEFAULTS
from loopeval.common.outputs import aside, folder_lock
from loopeval.tools.study.plan import Evaluation, check_before_compute, expand, expected_cost, status
from loopeval.tools.study.spec import RayOptions, Study, as_device, as_ray_address, load_study

__all__ = ["StudyResult", "load_study", "run_study"]


@dataclass(frozen=True)
class StudyResult:
    """What a study run did: each evaluation's outcome ("done", "skipped: done", "planned"
    or the error) and the report it wrote (``None`` on a dry run, or when an evaluation the
    report needs failed)."""

    study: Study
    outcomes: dict[str, str]
    report: Path | None

    @property
    def failed(self) -> list[str]:
        return [n for n, o in self.outcomes.items() if o not in ("done", "skipped: done", "planned")]


def run_study(path: str | Path, *, dry_run: bool = False, only: str | None = None, report_only: bool = False,
              workers: int = 1, devices: list[str] | None = None, progress: bool = True,
              rerun: bool = True, report: bool = True, ray: bool | str | None = None) -> StudyResult:
    """Validate the study at ``path``, run what is not done yet (``only``: the evaluations
    whose names match a glob pattern), and write ``OUTPUT/report.html`` and ``report.json``.
    A finished evaluation made with other settings or weights is run again (``rerun=False``:
    refused, naming what changed).
    ``devices`` runs one worker per device; ``workers`` runs that many CPU workers.
    ``report=False`` runs the evaluations and writes no report (``StudyResult.report`` None).
    ``ray``: run them as Ray tasks (True, or a cluster address) or not (False); ``None``: as
    the study's ``ray:`` key says, unless ``workers`` or ``devices`` are given (docs/protocol.md,
    "On a Ray cluster")."""
    from loopeval.tools.study.execute import run_parallel

    study = load_study(path)
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    for device in devices or ():
        as_device("--devices", device)
    if ray and (devices or workers > 1):
        raise ValueError("--ray schedules the evaluations itself: give it without --workers or --devices")
    on_ray = _ray_options(study, study.ray is not None and not devices and workers == 1 if ray is None else ray)
    study = replace(study, ray=on_ray)
    evaluations = expand(study)
    chosen = [e for e in evaluations if only is None or fnmatch.fnmatch(e.name, only)]
    if not chosen:
        raise ValueError(f"--only {only!r} matches no evaluation; they are named like {evaluations[0].name}")
    with nullcontext() if dry_run else folder_lock(study.output, "protocol"):
        check_before_compute(study, evaluations, rerun=rerun)
        states = {e.name: status(e, study, rerun=rerun) for e in chosen}
        stale = [f"{n} ({s.split(': ', 1)[1]})" for n, s in states.items() if s.startswith("stale")]
        if stale and report_only:
            raise ValueError(f"--report-only: {len(stale)} finished evaluation(s) were made with other settings or "
                             f"weights, e.g. {stale[0]}; run without --report-only to redo them")
        for name, state in states.items():
            if state.startswith("stale") and not dry_run:
                print(f"re-running {name}: its finished folder was made with other settings or weights "
                      f"({state.split(': ', 1)[1]})", file=sys.stderr)
        todo = [e for e in chosen if states[e.name] != "done"]
        outcomes = {e.name: "skipped: done" for e in chosen if e not in todo}
        if dry_run:
            cost = expected_cost(study, chosen)
            _print_plan(study, chosen, todo, cost)
            return StudyResult(study, {**outcomes, **{e.name: "planned" for e in todo}}, None)
        if not report_only and any(status(e, study) != "done" for e in evaluations):
            _move_report_aside(study)
        if todo and not report_only and on_ray is not None:
            from loopeval.tools.study.ray_backend import run_on_ray

            outcomes.update(run_on_ray(todo, study, on_ray, expected=expected_cost(study, todo), progress=progress))
        elif todo and not report_only:
            expected = expected_cost(study, todo) if len(devices or [None] * workers) > 1 else {}
            outcomes.update(run_parallel(todo, study, devices=devices or [None] * workers, expected=expected,
                                         progress=progress))
        if not report:
            return StudyResult(study, outcomes, None)
        missing = [e.name for e in evaluations if status(e, study) != "done"]  # by content, as the done-check
        if missing:
            print(f"no report: {len(missing)} evaluation(s) not done or made from other inputs ({', '.join(missing[:3])}"
                  f"{'...' if len(missing) > 3 else ''})", file=sys.stderr)
            return StudyResult(study, outcomes, None)
        return StudyResult(study, outcomes, write_study_report(study, evaluations))


def _ray_options(study: Study, ray: bool | str) -> RayOptions | None:
    """The Ray options a run uses, checked before anything runs (an address given here overrides the study's)."""
    if ray is False:
        return None
    from loopeval.tools.study.ray_backend import import_ray

    options = study.ray or RayOptions()
    if isinstance(ray, str) and ray:
        options = replace(options, address=as_ray_address("--ray", ray))
    if options.address is None and os.environ.get("RAY_ADDRESS", "").strip():
        as_ray_address("RAY_ADDRESS", os.environ["RAY_ADDRESS"])
    import_ray()
    return options


def _move_report_aside(study: Study) -> None:
    """A report whose evaluations are not all done with the study's inputs no longer stands:
    its files go to ``OUTPUT/.replaced/report.TIME`` before anything runs."""
    files = [p for p in (*study.output.glob("report.*"), *study.output.glob("report_*")) if p.is_file()]
    if not files:
        return
    moved = aside(study.output, "report")
    for file in files:
        file.replace(moved / file.name)
    print(f"the report in {study.output} was made from evaluations that are being redone or are missing; "
          f"moved to {moved}", file=sys.stderr)


def write_study_report(study: Study, evaluations: list[Evaluation]) -> Path:
    """The two-test report of a finished study, from its evaluation folders."""
    from loopeval.analysis.report import RunSpec, build_report, write_report

    def spec(e: Evaluation) -> RunSpec:
        return RunSpec(e.folder, seed=e.model.seed, variant=e.model.variant)

    report = study.report
    larger = [e for e in evaluations if e.model.role == "larger" and e.scale == study.default_scale]
    options = study.stat_options
    data = build_report(
        [spec(e) for e in evaluations if e.model.role == "twin"],
        [spec(e) for e in evaluations if e.model.role == "looped"],
        larger=spec(larger[0]) if larger else None, sizes=report.get("sizes"), default_scale=study.default_scale,
        cost=options.cost, selection=options.selection, alpha=options.alpha,
        margin=None if options.margin == DEFAULTS.margin else options.margin,  # A.5's, also where no metric is an accuracy
        margins=dict(options.margins),
        n_resamples=options.n_resamples, seed=options.seed,
        title=report.get("title") or f"{study.name}: does the loop pay for its compute?",
        strict=report.get("strict", False), intended_differences=study.intended_differences,
        allow_subset=study.pilot,
    )
    path = write_report(data, study.output / "report.html", latex_tables=report.get("latex", False))
    (study.output / "report.json").write_text(data.to_json())
    return path


def _print_plan(study: Study, chosen: list[Evaluation], todo: list[Evaluation], cost: dict[str, float]) -> None:
    print(f"study {study.name}: {len(chosen)} evaluations, {len(todo)} to run, into {study.output}")
    width = max(len(e.name) for e in chosen)
    for e in chosen:
        state = "todo" if e in todo else "done"
        print(f"  {e.name:<{width}}  {state}  budgeted {cost[e.name]:.3g} generated tokens x layer passes")
    print(json.dumps({"to_run": len(todo), "budgeted_cost": sum(cost[e.name] for e in todo)}))
