"""``loopeval protocol --ray``: the evaluations as Ray tasks on a local Ray (2 CPUs, one
cluster for the module) give what the single-process run and two workers give; a killed
task is run again to the same result; a failing one is FAILED with its error after its
retries; Ctrl-C cancels; bad Ray options are refused before anything runs."""

import json
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from test_study import _study, world  # noqa: F401 (the tiny twin, looped model and task of the study tests)

from loopeval.tools.study import load_study, run_study
from loopeval.tools.study.plan import expand
from loopeval.tools.study.ray_backend import START, evaluation_resources
from loopeval.tools.study.spec import RayOptions


def _ray():
    try:
        import ray
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("ray is missing, and .ci/run installs it (pip install 'loopeval[ray]')")
        pytest.skip("needs Ray (pip install 'loopeval[ray]'); .ci/run installs it")
    return ray


@pytest.fixture(scope="module")
def cluster():
    """A local Ray of 2 CPUs and 1 GPU that Ray counts but this machine lacks: a task asking for
    it takes the GPU path (its own worker, ``CUDA_VISIBLE_DEVICES`` set by Ray) and runs on the CPU."""
    ray = _ray()
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def _results(out: Path) -> dict:
    """Every evaluation's responses, per-item scores, aggregate results, trace items and settings record."""
    found = {}
    for folder in sorted((out / "evals").iterdir()):
        if folder.name.startswith("."):
            continue
        (samples,) = folder.rglob("samples_*.jsonl")
        (results,) = folder.rglob("results_*.json")
        (trace,) = folder.glob("loopeval_trace_*.jsonl")
        found[folder.name] = {
            "samples": [{k: r[k] for k in ("doc_id", "resps", "filtered_resps", "exact_match")}
                        for r in map(json.loads, samples.read_text().splitlines())],
            "results": json.loads(results.read_text())["results"],
            "trace": [{k: v for k, v in r.items() if k not in ("seconds", "wall_seconds")}
                      for r in map(json.loads, trace.read_text().splitlines()[1:])],
            "settings": json.loads((folder / "loopeval_evaluation.json").read_text()),
        }
    return found


def _report(out: Path) -> dict:
    """The study's report.json, less its creation time and the runs' folders."""
    report = json.loads((out / "report.json").read_text())
    report.pop("created")
    for run in report["runs"]:
        assert Path(run.pop("path")).parent == out / "evals"
    return report


@pytest.fixture(scope="module")
def single(world, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("single")
    result = run_study(_study(world, folder), progress=False)
    assert set(result.outcomes.values()) == {"done"} and result.report is not None
    return folder


@pytest.mark.slow
def test_ray_gives_the_results_of_one_process_and_of_two_workers(cluster, world, single, tmp_path):  # noqa: F811
    on_ray = tmp_path / "ray"
    on_ray.mkdir()
    path = _study(world, on_ray, ray={"cpus": 1})
    assert load_study(path).ray == RayOptions(cpus=1)
    result = run_study(path, progress=False)
    assert set(result.outcomes.values()) == {"done"} and len(result.outcomes) == 4
    expected = _results(single / "out")
    assert _results(on_ray / "out") == expected
    assert _report(on_ray / "out") == _report(single / "out")
    again = run_study(path, progress=False)  # the same done-check as without Ray: nothing runs
    assert set(again.outcomes.values()) == {"skipped: done"}

    workers = tmp_path / "workers"
    workers.mkdir()
    assert set(run_study(_study(world, workers), workers=2, progress=False).outcomes.values()) == {"done"}
    assert _results(workers / "out") == expected and _report(workers / "out") == _report(single / "out")


def _pid_when_started(log: Path, partial: Path, attempt: int = 1) -> int:
    """The pid of the ``attempt``-th Ray task of an evaluation, once it is inside the lm-eval run."""
    deadline = time.time() + 600  # only guards a hang: the task's start is the event waited for
    while time.time() < deadline:
        starts = [line for line in (log.read_text().splitlines() if log.exists() else []) if line.startswith(START)]
        if len(starts) >= attempt and partial.exists():
            return int(starts[attempt - 1].split(", pid ")[1].split(",")[0])
        time.sleep(0.02)
    raise TimeoutError(f"no Ray task started for {log.stem}")


@pytest.mark.slow
def test_a_killed_task_is_run_again_to_the_same_result(cluster, world, single, tmp_path):  # noqa: F811
    path = _study(world, tmp_path, ray={"retries": 1, "gpus": 1})  # device: cpu, on the GPU path
    (evaluation,) = [e for e in expand(load_study(path)) if e.name == "looped__plain__1x"]
    killed = []

    def kill():
        pid = _pid_when_started(evaluation.log, evaluation.partial)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill)
    killer.start()
    result = run_study(path, only=evaluation.name, report=False, progress=False)
    killer.join()
    assert killed and result.outcomes == {evaluation.name: "done"}
    starts = [line for line in evaluation.log.read_text().splitlines() if line.startswith(START)]
    assert len(starts) == 2 and f"pid {killed[0]}," in starts[0]
    assert _results(tmp_path / "out")[evaluation.name] == _results(single / "out")[evaluation.name]


