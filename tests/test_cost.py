"""loop_cost against the paper's pass counts and an independent FLOP counter."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import DynamicCache

from loopeval import loop_cost
from loopeval.tiny import tiny_config, tiny_model


@pytest.mark.parametrize(
    "layers, spec, passes, multiplier",
    [
        (24, "0:6x2", 30, 1.25),  # Qwen3.5-0.8B, Table 2
        (32, "1:9x2", 40, 1.25),  # Qwen3.5-4B
        (36, "10:19x2", 45, 1.25),  # Qwen3-8B training-free loop
        (32, "0:8x2+8:9x2", 41, 41 / 32),  # the 32 -> 41 searched span (1.28x)
    ],
)
def test_passes_and_multiplier_match_the_paper(layers, spec, passes, multiplier):
    cost = loop_cost(tiny_config("qwen3_5", num_layers=layers), spec)
    assert (cost.base_passes, cost.passes) == (layers, passes)
    assert cost.multiplier == pytest.approx(multiplier)
    assert cost.extra_passes == passes - layers


@pytest.mark.parametrize("arch, spec", [("qwen3", "1:4x2"), ("llama", "2:5x3"), ("qwen3_sliding", "0:4x2")])
@pytest.mark.parametrize("context", [5, 30])
def test_flops_per_token_match_a_flop_counter(arch, spec, context):
    """One cached decode step at context T, counted by torch's FlopCounterMode (matmuls
    only, so norms and activations are left out, as the 2 x params rule does)."""
    from loopeval import apply_loop

    model = tiny_model(arch, attn_implementation="eager")
    cost = loop_cost(model, spec)
    apply_loop(model, spec)
    ids = torch.randint(3, 400, (1, context))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :-1], cache=cache, use_cache=True)
        with FlopCounterMode(display=False) as counter:
            model(ids[:, -1:], cache=cache, use_cache=True)
    norms = [sum(p.numel() for n, p in layer.named_parameters() if "norm" in n) for layer in model.model.layers]
    expected = cost.flops_per_token(context) - 2 * sum(norms[j] for j in cost.schedule)
    assert counter.get_total_flops() == pytest.approx(expected, rel=0.01)


def test_generation_flops_is_the_sum_of_its_steps():
    cost = loop_cost(tiny_config("qwen3_sliding"), "1:3x2")
    prompt, generated = 7, 5
    head = 2 * cost.head_params
    steps = sum(cost.flops_per_token(t) - head for t in range(1, prompt + generated)) + head * generated
    assert cost.generation_flops(prompt, generated) == pytest.approx(steps)
    base = loop_cost(tiny_config("qwen3_sliding"), None)
    assert cost.generation_flops(prompt, generated, looped=False) == pytest.approx(base.generation_flops(prompt, generated))
    assert cost.generation_flops(prompt, generated) > base.generation_flops(prompt, generated)


def _cache_bytes(cache) -> int:
    """Bytes of every tensor a filled cache holds (KV tensors, and state dicts of linear-attention layers)."""
    total = 0
    for layer in cache.layers:
        for value in vars(layer).values():
            tensors = value.values() if isinstance(value, dict) else [value]
            total += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    return total


@pytest.mark.parametrize("spec", [None, "2:4x2"])
def test_cache_bytes_match_a_filled_cache(spec):
    """KV bytes per token and recurrent-state bytes per sequence, against what a real
    (looped) forward leaves in the cache: per-token growth between two lengths, and the rest."""
    from loopeval import apply_loop

    model = tiny_model("qwen3_5", num_layers=8)  # layers 3 and 7 are full attention
    if spec:
        apply_loop(model, spec)  # re-applies one linear (2) and one full-attention (3) layer
    measured = []
    for length in (10, 30):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(torch.randint(3, 100, (1, length)), cache=cache, use_cache=True)
        measured.append(_cache_bytes(cache))
    per_token = (measured[1] - measured[0]) / 20
    cost = loop_cost(tiny_model("qwen3_5", num_layers=8), spec, bytes_per_element=4)  # float32
    assert cost.kv_bytes_per_token == per_token
    assert cost.state_bytes_per_sequence == measured[0] - 10 * per_token
    if spec is None:
        assert (cost.base_kv_bytes_per_token, cost.base_state_bytes_per_sequence) == (
            cost.kv_bytes_per_token, cost.state_bytes_per_sequence)


def test_config_and_model_agree():
    cfg = tiny_config("qwen3_5")
    assert loop_cost(cfg, "1:3x2").flops_per_token(64) == loop_cost(tiny_model("qwen3_5"), "1:3x2").flops_per_token(64)


def test_bad_spec():
    with pytest.raises(ValueError, match="past the last layer"):
        loop_cost(tiny_config("qwen3", num_layers=4), "2:6x2")
