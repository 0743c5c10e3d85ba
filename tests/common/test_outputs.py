"""Outputs never overwrite inputs; one writer per output folder (issue 23.3, cases 9 and 10)."""

import multiprocessing as mp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loopeval.cli import main
from loopeval.common.outputs import LOCK_NAME, check_outputs, folder_lock

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


def test_a_held_lock_names_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / LOCK_NAME).write_text(str(holder.pid))
        with pytest.raises(ValueError, match=rf"place: .* in use by another loopeval process \(pid {holder.pid}\)"):
            with folder_lock(tmp_path, "place"):
                pytest.fail("a lock held by a live process was taken")
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(tmp_path, "place"):  # the holder died: its lock is taken over
        assert (tmp_path / LOCK_NAME).read_text() == str(os.getpid())
    assert not (tmp_path / LOCK_NAME).exists()


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
    assert ran == "ran" and f"in use by another loopeval process (pid {first.pid})" in refused


def test_train_overwrite_removes_the_previous_runs_files(tmp_path):
    from loopeval.training.twins import _check_out

    out = tmp_path / "twin"
    (out / "adapter").mkdir(parents=True)
    (out / "checkpoint-10").mkdir()
    (out / "training_manifest.json").write_text("{}")
    with pytest.raises(ValueError, match="not empty"):
        _check_out(out, False)
    _check_out(out, True)
    assert sorted(p.name for p in out.iterdir()) == ["training_manifest.json"]
