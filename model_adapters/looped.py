"""lm-eval model ``looped``: ``--model hf`` plus an exact loop, free decoding rules and a cost trace.

    lm_eval --model looped \\
        --model_args pretrained=PATH,loop=8:16x2,budget_forcing=true,trace=OUT \\
        --tasks gsm8k_boxed --include_path $(loopeval tasks-path) \\
        --apply_chat_template --log_samples --output_path OUT

Everything ``HFLM`` accepts keeps working (dtype, device, batch sizes, chat templates,
``parallelize``, ``accelerate launch``). The loopeval model args are:

``loop``, ``loop_operator``, ``loop_beta``, ``loop_mix``
    A loop to apply (``loopeval.apply_loop``); a checkpoint written by
    ``loopeval.save_model`` brings its own and needs only ``pretrained=``.
``check_cache`` (true)
    Check cached looped decoding against full recomputation on the first batch.
``budget_forcing`` (false), ``bf_reserve`` (512), ``bf_string`` (auto)
    Budget forcing. ``auto`` inserts ``loopeval.decoding.DEFAULT_THINK_STRING`` in an
    open thinking block and ``DEFAULT_ANSWER_STRING`` otherwise.
``repetition_stop`` (false)
    The same insertion when the output repeats a period of 4-256 tokens three times.
``budget_scale`` (1.0)
    Multiplies every task's ``max_gen_toks``.
``trace`` (none)
    A folder (normally the ``--output_path``) for the per-item cost trace.

Rules default to off, so ``looped`` without a loop reproduces ``--model hf``; give both
sides of a comparison the same rules. Stop strings never cut inside a thinking block,
and when the chat template opens a thinking block the response starts with
``<think>``, so a scorer can tell thinking that never closed.
"""

from __future__ import annotations

import copy
import inspect
import platform
from collections import defaultdict, deque

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from transformers import LogitsProcessorList

import loopeval
from loopeval.cache_check import check_cache as run_cache_check
from loopeval.cost import loop_cost
from loopeval.decoding import THINK_CLOSE, THINK_OPEN, DecodingRules, cut_at_stop, scaled_budget
from loopeval.loop import apply_loop, loop_config, resolve_loop
from loopeval.trace import DecodingSettings, TraceHeader, TraceItem, TraceWriter, prompt_hash

LOOPEVAL_ARGS = (
    "loop",
    "loop_operator",
    "loop_beta",
    "loop_mix",
    "check_cache",
    "budget_forcing",
    "bf_reserve",
    "bf_string",
    "repetition_stop",
    "budget_scale",
    "trace",
)
# from_pretrained keywords that HFLM forwards through **kwargs.
FROM_PRETRAINED_ARGS = (
    "attn_implementation",
    "low_cpu_mem_usage",
    "device_map",
    "load_in_8bit",
    "load_in_4bit",
    "bnb_4bit_compute_dtype",
    "bnb_4bit_quant_type",
    "bnb_4bit_use_double_quant",
    "torch_dtype",
    "cache_dir",
    "local_files_only",
    "token",
    "use_safetensors",
)


def _valid_args() -> list[str]:
    hf = [p for p in inspect.signature(HFLM.__init__).parameters if p not in ("self", "kwargs")]
    return sorted(set(hf) | set(LOOPEVAL_ARGS) | set(FROM_PRETRAINED_ARGS))


def _opens_thinking(context: str) -> bool:
    return context.rfind(THINK_OPEN) > context.rfind(THINK_CLOSE)


