"""The vLLM engine: looped vLLM models equal their unrolled copy in vLLM and the HF path, with the rules.

Runs where vLLM is installed (the engine's own environment: README, "The vLLM engine"). From
an environment without vLLM, ``test_engine_environment.py`` runs this file in the engine's.
"""

import gc
import math
import shutil

import pytest

from engine_support import assert_engine_tokens_equal_hf as _assert_engine_tokens_equal_hf
from support import QUESTIONS

NLL_TOLERANCE = dict(rel=1e-5, abs=1e-5)
"""A log-likelihood on the engine against the HF path's: each token's log-probability comes
from logits that two float32 kernel stacks round about 1e-6 of their size apart, and a sum of
same-sign terms keeps that relative size, so 1e-5 of the sum (about 80 float32 steps of it)
leaves 9x headroom over the largest gap measured (2.2e-4 at -203 nats, 1.1e-6: SmolLM2,
GSM8K test item 405); ``abs`` covers sums near 0."""


pytestmark = pytest.mark.usefixtures("needs_vllm")


@pytest.fixture(scope="module")
def evaluate(workdir):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(workdir / "tasks"), include_defaults=False)

    def run(lm, tasks=("tiny_gen",)):
        try:
            return simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, log_samples=True,
                                   verbosity="ERROR")
        finally:
            if type(lm.lm).__name__ == "VLLMLooped":  # free vLLM's memory before the next engine starts
                del lm.lm.model
                gc.collect()

    return run


def _samples(result, task):
    return {s["doc_id"]: s["resps"] for s in result["samples"][task]}


def _engine(path, **kwargs):
    """lm-eval's looped model on the engine; it runs at the session's thread decision (the HF
    path's rule: vLLM's CPU worker keeps a count set before it starts)."""
    import torch

    from loopeval.model_adapters.looped import LoopedLM

    kwargs.setdefault("batch_size", 8)
    lm = LoopedLM(pretrained=str(path), engine="vllm", dtype="float32", enforce_eager=True, max_model_len=1024,
                  **kwargs)
    assert torch.get_num_threads() == lm.session.threads.threads, (torch.get_num_threads(), lm.session.threads)
    return lm


def test_looped_equals_its_unrolled_copy_in_vllm(workdir):
    from loopeval.core.spec import LoopConfig
    from loopeval.engines.vllm_models import engine_overrides, register

    register()
    from vllm import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=32)
    tokens = []
    for path, overrides in ((workdir / "unrolled", None),
                            (workdir / "base", engine_overrides("LlamaForCausalLM", LoopConfig("1:3x2", operator="repeat")))):
        llm = LLM(str(path), dtype="float32", enforce_eager=True, distributed_executor_backend="uni", max_model_len=256,
                  enable_prefix_caching=True, hf_overrides=overrides)
        tokens.append([list(o.outputs[0].token_ids) for o in llm.generate(QUESTIONS, params, use_tqdm=False)])
        del llm
        gc.collect()
    assert tokens[0] == tokens[1]


def test_looped_gemma3_slides_each_extra_site_as_its_layer_does(tmp_path):
    """Gemma 3 (sliding window 4, layer 2 global) past its window: a loop over a sliding and the
    global layer, vLLM against apply_loop's HF model, each extra site sliding as its layer does
    (its sub-layer windows are refused, as on the HF path: test_refusals_name_the_arg). Every
    architecture's loops, Gemma 3's damped windows with an embedding mix among them, are checked
    eager and compiled against the HF path in test_compile.py."""
    from loopeval import save_model
    from loopeval.core.spec import LoopConfig
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model("gemma3", vocab_size=len(tokenizer), num_layers=4, hidden=128)  # head size 32
    assert model.config.layer_types == ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    save_model(model, tokenizer, tmp_path / "gemma3")
    loop = LoopConfig("1:3x3", operator="repeat")
    prompts = [tokenizer(q).input_ids for q in QUESTIONS]
    assert min(map(len, prompts)) > model.config.sliding_window
    windows = _assert_engine_tokens_equal_hf(
        tmp_path / "gemma3", model, loop, prompts,
        inspect=lambda m: {j: site.attn.sliding_window for (j, _, _), site in m.loop.sites.items()})[True]
    assert windows == {j: 4 if j != 2 else None for j in range(loop.spec.windows[0].start, loop.spec.windows[-1].end)}


