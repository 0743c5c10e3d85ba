"""lm-eval model ``looped``: ``--model hf`` plus an exact loop, free decoding rules and a cost trace.

    lm_eval --model looped \\
        --model_args pretrained=PATH,loop=8:16x2,budget_forcing=true,trace=OUT \\
        --tasks gsm8k_boxed --include_path $(loopeval tasks-path) \\
        --apply_chat_template --log_samples --output_path OUT

Everything ``HFLM`` accepts keeps working (dtype, device, batch sizes, chat templates,
``parallelize``, ``accelerate launch``). The loopeval model args are the fields of
:class:`LoopedArgs`; see docs/lm_eval_model.md. Rules default to off, so ``looped``
without a loop reproduces ``--model hf``; give both sides of a comparison the same
rules. Stop strings never cut inside a thinking block, and when the chat template opens
a thinking block the response starts with ``<think>``, so a scorer can tell thinking
that never closed.

lm-eval's ``--use_cache`` is refused: its key is the request alone, so it would serve
outputs made with another loop or rule. ``resume_dir=`` resumes a killed run safely.
"""

from __future__ import annotations

import copy
import inspect
import os
import platform
from collections import defaultdict, deque
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from transformers import LogitsProcessorList

import loopeval
from loopeval.args import as_bool, as_choice, as_float, as_int, as_text
from loopeval.cache_check import check_cache as run_cache_check
from loopeval.checkpoint import weights_fingerprint
from loopeval.loop import check_source
from loopeval.cost import loop_cost
from loopeval.decoding import (
    DEFAULT_RESERVE,
    RESERVE_RULES,
    THINK_CLOSE,
    THINK_OPEN,
    WHEN_ANSWERED,
    DecodingRules,
    RowOutcome,
    cut_at_stop,
    effective_reserve,
    forcing_tokens,
    scaled_budget,
)
from loopeval.loop import MIX_SOURCES, OPERATORS, apply_loop, loop_config, resolve_loop
from loopeval.responses import ResponseStore, request_key
from loopeval.serving import CACHES, check_compile_backend, generation_options
from loopeval.trace import DecodingSettings, TraceHeader, TraceItem, TraceWriter, prompt_hash


@dataclass(frozen=True)
class LoopedArgs:
    """The model args ``looped`` adds to ``--model hf``'s, parsed from lm-eval's strings.

    ``loop``, ``loop_operator``, ``loop_beta``, ``loop_mix``, ``loop_mix_source``: a
    loop to apply (a checkpoint written by ``loopeval.save_model`` brings its own).
    ``exit_after``: run the loop's first k steps and read the output there (004's
    fixed exit; :meth:`loopeval.loop.LoopConfig.exit_after`), exactly cached and
    charged as k steps. ``check_cache``:
    check cached looped decoding against full recomputation on the first batch.
    ``budget_forcing``, ``bf_reserve`` (tokens at the default budget, the paper's 512),
    ``bf_reserve_rule`` (how the reserve follows ``budget_scale``: ``scaled`` or
    ``fixed``, :func:`loopeval.decoding.effective_reserve`), ``bf_string`` (auto:
    ``DEFAULT_THINK_STRING`` in an open thinking block, ``DEFAULT_ANSWER_STRING``
    otherwise), ``bf_when_answered`` (``skip`` rows that already boxed an answer, or
    ``force`` them). ``repetition_stop``: the same insertion when the output repeats a
    period of 4-256 tokens three times. ``budget_scale``: multiplies every task's
    ``max_gen_toks``. ``trace``: a folder for the per-item cost trace. ``resume_dir``:
    a folder of finished generations; a rerun serves them (:mod:`loopeval.responses`).
    ``cache_implementation`` (``dynamic`` or ``static``) and ``compile`` (the decode step
    under ``torch.compile``, which needs ``static``) are passed to ``generate``
    (:func:`loopeval.serving.generation_options`); they change speed, not outputs, so the
    trace records them beside, not among, the shared decoding settings.
    """

    loop: str | None = None
    loop_operator: str | None = None
    loop_beta: float | None = None
    loop_mix: float | None = None
    loop_mix_source: str | None = None
    exit_after: int | None = None
    check_cache: bool = True
    budget_forcing: bool = False
    bf_reserve: int = DEFAULT_RESERVE
    bf_reserve_rule: str = "scaled"
    bf_string: str | None = None
    bf_when_answered: str = "skip"
    repetition_stop: bool = False
    budget_scale: float = 1.0
    trace: str | None = None
    resume_dir: str | None = None
    cache_implementation: str = "dynamic"
    compile: bool = False

    @classmethod
    def parse(cls, raw: dict) -> LoopedArgs:
        """Every value checked and typed; errors name the arg. ``raw`` keeps HFLM's args."""
        parsers = {
            "loop": as_text, "loop_operator": lambda n, v: as_choice(n, v, OPERATORS),
            "loop_beta": as_float, "loop_mix": as_float,
            "loop_mix_source": lambda n, v: as_choice(n, v, MIX_SOURCES), "exit_after": lambda n, v: as_int(n, v, minimum=1),
            "check_cache": as_bool, "budget_forcing": as_bool,
            "bf_reserve": lambda n, v: as_int(n, v, minimum=1),
            "bf_reserve_rule": lambda n, v: as_choice(n, v, RESERVE_RULES), "bf_string": as_text,
            "bf_when_answered": lambda n, v: as_choice(n, v, WHEN_ANSWERED), "repetition_stop": as_bool,
            "budget_scale": lambda n, v: as_float(n, v, positive=True), "trace": _folder, "resume_dir": _folder,
            "cache_implementation": lambda n, v: as_choice(n, v, CACHES), "compile": as_bool,
        }
        values = {}
        for f in fields(cls):
            if f.name in raw:
                value = raw.pop(f.name)
                values[f.name] = None if value is None else parsers[f.name](f.name, value)
        return cls(**values)


