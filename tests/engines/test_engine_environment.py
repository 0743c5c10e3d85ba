"""The engine's tests, run from an environment without vLLM in the engine's own.

vLLM pins its own transformers, so it lives in an environment of its own with loopeval in it
(README, "The vLLM engine"): ``LOOPEVAL_ENGINE_ENV``, or ``.venv-vllm`` in the checkout. The
README's one test command thus runs the engine's tests too; without an engine environment
this test skips with the reason, and fails when ``CI`` is set (``.ci/run`` builds it).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.mark.slow
@pytest.mark.longest
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                    reason="vLLM is in this environment: test_vllm_engine.py runs here directly")
def test_the_engine_tests_pass_in_the_engine_environment():
    env_dir = Path(os.environ.get("LOOPEVAL_ENGINE_ENV") or ROOT / ".venv-vllm")
    python = env_dir / "bin" / "python"
    if not python.exists():
        message = f"no engine environment at {env_dir} (README, \"The vLLM engine\", builds it)"
        if os.environ.get("CI"):
            pytest.fail(message + "; .ci/run builds it")
        pytest.skip(message)
    found = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True)
    assert found.returncode == 0, f"{python} cannot import vllm:\n{found.stderr[-2000:]}"
    result = subprocess.run([python, "-m", "pytest", str(HERE), "-q", "-n", "0",
                             "-p", "no:cacheprovider", "-o", "addopts=-ra"], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, f"{python} -m pytest tests/engines:\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    assert " passed" in result.stdout.strip().splitlines()[-1], result.stdout[-2000:]