@pytest.mark.parametrize("loop", [
    dict(loop="1:3x2", loop_operator="repeat"),
    dict(loop="1:3x2", loop_operator="damped"),
    # sub-layer windows, one nested in a whole-layer window, and input mixing from the embedding
    dict(loop="0:3x2+1:2x3/mlp+3:4x2/attn", loop_operator="damped", loop_beta=0.25, loop_mix=0.3,
         loop_mix_source="embedding"),
], ids=["repeat", "damped", "sub-layer-mix"])
def test_engine_equals_the_hf_path_with_forcing_and_the_repetition_stop(workdir, evaluate, tmp_path, loop):
    from loopeval.model_adapters.looped import LoopedLM
    from loopeval.evaluation.trace import find_traces

    rules = dict(**loop, budget_forcing=True, bf_reserve=20, repetition_stop=True)
    hf = evaluate(LoopedLM(pretrained=str(workdir / "base"), device="cpu", batch_size=8, max_length=1024,
                           trace=str(tmp_path / "hf"), **rules), ("tiny_gen", "tiny_mc"))
    vllm = evaluate(_engine(workdir / "base", trace=str(tmp_path / "vllm"), **rules), ("tiny_gen", "tiny_mc"))
    assert _samples(vllm, "tiny_gen") == _samples(hf, "tiny_gen")
    a, b = _samples(vllm, "tiny_mc"), _samples(hf, "tiny_mc")
    for doc in b:  # NLL_TOLERANCE: a sum of float32 log-probabilities from two kernel stacks
        assert [r[0][0] for r in a[doc]] == pytest.approx([r[0][0] for r in b[doc]], **NLL_TOLERANCE)
    (th,), (tv,) = find_traces(tmp_path / "hf"), find_traces(tmp_path / "vllm")
    fields = ("doc_id", "prompt_hash", "prompt_tokens", "generated_tokens", "finished", "forced_at",
              "repetition_stop_at", "flops", "bf_reserve")
    rows = lambda t: sorted(tuple(getattr(i, f) for f in fields) for i in t.items)  # noqa: E731
    assert rows(tv) == rows(th)
    assert any(i.forced_at is not None or i.repetition_stop_at is not None for i in tv.items)
    _assert_headers_equal_but_the_engine(th.header, tv.header)


def _assert_headers_equal_but_the_engine(hf, engine):
    """Two runs of the same model args: the trace headers equal field for field, and so the
    identities, except the engine's name and version and what each backend records of its own
    speed settings (generation), library versions and (HF only) cache check."""
    from loopeval.evaluation.identity import output_identity

    assert engine.decoding.differences(hf.decoding) == [
        "engine: 'vllm' vs None", f"engine_version: {engine.decoding.engine_version!r} vs None"]
    own = ("generation", "versions", "cache_check", "decoding")
    a, b = hf.to_dict(), engine.to_dict()
    assert {k: v for k, v in a.items() if k not in own} == {k: v for k, v in b.items() if k not in own}
    assert a["files"] and set(a["files"]) == {"pretrained"}  # config, tokenizer and chat template are identity
    assert {k: v for k, v in b["versions"].items() if k != "vllm"} == a["versions"]
    ia, ib = output_identity(hf), output_identity(engine)
    for identity in (ia, ib):
        identity["decoding"] = {k: v for k, v in identity["decoding"].items() if k not in ("engine", "engine_version")}
    assert ia == ib


def _looped(engine, path, **kwargs):
    from loopeval.model_adapters.looped import LoopedLM

    extra = dict(enforce_eager=True, max_model_len=1024) if engine == "vllm" else {}
    return LoopedLM(pretrained=str(path), engine=engine, dtype="float32", batch_size=8, **extra, **kwargs)


@pytest.fixture
def no_weights(monkeypatch):
    """Fail a test that loads weights or starts vLLM."""
    import vllm
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    monkeypatch.setattr(vllm.LLM, "__init__", lambda *a, **k: pytest.fail("vLLM started"))


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_both_backends_refuse_bad_input_with_one_message_before_any_weights_load(workdir, tmp_path, engine,
                                                                                 monkeypatch, no_weights):
    """The session checks every input once, for every backend, before any weights load."""
    import sys

    from support import local_tasks, write_tiny_gguf

    from loopeval.common import threads

    with pytest.raises(ValueError, match=r"^looped: unknown model arg\(s\) bogus_knob; valid: .*loop_operator"):
        _looped(engine, workdir / "base", bogus_knob=1)
    plain = tmp_path / "plain"
    shutil.copytree(workdir / "base", plain)
    (plain / "chat_template.jinja").unlink()
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "looped", "--apply_chat_template", "--tasks", "x"])
    with pytest.raises(ValueError, match=r"^looped: --apply_chat_template, but the tokenizer of .*plain has no chat"):
        _looped(engine, plain)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1 + 1?"}\n')  # no answer field
    folder = local_tasks(tmp_path / "tasks", {"gsm8k_boxed": bad})
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "looped", "--include_path", str(folder),
                                      "--tasks", "gsm8k_boxed"])
    with pytest.raises(ValueError, match=r"^looped: .*bad.jsonl"):
        _looped(engine, workdir / "base")
    monkeypatch.setattr(sys, "argv", ["lm_eval"])
    monkeypatch.setattr(threads, "_CHOICE", None)
    monkeypatch.setenv("LOOPEVAL_THREADS", "two")
    with pytest.raises(ValueError, match=r"^looped: LOOPEVAL_THREADS='two': expected a whole number"):
        _looped(engine, workdir / "base")
    monkeypatch.delenv("LOOPEVAL_THREADS")
    with pytest.raises(ValueError, match=r"^looped: pretrained=.*gguf_dir/m.gguf: not a GGUF file"):
        (tmp_path / "gguf_dir").mkdir()
        (tmp_path / "gguf_dir" / "m.gguf").write_bytes(b"not a gguf")
        _looped(engine, tmp_path / "gguf_dir", gguf_file="m.gguf")
    write_tiny_gguf(tmp_path / "gguf_dir" / "m.gguf", drop=("output_norm.weight",))
    with pytest.raises(ValueError, match=r"^looped: pretrained=.*gguf_dir/m.gguf: its tensors leave 1 weight\(s\) of "
                                         r"transformers' llama model unset .*: no tensor output_norm.weight "
                                         r"\(model.norm.weight\);"):
        _looped(engine, tmp_path / "gguf_dir", gguf_file="m.gguf")


