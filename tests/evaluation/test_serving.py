"""Serving: static-cache and compiled looped decoding are exact, ``serve_cost`` measures
what it says (memory growth against the hand-counted KV bytes), and bad input is refused
before any work."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from loopeval import apply_loop, loop_config, loop_cost, save_model
from loopeval.core.spec import LoopSpec
from loopeval.tools.tiny import tiny_model
from loopeval.core.unroll import unrolled_copy

SPECS = {"qwen3": "1:4x2", "qwen3_5": "2:4x3"}  # on Qwen3.5 layer 3 is full attention, 2 Gated DeltaNet


def _batch(rows=3, length=12):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 400, (rows, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    return ids, mask


def _generate(model, ids, mask, **options):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=10, min_new_tokens=10, do_sample=False,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True, **options)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_static_cache_equals_dynamic_unrolled_and_uncached(arch):
    spec = SPECS[arch]
    reference = unrolled_copy(tiny_model(arch), spec)
    model = apply_loop(tiny_model(arch), spec, operator="repeat")  # against the unrolled copy
    ids, mask = _batch()
    dynamic = _generate(model, ids, mask)
    static = _generate(model, ids, mask, cache_implementation="static")
    unrolled = _generate(reference, ids, mask, cache_implementation="static")
    for other in (dynamic, unrolled):
        assert torch.equal(static.sequences, other.sequences)
        torch.testing.assert_close(torch.stack(static.logits), torch.stack(other.logits), rtol=0, atol=1e-4)
    # cached equals uncached: one forward over the whole sequences recomputes every step
    full_mask = torch.cat([mask, torch.ones_like(static.sequences[:, ids.shape[1]:])], 1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = model(static.sequences, attention_mask=full_mask, position_ids=positions, use_cache=False).logits
    steps = full[:, ids.shape[1] - 1:-1]
    torch.testing.assert_close(steps, torch.stack(static.logits, 1), rtol=0, atol=1e-4)
    # one preallocated slot per call site, each with its own storage
    cache = static.past_key_values
    sites = [s for s in LoopSpec.parse(spec).call_sites(6) if s.slot is not None]
    assert type(cache).__name__ == "StaticCache" and len(cache.layers) == len(sites)
    for s in (s for s in sites if s.slot >= 6):
        mine, original = cache.layers[s.slot], cache.layers[s.layer]
        assert type(mine) is type(original)
        for name, value in vars(original).items():
            if isinstance(value, torch.Tensor) and value.dim() > 1:
                assert getattr(mine, name).shape == value.shape
                assert getattr(mine, name).data_ptr() != value.data_ptr()


def test_early_initialized_static_cache_keeps_fixed_addresses():
    """A cache allocated before the first forward (as for a compiled prefill): the loop's
    copies carry the static-address mark transformers puts on the originals."""
    from transformers import StaticCache

    model = apply_loop(tiny_model("qwen3"), SPECS["qwen3"])
    ids, mask = _batch()
    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + 10)
    cache.early_initialization(batch_size=3, num_heads=2, head_dim=16, dtype=torch.float32, device="cpu")
    given = _generate(model, ids, mask, cache=cache)
    assert torch.equal(given.sequences, _generate(model, ids, mask).sequences)
    marks = {getattr(layer.keys, "_dynamo_static_input_type", None) for layer in cache.layers}
    assert len(cache.layers) == 9 and marks == {getattr(cache.layers[0].keys, "_dynamo_static_input_type")} != {None}


def test_decode_step_compiles_without_graph_breaks():
    from transformers import StaticCache

    model = apply_loop(tiny_model("qwen3", num_layers=4), "1:3x2")
    ids = torch.randint(3, 400, (1, 6))
    cache = StaticCache(config=model.config, max_cache_len=8)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        explained = torch._dynamo.explain(model)(input_ids=ids[:, :1], cache=cache, use_cache=True,
                                                 position_ids=torch.tensor([[6]]))
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.slow  # inductor compiles the decode step: about a minute on two cores
def test_compiled_decoding_equals_eager():
    from loopeval.evaluation.serving import generation_options

    model = apply_loop(tiny_model("qwen3", num_layers=4), "1:3x2")
    ids, mask = _batch(rows=1)
    eager = _generate(model, ids, mask, **generation_options("static"))
    compiled = _generate(model, ids, mask, **generation_options("static", compile=True))
    assert hasattr(model, "_compiled_call")  # generate really took the compiled path
    assert torch.equal(eager.sequences, compiled.sequences)
    torch.testing.assert_close(torch.stack(eager.logits), torch.stack(compiled.logits), rtol=0, atol=1e-4)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_serve_cost_measures_the_kv_cache_it_predicts(cache, tmp_path):
    from loopeval.evaluation.serving import ServeCost, read_serve_cost, serve_cost

    model = tiny_model("qwen3")
    result = serve_cost(model, loop="1:4x2", prompt_tokens=8, new_tokens=5, batch_sizes=[1, 2], repeats=1,
                        cache=cache, out=tmp_path, progress=False)
    base, looped = result.models
    assert (base.loop, looped.loop) == (None, "1:4x2") and (base.passes, looped.passes) == (6, 9)
    # by hand: 6 (9) attention call sites x K and V x 2 heads x 16 dims x 4 bytes per token
    assert (base.kv_bytes_per_token, looped.kv_bytes_per_token) == (6 * 256, 9 * 256)
    # the dynamic cache grows by its KV bytes and the int64 token id per generated token;
    # the static one is preallocated and grows by the token id alone
    for m in (base, looped):
        assert m.memory_growth_per_token == (m.kv_bytes_per_token if cache == "dynamic" else 0) + 8
        assert m.weight_bytes == 4 * sum(p.numel() for p in model.parameters()) + 4 * sum(
            b.numel() for b in model.buffers())
        assert m.peak_memory_bytes > m.weight_bytes and math.isfinite(m.latency_s.median) and m.prefill_s.median > 0
        assert sorted(m.throughput) == [1, 2] and m.max_batch == 2
    ratios = result.ratios()
    assert ratios["multiplier"] == 1.5 and ratios["kv_bytes_per_token"] == 1.5
    assert ratios["flop_multiplier"] == pytest.approx(
        loop_cost(model, "1:4x2").generation_flops(8, 5) / loop_cost(model, None).generation_flops(8, 5))
    assert read_serve_cost(tmp_path) == result
    import transformers

    assert (result.engine, result.engine_version) == ("hf", transformers.__version__)
    old = json.loads((tmp_path / "serve_cost.json").read_text())  # as written before the engine was recorded
    del old["engine"], old["engine_version"]
    for m in old["models"]:
        del m["engine_kv_bytes_per_token"]
    assert ServeCost.from_dict(old) == result
    assert "c = 1.500" in result.to_text()
    assert loop_config(model) is None  # the given model is the unlooped side, untouched


def test_a_looped_model_is_compared_with_its_own_unlooped_self():
    from loopeval.evaluation.serving import serve_cost

    model = apply_loop(tiny_model("qwen3", num_layers=4), "1:3x2")
    result = serve_cost(model, prompt_tokens=4, new_tokens=3, batch_sizes=[1], repeats=1, progress=False)
    assert [m.loop for m in result.models] == [None, "1:3x2"]
    assert str(loop_config(model).spec) == "1:3x2"  # the given model keeps its loop


def test_cpu_auto_batch_doubles_while_throughput_rises(monkeypatch):
    from loopeval.evaluation import serving

    rates = {1: 10.0, 2: 19.0, 4: 30.0, 8: 31.0, 16: 60.0}  # 8 adds under 5%: stop, keep 4
    monkeypatch.setattr(serving.hf.HFMeter, "seconds", lambda self, model, batch, new: batch * new / rates[batch])
    meter = serving.hf.HFMeter("cpu", 0, 100, 4, {}, 0)
    assert serving.hf.auto_batch(meter, None, 10, cache_bytes_per_row=1) == 4
    assert serving.hf.auto_batch(meter, None, 10, cache_bytes_per_row=10**15) == 1  # memory bound first


@pytest.mark.parametrize("limit", [1, 2, 3, 693, 710, 1024])
def test_cuda_auto_batch_finds_the_largest_batch_that_fits(limit):
    """Doubling then bisecting against a fake device whose out-of-memory starts past ``limit``."""
    from loopeval.evaluation import serving

    class Device:
        cuda, device = True, "cuda"

        def fits(self, model, batch, new_tokens):
            return batch <= limit

    assert serving.hf.auto_batch(Device(), None, 4, cache_bytes_per_row=1) == limit


@pytest.mark.parametrize(("options", "message"), [
    ({"batch_sizes": [0, 8]}, r"batch sizes \[0, 8\]: expected 'auto' or positive integers"),
    ({"new_tokens": 2000}, r"2008 positions: more than Qwen3ForCausalLM's maximum position 1024"),
    ({"new_tokens": 1}, r"new_tokens 1: must be an integer >= 2"),
    ({"compile": True}, r"compile needs the static cache"),
    ({"cache": "paged"}, r"cache 'paged': choose one of dynamic, static"),
    ({"loop": None}, r"has no loop: give --loop SPEC"),
    ({"loop": "1:9x2"}, r"reaches past the last layer"),
])
def test_bad_input_is_refused_before_any_work(options, message, monkeypatch):
    from loopeval.evaluation import serving

    monkeypatch.setattr(serving.measure, "_load", lambda *a, **k: pytest.fail("models loaded before the input was checked"))
    kwargs = {"loop": "1:4x2", "prompt_tokens": 8, "new_tokens": 4, **options}
    with pytest.raises(ValueError, match=message):
        serving.serve_cost(tiny_model("qwen3"), progress=False, **kwargs)


@pytest.mark.parametrize(("options", "message"), [
    ({"cache": "static"}, r"--engine vllm: --cache static set transformers' generate and mean nothing on vLLM"),
    ({"cache": "static", "compile": True}, r"--engine vllm: --cache static, --compile set transformers' generate"),
    ({"device": "cpu"}, r"--engine vllm: --device cpu set transformers' generate"),
    ({"batch_sizes": "auto"}, r"--engine vllm needs explicit --batch-sizes"),
    ({"engine_args": {"enable_prefix_caching": True}}, r"engine_args enable_prefix_caching: serve-cost fixes them"),
])
def test_the_engine_refuses_what_it_cannot_measure_before_any_work(options, message, tmp_path, monkeypatch):
    """Options of transformers' generate, auto batches and fixed settings are refused on the
    engine before vLLM is imported or any model loads (this environment has no vLLM)."""
    from loopeval.engines import vllm_serving
    from loopeval.evaluation import serving

    monkeypatch.setattr(serving.measure, "_load", lambda *a, **k: pytest.fail("models loaded before the input was checked"))
    kwargs = {"loop": "1:4x2", "prompt_tokens": 8, "new_tokens": 4, "batch_sizes": [1], **options}
    with pytest.raises(ValueError, match=message):
        vllm_serving.serve_cost(str(tmp_path), progress=False, **kwargs)
    with pytest.raises(ValueError, match=r"--engine vllm loads checkpoint folders, not a Qwen3ForCausalLM object"):
        vllm_serving.serve_cost(tiny_model("qwen3"), loop="1:4x2", batch_sizes=[1], progress=False)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_engine_by_name_is_refused_naming_what_it_takes(engine, tmp_path):
    from loopeval.evaluation import serving

    message = rf"engine '{engine}': serve_cost takes a serving backend object .* loopeval serve-cost --engine NAME"
    with pytest.raises(ValueError, match=message):
        serving.serve_cost(str(tmp_path), loop="1:4x2", batch_sizes=[1], engine=engine, progress=False)


def test_a_missing_vllm_is_refused_with_the_install_line(tmp_path, monkeypatch):
    from loopeval.engines import vllm_engine, vllm_serving
    from loopeval.evaluation import serving

    def missing():
        raise ImportError(vllm_engine.INSTALL)

    monkeypatch.setattr(vllm_serving, "engine_version", missing)
    monkeypatch.setattr(serving.measure, "_load", lambda *a, **k: pytest.fail("models loaded before vLLM was found"))
    with pytest.raises(ValueError) as refused:
        vllm_serving.serve_cost(str(tmp_path), loop="1:4x2", batch_sizes=[1], progress=False)
    assert str(refused.value) == f"--engine vllm: {vllm_engine.INSTALL}"


def test_compile_without_a_working_backend_is_explained(monkeypatch):
    from loopeval.evaluation import serving

    def broken(*a, **k):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(serving.measure, "_load", lambda *a, **k: pytest.fail("models loaded before the backend was checked"))
    with pytest.raises(ValueError, match=r"--compile: torch.compile \(inductor\) cannot build a kernel on cpu "
                                         r"\(InvalidCxxCompiler.*\); drop --compile"):
        serving.serve_cost(tiny_model("qwen3"), loop="1:4x2", cache="static", compile=True, progress=False)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from loopeval.tools.tiny import tiny_tokenizer

    root = tmp_path_factory.mktemp("serving")
    tokenizer = tiny_tokenizer()
    save_model(tiny_model("qwen3", vocab_size=len(tokenizer), num_layers=4), tokenizer, root / "base")
    save_model(apply_loop(tiny_model("qwen3", vocab_size=len(tokenizer), num_layers=4), "1:3x2"), tokenizer,
               root / "looped")
    save_model(tiny_model("qwen3", num_layers=4), tiny_tokenizer(vocab_size=300), root / "other")
    return root


def test_models_with_different_tokenizers_or_a_loop_for_two_are_refused(checkpoints, monkeypatch):
    from loopeval.evaluation import serving

    monkeypatch.setattr(serving.measure, "_load", lambda *a, **k: pytest.fail("models loaded before the input was checked"))
    with pytest.raises(ValueError, match=r"other and .*base have different tokenizers"):
        serving.serve_cost([checkpoints / "base", checkpoints / "other"], progress=False)
    with pytest.raises(ValueError, match="--loop compares one model with its own unlooped self"):
        serving.serve_cost([checkpoints / "base", checkpoints / "looped"], loop="1:3x2", progress=False)
    with pytest.raises(ValueError, match="already has the loop 1:3x2"):
        serving.serve_cost(checkpoints / "looped", loop="0:2x2", progress=False)


def test_two_checkpoints_are_compared_with_the_first(checkpoints):
    from loopeval.evaluation.serving import serve_cost

    result = serve_cost([checkpoints / "base", checkpoints / "looped"], prompt_tokens=4, new_tokens=3,
                        batch_sizes=[1], repeats=1, progress=False)
    assert [m.loop for m in result.models] == [None, "1:3x2"] and result.ratios()["multiplier"] == 1.5


def test_lm_eval_model_passes_cache_and_compile_to_generate_and_records_them(checkpoints, tmp_path, monkeypatch):
    from loopeval.model_adapters.looped import LoopedLM
    from loopeval.evaluation.model_args import LoopedArgs

    assert LoopedArgs.parse({"cache_implementation": "static", "compile": "true"}).compile is True
    with pytest.raises(ValueError, match=r"cache_implementation='paged': choose one of dynamic, static"):
        LoopedArgs.parse({"cache_implementation": "paged"})
    with pytest.raises(ValueError, match="compile needs the static cache"):
        LoopedLM(pretrained=str(checkpoints / "looped"), compile=True)
    lm = LoopedLM(pretrained=str(checkpoints / "looped"), device="cpu", cache_implementation="static",
                  trace=str(tmp_path))
    assert lm.generation_options == {"disable_compile": True, "cache_implementation": "static"}
    header = lm.session.trace_header()
    assert header.generation == {"cache_implementation": "static", "compile": False}
    assert "cache_implementation" not in header.decoding.__dict__  # speed only: not a shared setting
    from loopeval.evaluation.trace import TraceHeader

    assert TraceHeader.from_record({"kind": "header", "format": 2, **header.to_dict()}).generation == header.generation


def test_lm_eval_static_cache_generates_what_the_dynamic_cache_does(checkpoints, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from support import write_generate_task
    from loopeval.model_adapters.looped import LoopedLM

    rows = [{"question": q, "answer": "7"} for q in ("What is 3 + 4?", "Tom has 3 apples.", "2 + 2 =")]
    write_generate_task(tmp_path, "tiny_gen", rows, max_gen_toks=8)
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    responses = []
    for cache in ("dynamic", "static"):
        lm = LoopedLM(pretrained=str(checkpoints / "looped"), device="cpu", batch_size=3, cache_implementation=cache,
                      check_cache=False)
        result = simple_evaluate(model=lm, tasks=["tiny_gen"], task_manager=manager, log_samples=True,
                                 verbosity="ERROR")
        responses.append({s["doc_id"]: s["resps"] for s in result["samples"]["tiny_gen"]})
    assert responses[0] == responses[1]


def _cli(*args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "loopeval", "serve-cost", *args], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.slow
def test_cli_writes_the_json_and_the_table(checkpoints, tmp_path):
    done = _cli("--model", str(checkpoints / "base"), "--loop", "1:3x2", "--prompt-tokens", "6", "--new-tokens", "3",
                "--batch-sizes", "1,2", "--repeats", "1", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "serve_cost.json").read_text())
    assert [m["loop"] for m in data["models"]] == [None, "1:3x2"] and data["ratios"][0]["multiplier"] == 1.5
    assert "looped 1:3x2 / unlooped:  c = 1.500" in done.stdout
    bad = _cli("--model", str(checkpoints / "base"), "--loop", "1:3x2", "--batch-sizes", "0", "--out", str(tmp_path))
    assert bad.returncode == 2 and "batch sizes [0]" in bad.stderr


def _served(name: str, passes: float, latency_ms, tokens_per_s, prefill_s=(0.1, 0.1, 0.1)):
    from loopeval.evaluation.serving import ModelServing, Spread

    return ModelServing(name=name, loop=None if passes == 30 else "6:8x2", passes=passes, generation_flops=passes,
                        weight_bytes=1, kv_bytes_per_token=1, state_bytes_per_sequence=0,
                        prefill_s=Spread.of(prefill_s), latency_s=Spread.of([x / 1e3 for x in latency_ms]),
                        throughput={1: Spread.of(tokens_per_s)}, max_batch=1, peak_memory_bytes=1,
                        memory_growth_per_token=0.0)


def test_ratios_carry_their_spread_and_implausible_ones_are_flagged():
    from loopeval.evaluation.serving import ServeCost

    # Issue 24's real figures under load: c = 32/30 = 1.067, but the looped model measured faster
    # in every repeat (per-repeat latency ratios 0.5, 6/11, 7/12; throughput 2, 11/6, 12/7).
    loaded = ServeCost((_served("base", 30, [10, 11, 12], [3.0, 6.0, 7.0]),
                        _served("looped", 32, [5, 6, 7], [6.0, 11.0, 12.0])), {"repeats": 3})
    spread = loaded.ratio_spreads()
    assert spread["latency"].samples == pytest.approx((0.5, 6 / 11, 7 / 12))
    assert (spread["throughput"].low, spread["throughput"].high) == pytest.approx((12 / 7, 2.0))
    latency, prefill, throughput = loaded.checks()
    assert not latency.reliable and not throughput.reliable and prefill.reliable
    assert "faster than the unlooped model" in latency.note and "load from other processes" in latency.note
    assert "--repeats 10" in latency.note
    text = loaded.to_text()
    assert "latency x0.545 UNRELIABLE [per repeat 0.500, 0.583]" in text and "unreliable: throughput" in text
    # Plausible: the loop 4-6% slower, inside [1 - slack, c (1 + slack)] in every repeat.
    fine = ServeCost((_served("base", 30, [10, 11, 12], [100.0, 91.0, 83.0]),
                      _served("looped", 32, [10.5, 11.6, 12.5], [95.0, 86.0, 80.0])), {"repeats": 3})
    assert all(c.reliable and not c.note for c in fine.checks())
    assert "unreliable" not in fine.to_text().lower()


def test_the_headline_ratio_is_checked_and_every_spread_too():
    """Issue 31's cases: a median latency ratio of 0.807 for a loop that adds passes, whose
    range still reaches a plausible value, and prefill ratios from 0.52 to 2.31, are unreliable;
    the headline and the note name the same statistic (the median of the per-repeat ratios)."""
    from loopeval.evaluation.serving import ServeCost, plausible_range

    # per-repeat latency ratios 0.70, 0.807, 0.96 (the ratio of the medians would be 8.07 / 10 too)
    result = ServeCost((_served("base", 30, [10, 10, 10], [100.0, 100.0, 100.0], prefill_s=(0.1, 0.1, 0.1)),
                        _served("looped", 34, [7.0, 8.07, 9.6], [93.0, 92.0, 91.0], prefill_s=(0.052, 0.1, 0.231))),
                       {"repeats": 3})
    latency, prefill, throughput = result.checks()
    assert result.ratios()["latency"] == pytest.approx(0.807) == latency.ratio.median
    assert not latency.reliable and "unreliable: latency x0.807" in latency.note and "faster than the unlooped" in latency.note
    assert not prefill.reliable and "from per-repeat ratios 0.520 to 2.310" in prefill.note
    assert throughput.reliable and not throughput.note
    data = result.to_dict()
    assert [(c["name"], c["reliable"]) for c in data["checks"][0]] == [("latency", False), ("prefill", False),
                                                                      ("throughput", True)]
    assert data["checks"][0][0]["ratio"] == data["ratios"][0]["latency"] and "median" in data["ratio_statistic"]
    text = result.to_text()
    assert "latency x0.807 UNRELIABLE" in text and "prefill x1.000 UNRELIABLE" in text and "throughput x0.920 [" in text
    # what c allows, for a loop that adds passes and for a candidate that saves them
    assert plausible_range("latency", 1.5) == pytest.approx((0.95, 1.575))
    assert plausible_range("throughput", 1.5) == pytest.approx((1 / 1.575, 1 / 0.95))
    assert plausible_range("prefill", 0.5) == pytest.approx((0.475, 1.05))
