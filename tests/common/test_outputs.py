"""Outputs never overwrite inputs; one writer per output folder (issue 23.3, cases 9 and 10)."""

import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loopeval.cli import main
from loopeval.common.outputs import LOCK_NAME, aside, check_outputs, folder_lock, record_written
from loopeval.common.paths import tasks_path

RUNS = Path(__file__).parents[1] / "fixtures" / "runs"


def test_report_out_on_an_input_results_file_is_refused_and_the_file_kept(tmp_path, capsys):
    twin, looped = tmp_path / "twin", tmp_path / "looped"
    shutil.copytree(RUNS / "twin", twin)
    shutil.copytree(RUNS / "looped", looped)
    (results,) = twin.rglob("results_*.json")
    before = results.read_bytes()
    assert main(["report", "--out", str(results), "--twin", str(twin), "--looped", str(looped)]) == 2
    assert "would overwrite the input" in capsys.readouterr().err
    assert results.read_bytes() == before


def test_json_equal_to_out_is_refused(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", "--out", str(out), "--json", str(out), "--twin", str(RUNS / "twin"),
                 "--looped", str(RUNS / "looped")]) == 2
    assert "--json" in capsys.readouterr().err and not out.exists()


def test_check_outputs_allows_new_files_beside_inputs(tmp_path):
    (tmp_path / "run").mkdir()
    check_outputs({"--out": tmp_path / "run" / "new.html"}, [tmp_path / "run"])
    (tmp_path / "run" / "old.json").write_text("{}")
    with pytest.raises(ValueError, match="holds old.json"):
        check_outputs({"--out": tmp_path / "run" / "old.json"}, [tmp_path / "run"])


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _lock_of(pid, **changes):
    """The lock a live process ``pid`` on this host would write, with ``changes``."""
    from loopeval.common.outputs import _boot_id, _start_time

    return json.dumps({"host": socket.gethostname(), "boot": _boot_id(), "pid": pid, "started": _start_time(pid),
                       **changes})


def test_a_held_lock_names_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    holder = _sleeper()
    try:
        for text in (str(holder.pid), _lock_of(holder.pid)):  # a bare pid is the lock of loopeval before issue 32
            (tmp_path / LOCK_NAME).write_text(text)
            with pytest.raises(ValueError, match=rf"place: .* in use by another loopeval process \(pid {holder.pid}"):
                with folder_lock(tmp_path, "place"):
                    pytest.fail("a lock held by a live process was taken")
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(tmp_path, "place"):  # the holder died: its lock is taken over
        lock = json.loads((tmp_path / LOCK_NAME).read_text())
        assert (lock["pid"], lock["host"]) == (os.getpid(), socket.gethostname()) and lock["started"] > 0
        with folder_lock(tmp_path, "protocol"):  # the same process nests (the demo runs a study in its folder)
            assert json.loads((tmp_path / LOCK_NAME).read_text()) == lock
        assert (tmp_path / LOCK_NAME).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_reused_pid_frees_the_lock_but_another_hosts_holder_keeps_it(tmp_path):
    other = _sleeper()  # alive, but not the process that took the lock: its pid was reused
    try:
        (tmp_path / LOCK_NAME).write_text(_lock_of(other.pid, started=1))
        with folder_lock(tmp_path, "place"):
            assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        other.kill()
        other.wait()
    (tmp_path / LOCK_NAME).write_text(_lock_of(2 ** 22, host="node-7", boot="x"))  # another host's pid
    with pytest.raises(ValueError, match=r"in use by another loopeval process \(pid 4194304 on host node-7.*"
                                         r"cannot tell .* whether it still runs: if it does not, delete .*\.loopeval\.lock"):
        with folder_lock(tmp_path, "train"):
            pytest.fail("another host's lock was taken")
    (tmp_path / LOCK_NAME).write_text("garbage")
    with pytest.raises(ValueError, match=r"\.loopeval\.lock is not a lock written by loopeval \('garbage'; .*\); if no loopeval"):
        with folder_lock(tmp_path, "train"):
            pytest.fail("an unreadable lock was taken")


def _hold(folder, started, release, results):
    try:
        with folder_lock(folder, "protocol"):
            started.set()
            release.wait(10)
        results.put("ran")
    except ValueError as exc:
        results.put(str(exc))


def test_two_writers_at_once_get_one_lock(tmp_path):
    ctx = mp.get_context("spawn")
    started, release, results = ctx.Event(), ctx.Event(), ctx.Queue()
    first = ctx.Process(target=_hold, args=(tmp_path, started, release, results))
    first.start()
    assert started.wait(60)
    idle = (ctx.Event(), ctx.Event())  # kept alive until the second writer has run
    second = ctx.Process(target=_hold, args=(tmp_path, *idle, results))
    second.start()
    second.join(60)
    release.set()
    first.join(60)
    refused, ran = results.get(timeout=5), results.get(timeout=5)  # the second writer ends first
    assert ran == "ran" and f"in use by another loopeval process (pid {first.pid}," in refused


def test_train_overwrite_removes_only_what_loopeval_recorded_writing(tmp_path):
    from loopeval.training.twins import _check_out

    out = tmp_path / "twin"
    (out / "adapter").mkdir(parents=True)  # the user's, like checkpoint-best.pt
    (out / "checkpoint-best.pt").write_text("mine")
    (out / "checkpoint-10").mkdir()  # the previous run's manifest records it
    (out / "training_manifest.json").write_text(json.dumps({"checkpoints": [{"path": "checkpoint-10"}], "adapters": None}))
    record_written(out, "checkpoint-20")  # an interrupted run recorded it before writing it
    (out / "checkpoint-20").mkdir()
    record_written(out, "../outside")  # never followed out of the folder
    (tmp_path / "outside").write_text("kept")
    with pytest.raises(ValueError, match="not empty"):
        _check_out(out, False)
    _check_out(out, True)
    assert sorted(p.name for p in out.iterdir()) == ["adapter", "checkpoint-best.pt", "training_manifest.json"]
    assert (tmp_path / "outside").is_file()


def test_no_output_goes_into_loopevals_installed_folders(tmp_path, capsys):
    tasks = tasks_path()
    before = {p.name: p.read_bytes() for p in tasks.glob("*.yaml")}
    data = tmp_path / "data" / "gsm8k" / "main"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    for argv in (["local-tasks", "--data", str(tmp_path / "data"), "--out", str(tasks)],
                 ["local-tasks", "--data", str(tmp_path / "data"), "--out", str(tasks / "sub")],
                 ["place", "--model", "no/such", "--data", "x.jsonl", "--out", str(tasks.parent / "loopeval" / "p")]):
        assert main(argv) == 2, argv
        assert "inside loopeval's installed folder" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tasks.glob("*.yaml")} == before and not (tasks / "sub").exists()


def test_results_moved_aside_within_one_second_keep_separate_folders(tmp_path):
    """Two results superseded in the same second (a study re-run twice, CI's failure) each get
    their own folder: the second move neither overwrites nor is refused by the first."""
    for content in ("first", "second", "third"):
        result = tmp_path / "evals" / "run"
        result.mkdir(parents=True)
        (result / "samples.jsonl").write_text(content)
        os.replace(result, aside(tmp_path / "evals", "run"))
    moved = sorted((tmp_path / "evals" / ".replaced").iterdir())
    assert len(moved) == 3
    assert sorted((m / "samples.jsonl").read_text() for m in moved) == ["first", "second", "third"]
