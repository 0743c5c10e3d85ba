"""Is cached looped decoding exact? Compare it with full recomputation.

Greedy decoding with the KV cache is run once; then one uncached forward over each
prompt plus its generated tokens recomputes every step's logits. A shared or missing
cache slot shows up as a logit gap and, soon after, as a different greedy token.

A step passes when its greedy token is the recomputed one (outside a numerical tie) and
its largest logit gap is within ``max(atol, rtol * max |recomputed logit|)``. That rule
is a fast path, not the verdict on a failure: how far the cached and the uncached kernels
round apart depends on the weights, not only on the logits' size. Trained weights with
sharp attention (large query-key products) amplify float32 rounding: a tiny Qwen3 with
its q/k norms scaled 30x drifts 2.3e-4 of its logits looped, and 6e-3 *unlooped*, with
HF's own exact cache. So a check that fails in the model's dtype is run again in float64
on the same model (every parameter and buffer cast, then restored bit for bit), where
rounding is 1e-9 of that: an exact cache gives a gap of 0 there, a wrong cache slot still
a sizeable fraction of the logits. The float64 check decides; the result keeps the gap in
the model's dtype beside it (``rounding_gap``).
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch

# The logit gap always accepted, by dtype: float32 kernels differ only in summation
# order; bf16 and fp16 round each layer's output.
DEFAULT_ATOL = {torch.float64: 1e-6, torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.1}
# The gap accepted per unit of the step's largest |logit| on the fast path: float32 rounding
# of tiny random loops measures about 1e-6 relative, a shared cache slot 1e-2 and more; trained
# weights can round further apart (module docstring), so a failure is decided in float64.
DEFAULT_RTOL = {torch.float64: 1e-9, torch.float32: 2e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}



def rounding_tolerance(logits: torch.Tensor, dtype: torch.dtype, *, atol: float | None = None,
                       rtol: float | None = None) -> torch.Tensor:
    """Per step (the last dimension is the vocabulary): how far two correct computations of
    these logits in ``dtype`` may round apart, ``max(atol, rtol * max |logit|)`` with the
    dtype's defaults (:data:`DEFAULT_ATOL`, :data:`DEFAULT_RTOL`)."""
    atol = DEFAULT_ATOL.get(dtype, 1e-3) if atol is None else atol
    rtol = DEFAULT_RTOL.get(dtype, 2e-4) if rtol is None else rtol
    return torch.clamp(rtol * logits.abs().amax(-1), min=atol)


def clear_winner(logits: torch.Tensor, tolerance: torch.Tensor) -> torch.Tensor:
    """Per step: whether the top logit leads the runner-up by more than ``tolerance``, so
    that no rounding within it can change the greedy token (outside a numerical tie)."""
    top2 = logits.topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]) > tolerance


DEFAULT_PROMPTS = (
    "Tom has 3 apples and buys 4 more. How many apples does he have?",
    "A train travels 60 miles in 1.5 hours. What is its speed?",
    "Sara reads 5 pages a day for 6 days. How many pages does she read?",
)


@dataclass(frozen=True)
class CacheCheckResult:
    ok: bool
    max_abs_diff: float  # largest |cached - recomputed| logit over compared steps
    first_divergence: int | None  # first generated-token index that differs, any row
    row: int | None  # the prompt where it happens
    atol: float
    tokens_compared: int
    error: str | None = None  # cached decoding raised instead of producing tokens
    rtol: float = 0.0
    max_rel_diff: float = 0.0  # largest gap over its step's largest |recomputed logit|
    decided_in: str | None = None  # "float64": the check failed in the model's dtype and was decided in float64
    rounding_gap: float | None = None  # then: the largest gap in the model's dtype

    def __str__(self) -> str:
        if self.error is not None:
            return f"cache check FAILED: cached decoding raised {self.error}"
        verdict = "OK" if self.ok else f"MISMATCH at generated token {self.first_divergence} of prompt {self.row}"
        where = "" if self.decided_in is None else (
            f" in {self.decided_in} (in the model's dtype the gap was {self.rounding_gap:.3g}, past its tolerance: "
            f"decided in {self.decided_in}, where rounding cannot hide a wrong cache)")
        return (
            f"cache check {verdict}{where}: max |cached - recomputed| logit = {self.max_abs_diff:.3g}, "
            f"{self.max_rel_diff:.3g} of the logits' magnitude (tolerance max({self.atol:g}, {self.rtol:g} x magnitude)) "
            f"over {self.tokens_compared} tokens"
        )


def checked_prompts(prompts) -> list[str]:
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts:
        raise ValueError("check_cache: prompts is empty")
    blank = [i for i, text in enumerate(prompts) if not isinstance(text, str) or not text.strip()]
    if blank:
        raise ValueError(f"check_cache: prompt {blank[0]} is empty; an empty prompt has no token to decode from")
    return prompts


