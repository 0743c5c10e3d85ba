"""The looped model must equal its unrolled copy, cached and uncached, with no new parameters."""

import math

import pytest
import torch
from torch import nn

from loopeval import LoopSpec, apply_loop, check_cache, loop_config, remove_loop
from loopeval.loop import CallSite, Window
from loopeval.tiny import ARCHITECTURES, tiny_model
from loopeval.unroll import unrolled_copy

SPECS = {
    "qwen3": "1:4x2",
    "llama": "2:5x3",
    "qwen3_sliding": "1:3x2+4:6x2",
    "qwen3_5": "1:5x2",
    "qwen2": "0:2x2+3:4x3",
    "mistral": "2:4x2",
    "qwen3_next": "2:4x3",
}


# -- LoopSpec ------------------------------------------------------------------------


def test_parse_and_schedule():
    spec = LoopSpec.parse("8:16x2")
    assert spec.windows == (Window(8, 16, 2),)
    assert spec.extra_passes == 8
    assert LoopSpec.parse("2:4x2").schedule(6) == [0, 1, 2, 3, 2, 3, 4, 5]
    two = LoopSpec.parse("10:12x3 + 2:4x2")
    assert str(two) == "2:4x2+10:12x3"
    assert two.extra_passes == 2 + 4
    assert two.schedule(13) == [0, 1, 2, 3, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 10, 11, 10, 11, 12]
    assert LoopSpec.parse(two) is two


def test_call_sites_have_distinct_slots():
    sites = LoopSpec.parse("2:4x3+5:6x2").call_sites(7)
    assert [s.slot for s in sites if s.pass_index == 1] == list(range(7))
    assert sorted(s.slot for s in sites) == list(range(len(sites)))
    assert [(s.layer, s.pass_index) for s in sites if s.slot >= 7] == [(2, 2), (3, 2), (2, 3), (3, 3), (5, 2)]
    assert all(s.kind == "layer" for s in sites)


def test_sub_layer_grammar_round_trips():
    paper = LoopSpec.parse("0:1x3/mlp + 0:8x2")  # Qwen3.5's searched span (paper A.1)
    assert paper.windows == (Window(0, 8, 2), Window(0, 1, 3, "mlp"))
    assert str(paper) == "0:8x2+0:1x3/mlp"
    assert paper.extra_passes == 9  # 8 layer passes + 2 MLP-block passes at half a pass each
    assert LoopSpec.parse("10:19x2/mlp").extra_passes == 4.5
    assert LoopSpec.parse("0:2x3/attn").extra_passes == 2
    for text in ["8:16x2", "10:19x2/mlp", "1:3x3/attn+4:6x2", "0:8x2+0:1x3/mlp", "2:6x2+2:6x2/attn+7:8x4/mlp"]:
        spec = LoopSpec.parse(text)
        assert str(spec) == text and LoopSpec.parse(str(spec)) == spec
    assert str(LoopSpec.parse(" 2 : 6 x 2 /MLP")) == "2:6x2/mlp"


def test_sub_layer_call_sites():
    """MLP-only passes have no cache slot; attention-only passes get their own; a nested
    window runs right after its last layer's first pass, before its enclosing window's passes."""
    sites = LoopSpec.parse("0:3x2+0:1x3/mlp+4:6x2/attn").call_sites(6)
    assert sites == [
        CallSite(0, 1, 0), CallSite(0, 2, None, "mlp"), CallSite(0, 3, None, "mlp"),
        CallSite(1, 1, 1), CallSite(2, 1, 2), CallSite(0, 2, 6), CallSite(1, 2, 7), CallSite(2, 2, 8),
        CallSite(3, 1, 3), CallSite(4, 1, 4), CallSite(5, 1, 5), CallSite(4, 2, 9, "attn"), CallSite(5, 2, 10, "attn"),
    ]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("4:4x2", "end 4 <= start 4"),
        ("6:3x2", "end 3 <= start 6"),
        ("2:4x0", "K must be >= 1"),
        ("2:5x2+4:6x2", "overlap"),
        ("2-4x2", "cannot parse"),
        ("2:4", "cannot parse"),
        ("", "empty"),
        ("2:4x2+", "cannot parse"),
        ("2:4x2/ffn", "expected /attn or /mlp"),
        ("2:6x2+4:8x2/mlp", "overlap without nesting"),
        ("0:2x2+0:4x2/mlp", "overlap without nesting"),
        ("0:4x2/mlp+2:6x2/attn", "overlap"),
    ],
)
def test_malformed_specs(spec, message):
    with pytest.raises(ValueError, match=message) as info:
        LoopSpec.parse(spec)
    assert repr(spec) in str(info.value)


