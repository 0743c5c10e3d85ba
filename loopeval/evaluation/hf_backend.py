"""The HF backend of lm-eval's ``looped`` model: lm-eval's ``HFLM`` loads the model, batches and
scores; transformers' ``generate`` generates under the session's rules.

:class:`HFBackend` is what the session reads before loading (the args ``HFLM`` takes, the
refusals of ``compile``); :class:`HFLooped` is the loaded model, an ``HFLM`` that applies
the loop, runs the cache check on its first batch, and hands every generation batch to the
session (:meth:`loopeval.evaluation.session.Session.serve`). Everything ``HFLM`` accepts
keeps working (dtype, device, batch sizes, chat templates, ``parallelize``, ``accelerate launch``).
"""

from __future__ import annotations

import copy
import inspect
from collections import defaultdict, deque

import torch
from lm_eval.models.huggingface import HFLM
from transformers import LogitsProcessor, LogitsProcessorList

from loopeval.core.cache_check import check_cache as run_cache_check
from loopeval.core.checkpoint import weights_fingerprint
from loopeval.core.cost import loop_cost
from loopeval.core.gguf import GGUFCheckedAutoModel
from loopeval.core.loop import apply_loop, loop_config
from loopeval.evaluation.serving import check_compile_backend, generation_options
from loopeval.evaluation.session import PLAN_KEY, Loaded, Session, end_of_sequence_ids

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

TOKEN_PROGRESS_FROM = 64
"""A batch generating at least this many tokens shows a progress bar over its tokens (lm-eval's
own bar only counts finished requests, so one long batch would sit at 0 for minutes)."""


class HFBackend:
    """The ``hf`` backend, before loading (:class:`loopeval.evaluation.session.Backend`)."""

    name = "hf"
    engine = None

    def model_args(self) -> set[str]:
        hf = {p for p in inspect.signature(HFLM.__init__).parameters if p not in ("self", "kwargs")}
        return hf | set(FROM_PRETRAINED_ARGS)

    def check(self, session: Session) -> None:
        args = session.args
        generation_options(args.cache_implementation, args.compile)  # refuses compile without the static cache
        if args.compile:
            check_compile_backend(session.raw.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))

    def version(self) -> None:
        return None

    def load(self, session: Session) -> HFLooped:
        return HFLooped(session)


class _TokenProgress(LogitsProcessor):
    """Counts generated tokens on a bar; the scores pass through unchanged."""

    def __init__(self, bar):
        self.bar = bar

    def __call__(self, input_ids, scores):
        self.bar.update()
        return scores


