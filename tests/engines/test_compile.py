"""Compiled loops on the engine: a looped model compiles exactly when its unlooped base does,
and compiled it gives the eager engine's and the HF path's greedy tokens. The eager engine's
half is also the engine's check of every looped architecture against the HF path.

Runs where vLLM is installed (the engine's own environment), like ``test_vllm_engine.py``.
Each engine here compiles its model once at start (inductor on CPU: about a minute, even for a
tiny model), so each architecture gets one compiled engine and one eager engine, on a few
prompts, and three of them are compiled by Dynamo's trace alone (:data:`DYNAMO_ONLY`).
"""

import json

import pytest

from engine_support import assert_engine_tokens_equal_hf
from support import QUESTIONS

BOTH = (True, False)  # enforce_eager: eager, then compiled


pytestmark = pytest.mark.usefixtures("needs_vllm")


def _compiled(m):
    """Whether the loop's module ran compiled (compiled now, or its compiled graph loaded from
    vLLM's cache), and whether vLLM would compile the base's own decoder model (the decorator's
    verdict for the unlooped model under the same settings)."""
    ran = not m.loop.do_not_compile and (m.loop.compiled or getattr(m.loop, "aot_compiled_fn", None) is not None)
    return ran, not m.model.do_not_compile


def _check(path, model, loop, prompts, **kwargs):
    """Eager and compiled engine each equal the HF path (``assert_engine_tokens_equal_hf``), and
    the loop compiled exactly where the unlooped base would have."""
    states = assert_engine_tokens_equal_hf(path, model, loop, prompts, inspect=_compiled, enforce_eager=BOTH, **kwargs)
    assert states == {True: (False, False), False: (True, True)}


DYNAMO_ONLY = {"compilation_config": {"backend": "eager"}}
"""vLLM's compilation with TorchDynamo's trace (whole graph, split at attention) but without
inductor's code generation: what differs between architectures is what Dynamo traces, and an
inductor compile costs about a minute per engine here, so Qwen2, Qwen3 and Mistral take this."""


@pytest.mark.parametrize("arch,loop,engine_args", [
    ("llama", dict(spec="1:3x3+3:4x2/attn", operator="damped", beta=0.5), None),
    ("qwen2", dict(spec="1:3x3+3:4x2/attn", operator="damped", beta=0.5), DYNAMO_ONLY),
    ("qwen3", dict(spec="0:2x2+2:4x3/attn", operator="repeat"), DYNAMO_ONLY),
    ("mistral", dict(spec="1:3x3+3:4x2/attn", operator="damped", beta=0.5), DYNAMO_ONLY),
    ("gemma3", dict(spec="0:2x2+2:4x3", operator="damped", beta=0.5, mix=0.3, mix_source="embedding"), None),
], ids=["llama", "qwen2-dynamo", "qwen3-dynamo", "mistral-dynamo", "gemma3"])
def test_compiled_loop_equals_eager_and_the_hf_path(tmp_path, arch, loop, engine_args):
    """Every looped architecture, with two windows (an /attn window, or Gemma 3's damped windows
    mixing in its scaled embedding over sliding and global layers, past the sliding window):
    compiled, eager and HF greedy tokens agree (Mistral past its sliding window of 8, so the
    extra call sites slide too)."""
    from loopeval import save_model
    from loopeval.core.spec import LoopConfig
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(arch, vocab_size=len(tokenizer), num_layers=4, hidden=128)  # head size 32
    save_model(model, tokenizer, tmp_path / arch)
    prompts = [tokenizer(q).input_ids for q in QUESTIONS]
    window = getattr(model.config, "sliding_window", None)
    assert window is None or max(map(len, prompts)) > window
    _check(tmp_path / arch, model, LoopConfig(**loop), prompts, engine_args=engine_args)


def test_two_loops_on_one_checkpoint_compile_apart(tmp_path):
    """vLLM keys its compiled-graph cache by its config's hash; the loop (in ``hf_overrides``, so in
    the model's config) is part of it, so one checkpoint looped two ways never shares a graph."""
    from loopeval import save_model
    from loopeval.core.spec import LoopConfig
    from loopeval.engines.vllm_engine import configure_environment
    from loopeval.engines.vllm_models import engine_overrides, register
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    configure_environment()
    register()
    from vllm.engine.arg_utils import EngineArgs

    tokenizer = tiny_tokenizer()
    save_model(tiny_model("llama", vocab_size=len(tokenizer), num_layers=4, hidden=128), tokenizer, tmp_path)

    def key(**loop):
        overrides = {"hf_overrides": engine_overrides("LlamaForCausalLM", LoopConfig(**loop))} if loop else {}
        return EngineArgs(model=str(tmp_path), dtype="float32", max_model_len=256, distributed_executor_backend="uni",
                          **overrides).create_engine_config().compute_hash()

    keys = [key(), key(spec="1:3x2", operator="repeat"), key(spec="1:3x2/attn", operator="repeat"),
            key(spec="1:3x2", operator="damped", beta=0.5), key(spec="1:3x2", operator="damped", beta=0.25)]
    assert len(set(keys)) == len(keys)
    assert key(spec="1:3x2", operator="repeat") == keys[1]


def _gsm8k_questions():
    from real.conftest import GSM8K_8

    return [json.loads(line)["question"] for line in GSM8K_8.read_text().splitlines()]


def test_smollm2_compiled_loop_gives_the_hf_paths_tokens():
    """Real weights: SmolLM2-135M-Instruct looped 14:16x2 (damped) on GSM8K questions."""
    from loopeval import load_model
    from loopeval.core.spec import LoopConfig
    from real.conftest import _absent, _smollm2_file, imported

    gguf = _smollm2_file()
    if gguf is None or not gguf.is_file():
        _absent(f"SmolLM2 GGUF not found at {gguf} (set LOOPEVAL_SMOLLM2_GGUF)")
    path = imported(gguf)
    model, tokenizer = load_model(path)
    prompts = [tokenizer(q).input_ids for q in _gsm8k_questions()[:3]]
    _check(path, model, LoopConfig("14:16x2", operator="damped", beta=0.5), prompts, max_tokens=16)


def test_gemma3_270m_compiled_loop_gives_the_hf_paths_tokens():
    """Real weights: Gemma 3 270M looped over sliding layer 4, global layer 5 and sliding layer 6,
    on GSM8K questions and on a prompt past the 512-token window; the engine's greedy tokens,
    eager and compiled, are apply_loop's."""
    from loopeval import load_model
    from loopeval.core.spec import LoopConfig
    from real.conftest import _absent, _gemma3_file, imported

    gguf = _gemma3_file()
    if gguf is None or not gguf.is_file():
        _absent(f"Gemma 3 270M GGUF not found ({gguf}; set LOOPEVAL_GEMMA3_GGUF)")
    path = imported(gguf)
    model, tokenizer = load_model(path)
    questions = _gsm8k_questions()
    prompts = [tokenizer(q).input_ids for q in questions[:3]] + [tokenizer(" ".join(questions) * 3).input_ids[:530]]
    assert model.config.sliding_window == 512 and len(prompts[-1]) == 530
    assert model.config.layer_types[4:7] == ["sliding_attention", "full_attention", "sliding_attention"]
    _check(path, model, LoopConfig("4:7x2", operator="damped", beta=0.5), prompts, max_tokens=16, max_model_len=1024)
