"""Is cached looped decoding exact? Compare it with full recomputation.

Greedy decoding with the KV cache is run once; then one uncached forward over each
prompt plus its generated tokens recomputes every step's logits. A shared or missing
cache slot shows up as a logit gap and, soon after, as a different greedy token.

The criterion is scale-aware. A step passes when its greedy token is the recomputed
one (outside a numerical tie) and its largest logit gap is within
``max(atol, rtol * max |recomputed logit|)``: rounding grows with the logits' magnitude
(a trained ``0:6x3`` loop with mixing drifts by 0.0019 in float32, about 1e-4 of its
logits), while a wrong cache slot changes the logits by a sizeable fraction of
themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# The logit gap always accepted, by dtype: float32 kernels differ only in summation
# order; bf16 and fp16 round each layer's output.
DEFAULT_ATOL = {torch.float64: 1e-6, torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.1}
# The gap accepted per unit of the step's largest |logit|: float32 rounding of tiny
# random loops measures about 1e-6 relative (docs/looping.md), a shared cache slot 1e-2
# and more.
DEFAULT_RTOL = {torch.float64: 1e-9, torch.float32: 2e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}

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

    def __str__(self) -> str:
        if self.error is not None:
            return f"cache check FAILED: cached decoding raised {self.error}"
        verdict = "OK" if self.ok else f"MISMATCH at generated token {self.first_divergence} of prompt {self.row}"
        return (
            f"cache check {verdict}: max |cached - recomputed| logit = {self.max_abs_diff:.3g}, "
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
    dtype: :data:`DEFAULT_ATOL`, :data:`DEFAULT_RTOL`; ``rtol=0`` is the absolute test."""
    prompts = checked_prompts(prompts)
    if max_new_tokens < 1:
        raise ValueError(f"check_cache: max_new_tokens must be >= 1, got {max_new_tokens}")
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
    tolerance = torch.clamp(rtol * magnitude, min=atol)
    top2 = full.topk(2, dim=-1).values
    clear_winner = (top2[..., 0] - top2[..., 1]) > tolerance
    wrong_token = (full.argmax(-1) != generated) & clear_winner
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
