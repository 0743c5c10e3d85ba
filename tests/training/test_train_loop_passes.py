"""``loop_passes`` / ``loop_disabled``: one forward at another depth, checked against
unrolled copies (the loop at K passes is the unrolled schedule of ``S:ExK``)."""

import pytest
import torch

from loopeval.core.loop import apply_loop
from loopeval.core.loop_controls import loop_disabled, loop_passes
from loopeval.tools.tiny import tiny_model
from loopeval.core.unroll import unrolled_copy


def _ids(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 400, (2, 12), generator=g)


@pytest.mark.parametrize("arch, spec, deeper", [("qwen3", "1:4x2", "1:4x3"), ("qwen3_5", "1:3x2", "1:3x4"),
                                                ("llama", "0:2x2+3:5x2", "0:2x3+3:5x3")])
def test_passes_equal_the_unrolled_schedule(arch, spec, deeper):
    model = tiny_model(arch)
    ids = _ids()
    with torch.no_grad():
        base = model(ids, use_cache=False).logits
        k = int(deeper.split("x")[-1])
        reference = unrolled_copy(model, deeper)(ids, use_cache=False).logits
        own = unrolled_copy(model, spec)(ids, use_cache=False).logits
        apply_loop(model, spec, operator="repeat")
        with loop_passes(model, k):
            deep = model(ids, use_cache=False).logits
        with loop_disabled(model):
            off = model(ids, use_cache=False).logits
        again = model(ids, use_cache=False).logits
    torch.testing.assert_close(deep, reference, rtol=0, atol=1e-5)
    assert torch.equal(off, base)  # exactly the base model, not merely close
    torch.testing.assert_close(again, own, rtol=0, atol=1e-5)  # the spec's own depth is back


def test_nested_blocks_restore_the_outer_depth_and_gradients_flow():
    model = apply_loop(tiny_model("qwen3"), "1:3x2", operator="repeat")
    ids = _ids(1)
    with loop_passes(model, 3):
        with loop_disabled(model):
            pass
        logits = model(ids, use_cache=False).logits
    reference = unrolled_copy(tiny_model("qwen3"), "1:3x3")(ids, use_cache=False).logits
    torch.testing.assert_close(logits, reference, rtol=0, atol=1e-5)
    logits.sum().backward()
    assert model.model.layers[1].self_attn.q_proj.weight.grad is not None


def test_damped_operator_off_is_the_base_model():
    model = tiny_model("qwen3")
    ids = _ids(2)
    with torch.no_grad():
        base = model(ids, use_cache=False).logits
        apply_loop(model, "1:4x3", operator="damped", beta=0.3, mix=0.5)
        with loop_disabled(model):
            assert torch.equal(model(ids, use_cache=False).logits, base)


def test_bad_depths_are_named():
    model = tiny_model("qwen3")
    with loop_disabled(model):  # an unlooped model is already its base model
        pass
    with pytest.raises(ValueError, match="has no loop"):
        with loop_passes(model, 2):
            pass
    apply_loop(model, "1:3x2", operator="repeat")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="integer >= 1"):
            with loop_passes(model, bad):
                pass
    with pytest.raises(ValueError, match="use_cache=False"), torch.no_grad():
        with loop_passes(model, 3):
            model(_ids(), use_cache=True)
    flat = apply_loop(tiny_model("qwen3"), "1:3x1+4:5x2", operator="repeat")
    with pytest.raises(ValueError, match="K = 1"):
        with loop_passes(flat, 2):
            pass