@register_model("looped")
class LoopedLM(HFLM):
    """``HFLM`` with a loop, decoding rules and a per-item trace (see the module docstring)."""

    def __init__(
        self,
        pretrained,
        loop: str | None = None,
        loop_operator: str | None = None,
        loop_beta: float | None = None,
        loop_mix: float | None = None,
        check_cache: bool = True,
        budget_forcing: bool = False,
        bf_reserve: int = 512,
        bf_string: str | None = None,
        repetition_stop: bool = False,
        budget_scale: float = 1.0,
        trace: str | None = None,
        **kwargs,
    ) -> None:
        unknown = sorted(set(kwargs) - set(_valid_args()))
        if unknown:
            raise ValueError(f"looped: unknown model arg(s) {', '.join(unknown)}; valid: {', '.join(_valid_args())}")
        if int(bf_reserve) < 1:
            raise ValueError(f"looped: bf_reserve must be >= 1, got {bf_reserve}")
        scaled_budget(1, float(budget_scale))  # rejects scale <= 0
        # The loop is checked against the config before HFLM loads any weights.
        self.loop = resolve_loop(
            pretrained, None if loop is None else str(loop), operator=loop_operator,
            beta=None if loop_beta is None else float(loop_beta), mix=None if loop_mix is None else float(loop_mix),
            arg_prefix="loop_", revision=kwargs.get("revision"), trust_remote_code=kwargs.get("trust_remote_code", False),
        )
        # Keep the thinking block in responses (the scorer needs it); HFLM would demand
        # think_end_token and strip it.
        if kwargs.get("enable_thinking") is not None and kwargs.get("think_end_token") is None:
            args = dict(kwargs.pop("chat_template_args", None) or {})
            args["enable_thinking"] = bool(kwargs.pop("enable_thinking"))
            kwargs["chat_template_args"] = args
        super().__init__(pretrained, **kwargs)
        if self.loop is not None and loop_config(self.model) is None:
            apply_loop(self.model, self.loop)
        self.cost = loop_cost(self.model, self.loop.spec if self.loop else None)
        self.check_cache = bool(check_cache) and self.loop is not None
        self.cache_check_result = None
        self.budget_forcing = bool(budget_forcing)
        self.bf_reserve = int(bf_reserve)
        self.bf_string = bf_string
        self.repetition_stop = bool(repetition_stop)
        self.budget_scale = float(budget_scale)
        self.trace_dir = trace
        self._trace_writer = None
        self._batch_contexts: list[str] = []
        self._pending = defaultdict(deque)

    # -- generation ------------------------------------------------------------------

    def decoding_settings(self) -> DecodingSettings:
        """The settings both sides of a comparison must share."""
        template = self.tokenizer.chat_template
        return DecodingSettings(
            budget_forcing=self.budget_forcing,
            bf_reserve=self.bf_reserve if self.budget_forcing else None,
            bf_string=self.bf_string if self.budget_forcing else None,
            repetition_stop=self.repetition_stop,
            budget_scale=self.budget_scale,
            dtype=str(next(self.model.parameters()).dtype).replace("torch.", ""),
            batch_size=str(self.batch_size),
            chat_template_sha=prompt_hash(template) if template else None,
            chat_template_args=dict(self.chat_template_args or {}),
        )

    def trace_header(self) -> TraceHeader:
        """This evaluation's trace header: the shared decoding settings plus this side's loop and cost."""
        check = self.cache_check_result
        return TraceHeader(
            model=str(self.pretrained) if isinstance(self.pretrained, str) else type(self.pretrained).__name__,
            loop=self.loop.to_dict() if self.loop else None,
            cost=self.cost.summary(),
            decoding=self.decoding_settings(),
            cache_check=None if check is None else {"ok": check.ok, "max_abs_diff": check.max_abs_diff},
            versions={"loopeval": loopeval.__version__, "python": platform.python_version(), "torch": torch.__version__},
        )

    def _plan(self, request) -> tuple[str, dict, list[str]]:
        context, gen_kwargs = request.args
        gen_kwargs = dict(gen_kwargs)
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        budget = scaled_budget(int(gen_kwargs.get("max_gen_toks", self.max_gen_toks)), self.budget_scale)
        if self.budget_forcing and self.bf_reserve >= budget:
            raise ValueError(
                f"looped: bf_reserve={self.bf_reserve} must be smaller than the token budget of task "
                f"{request.task_name!r} (max_gen_toks={budget} after budget_scale={self.budget_scale})"
            )
        # Stop strings are applied by loopeval (never inside thinking); lm-eval keeps only EOS.
        gen_kwargs.update(max_gen_toks=budget, until=[])
        return context, gen_kwargs, until

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        plans = [self._plan(r) for r in requests]  # every budget is checked before any work
        clones = []
        for request, (context, gen_kwargs, until) in zip(requests, plans):
            clone = copy.copy(request)
            clone.arguments = (context, gen_kwargs)
            clones.append(clone)
            # Keyed by context: lm-eval hands _model_generate the batch's contexts, and a task may
            # set max_length, so the budget is not a reliable key.
            self._pending[context].append((request, until))
        try:
            texts = super().generate_until(clones, disable_tqdm=disable_tqdm)
        finally:
            self._pending.clear()
        out = []
        for text, (context, _, until) in zip(texts, plans):
            text = THINK_OPEN + text if _opens_thinking(context) else text
            out.append(cut_at_stop(text, until))
        return out

    def tok_batch_encode(self, strings, *args, **kwargs):
        self._batch_contexts = list(strings)
        return super().tok_batch_encode(strings, *args, **kwargs)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        contexts = self._batch_contexts
        max_new = max_length - context.shape[1]
        entries = [self._pending[c].popleft() for c in contexts]
        if self.check_cache and self.cache_check_result is None:
            self._run_cache_check(contexts, max_new)
        eos = {self.eot_token_id, *self._generation_eos()}
        rules = DecodingRules(
            self.tokenizer,
            context,
            max_new,
            budget_forcing=self.budget_forcing,
            reserve=self.bf_reserve,
            force_string=self.bf_string,
            repetition_stop=self.repetition_stop,
            stops=entries[0][1],
            eos_token_ids=[e for e in eos if e is not None],
        )
        if rules.active:
            generation_kwargs["logits_processor"] = LogitsProcessorList([rules])
        sequences = super()._model_generate(context, max_length, stop, **generation_kwargs)
        if self.trace_dir is not None:
            if self._trace_writer is None:  # after the cache check, so the header records it
                self._trace_writer = TraceWriter(
                    self.trace_dir, self.trace_header(), rank=self.rank, world_size=self.world_size
                )
            mask = generation_kwargs.get("attention_mask")
            prompt_tokens = mask.sum(1).tolist() if mask is not None else [context.shape[1]] * len(contexts)
            self._trace_writer.write(
                [self._trace_item(req, c, p, o, max_new) for (req, _), c, p, o in zip(entries, contexts, prompt_tokens, rules.outcomes(sequences))]
            )
        return sequences

    def _generation_eos(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos or [])

    def _trace_item(self, request, context: str, prompt_tokens: int, outcome, max_new: int) -> TraceItem:
        return TraceItem(
            task=request.task_name,
            doc_id=int(request.doc_id),
            idx=int(request.idx),
            prompt_hash=prompt_hash(context),
            prompt_tokens=int(prompt_tokens),
            generated_tokens=outcome.generated_tokens,
            max_gen_toks=max_new,
            finished=outcome.finished,
            forced_at=outcome.forced_at,
            repetition_stop_at=outcome.repetition_stop_at,
            passes_per_token=self.cost.passes,
            flops=self.cost.generation_flops(int(prompt_tokens), outcome.generated_tokens),
        )

    def _run_cache_check(self, contexts: list[str], max_new: int) -> None:
        result = run_cache_check(self.model, self.tokenizer, contexts[:4], max_new_tokens=min(16, max_new))
        self.cache_check_result = result
        if not result.ok:
            raise RuntimeError(
                f"looped: {result}. Cached looped decoding of loop {self.loop.spec} differs from full "
                "recomputation, so generations would be wrong; the run is stopped. "
                "(check_cache=false skips this check; do not use it to hide a failure.)"
            )