def test_spec_past_last_layer_fails_before_touching_the_model():
    model = tiny_model("qwen3", num_layers=4)
    with pytest.raises(ValueError, match="past the last layer"):
        apply_loop(model, "2:5x2")
    assert loop_config(model) is None
    assert not model.model.layers[3]._forward_hooks


def test_bad_options():
    model = tiny_model("qwen3", num_layers=4)
    with pytest.raises(ValueError, match="unknown"):
        apply_loop(model, "1:3x2", operator="cubic")
    with pytest.raises(ValueError, match="only the 'damped'"):
        apply_loop(model, "1:3x2", operator="repeat", beta=0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        apply_loop(model, "1:3x2", operator="damped", beta=1.5)
    apply_loop(model, "1:3x2")
    with pytest.raises(ValueError, match="already looped"):
        apply_loop(model, "1:3x2")


def test_sub_layer_loop_on_unknown_layers_is_refused():
    """OLMo-2 normalises after each block (post-norm), so its blocks cannot run alone the
    way a pre-norm layer's can; whole-layer loops still work."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    model = Olmo2ForCausalLM(Olmo2Config(num_hidden_layers=3, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                         num_key_value_heads=2, vocab_size=64))
    with pytest.raises(ValueError, match="Olmo2DecoderLayer"):
        apply_loop(model, "0:2x2/mlp")
    assert loop_config(model) is None
    apply_loop(model, "0:2x2")


def test_unsupported_architecture_is_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        apply_loop(model, "0:1x2")


# -- equivalence with the unrolled copy ----------------------------------------------


def _batch(seed=0, rows=3, length=20):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 400, (rows, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :6] = 0  # left padding
    mask[1, :2] = 0
    return ids, mask


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_looped_equals_unrolled(arch):
    model = tiny_model(arch)
    spec = SPECS[arch]
    reference = unrolled_copy(model, spec)
    params = [p.data_ptr() for p in model.parameters()]
    keys = list(model.state_dict())
    apply_loop(model, spec, operator="repeat")
    assert [p.data_ptr() for p in model.parameters()] == params
    assert list(model.state_dict()) == keys
    assert sum(p.numel() for p in reference.parameters()) > sum(p.numel() for p in model.parameters())

    ids, mask = _batch()
    with torch.no_grad():
        looped = model(ids, attention_mask=mask).logits
        unrolled = reference(ids, attention_mask=mask).logits
        torch.testing.assert_close(looped[mask.bool()], unrolled[mask.bool()], rtol=0, atol=1e-5)
        kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
        kwargs.update(output_logits=True, return_dict_in_generate=True)
        a = model.generate(ids, **kwargs)
        b = reference.generate(ids, **kwargs)
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), rtol=0, atol=1e-5)
    # one cache slot per call site
    assert len(a.past_key_values.layers) == len(LoopSpec.parse(spec).schedule(model.config.num_hidden_layers))


SUB_LAYER_SPECS = ["1:4x2/mlp", "1:5x3/attn", "0:4x2+0:1x3/mlp", "0:5x2+1:3x2/attn", "1:3x2/attn+3:5x3/mlp"]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("spec", SUB_LAYER_SPECS)
def test_sub_layer_loop_equals_unrolled(arch, spec):
    """Against a hook-free copy whose sub-layer call sites are copied layers with the
    other block zeroed: same logits and greedy tokens, cached and uncached. On Qwen3.5,
    layers 0-2 are Gated DeltaNet and layer 3 full attention, so /attn passes exercise
    both a recurrent/conv-state slot and a KV slot."""
    model = tiny_model(arch)
    reference = unrolled_copy(model, spec)
    ids, mask = _batch()
    with torch.no_grad():
        base = model(ids, attention_mask=mask).logits
        apply_loop(model, spec, operator="repeat")
        looped = model(ids, attention_mask=mask).logits
        unrolled = reference(ids, attention_mask=mask).logits
        kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
        kwargs.update(output_logits=True, return_dict_in_generate=True)
        a = model.generate(ids, **kwargs)
        b = reference.generate(ids, **kwargs)
    assert (looped - base)[mask.bool()].abs().max() > 1e-3  # the loop does something
    torch.testing.assert_close(looped[mask.bool()], unrolled[mask.bool()], rtol=0, atol=1e-5)
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), rtol=0, atol=1e-5)
    slotted = [s for s in LoopSpec.parse(spec).call_sites(6) if s.slot is not None]
    assert len(a.past_key_values.layers) == len(slotted)  # none for MLP-only passes


@pytest.mark.parametrize("arch, spec", [("qwen3", "1:3x3/attn+3:5x2/mlp"), ("qwen3_5", "0:4x2+0:1x3/mlp"),
                                        ("qwen3_5", "2:4x3/attn"), ("qwen3_next", "1:4x2/attn+4:5x2/mlp")])
def test_sub_layer_loop_cached_equals_uncached(arch, spec, tokenizer):
    model = apply_loop(tiny_model(arch, vocab_size=len(tokenizer)), spec, operator="damped", beta=0.25)
    result = check_cache(model, tokenizer, max_new_tokens=16)
    assert result.ok, result
    assert result.max_abs_diff < 1e-4


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cached_equals_uncached(arch, tokenizer):
    model = apply_loop(tiny_model(arch, vocab_size=len(tokenizer)), SPECS[arch])
    result = check_cache(model, tokenizer, max_new_tokens=24)
    assert result.ok, result
    assert result.max_abs_diff < 1e-4
    assert result.tokens_compared > 24


def test_uncached_forward_has_no_cache_side_effects():
    model = apply_loop(tiny_model("qwen3"), "1:4x3")
    ids, mask = _batch()
    with torch.no_grad():
        first = model(ids, attention_mask=mask, use_cache=False).logits
        second = model(ids, attention_mask=mask, use_cache=False).logits
    assert torch.equal(first, second)


def test_remove_loop_restores_the_base_model():
    model = tiny_model("qwen3")
    ids, mask = _batch()
    with torch.no_grad():
        base = model(ids, attention_mask=mask).logits
        apply_loop(model, "1:4x2")
        looped = model(ids, attention_mask=mask).logits
        remove_loop(model)
        again = model(ids, attention_mask=mask).logits
    assert not torch.allclose(base, looped)
    assert torch.equal(base, again)


def test_cache_filled_without_the_loop_is_refused():
    from transformers import DynamicCache

    model = tiny_model("qwen3")
    ids, _ = _batch()
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        apply_loop(model, "1:4x2")
        with pytest.raises(ValueError, match="without the loop"):
            model(ids[:, -1:], cache=cache, use_cache=True)


# -- operators, against an independent recomputation ---------------------------------


def _manual(model, ids, window, step):
    """Run the decoder by hand: ``step(g, x0)`` gives the window's output, where
    ``g(h)`` applies layers window[0]..window[1]-1 once, uncached."""
    from transformers.masking_utils import create_causal_mask

    inner = model.model
    x = inner.embed_tokens(ids)
    pos = torch.arange(ids.shape[1]).unsqueeze(0)
    pe = inner.rotary_emb(x, pos)
    mask = create_causal_mask(config=model.config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=pos)

    kwargs = dict(attention_mask=mask, position_embeddings=pe, position_ids=pos)

    def layer(j, h):
        return inner.layers[j](h, **kwargs)

    def g(h):
        for j in range(*window):
            h = layer(j, h)
        return h

    g.kwargs = {j: kwargs for j in range(len(inner.layers))}

    h = x
    for j in range(window[0]):
        h = layer(j, h)
    h = step(g, h)
    for j in range(window[1], len(inner.layers)):
        h = layer(j, h)
    return model.lm_head(inner.norm(h))


@pytest.mark.parametrize("K, beta", [(2, 0.0), (3, 0.25), (4, 1.0)])
def test_damped_operator(K, beta):
    model = tiny_model("qwen3")
    ids, _ = _batch()

    def damped(g, x0):
        f = x0
        for _ in range(K):
            f = f + (g(f) - f) / K
        return beta * g(x0) + (1 - beta) * f

    with torch.no_grad():
        expected = _manual(model, ids, (2, 4), damped)
        apply_loop(model, f"2:4x{K}", operator="damped", beta=beta)
        got = model(ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_mix_operator():
    model = tiny_model("qwen3")
    ids, _ = _batch()
    w = 1 / (1 + math.exp(-0.7))

    def mixed(g, x0):
        h = g(x0)
        for _ in range(2):
            h = g(w * x0 + (1 - w) * h)
        return h

    with torch.no_grad():
        expected = _manual(model, ids, (1, 5), mixed)
        apply_loop(model, "1:5x3", operator="repeat", mix=0.7)
        got = model(ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_paper_mlp_loop_by_hand():
    """The paper's span shape, "loops it twice, plus one MLP loop (K=3) at its first
    layer", damped (beta = 0.25), written out by hand: layer 0, its MLP block twice more
    under the damped update, layers 1-3, then the damped window pass."""
    model = tiny_model("qwen3")
    ids, _ = _batch()
    beta = 0.25
    layers = model.model.layers

    def mlp(j, h):
        return h + layers[j].mlp(layers[j].post_attention_layernorm(h))

    def window(g, x0):
        y1 = layers[0](x0, **g.kwargs[0])  # pass 1 with the MLP loop at layer 0
        f = x0 + (y1 - x0) / 3
        for _ in range(2):
            f = f + (mlp(0, f) - f) / 3
        h = beta * y1 + (1 - beta) * f
        for j in (1, 2, 3):
            h = layers[j](h, **g.kwargs[j])
        y1 = h
        f = x0 + (y1 - x0) / 2
        f = f + (g(f) - f) / 2
        return beta * y1 + (1 - beta) * f

    with torch.no_grad():
        expected = _manual(model, ids, (0, 4), window)
        apply_loop(model, "0:4x2+0:1x3/mlp", operator="damped", beta=beta)
        got = model(ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("operator, options", [("damped", {"beta": 0.3}), ("repeat", {"mix": 4.6})])
def test_operators_decode_exactly_with_the_cache(operator, options, tokenizer):
    for arch in ("qwen3", "qwen3_5"):
        model = apply_loop(tiny_model(arch, vocab_size=len(tokenizer)), "1:3x3", operator=operator, **options)
        assert check_cache(model, tokenizer, max_new_tokens=16).ok


# -- the check catches a naive loop ---------------------------------------------------


def _naive_loop(model, spec):
    """The common mistake: reuse the layer modules in a longer layer list, so every
    pass of a layer writes the same cache slot (its own ``layer_idx``)."""
    schedule = LoopSpec.parse(spec).schedule(len(model.model.layers))
    model.model.layers = nn.ModuleList(model.model.layers[j] for j in schedule)
    model.config.layer_types = [model.config.layer_types[j] for j in schedule]
    model.config.num_hidden_layers = len(schedule)
    return model


def test_check_cache_catches_a_shared_cache_slot(tokenizer):
    model = _naive_loop(tiny_model("qwen3", vocab_size=len(tokenizer)), "1:4x2")
    result = check_cache(model, tokenizer, max_new_tokens=16)
    assert not result.ok
    assert result.first_divergence == 0
    assert result.max_abs_diff > 1e-2
    assert "FAILED" in str(result) or "MISMATCH" in str(result)


def test_check_cache_catches_a_decode_path_that_skips_the_loop(tokenizer):
    """Another common mistake: the loop runs at prefill only, so decode steps skip it.
    Nothing crashes; the tokens silently drift from full recomputation."""
    model = apply_loop(tiny_model("qwen3", vocab_size=len(tokenizer)), "1:4x3")
    runtime = model._loopeval
    looper = runtime.layers[3]._forward_hooks
    (key, hook), = [(k, h) for k, h in looper.items()]

    def prefill_only(module, args, kwargs, output):
        return hook(module, args, kwargs, output) if output.shape[1] > 1 else None

    looper[key] = prefill_only
    result = check_cache(model, tokenizer, max_new_tokens=16)
    assert not result.ok and result.error is None
    assert result.first_divergence == 1  # the first decode step
    assert "MISMATCH" in str(result)