def test_an_edited_tokenizer_or_chat_template_makes_an_engine_resume_run_again(workdir, evaluate, tmp_path,
                                                                                monkeypatch):
    """The engine's resume key holds the checkpoint's files (config, tokenizer, chat template),
    as the HF path's does: an unchanged rerun is served, an edited one generated again."""
    from loopeval.engines import vllm_engine

    model, store, calls = tmp_path / "model", tmp_path / "store", []
    shutil.copytree(workdir / "base", model)
    generate = vllm_engine.generate
    monkeypatch.setattr(vllm_engine, "generate", lambda *a, **k: (calls.append(1), generate(*a, **k))[1])

    def run():
        calls.clear()
        evaluate(_looped("vllm", model, loop="1:3x2", resume_dir=str(store)))
        return bool(calls)

    assert run() and not run()
    template = model / "chat_template.jinja"
    template.write_text(template.read_text() + "\n")
    assert run()
    tokenizer = model / "tokenizer_config.json"
    tokenizer.write_text(tokenizer.read_text().replace("{", '{"model_max_length": 4096, ', 1))
    assert run()


def test_refusals_name_the_arg(workdir, tmp_path):
    from loopeval import save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    with pytest.raises(ValueError, match="cache_implementation=static sets transformers' generate"):
        _engine(workdir / "base", loop="1:3x2", cache_implementation="static")
    with pytest.raises(ValueError, match="device=cuda:1: vLLM places itself"):
        _engine(workdir / "base", device="cuda:1")
    with pytest.raises(ValueError, match=r"^looped: pretrained=.*model.gguf: no such GGUF file"):  # the shared check
        _engine(workdir / "base", gguf_file="model.gguf")
    from support import write_tiny_gguf

    write_tiny_gguf(tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="not gguf_file="):  # a sound GGUF: the engine's own refusal
        _engine(tmp_path, gguf_file="m.gguf")
    gated = tmp_path / "gated"
    shutil.copytree(workdir / "looped", gated)
    (gated / "exit_gate.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="carries an exit gate .* does not run exit gates"):
        _engine(gated)
    tokenizer = tiny_tokenizer()
    save_model(tiny_model("qwen3_5", vocab_size=len(tokenizer), num_layers=4, hidden=128), tokenizer, tmp_path / "q")
    with pytest.raises(ValueError, match="no looped variant of Qwen3_5ForCausalLM"):
        _engine(tmp_path / "q", loop="0:2x2")
    save_model(tiny_model("gemma3", vocab_size=len(tokenizer), num_layers=3, hidden=128), tokenizer, tmp_path / "g")
    with pytest.raises(ValueError, match="re-applies only the mlp block of layer 1, a Gemma3DecoderLayer"):
        _engine(tmp_path / "g", loop="1:3x2/mlp")


def test_smollm2_looped_on_the_engine_gives_the_hf_paths_responses(tmp_path):
    """Real weights and real GSM8K items: a damped loop with budget forcing, both paths, the same responses."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from loopeval.evaluation.local_data import write_local_tasks
    from loopeval.model_adapters.looped import LoopedLM
    from real.conftest import GSM8K_8, _absent, _smollm2_file, imported

    gguf = _smollm2_file()
    if not gguf.is_file():
        _absent(f"SmolLM2 GGUF not found at {gguf} (set LOOPEVAL_SMOLLM2_GGUF)")
    model = imported(gguf)
    (tmp_path / "data" / "gsm8k" / "main").mkdir(parents=True)
    shutil.copyfile(GSM8K_8, tmp_path / "data" / "gsm8k" / "main" / "test.jsonl")
    write_local_tasks(tmp_path / "data", tmp_path / "tasks", tasks=["gsm8k_boxed", "gsm8k_nll"])
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    args = dict(loop="14:16x2", budget_forcing=True, budget_scale=0.125, batch_size=2)
    runs = []
    for lm in (lambda: LoopedLM(pretrained=str(model), device="cpu", **args),
               lambda: _engine(model, **args)):
        runs.append(simple_evaluate(model=lm(), tasks=["gsm8k_boxed", "gsm8k_nll"], task_manager=manager, limit=2,
                                    apply_chat_template=True, log_samples=True, verbosity="ERROR"))
        gc.collect()
    hf, engine = runs
    assert _samples(engine, "gsm8k_boxed") == _samples(hf, "gsm8k_boxed")
    a, b = _samples(engine, "gsm8k_nll"), _samples(hf, "gsm8k_nll")
    for doc in b:
        assert a[doc][0][0] == pytest.approx(b[doc][0][0], **NLL_TOLERANCE)


def test_a_study_runs_on_the_engine_and_its_results_are_recognised(workdir, tmp_path):
    """``engine: vllm`` among a study's shared model args: both sides run on the engine, record it,
    and a rerun finds them done."""
    import yaml

    from loopeval.evaluation.trace import find_traces
    from loopeval.tools.study import run_study

    study = {
        "name": "engine", "output": str(tmp_path / "out"),
        "models": [{"name": "twin", "role": "twin", "path": str(workdir / "base")},
                   {"name": "looped", "role": "looped", "path": str(workdir / "looped")}],
        "tasks": ["tiny_gen"], "include_path": [str(workdir / "tasks")], "budgets": [1],
        "decoding": [{"name": "plain"}],
        "lm_eval": {"batch_size": 8, "device": "cpu",
                    "model_args": {"engine": "vllm", "dtype": "float32", "enforce_eager": True, "max_model_len": 512}},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    first = run_study(path, report=False, progress=False)
    assert set(first.outcomes.values()) == {"done"}
    for name in first.outcomes:
        (trace,) = find_traces(tmp_path / "out" / "evals" / name)
        assert trace.header.decoding.engine == "vllm" and (trace.header.loop is None) == name.startswith("twin")
    again = run_study(path, report=False, progress=False)
    assert set(again.outcomes.values()) == {"skipped: done"}


def test_serve_cost_on_the_engine_allocates_the_kv_cache_loop_cost_counts(workdir, tmp_path):
    """serve-cost --engine vllm on a tiny looped Llama: both engines measured, and the KV bytes
    per token vLLM allocates equal a hand count of the call sites that attend."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from loopeval.engines.vllm_engine import engine_version
    from loopeval.engines.vllm_serving import serve_cost
    from loopeval.evaluation.serving import read_serve_cost

    result = serve_cost(workdir / "base", loop="1:3x2", prompt_tokens=16, new_tokens=8,
                        batch_sizes=[1, 2], repeats=1, out=tmp_path, progress=False)
    base, looped = result.models
    config = AutoConfig.from_pretrained(workdir / "base")
    head_dim = config.hidden_size // config.num_attention_heads
    per_site = 2 * config.num_key_value_heads * head_dim * 4  # K and V, float32
    # 4 layers attend once; the loop 1:3x2 calls layers 1 and 2 a second time
    assert (base.engine_kv_bytes_per_token, looped.engine_kv_bytes_per_token) == (4 * per_site, 6 * per_site)
    assert (base.kv_bytes_per_token, looped.kv_bytes_per_token) == (4 * per_site, 6 * per_site)
    ratios = result.ratios()
    assert ratios["kv_bytes_per_token"] == looped.engine_kv_bytes_per_token / base.engine_kv_bytes_per_token == 1.5
    assert ratios["multiplier"] == 1.5
    for m in (base, looped):
        assert m.peak_memory_bytes == m.weight_bytes + 24 * m.engine_kv_bytes_per_token
        assert m.memory_growth_per_token is None and math.isfinite(m.latency_s.median) and m.prefill_s.median > 0
        assert sorted(m.throughput) == [1, 2] and m.max_batch == 2
    hf = AutoModelForCausalLM.from_pretrained(workdir / "base", dtype="float32")
    tensors = [*hf.parameters(), *hf.buffers()]
    # the weights at float32 (rotary buffers included), shared by the loop's call sites
    assert base.weight_bytes == looped.weight_bytes == 4 * sum(t.numel() for t in tensors)
    assert (result.engine, result.engine_version) == ("vllm", engine_version())
    assert result.settings["engine_args"] == {"distributed_executor_backend": "uni", "enable_prefix_caching": False,
                                              "enforce_eager": False}
    assert read_serve_cost(tmp_path) == result
    assert result.to_text().startswith(f"vllm {engine_version()}, cpu, float32")
