"""``loopeval demo`` survives an interruption: the next run takes its half-written folder
back and finishes; a folder that is not a demo's is still refused."""

import json
import os
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


def _demo(out, **kwargs):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "loopeval", "demo", "--size", "tiny", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", ["3/5", "4/5"])
def test_interrupted_demo_resumes(tmp_path, stop_at):
    """Ctrl-C during training, or during the evaluations; the rerun finishes the demo."""
    out = tmp_path / "demo"
    first = _demo(out)
    seen = ""
    deadline = time.time() + 600
    for line in first.stdout:
        seen += line
        if f"[loopeval demo] {stop_at}" in line:
            time.sleep(3.0 if stop_at == "3/5" else 15.0)
            break
        assert time.time() < deadline, seen
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=120)
    assert first.returncode != 0, seen  # it was interrupted, not finished
    assert json.loads((out / MARKER).read_text())["status"] != "done"

    second = _demo(out)
    stdout, _ = second.communicate(timeout=900)
    assert second.returncode == 0, stdout[-3000:]
    assert "resuming the demo interrupted in" in stdout
    if stop_at == "4/5":  # the models were trained: kept, not trained again
        assert "3/5 training" not in stdout and "kept from an earlier run" in stdout
    assert (out / "report.html").is_file()
    assert len([p for p in (out / "evals").iterdir() if not p.name.startswith(".")]) == 16
    assert json.loads((out / MARKER).read_text())["status"] == "done"
