"""Running a study's evaluations: one lm-eval run each, saved exactly as ``lm_eval
--output_path ... --log_samples`` saves it, in one process or in parallel workers.

A worker is a process with its own device (``--devices cuda:0,cuda:1``) or a share of
the CPU (``--workers N``); it takes evaluations from a queue until none are left. A
failing evaluation is reported with its log and does not stop the others. lm-eval's own
output goes to ``OUTPUT/logs/NAME.log``. A killed evaluation restarts from its resume
store (the ``looped`` model's ``resume_dir``) without regenerating finished batches.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from loopeval.common.outputs import aside
from loopeval.tools.study.plan import Evaluation, record, task_manager
from loopeval.tools.study.spec import Study


@contextmanager
def stderr_to(path: Path):
    """Send file descriptor 2 (lm-eval's logs and progress bars, and the ``git`` it runs for
    provenance) to ``path``, so the caller shows its own progress only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _env_info_once() -> None:
    """lm-eval records torch's environment report in every result (``pip list`` and other
    subprocesses, seconds per evaluation); within one process it cannot change, so it is
    collected for the first evaluation and copied into the others."""
    import copy

    from lm_eval import evaluator

    if getattr(evaluator.add_env_info, "loopeval_once", False):
        return
    collect, known = evaluator.add_env_info, {}

    def add_env_info(storage: dict) -> None:
        if not known:
            collect(known)
        storage.update(copy.deepcopy(known))

    add_env_info.loopeval_once = True
    evaluator.add_env_info = add_env_info