@pytest.mark.slow
def test_a_failing_task_is_retried_then_failed_with_its_error(cluster, world, tmp_path):  # noqa: F811
    path = _study(world, tmp_path, budgets=[1], ray={"retries": 1},
                  lm_eval={"batch_size": 3, "device": "cpu", "model_args": {"max_length": "long"}})
    result = run_study(path, only="twin__*", progress=False)
    (outcome,) = result.outcomes.values()
    error, _, attempts = outcome.rpartition(" (")
    assert attempts == "after 2 attempt(s))"
    log = (tmp_path / "out" / "logs" / "twin__plain__1x.log").read_text().splitlines()
    assert sum(line.startswith(START) for line in log) == 2 and log[-1] == error  # the task's own error, as raised
    assert result.report is None and not (tmp_path / "out" / "evals" / "twin__plain__1x").exists()


@pytest.mark.slow
def test_ctrl_c_cancels_the_tasks(cluster, world, tmp_path):  # noqa: F811
    path = _study(world, tmp_path, budgets=[1], ray=True)
    (evaluation,) = [e for e in expand(load_study(path)) if e.name == "twin__plain__1x"]
    pids = []

    def interrupt():
        pids.append(_pid_when_started(evaluation.log, evaluation.partial))
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    threading.Thread(target=interrupt).start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest-xdist workers ignore SIGINT
    try:
        with pytest.raises(KeyboardInterrupt):
            run_study(path, only=evaluation.name, progress=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert _exited(pids[0], hang_guard=300), "the cancelled task's worker is still running"
    assert not evaluation.folder.exists()


def _exited(pid: int, *, hang_guard: float) -> bool:
    """Wait for process ``pid`` (not a child of this one) to exit, on the exit itself (a
    pidfd turns readable); ``hang_guard`` seconds only guard a hang."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], hang_guard)[0])
    finally:
        os.close(fd)


def test_resources_per_evaluation(world, tmp_path):  # noqa: F811
    """One GPU where the evaluation runs on CUDA, none on the CPU, CPUs as given, and an engine's
    ranks (vLLM's tensor and pipeline parallel sizes) multiply the GPUs."""
    def want(cluster_has_gpus=False, **change):
        study = load_study(_study(world, tmp_path, **change))
        return evaluation_resources(expand(study)[0], study, study.ray or RayOptions(), cluster_has_gpus=cluster_has_gpus)

    assert (want().cpus, want().gpus) == (1, 0)
    assert want(lm_eval={"device": "cuda"}).gpus == 1
    assert want(lm_eval={}).gpus == 0 and want(lm_eval={}, cluster_has_gpus=True).gpus == 1
    assert (want(ray={"cpus": 4}).cpus, want(ray={"cpus": 4}).gpus) == (4, 0)
    engine = {"device": "cuda", "model_args": {"tensor_parallel_size": 4, "pipeline_parallel_size": 2}}
    assert want(lm_eval=engine).gpus == 8 and want(lm_eval=engine, ray={"gpus": 0.5}).gpus == 4


@pytest.mark.parametrize(("ray", "message"), [
    ({"gpu": 1}, r"study.yaml: ray.gpu: unknown key; ray takes address, cpus, gpus, retries"),
    ({"cpus": 0}, r"study.yaml: ray.cpus: cpus=0: must be > 0"),
    ({"retries": -1}, r"study.yaml: ray.retries: retries=-1: must be >= 0"),
    ([1], r"study.yaml: ray: \[1\]: expected true, an address \(auto, local, HOST:PORT or ray://HOST:PORT\) or a mapping"),
])
def test_bad_ray_options_name_the_key(world, tmp_path, ray, message):  # noqa: F811
    with pytest.raises(ValueError, match=message):
        load_study(_study(world, tmp_path, ray=ray))
    assert load_study(_study(world, tmp_path, ray="auto")).ray == RayOptions(address="auto")


def test_without_ray_the_flag_names_the_extra(world, tmp_path, monkeypatch, capsys):  # noqa: F811
    from loopeval.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)
    path = _study(world, tmp_path)
    assert main(["protocol", str(path), "--ray"]) == 2
    assert "--ray needs Ray, an optional extra of loopeval: pip install 'loopeval[ray]'" in capsys.readouterr().err
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "ray": True}))
    with pytest.raises(ImportError, match=r"pip install 'loopeval\[ray\]'"):
        run_study(path, dry_run=True)
    assert set(run_study(path, dry_run=True, workers=2).outcomes.values()) == {"planned"}  # --workers: no Ray


def test_what_no_node_can_hold_is_refused_before_anything_runs(cluster, world, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match=r"asks Ray for 1 CPU\(s\) and 2 GPU\(s\) on one node, but the largest node "
                                         r"of the cluster has 2 CPU\(s\) and 1 GPU\(s\)"):
        run_study(_study(world, tmp_path, ray={"gpus": 2}), progress=False)
    with pytest.raises(ValueError, match=r"lm_eval.device: cuda:1 names a device of one machine"):
        run_study(_study(world, tmp_path, ray=True, lm_eval={"device": "cuda:1"}), progress=False)
    assert not (tmp_path / "out" / "evals").exists()