class HFLooped(HFLM):
    """``HFLM`` with the session's loop, rules, store and trace (the module docstring)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        args = session.args
        if session.backend_args.get("gguf_file"):
            self.AUTO_MODEL_CLASS = GGUFCheckedAutoModel
        self._batch_contexts: list[str] = []
        self._pending = defaultdict(deque)
        super().__init__(session.pretrained, truncation=args.truncation, **session.backend_args)
        if session.loop is not None and loop_config(self.model) is None:
            apply_loop(self.model, session.loop)
        self.generation_options = generation_options(args.cache_implementation, args.compile, device=self.device)
        self.cost = loop_cost(self.model, session.loop.spec if session.loop else None)
        session.batch_size = str(self.batch_size)
        session.loaded(Loaded(
            tokenizer=self.tokenizer, eos_ids=end_of_sequence_ids(self.eot_token_id, self.model.generation_config),
            weights=weights_fingerprint(self.model), cost=self.cost,
            dtype=str(next(self.model.parameters()).dtype).replace("torch.", ""), seed=torch.initial_seed,
            max_length=int(self.max_length), max_gen_toks=int(self.max_gen_toks),
            chat_template=self.tokenizer.chat_template,
            generation={"cache_implementation": args.cache_implementation, "compile": args.compile},
            versions={"torch": torch.__version__},
            rank=self.rank, world_size=self.world_size))
        self.check_cache = args.check_cache and session.loop is not None

    def set_cache_hook(self, cache_hook) -> None:
        Session.refuse_use_cache(cache_hook)
        super().set_cache_hook(cache_hook)

    def _detect_batch_size(self, *args, **kwargs):
        size = super()._detect_batch_size(*args, **kwargs)
        self.session.batch_size = str(size)
        return size

    def apply_chat_template(self, *args, **kwargs):
        self.session.apply_chat_template()
        return super().apply_chat_template(*args, **kwargs)

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        if requests:
            self._open_trace([r.args[0] for r in requests[:4]], 16)
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        if requests:
            self._open_trace([r.args[0] for r in requests[:4]], 16)
        return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        plans = [self.session.plan(r) for r in requests]  # every budget is checked before any work
        clones = []
        for request, (context, gen_kwargs, plan) in zip(requests, plans):
            clone = copy.copy(request)
            clone.arguments = (context, gen_kwargs)
            clones.append(clone)
            # Keyed by plan and context: lm-eval hands _model_generate the batch's contexts.
            self._pending[(plan.key, context)].append((request, gen_kwargs))
        try:
            texts = super().generate_until(clones, disable_tqdm=disable_tqdm)
        finally:
            self._pending.clear()
        return [self.session.finish(text, context, plan) for text, (context, _, plan) in zip(texts, plans)]

    def tok_batch_encode(self, strings, *args, **kwargs):
        self._batch_contexts = list(strings)
        return super().tok_batch_encode(strings, *args, **kwargs)

    def _open_trace(self, contexts: list[str], max_new: int) -> None:
        self.session.open_trace(contexts, max_new, self._run_cache_check if self.check_cache else None)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        plan = self.session.plans[generation_kwargs.pop(PLAN_KEY)]
        contexts = self._batch_contexts
        max_new = max_length - context.shape[1]
        entries = [self._pending[(plan.key, c)].popleft() for c in contexts]
        self._open_trace(contexts, max_new)
        mask = generation_kwargs.get("attention_mask")
        prompt_tokens = mask.sum(1).tolist() if mask is not None else [context.shape[1]] * len(contexts)

        def generate():
            sequences, outcomes = self._generate(context, max_length, stop, plan, generation_kwargs)
            return list(zip(sequences[:, context.shape[1]:].tolist(), outcomes))

        results = self.session.serve([r for r, _ in entries], [kw for _, kw in entries], contexts, prompt_tokens,
                                     [plan] * len(contexts), [max_new] * len(contexts), generate, same_length=True)
        return torch.cat([context, torch.tensor([g for g, _ in results], device=context.device)], 1)

    def _generate(self, context, max_length, stop, plan, generation_kwargs):
        """One cached ``generate`` call with the session's rules; the sequences and each row's outcome."""
        max_new = max_length - context.shape[1]
        rules = self.session.rules(context, max_new, plan)
        processors = [rules] if rules.active else []
        bar = None
        if max_new >= TOKEN_PROGRESS_FROM and self.rank == 0:
            from tqdm.auto import tqdm

            bar = tqdm(total=max_new, desc=f"batch of {context.shape[0]}", unit="token", leave=False)
            processors.append(_TokenProgress(bar))
        if processors:
            generation_kwargs["logits_processor"] = LogitsProcessorList(processors)
        generation_kwargs.update(self.generation_options)
        try:
            sequences = super()._model_generate(context, max_length, stop, **generation_kwargs)
        finally:
            if bar is not None:
                bar.close()
        return sequences, rules.outcomes(sequences)

    def _run_cache_check(self, contexts: list[str], max_new: int):
        result = run_cache_check(self.model, self.tokenizer, contexts[:4], max_new_tokens=min(16, max_new))
        if result.error is not None:
            raise RuntimeError(f"looped: the cache check could not run: {result.error}")
        if not result.ok:
            raise RuntimeError(
                f"looped: {result}. Cached looped decoding of loop {self.session.loop.spec} differs from full "
                "recomputation, so generations would be wrong; the run is stopped. "
                "(check_cache=false skips this check; do not use it to hide a failure.)"
            )
        return result