def run_lm_eval(model_args: dict, tasks: list[str], output: Path, *, task_manager, lm_eval: dict, log: Path) -> Path:
    """One ``simple_evaluate`` of the ``looped`` model, saved into ``output`` as lm-eval's CLI
    saves it (``results_*.json`` and ``samples_*.jsonl`` in the model folder)."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    _env_info_once()

    tracker = EvaluationTracker(output_path=str(output))
    options = {k: lm_eval[k] for k in ("batch_size", "device", "num_fewshot", "system_instruction",
                                       "fewshot_as_multiturn", "gen_kwargs", "limit") if lm_eval.get(k) is not None}
    options.setdefault("device", default_device())
    with stderr_to(log):
        results = simple_evaluate(
            model="looped", model_args=model_args, tasks=list(tasks), task_manager=task_manager,
            apply_chat_template=lm_eval.get("apply_chat_template", False), log_samples=True,
            evaluation_tracker=tracker, verbosity="ERROR", **options,
        )
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        for task in results["configs"]:
            tracker.save_results_samples(task_name=task, samples=samples[task])
    return output


def default_device() -> str:
    """The device of a study without ``device:``: CUDA where this machine has it, else the CPU
    (lm-eval's own default, CUDA, fails every evaluation on a CPU-only machine)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_one(evaluation: Evaluation, study: Study, manager=None) -> Path:
    """Run one evaluation into its partial folder, record its settings, then rename it into
    place: a folder under ``evals/`` is always complete. A stale folder of the same name is
    first moved to ``evals/.replaced/NAME.TIME``."""
    if evaluation.partial.exists():
        shutil.rmtree(evaluation.partial)  # what a killed run left; its resume store survives
    if evaluation.folder.exists():  # a stale result, moved aside first: a failed re-run leaves none to report from
        os.replace(evaluation.folder, aside(evaluation.folder.parent, evaluation.name))
    evaluation.partial.mkdir(parents=True)
    evaluation.resume.mkdir(parents=True, exist_ok=True)
    manager = manager or task_manager(study)
    run_lm_eval(evaluation.model_args(study), list(study.tasks), evaluation.partial, task_manager=manager,
                lm_eval=study.lm_eval, log=evaluation.log)
    record(evaluation, study)
    os.replace(evaluation.partial, evaluation.folder)
    return evaluation.folder


def _worker(study: Study, index: int, device: str | None, workers: int, jobs, events) -> None:
    """Worker ``index`` of ``workers``: take evaluations from ``jobs`` until a ``None``; report to ``events``."""
    from loopeval.common.threads import configure_threads

    configure_threads(workers=workers)
    if device is not None:
        study = _on_device(study, device)
    manager = task_manager(study)
    while (evaluation := jobs.get()) is not None:
        events.put(("start", index, evaluation.name, time.time()))
        try:
            run_one(evaluation, study, manager)
            events.put(("done", index, evaluation.name, time.time()))
        except BaseException as exc:  # reported with its log; the other evaluations go on
            with open(evaluation.log, "a") as log:
                traceback.print_exc(file=log)
            events.put(("failed", index, evaluation.name, f"{type(exc).__name__}: {exc}"))
            if isinstance(exc, KeyboardInterrupt):
                return


def _on_device(study: Study, device: str) -> Study:
    from dataclasses import replace

    return replace(study, lm_eval={**study.lm_eval, "device": device})


def run_parallel(evaluations: list[Evaluation], study: Study, *, devices: list[str | None], expected: dict[str, float],
                 progress: bool = True) -> dict[str, str]:
    """Run ``evaluations`` on one worker per entry of ``devices`` (``None``: the study's own
    device); returns ``{name: "done" | error}``. With one worker, the evaluations run in
    this process."""
    from tqdm.auto import tqdm

    from loopeval.common.threads import requested_threads

    requested_threads()  # a bad LOOPEVAL_THREADS is refused once, before any evaluation loads weights
    outcome: dict[str, str] = {}
    total = tqdm(total=len(evaluations), desc="evaluations", unit="eval", disable=not progress, file=sys.stdout)
    if len(devices) == 1:
        study = _on_device(study, devices[0]) if devices[0] else study
        manager = task_manager(study)
        for e in evaluations:
            total.set_postfix_str(e.name)
            try:
                run_one(e, study, manager)
                outcome[e.name] = "done"
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # reported with its log; the other evaluations go on
                with open(e.log, "a") as log:
                    traceback.print_exc(file=log)
                outcome[e.name] = f"{type(exc).__name__}: {exc}"
                tqdm.write(f"FAILED {e.name}: {outcome[e.name]} (log: {e.log})", file=sys.stdout)
            total.update()
        total.close()
        return outcome
    return _pool(evaluations, study, devices, expected, total)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _stop_on_sigterm():
    """SIGTERM (a scheduler's kill) stops the workers as Ctrl-C does, instead of orphaning them."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupt)


def _pool(evaluations, study, devices, expected, total) -> dict[str, str]:
    import multiprocessing as mp
    import queue

    from tqdm.auto import tqdm

    context = mp.get_context("spawn")
    jobs, events = context.Queue(), context.Queue()
    for e in sorted(evaluations, key=lambda e: -expected.get(e.name, 0)):  # longest first
        jobs.put(e)
    for _ in devices:
        jobs.put(None)
    workers = [context.Process(target=_worker, args=(study, i, d, len(devices), jobs, events), daemon=True)
               for i, d in enumerate(devices)]
    lines = [tqdm(total=0, bar_format="{desc}", desc=f"  worker {i}: idle", position=i + 1, file=sys.stdout,
                  disable=total.disable) for i in range(len(devices))]
    rate: dict[int, float] = {}  # budgeted cost per second, per worker
    started: dict[str, float] = {}
    outcome: dict[str, str] = {}
    by_name = {e.name: e for e in evaluations}
    for w in workers:
        w.start()
    previous = _stop_on_sigterm()
    try:
        while len(outcome) < len(evaluations):
            if not any(w.is_alive() for w in workers) and events.empty():
                for name in by_name:
                    outcome.setdefault(name, "the worker stopped before running it")
                break
            try:
                kind, index, name, value = events.get(timeout=1.0)
            except queue.Empty:
                continue
            line, where = lines[index], f"  worker {index} ({devices[index] or study.lm_eval.get('device', 'cpu')})"
            if kind == "start":
                started[name] = value
                eta = expected.get(name, 0) / rate[index] if rate.get(index) else None
                line.set_description_str(f"{where}: {name}" + (f", ETA {eta / 60:.1f} min" if eta else ""))
                continue
            if kind == "done":
                seconds = max(1e-3, value - started[name])
                rate[index] = expected.get(name, 0) / seconds or rate.get(index, 0)
                outcome[name] = "done"
            else:
                outcome[name] = value
                tqdm.write(f"FAILED {name}: {value} (log: {by_name[name].log})", file=sys.stdout)
            line.set_description_str(f"{where}: idle")
            total.update()
    except KeyboardInterrupt:
        for w in workers:
            w.terminate()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for w in workers:
            w.join(timeout=5)
        for line in lines:
            line.close()
        total.close()
    return outcome
