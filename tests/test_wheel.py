"""The task folder ships in the wheel and works from a non-editable install."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TASK_FILES = sorted(p.name for p in (REPO / "tasks").iterdir() if p.is_file() and not p.name.endswith(".pyc"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("loopeval-*.whl")
    return built


@pytest.mark.slow
def test_wheel_carries_the_task_folder(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n.removeprefix("loopeval/tasks/") for n in names if n.startswith("loopeval/tasks/"))
    assert shipped == TASK_FILES
    assert {"utils.py", "_boxed_template_yaml", "_letter_template_yaml", "loop_core.yaml"} <= set(shipped)
    assert "loopeval/evaluation/scoring.py" in names
    # the lm-eval adapter installs inside loopeval; nothing claims a generic top-level name
    assert {"loopeval/model_adapters/looped.py", "loopeval/model_adapters/_register.py", "loopeval-lm-eval.pth"} <= set(names)
    assert {n.split("/")[0] for n in names if "/" in n} == {"loopeval", wheel.name.split("-py")[0] + ".dist-info"}


@pytest.mark.slow
def test_installed_wheel_serves_tasks_to_lm_eval(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    # Run outside the checkout so that only the installed copy of loopeval is importable first.
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, *args], cwd=tmp_path, env=env, check=True, capture_output=True, text=True
    ).stdout

    include = run("-m", "loopeval", "tasks-path").strip()
    assert Path(include) == site / "loopeval" / "tasks"

    names = "gsm8k_boxed,math500_boxed,aime24_boxed_think,gpqa_diamond_boxed,mmlu_pro_2k,loop_core,loop_full_think"
    assert "All tasks found and valid" in run("-m", "lm_eval", "validate", "--tasks", names, "--include_path", include)

    # lm-eval imports utils.py beside the YAML, and utils.py the installed loopeval.evaluation.scoring.
    probe = f"""
from lm_eval.tasks._yaml_loader import load_yaml
import loopeval.evaluation.scoring
config = load_yaml({include!r} + "/gsm8k_boxed.yaml")
score = config["process_results"]({{"gold": "72"}}, ["so \\\\boxed{{72}}"])
print(loopeval.evaluation.scoring.__file__, score["acc"], score["extracted"])
"""
    scoring_file, acc, extracted = run("-c", probe).split()
    assert Path(scoring_file) == site / "loopeval" / "evaluation" / "scoring.py"
    assert (acc, extracted) == ("1.0", "72")

    # the start-up hook (processed as site-packages would) registers `looped` from the installed copy
    probe = f"""
import site
site.addsitedir({str(site)!r})
from lm_eval.api.registry import get_model
import inspect
print(inspect.getfile(get_model("looped")), get_model("hf").__name__)
"""
    adapter_file, hf = run("-c", probe).split()
    assert Path(adapter_file) == site / "loopeval" / "model_adapters" / "looped.py" and hf == "HFLM"