@torch.no_grad()
def check_cache(model, tokenizer, prompts=DEFAULT_PROMPTS, max_new_tokens: int = 32, *, atol: float | None = None,
                rtol: float | None = None) -> CacheCheckResult:
    """Greedy-decode ``prompts`` (left-padded, one batch) with the cache and compare every
    step's logits with an uncached recomputation. A step fails when its logits differ
    by more than ``max(atol, rtol * max |recomputed logit|)`` or its greedy token differs
    outside a numerical tie (top two logits closer than that tolerance). Defaults by
    dtype: :data:`DEFAULT_ATOL`, :data:`DEFAULT_RTOL`; ``rtol=0`` is the absolute test.

    With the default tolerances a check that fails in the model's dtype is decided in
    float64 (module docstring; it needs the model's memory at 8 bytes a value for the
    moment; where float64 cannot run, e.g. out of memory, the failure stands). Given
    tolerances are applied as given, in the model's dtype."""
    prompts = checked_prompts(prompts)
    if max_new_tokens < 1:
        raise ValueError(f"check_cache: max_new_tokens must be >= 1, got {max_new_tokens}")
    result = _check(model, tokenizer, prompts, max_new_tokens, atol=atol, rtol=rtol)
    if result.ok or result.error is not None or atol is not None or rtol is not None \
            or next(model.parameters()).dtype == torch.float64:
        return result
    try:
        with _in_float64(model):
            truth = _check(model, tokenizer, prompts, max_new_tokens, atol=None, rtol=None)
    except (RuntimeError, TypeError, ValueError):  # no float64 kernel or memory here, or a quantized model
        return result
    if truth.error is not None:
        return result
    return dataclasses.replace(truth, decided_in="float64", rounding_gap=result.max_abs_diff)


@contextmanager
def _in_float64(model):
    """Every floating parameter and buffer of ``model`` in float64 inside the block, then
    each back in its own dtype (a float64 round trip restores float32, bf16 and fp16 exactly)."""
    params = {name: p.dtype for name, p in model.named_parameters()}
    buffers = {name: b.dtype for name, b in model.named_buffers(remove_duplicate=False)}
    try:
        model.to(torch.float64)
        yield model
    finally:  # also after a cast that failed half way
        for name, p in model.named_parameters():
            p.data = p.data.to(params[name])
        for name, b in model.named_buffers(remove_duplicate=False):
            module, _, leaf = name.rpartition(".")
            model.get_submodule(module)._buffers[leaf] = b.to(buffers[name])


def _check(model, tokenizer, prompts: list[str], max_new_tokens: int, *, atol: float | None,
           rtol: float | None) -> CacheCheckResult:
    dtype = next(model.parameters()).dtype
    atol = DEFAULT_ATOL.get(dtype, 1e-3) if atol is None else atol
    rtol = DEFAULT_RTOL.get(dtype, 2e-4) if rtol is None else rtol
    device = next(model.parameters()).device
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    finally:
        tokenizer.padding_side = side
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    try:
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=pad,
        )
    except RuntimeError as exc:  # e.g. a cache slot written twice no longer matches its mask
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        return CacheCheckResult(False, math.inf, 0, 0, float(atol), 0, error=message, rtol=float(rtol), max_rel_diff=math.inf)
    prompt_len = enc.input_ids.shape[1]
    generated = out.sequences[:, prompt_len:]
    cached = torch.stack(out.logits, dim=1).float()
    steps = generated.shape[1]
    mask = torch.cat([enc.attention_mask, torch.ones_like(generated)], dim=1)
    position_ids = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    full = model(out.sequences, attention_mask=mask, position_ids=position_ids, use_cache=False).logits
    full = full[:, prompt_len - 1 : prompt_len - 1 + steps].float()

    # Compare each row up to and including its first end-of-sequence token.
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    is_eos = torch.isin(generated, torch.tensor(eos, device=device)) if eos else torch.zeros_like(generated, dtype=torch.bool)
    valid = (is_eos.long().cumsum(1) - is_eos.long()) == 0

    gap = (full - cached).abs().amax(-1)
    magnitude = full.abs().amax(-1)
    tolerance = rounding_tolerance(full, dtype, atol=atol, rtol=rtol)
    wrong_token = (full.argmax(-1) != generated) & clear_winner(full, tolerance)
    bad = valid & ((gap > tolerance) | wrong_token)
    first, row = None, None
    if bad.any():
        steps_bad = torch.where(bad.any(0))[0]
        first = int(steps_bad[0])
        row = int(torch.where(bad[:, first])[0][0])
    return CacheCheckResult(
        ok=first is None,
        max_abs_diff=float(gap[valid].max()) if valid.any() else 0.0,
        first_divergence=first,
        row=row,
        atol=float(atol),
        tokens_compared=int(valid.sum()),
        rtol=float(rtol),
        max_rel_diff=float((gap / magnitude.clamp(min=1e-30))[valid].max()) if valid.any() else 0.0,
    )
