"""Fixtures the engine's test files share."""

import importlib.util
import json
import os

import pytest

from support import MC_YAML, QUESTIONS, write_generate_task


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from loopeval import apply_loop, save_model
    from loopeval.core.unroll import unrolled_copy
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("vllm_engine")
    tokenizer = tiny_tokenizer()
    # head size 32: vLLM's CPU attention has no smaller one
    base = tiny_model("llama", vocab_size=len(tokenizer), num_layers=4, hidden=128)
    save_model(base, tokenizer, root / "base")
    unrolled = unrolled_copy(base, "1:3x2")
    unrolled.config.num_hidden_layers = len(unrolled.model.layers)
    save_model(unrolled, tokenizer, root / "unrolled")
    save_model(apply_loop(tiny_model("llama", vocab_size=len(tokenizer), num_layers=4, hidden=128), "1:3x2",
                          operator="repeat"), tokenizer, root / "looped")
    tasks = root / "tasks"
    rows = [{"question": q, "answer": "7", "label": i % 3} for i, q in enumerate(QUESTIONS)]
    write_generate_task(tasks, "tiny_gen", rows, max_gen_toks=48)
    (tasks / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tasks / "tiny_mc.yaml").write_text(MC_YAML.format(data=tasks / "data.jsonl"))
    return root


@pytest.fixture(scope="module")
def needs_vllm():
    """Skip a module's tests where vLLM is not installed (``pytestmark = pytest.mark.usefixtures("needs_vllm")``);
    test_engine_environment.py runs them in the engine's environment. 1 GiB of KV cache per engine."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("no vLLM in this environment: test_engine_environment.py runs these tests in the engine's")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
