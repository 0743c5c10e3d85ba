"""A study's evaluations as Ray tasks: ``loopeval protocol STUDY.yaml --ray [ADDRESS]``, or
the study's ``ray:`` key.

Ray only schedules. The done-checks run in this process before anything is submitted, as
without Ray; each evaluation still to run becomes one task that calls
:func:`~loopeval.tools.study.execute.run_one` (the same lm-eval run, settings record and
rename of ``OUTPUT/evals/.partial/NAME`` into ``OUTPUT/evals/NAME``) on a node holding the
resources it asks for (:func:`evaluation_resources`). So every node must see the study's
output folder, models and task folders at the same paths (a shared filesystem); that is
checked on every node before any evaluation is submitted. A task that raises or whose
worker dies is run again, ``retries`` times at most, resuming from its resume store;
then the evaluation is FAILED with the task's error. Ctrl-C (or SIGTERM) cancels every
task not finished.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from loopeval.tools.study.execute import _stop_on_sigterm, run_one
from loopeval.tools.study.plan import Evaluation
from loopeval.tools.study.spec import RayOptions, Study

EXTRA = "pip install 'loopeval[ray]'"
ENGINE_RANKS = ("tensor_parallel_size", "pipeline_parallel_size")
"""The model args (vLLM's names) whose product is the number of ranks, one GPU each, of one engine."""
START = "loopeval: Ray task"
"""How a task's first line in ``OUTPUT/logs/NAME.log`` starts: node, pid and time of each attempt."""


def import_ray():
    """Ray, or an ``ImportError`` naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ImportError(f"--ray needs Ray, an optional extra of loopeval: {EXTRA}", name="ray") from None
    return ray


@dataclass(frozen=True)
class Resources:
    """What one evaluation asks Ray for."""

    cpus: float
    gpus: float


def evaluation_resources(evaluation: Evaluation, study: Study, options: RayOptions, *, cluster_has_gpus: bool) -> Resources:
    """``options.cpus`` CPUs and ``options.gpus`` GPUs per engine rank, the ranks being the product
    of the evaluation's ``tensor_parallel_size`` and ``pipeline_parallel_size`` model args (1 for
    the ``looped`` model, which takes neither). ``gpus`` unset: 1 where the evaluation runs on
    CUDA (``lm_eval.device: cuda``, or no device on a cluster that has GPUs), else 0."""
    args = evaluation.model_args(study)
    ranks = 1
    for key in ENGINE_RANKS:
        ranks *= int(args.get(key, 1))
    device = str(study.lm_eval.get("device") or "")
    gpus = options.gpus if options.gpus is not None else float(device.startswith("cuda") or (not device and cluster_has_gpus))
    return Resources(cpus=options.cpus, gpus=gpus * ranks)


def run_on_ray(evaluations: list[Evaluation], study: Study, options: RayOptions, *, expected: dict[str, float],
               progress: bool = True) -> dict[str, str]:
    """Run ``evaluations`` as Ray tasks, longest (``expected`` cost) first; returns ``{name: "done" | error}``.
    Joins the running Ray of this process if there is one, else ``ray.init(options.address)``
    (``None``: ``RAY_ADDRESS``, else a new local Ray, never the address a stopped cluster left
    behind), and disconnects at the end (a local Ray it started stops)."""
    ray = import_ray()
    _check_device(study)
    started = not ray.is_initialized()
    if started:
        address = options.address or os.environ.get("RAY_ADDRESS") or "local"
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    starts = None
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        cluster_has_gpus = any(n["Resources"].get("GPU", 0) > 0 for n in nodes)
        wants = {e.name: evaluation_resources(e, study, options, cluster_has_gpus=cluster_has_gpus) for e in evaluations}
        _check_fits(wants, nodes, ray.cluster_resources().get("GPU", 0))
        _check_shared_paths(ray, study, nodes)
        starts = ray.remote(num_cpus=0)(Starts).remote()
        # a GPU task gets a fresh worker (CUDA cannot move to the next task's GPUs); a CPU task sees no GPU
        on_gpu, on_cpu = ray.remote(max_calls=1)(_task), ray.remote(_task)
        study_ref = ray.put(study)
        refs = {}
        for e in sorted(evaluations, key=lambda e: -expected.get(e.name, 0)):
            want = wants[e.name]
            task, hidden = (on_gpu, None) if want.gpus else (on_cpu, {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}})
            refs[task.options(num_cpus=want.cpus, num_gpus=want.gpus, max_retries=options.retries, retry_exceptions=True,
                              name=e.name, runtime_env=hidden).remote(e, study_ref, starts)] = e
        return _collect(ray, refs, starts, expected, progress, attempts=options.retries + 1)
    finally:
        if starts is not None:
            ray.kill(starts)
        if started:
            ray.shutdown()


class Starts:
    """Where each task says it started: the tasks send, the driver takes what came."""

    def __init__(self):
        self.started: list[tuple[str, str, float]] = []

    def record(self, name: str, node: str, at: float) -> None:
        self.started.append((name, node, at))

    def take(self) -> list[tuple[str, str, float]]:
        taken, self.started = self.started, []
        return taken


def _task(evaluation: Evaluation, study: Study, starts) -> str:
    """One attempt at one evaluation, on a Ray worker: its node, pid and time go first into its
    log and to the driver (without waiting: a task waiting on Ray lends its CPU to another
    task); an error goes into the log with its traceback, then to Ray."""
    import ray

    node = ray.get_runtime_context().get_node_id()[:8]
    evaluation.log.parent.mkdir(parents=True, exist_ok=True)
    with open(evaluation.log, "a") as log:
        log.write(f"{START} on node {node}, pid {os.getpid()}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    starts.record.remote(evaluation.name, node, time.time())
    try:
        run_one(evaluation, study)
    except BaseException:
        with open(evaluation.log, "a") as log:
            traceback.print_exc(file=log)
        raise
    return evaluation.name


def _collect(ray, refs: dict, starts, expected: dict[str, float], progress: bool, *, attempts: int) -> dict[str, str]:
    """Wait for every task, showing the evaluations done of all and one line per running
    evaluation (its node, attempt and an ETA from the measured speed and its budgeted cost)."""
    from tqdm.auto import tqdm

    total = tqdm(total=len(refs), desc="evaluations", unit="eval", disable=not progress, file=sys.stdout)
    lines: list = []  # one per running evaluation at a time
    slot: dict[str, int] = {}
    began: dict[str, float] = {}
    tries: dict[str, int] = {}
    cost = seconds = 0.0
    outcome: dict[str, str] = {}
    pending = list(refs)
    previous = _stop_on_sigterm()
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            for name, node, at in ray.get(starts.take.remote()):
                began[name], tries[name] = at, tries.get(name, 0) + 1
                if name in outcome:  # its end was seen first
                    continue
                if name not in slot:
                    free = [i for i in range(len(lines)) if i not in slot.values()]
                    if not free:
                        lines.append(tqdm(total=0, bar_format="{desc}", position=len(lines) + 1, file=sys.stdout,
                                          disable=total.disable))
                        free = [len(lines) - 1]
                    slot[name] = free[0]
                eta = expected.get(name, 0) * seconds / cost if cost else None
                retry = f", attempt {tries[name]}" if tries[name] > 1 else ""
                lines[slot[name]].set_description_str(
                    f"  {name} on node {node}{retry}" + (f", ETA {eta / 60:.1f} min" if eta else ""))
            for ref in done:
                name = refs[ref].name
                try:
                    ray.get(ref)
                    outcome[name] = "done"
                    if name in began and expected.get(name):
                        cost, seconds = cost + expected[name], seconds + max(1e-3, time.time() - began[name])
                except ray.exceptions.RayError as exc:
                    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
                    outcome[name] = f"{type(cause).__name__}: {cause}".strip() + f" (after {attempts} attempt(s))"
                    tqdm.write(f"FAILED {name}: {outcome[name]} (log: {refs[ref].log})", file=sys.stdout)
                if name in slot:
                    lines[slot.pop(name)].set_description_str("")
                total.update()
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for line in lines:
            line.close()
        total.close()
    return outcome


def _check_device(study: Study) -> None:
    device = str(study.lm_eval.get("device") or "")
    if device.startswith("cuda:"):
        raise ValueError(f"{study.path}: lm_eval.device: {device} names a device of one machine; on Ray each "
                         "evaluation runs on the GPUs Ray gives it: use device: cuda, or leave it out")


def _check_fits(wants: dict[str, Resources], nodes: list[dict], cluster_gpus: float) -> None:
    """Refuse an evaluation that no node of the cluster can hold (Ray would wait for it forever)."""
    for name, want in wants.items():
        if not any(n["Resources"].get("CPU", 0) >= want.cpus and n["Resources"].get("GPU", 0) >= want.gpus for n in nodes):
            largest = max(((n["Resources"].get("CPU", 0), n["Resources"].get("GPU", 0)) for n in nodes), default=(0, 0))
            raise ValueError(f"evaluation {name} asks Ray for {want.cpus:g} CPU(s) and {want.gpus:g} GPU(s) on one node, "
                             f"but the largest node of the cluster has {largest[0]:g} CPU(s) and {largest[1]:g} GPU(s) "
                             f"({cluster_gpus:g} GPU(s) in all); change the study's ray: cpus/gpus, or add a node")


def _check_shared_paths(ray, study: Study, nodes: list[dict]) -> None:
    """Every node sees the output folder (a file written here), the models' local folders and
    the task folders at the same paths."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = study.output / f".ray-probe-{os.getpid()}"
    probe.write_text(str(time.time()))
    wanted = [str(probe), *(m.path for m in study.models if Path(m.path).exists()), *study.include_path]
    try:
        look = ray.remote(_missing)
        found = ray.get([look.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote(wanted) for n in nodes])
    finally:
        probe.unlink(missing_ok=True)
    for node, missing in zip(nodes, found):
        if missing:
            raise ValueError(f"Ray node {node['NodeManagerAddress']} does not see {missing[0]}"
                             f"{' (the study output folder)' if missing[0] == str(probe) else ''}: every node needs the "
                             "study's output, models and task folders at the same paths (a shared filesystem)")


def _missing(paths: list[str]) -> list[str]:
    return [p for p in paths if not os.path.exists(p)]
