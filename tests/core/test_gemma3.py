"""Gemma 3: loops over its mixed sliding-window and global layers, the kind of each call
site's cache slot, and window-aware cache bytes, against a filled cache.

(Gemma 3 is also in ``loopeval.tools.tiny.ARCHITECTURES``, so tests/test_loop.py checks it
against the unrolled copy and full recomputation like every architecture.)"""

import pytest
import torch
from transformers import DynamicCache

from loopeval import LoopSpec, apply_loop, check_cache, loop_cost
from loopeval.tools.tiny import tiny_model
from loopeval.core.unroll import unrolled_copy

pytestmark = pytest.mark.usefixtures("one_thread")

SPEC = "1:4x2+4:6x3"  # layers 0 1 [2] 3 4 [5]: [global]; windows span sliding and global layers
WINDOW = 4


def _slot_layer_class(cache_layer) -> str:
    return type(cache_layer).__name__


def test_each_call_site_owns_a_slot_of_its_layers_kind():
    model = apply_loop(tiny_model("gemma3"), SPEC)
    kinds = model.config.layer_types
    ids = torch.randint(3, 400, (2, 11))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    cache = out.past_key_values
    sites = [s for s in LoopSpec.parse(SPEC).call_sites(6) if s.slot is not None]
    assert len(cache.layers) == len(sites) == 13
    stored = ids.shape[1] + 6 - 1  # the last generated token is not fed back
    for site in sites:
        layer = cache.layers[site.slot]
        sliding = kinds[site.layer] == "sliding_attention"
        assert _slot_layer_class(layer) == ("DynamicSlidingWindowLayer" if sliding else "DynamicLayer"), site
        # a sliding slot holds window - 1 tokens between steps, a global slot every token
        assert layer.keys.shape[-2] == (WINDOW - 1 if sliding else stored), site


@pytest.mark.parametrize("operator, beta", [("repeat", 0.0), ("damped", 0.5)])
def test_long_sequences_past_the_window_equal_unrolled_and_recomputation(operator, beta, tokenizer):
    """Prompts of 4-5 windows, 16 generated tokens: every sliding slot has wrapped many times."""
    base = tiny_model("gemma3", vocab_size=len(tokenizer))
    model = apply_loop(tiny_model("gemma3", vocab_size=len(tokenizer)), SPEC, operator=operator, beta=beta)
    prompts = ["Tom has 3 apples and buys 4 more. How many apples does he have?", "What is 12 + 30?"]
    result = check_cache(model, tokenizer, prompts, max_new_tokens=16)
    assert result.ok and result.max_abs_diff < 1e-4, result
    if operator == "repeat":  # the unrolled copy is the repeat operator's reference
        reference = unrolled_copy(base, SPEC)
        ids = torch.randint(3, len(tokenizer), (1, 5 * WINDOW))
        with torch.no_grad():
            a = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0, output_logits=True,
                               return_dict_in_generate=True)
            b = reference.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0, output_logits=True,
                                   return_dict_in_generate=True)
        assert torch.equal(a.sequences, b.sequences)
        torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), rtol=0, atol=1e-5)


def _stored_kv_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


@pytest.mark.parametrize("spec", [None, SPEC])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_bytes_stop_growing_at_the_window(spec, dtype):
    model = tiny_model("gemma3").to(dtype)
    if spec:
        apply_loop(model, spec)
    cost = loop_cost(model, spec)
    assert cost.bytes_per_element == torch.tensor([], dtype=dtype).element_size()
    assert cost.sliding_window == WINDOW
    elems = 2 * 2 * 16  # K and V, 2 KV heads, head_dim 16
    sites = [s for s in (LoopSpec.parse(spec) if spec else LoopSpec(())).call_sites(6) if s.slot is not None]
    sliding = sum(model.config.layer_types[s.layer] == "sliding_attention" for s in sites)
    for length in (2, WINDOW, 3 * WINDOW, 10 * WINDOW):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(torch.randint(3, 100, (1, length)), cache=cache, use_cache=True)
        measured = _stored_kv_bytes(cache)
        # kv_bytes counts min(T, window) per sliding slot; the dynamic cache keeps window - 1
        # between steps (the current token's K/V joins it while the step attends).
        kept = sliding * elems * cost.bytes_per_element * (length >= WINDOW)
        assert cost.kv_bytes(length) == measured + kept
    assert cost.kv_bytes_per_token == len(sites) * elems * cost.bytes_per_element
    assert cost.kv_bytes_per_token_past_window == (len(sites) - sliding) * elems * cost.bytes_per_element
    grown = cost.kv_bytes(10 * WINDOW + 7) - cost.kv_bytes(10 * WINDOW)
    assert grown == 7 * cost.kv_bytes_per_token_past_window
    summary = cost.summary()
    assert (summary["sliding_window"], summary["bytes_per_element"]) == (WINDOW, cost.bytes_per_element)


def test_bytes_per_element_follow_the_dtype(tokenizer):
    from loopeval.core.cost import loop_cost as cost_of

    model = tiny_model("gemma3", vocab_size=len(tokenizer))
    assert cost_of(model, None).bytes_per_element == 4  # float32, not a hard-coded 2
    assert cost_of(model.config, None).bytes_per_element == 4  # a config naming no dtype: from_config's float32
    model.config.dtype = "bfloat16"
    assert cost_of(model.config, "1:3x2").bytes_per_element == 2


def test_sub_layer_windows_are_refused_on_gemma3():
    with pytest.raises(ValueError, match="Gemma3DecoderLayer"):
        apply_loop(tiny_model("gemma3"), "1:3x2/mlp")