DECODING_ARGS = ("budget_forcing", "bf_reserve", "bf_reserve_rule", "bf_string", "bf_when_answered", "repetition_stop")
"""The args of the free decoding rules: a decoding condition that both sides of a comparison share."""


def _folder(name: str, value) -> str:
    """A folder to write into, created now, so a bad path fails before any work."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}={value!r}: expected a folder path")
    try:
        Path(value).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{name}={value}: cannot create the folder ({exc.strerror or exc})") from None
    if not os.access(value, os.W_OK):
        raise ValueError(f"{name}={value}: the folder is not writable")
    return value


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
    return sorted(set(hf) | {f.name for f in fields(LoopedArgs)} | set(FROM_PRETRAINED_ARGS))


def _opens_thinking(context: str) -> bool:
    return context.rfind(THINK_OPEN) > context.rfind(THINK_CLOSE)


@register_model("looped")
class LoopedLM(HFLM):
    """``HFLM`` with a loop, decoding rules and a per-item trace (see the module docstring)."""

    def __init__(self, pretrained, **kwargs) -> None:
        unknown = sorted(set(kwargs) - set(_valid_args()))
        if unknown:
            raise ValueError(f"looped: unknown model arg(s) {', '.join(unknown)}; valid: {', '.join(_valid_args())}")
        args = LoopedArgs.parse(kwargs)
        generation_options(args.cache_implementation, args.compile)  # refuses compile without the static cache
        if args.compile:
            check_compile_backend(kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
        if isinstance(pretrained, str):
            try:
                check_source(pretrained)
            except ValueError as exc:
                raise ValueError(f"looped: pretrained={exc}") from None
        # The loop is checked against the config before HFLM loads any weights.
        self.loop = resolve_loop(
            pretrained, args.loop, operator=args.loop_operator, beta=args.loop_beta, mix=args.loop_mix,
            mix_source=args.loop_mix_source, arg_prefix="loop_", revision=kwargs.get("revision"),
            trust_remote_code=kwargs.get("trust_remote_code", False),
        )
        if args.exit_after is not None:
            if self.loop is None:
                raise ValueError(f"looped: exit_after={args.exit_after} given for a model without a loop "
                                 "(give loop= or a looped checkpoint)")
            try:
                self.loop = self.loop.exit_after(args.exit_after)
            except ValueError as exc:
                raise ValueError(f"looped: {exc}") from None
        # Keep the thinking block in responses (the scorer needs it); HFLM would demand
        # think_end_token and strip it.
        if kwargs.get("enable_thinking") is not None and kwargs.get("think_end_token") is None:
            template_args = dict(kwargs.pop("chat_template_args", None) or {})
            template_args["enable_thinking"] = as_bool("enable_thinking", kwargs.pop("enable_thinking"))
            kwargs["chat_template_args"] = template_args
        super().__init__(pretrained, **kwargs)
        from loopeval.threads import configure_threads

        self.threads = configure_threads(self.model)
        if self.loop is not None and loop_config(self.model) is None:
            apply_loop(self.model, self.loop)
        self.args = args
        self.generation_options = generation_options(args.cache_implementation, args.compile, device=self.device)
        self.cost = loop_cost(self.model, self.loop.spec if self.loop else None)
        self.check_cache = args.check_cache and self.loop is not None
        self.cache_check_result = None
        self.budget_scale = args.budget_scale
        self.force_ids = forcing_tokens(self.tokenizer, args.bf_string)
        self.weights = weights_fingerprint(self.model)
        self._trace_writer = None
        self._store = None
        if args.resume_dir is not None:
            self._store = ResponseStore(args.resume_dir, rank=self.rank, world_size=self.world_size)
        self._batch_contexts: list[str] = []
        self._pending = defaultdict(deque)

    def set_cache_hook(self, cache_hook) -> None:
        if getattr(cache_hook, "dbdict", None) is not None:
            raise ValueError(
                "looped: lm-eval's --use_cache keys a result on the request alone, so it would serve outputs "
                "made with another loop, budget or decoding rule; drop --use_cache and pass resume_dir=FOLDER "
                "in --model_args to resume a killed run safely"
            )
        super().set_cache_hook(cache_hook)

    # -- generation ------------------------------------------------------------------

    def decoding_settings(self) -> DecodingSettings:
        """The settings both sides of a comparison must share."""
        a, template = self.args, self.tokenizer.chat_template
        forcing = a.budget_forcing
        return DecodingSettings(
            budget_forcing=forcing,
            bf_reserve=a.bf_reserve if forcing else None,
            bf_reserve_rule=a.bf_reserve_rule if forcing else None,
            bf_string=a.bf_string if forcing else None,
            bf_when_answered=a.bf_when_answered if forcing else None,
            repetition_stop=a.repetition_stop,
            budget_scale=a.budget_scale,
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
            exit_after=self.args.exit_after,
            cost=self.cost.summary(),
            decoding=self.decoding_settings(),
            cache_check=None if check is None else {"ok": check.ok, "max_abs_diff": check.max_abs_diff,
                                                   "error": check.error},
            versions={"loopeval": loopeval.__version__, "python": platform.python_version(), "torch": torch.__version__},
            weights=self.weights,
            generation={"cache_implementation": self.args.cache_implementation, "compile": self.args.compile},
        )

    def _identity(self) -> dict:
        """Everything besides the request that changes a generation: the response store's key."""
        return {"model": str(self.pretrained), "weights": self.weights, "loop": self.loop and self.loop.to_dict(),
                "decoding": self.decoding_settings().__dict__}

    def _plan(self, request) -> tuple[str, dict, list[str], int | None]:
        context, gen_kwargs = request.args
        gen_kwargs = dict(gen_kwargs)
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        budget = scaled_budget(int(gen_kwargs.get("max_gen_toks", self.max_gen_toks)), self.budget_scale)
        reserve = None
        if self.args.budget_forcing:
            try:
                reserve = effective_reserve(self.args.bf_reserve, budget=budget, scale=self.budget_scale,
                                            rule=self.args.bf_reserve_rule,
                                            minimum=max(len(ids) for ids in self.force_ids))
            except ValueError as exc:
                raise ValueError(f"looped: task {request.task_name!r}: {exc}") from None
        # Stop strings are applied by loopeval (never inside thinking); lm-eval keeps only EOS.
        gen_kwargs.update(max_gen_toks=budget, until=[])
        return context, gen_kwargs, until, reserve

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        plans = [self._plan(r) for r in requests]  # every budget is checked before any work
        clones = []
        for request, (context, gen_kwargs, until, reserve) in zip(requests, plans):
            clone = copy.copy(request)
            clone.arguments = (context, gen_kwargs)
            clones.append(clone)
            # Keyed by context: lm-eval hands _model_generate the batch's contexts, and a task may
            # set max_length, so the budget is not a reliable key.
            self._pending[context].append((request, until, reserve, gen_kwargs))
        try:
            texts = super().generate_until(clones, disable_tqdm=disable_tqdm)
        finally:
            self._pending.clear()
        out = []
        for text, (context, _, until, _) in zip(texts, plans):
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
        mask = generation_kwargs.get("attention_mask")
        prompt_tokens = mask.sum(1).tolist() if mask is not None else [context.shape[1]] * len(contexts)
        keys = []
        if self._store is not None:
            identity = self._identity()
            keys = [request_key(identity, c, {"request": req.args[1], "run": kw})
                    for (req, _, _, kw), c in zip(entries, contexts)]
        stored = self._store.batch(keys) if self._store is not None else None
        if stored is not None and len({len(r["generated"]) for r in stored}) == 1:
            sequences = torch.cat([context, torch.tensor([r["generated"] for r in stored], device=context.device)], 1)
            outcomes = [RowOutcome(**r["outcome"]) for r in stored]
        else:
            sequences, outcomes = self._generate(context, max_length, stop, entries, generation_kwargs)
            if self._store is not None:
                generated = sequences[:, context.shape[1]:].tolist()
                self._store.add([(k, g, o.__dict__, int(p)) for k, g, o, p in zip(keys, generated, outcomes, prompt_tokens)])
        if self.args.trace is not None:
            if self._trace_writer is None:  # after the cache check, so the header records it
                self._trace_writer = TraceWriter(
                    self.args.trace, self.trace_header(), rank=self.rank, world_size=self.world_size
                )
            self._trace_writer.write([
                self._trace_item(req, c, p, o, max_new, reserve)
                for (req, _, reserve, _), c, p, o in zip(entries, contexts, prompt_tokens, outcomes)
            ])
        return sequences

    def _generate(self, context, max_length, stop, entries, generation_kwargs):
        """One cached ``generate`` call with the decoding rules; the sequences and each row's outcome."""
        eos = {self.eot_token_id, *self._generation_eos()}
        a = self.args
        rules = DecodingRules(
            self.tokenizer,
            context,
            max_length - context.shape[1],
            budget_forcing=a.budget_forcing,
            reserve=entries[0][2] or DEFAULT_RESERVE,
            force_string=a.bf_string,
            when_answered=a.bf_when_answered,
            repetition_stop=a.repetition_stop,
            stops=entries[0][1],
            eos_token_ids=[e for e in eos if e is not None],
        )
        if rules.active:
            generation_kwargs["logits_processor"] = LogitsProcessorList([rules])
        generation_kwargs.update(self.generation_options)
        sequences = super()._model_generate(context, max_length, stop, **generation_kwargs)
        return sequences, rules.outcomes(sequences)

    def _generation_eos(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos or [])

    def _trace_item(self, request, context: str, prompt_tokens: int, outcome, max_new: int,
                    reserve: int | None) -> TraceItem:
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
            bf_reserve=reserve,
            forcing_skipped=outcome.forcing_skipped,
        )

    def _run_cache_check(self, contexts: list[str], max_new: int) -> None:
        result = run_cache_check(self.model, self.tokenizer, contexts[:4], max_new_tokens=min(16, max_new))
        self.cache_check_result = result
        if result.error is not None:
            raise RuntimeError(f"looped: the cache check could not run: {result.error}")
        if not result.ok:
            raise RuntimeError(
                f"looped: {result}. Cached looped decoding of loop {self.loop.spec} differs from full "
                "recomputation, so generations would be wrong; the run is stopped. "
                "(check_cache=false skips this check; do not use it to hide a failure.)"
            )
