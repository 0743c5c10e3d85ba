"""``loopeval demo`` survives an interruption: the next run takes its half-written folder
back and finishes; a folder that is not a demo's is still refused."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from loopeval.tools.demo import MARKER, run_demo


def test_foreign_folder_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not a loopeval demo folder"):
        run_demo(tmp_path, size="tiny")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_second_demo_on_a_live_folder_is_refused(tmp_path):
    """The demo holds its folder's lock for its whole run: a second one (here with another
    seed) is refused before it touches anything, instead of retraining in place."""
    (tmp_path / MARKER).write_text(json.dumps({"size": "tiny", "seed": 0, "loop": "2:4x2", "recipe": "full",
                                               "status": "trained"}))
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from loopeval.common.outputs import folder_lock\n"
                               "with folder_lock(sys.argv[1], 'demo'):\n    print('held', flush=True); time.sleep(60)",
                               str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in tmp_path.iterdir())
        with pytest.raises(ValueError, match=rf"demo: .* is in use by another loopeval process \(pid {holder.pid},"):
            run_demo(tmp_path, size="tiny", seed=1)
        assert sorted(p.name for p in tmp_path.iterdir()) == before
        assert json.loads((tmp_path / MARKER).read_text())["seed"] == 0
    finally:
        holder.kill()
        holder.wait()


def _demo(out, log):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    # pytest-xdist's workers ignore SIGINT, and an ignored signal stays ignored across exec:
    # give the demo the default disposition a shell gives it, so Ctrl-C reaches it
    return subprocess.Popen([sys.executable, "-m", "loopeval", "demo", "--size", "tiny", "--out", str(out)],
                            stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(condition, deadline, what):
    """Poll for an event the demo shows in its folder or log; the deadline only guards a hang."""
    while not condition():
        assert time.time() < deadline, what()
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", ["3/5", "4/5"])
def test_interrupted_demo_resumes(tmp_path, stop_at):
    """Ctrl-C during training, or during the evaluations; the rerun finishes the demo."""
    out, log_file = tmp_path / "demo", tmp_path / "first.log"
    with log_file.open("w") as log:
        first = _demo(out, log)
        deadline = time.time() + 600
        seen = log_file.read_text
        _wait_for(lambda: f"[loopeval demo] {stop_at}" in seen() or first.poll() is not None, deadline, seen)
        if stop_at == "3/5":  # interrupt once a training step is done: training is under way
            _wait_for(lambda: re.search(r"\|\s*[1-9]\d*/\d+ \[", seen().split(stop_at, 1)[-1])
                      or first.poll() is not None, deadline, seen)
        else:  # interrupt once the first of the 16 evaluations is done: the others are still to run
            _wait_for(lambda: any(not p.name.startswith(".") for p in (out / "evals").glob("*"))
                      or first.poll() is not None, deadline, seen)
        first.send_signal(signal.SIGINT)
        first.wait(timeout=120)
    assert first.returncode != 0, seen()  # it was interrupted, not finished
    assert json.loads((out / MARKER).read_text())["status"] != "done"

    with (tmp_path / "second.log").open("w") as log:
        second = _demo(out, log)
        second.wait(timeout=900)
    stdout = (tmp_path / "second.log").read_text()
    assert second.returncode == 0, stdout[-3000:]
    assert "resuming the demo interrupted in" in stdout
    if stop_at == "4/5":  # the models were trained: kept, not trained again
        assert "3/5 training" not in stdout and "kept from an earlier run" in stdout
    assert (out / "report.html").is_file()
    assert len([p for p in (out / "evals").iterdir() if not p.name.startswith(".")]) == 16
    assert json.loads((out / MARKER).read_text())["status"] == "done"


def test_a_demo_resumes_its_models_by_content(tmp_path):
    """Issue 32: a demo folder whose trained weights were deleted or changed trains them again
    (it never evaluates what is not there); a README beside them changes nothing."""
    from loopeval.tools.demo import _claim
    from loopeval.training.manifest import MANIFEST_NAME

    settings = {"size": "tiny", "seed": 0, "loop": "2:4x2", "recipe": "full"}
    assert _claim(tmp_path, settings) is False
    for name in ("twin", "looped"):
        folder = tmp_path / "checkpoints" / name
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(name.encode())
        (folder / MANIFEST_NAME).write_text("{}")
    from loopeval.tools.demo import _checkpoints, _mark

    _mark(tmp_path, settings, status="done", checkpoints=_checkpoints(tmp_path))
    (tmp_path / "checkpoints" / "twin" / "README.md").write_text("notes")
    assert _claim(tmp_path, settings) is True
    (tmp_path / "checkpoints" / "looped" / "model.safetensors").unlink()
    assert _claim(tmp_path, settings) is False
    assert json.loads((tmp_path / MARKER).read_text())["status"] == "started"
