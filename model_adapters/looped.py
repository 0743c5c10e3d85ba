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
import json
import os
import platform
import sys
import warnings
from collections import defaultdict, deque
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path

from loopeval.common.threads import set_wait_policy

set_wait_policy()  # before torch starts its OpenMP runtime (loopeval.common.threads)

import torch  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402
from transformers import LogitsProcessor, LogitsProcessorList

import loopeval
from loopeval.common.args import as_bool, as_field, as_int, as_text
from loopeval.common.threads import configure_threads
from loopeval.core.cache_check import check_cache as run_cache_check
from loopeval.core.checkpoint import weights_fingerprint
from loopeval.evaluation.identity import loaded_fingerprint, output_identity
from loopeval.core.loop import check_source
from loopeval.core.cost import loop_cost
from loopeval.core.gguf import GGUFCheckedAutoModel, check_chat_template
from loopeval.evaluation.decoding import (
    DecodingRules,
    RowOutcome,
    check_forcing_against_eos,
    check_forcing_against_stops,
    cut_at_stop,
    effective_reserve,
    forcing_strings,
    forcing_tokens,
    scaled_budget,
)
from loopeval.core.loop import apply_loop, loop_config, resolve_loop
from loopeval.core.spec import LOOP_OPTIONS, option_fields
from loopeval.evaluation.responses import ResponseStore, request_key
from loopeval.evaluation.settings import DECODING_OPTIONS, DEFAULT_RESERVE, THINK_CLOSE, THINK_OPEN, DecodingOptions
from loopeval.evaluation.serving import CACHES, check_compile_backend, generation_options
from loopeval.evaluation.trace import DecodingSettings, TraceHeader, TraceItem, TraceWriter, prompt_hash


ENGINES = ("hf", "vllm")
"""Where ``looped`` generates: transformers' ``generate``, or vLLM (``engine=vllm``)."""


@dataclass(frozen=True)
class AdapterArgs:
    """The model args of ``looped`` itself (beside the loop's and the decoding options').

    ``exit_after``: run the loop's first k steps and read the output there (004's fixed
    exit; :meth:`loopeval.core.spec.LoopConfig.exit_after`), exactly cached and charged as
    k steps. ``check_cache``: check cached looped decoding against full recomputation on
    the first batch. ``trace``: a folder for the per-item cost trace. ``resume_dir``: a
    folder of finished generations; a rerun serves them (:mod:`loopeval.evaluation.responses`).
    ``cache_implementation`` (``dynamic`` or ``static``) and ``compile`` (the decode step
    under ``torch.compile``, which needs ``static``) are passed to ``generate``
    (:func:`loopeval.evaluation.serving.generation_options`); they change speed, not
    outputs, so the trace records them beside, not among, the shared decoding settings.
    ``engine``: ``hf`` (transformers' ``generate``) or ``vllm`` (``looped_vllm.LoopedVLLM``:
    the same args on vLLM, docs/engine.md).
    """

    exit_after: int | None = field(default=None, metadata={"parse": lambda n, v: as_int(n, v, minimum=1)})
    check_cache: bool = True
    trace: str | None = field(default=None, metadata={"parse": lambda n, v: _folder(n, v)})
    resume_dir: str | None = field(default=None, metadata={"parse": lambda n, v: _folder(n, v)})
    cache_implementation: str = field(default="dynamic", metadata={"choices": CACHES})
    compile: bool = False
    engine: str = field(default="hf", metadata={"choices": ENGINES})


def _loop_fields() -> list:
    """``loop`` and ``loop_<option>`` for every loop option, all ``None`` when not given."""
    spec = [("loop", str | None, field(default=None, metadata={"parse": as_text}))]
    return spec + [(f"loop_{f.name}", f.type, field(default=None, metadata=f.metadata)) for f in option_fields()]


def _copied(cls) -> list:
    return [(f.name, f.type, field(default=f.default, default_factory=f.default_factory, metadata=f.metadata))
            for f in fields(cls)]


def _parse(cls, raw: dict):
    """Every ``looped`` arg in ``raw`` checked and typed (popped); errors name the arg.
    ``raw`` keeps HFLM's args."""
    values = {f.name: as_field(f, f.name, raw.pop(f.name)) for f in fields(cls)
              if f.name in raw and raw[f.name] is not None}
    for f in fields(cls):
        raw.pop(f.name, None)
    return cls(**values)


LoopedArgs = make_dataclass("LoopedArgs", [*_loop_fields(), *_copied(DecodingOptions), *_copied(AdapterArgs)],
                            frozen=True, namespace={"parse": classmethod(_parse)})
LoopedArgs.__doc__ = """The model args ``looped`` adds to ``--model hf``'s: the loop (``loop`` and
``loop_<option>`` for each field of :class:`loopeval.core.spec.LoopConfig`), the decoding
options (the fields of :class:`loopeval.evaluation.settings.DecodingOptions`) and the
adapter's own (:class:`AdapterArgs`). Derived from those definitions, so a new field
there is a new model arg here. ``LoopedArgs.parse(raw)`` types them."""


def decoding_options(args) -> DecodingOptions:
    """The decoding options of parsed ``LoopedArgs``."""
    return DecodingOptions(**{name: getattr(args, name) for name in DECODING_OPTIONS})


PLAN_KEY = "loopeval_plan"
"""The generation kwarg that carries a request's plan key through lm-eval's batching (never reaches ``generate``)."""


@dataclass(frozen=True)
class _Plan:
    """What ``looped`` does to one request beyond lm-eval: its stop strings and its forcing reserve.
    Requests of one batch share a plan (lm-eval batches by generation kwargs, which hold its key)."""

    until: tuple[str, ...]
    reserve: int | None

    @property
    def key(self) -> str:
        return json.dumps([list(self.until), self.reserve])


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


TOKEN_PROGRESS_FROM = 64
"""A batch generating at least this many tokens shows a progress bar over its tokens (lm-eval's
own bar only counts finished requests, so one long batch would sit at 0 for minutes)."""


class _TokenProgress(LogitsProcessor):
    """Counts generated tokens on a bar; the scores pass through unchanged."""

    def __init__(self, bar):
        self.bar = bar

    def __call__(self, input_ids, scores):
        self.bar.update()
        return scores


def pilot_warning(argv: list[str]) -> str | None:
    """The warning for an ``lm_eval ... --limit N`` command line, else ``None``."""
    for i, arg in enumerate(argv):
        if arg in ("--limit", "-L") and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--limit="):
            value = arg.split("=", 1)[1]
        else:
            continue
        return (f"looped: lm_eval --limit {value} evaluates a subset of each task, so this run is a pilot: loopeval "
                "compare, report and score-audit read it only with --allow-subset, label it 'pilot: n of N items' "
                "and state no final verdict")
    return None


def chat_template_requested(argv: list[str]) -> bool:
    """Whether an ``lm_eval`` command line asks for ``--apply_chat_template``."""
    return any(a == "--apply_chat_template" or a.startswith("--apply_chat_template=") for a in argv)


def check_requested_local_tasks(argv: list[str]) -> None:
    """On an ``lm_eval ... --include_path DIR --tasks T`` command line, check the data of the
    local tasks named (:func:`loopeval.evaluation.local_data.check_local_tasks`) before the
    model loads: lm-eval builds the model first and reads task data after."""
    import argparse

    from loopeval.evaluation.local_data import check_local_tasks

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--include_path")
    parser.add_argument("--tasks", "-t", nargs="+")
    known, _ = parser.parse_known_args(argv[1:])
    if known.include_path and known.tasks and Path(known.include_path).is_dir():
        check_local_tasks([known.include_path], tasks={t for arg in known.tasks for t in arg.split(",") if t})


class ScoringTrace:
    """Scoring requests (loglikelihood) open the trace first, so a scoring-only run's header is on record.
    A base of ``LoopedLM`` and of the engine's ``LoopedVLLM``, before their lm-eval class."""

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        if requests:
            self._open_trace([r.args[0] for r in requests[:4]], 16)
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        if requests:
            self._open_trace([r.args[0] for r in requests[:4]], 16)
        return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)


class LoopedLM(ScoringTrace, HFLM):
    """``HFLM`` with a loop, decoding rules and a per-item trace (see the module docstring)."""

    def __new__(cls, pretrained=None, **kwargs):
        check_requested_local_tasks(sys.argv)  # both engines: before any weights load
        if str(kwargs.get("engine", "hf")).strip().lower() == "vllm":
            from loopeval.evaluation.model_adapters.looped_vllm import LoopedVLLM

            return LoopedVLLM(pretrained, **kwargs)
        return super().__new__(cls)

    def __init__(self, pretrained, **kwargs) -> None:
        unknown = sorted(set(kwargs) - set(_valid_args()))
        if unknown:
            raise ValueError(f"looped: unknown model arg(s) {', '.join(unknown)}; valid: {', '.join(_valid_args())}")
        args = LoopedArgs.parse(kwargs)
        if (pilot := pilot_warning(sys.argv)) is not None:  # before the weights load: the compute is not spent yet
            warnings.warn(pilot, stacklevel=2)
        generation_options(args.cache_implementation, args.compile)  # refuses compile without the static cache
        if args.compile:
            check_compile_backend(kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
        if isinstance(pretrained, str):
            try:
                check_source(pretrained, gguf_file=kwargs.get("gguf_file"))
            except ValueError as exc:
                raise ValueError(f"looped: pretrained={exc}") from None
        # The loop is checked against the config before HFLM loads any weights.
        self.loop = resolve_loop(
            pretrained, args.loop, **{name: getattr(args, f"loop_{name}") for name in LOOP_OPTIONS},
            arg_prefix="loop_", revision=kwargs.get("revision"),
            trust_remote_code=kwargs.get("trust_remote_code", False), gguf_file=kwargs.get("gguf_file"),
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
        self.files = loaded_fingerprint({"pretrained": pretrained, **kwargs}, weights=False)  # before loading
        tokenizer = kwargs.get("tokenizer") or pretrained
        if chat_template_requested(sys.argv) and isinstance(tokenizer, str):  # before the weights load
            check_chat_template(tokenizer, revision=kwargs.get("revision") or "main",
                                trust_remote_code=kwargs.get("trust_remote_code", False),
                                gguf_file=kwargs.get("gguf_file"))
        self.batch_size_used = None  # what batch_size=auto detected
        self.chat_template_applied = False
        try:
            configure_threads()  # once, before the weights load: the count is part of the numerics
        except ValueError as exc:
            raise ValueError(f"looped: {exc}") from None
        if kwargs.get("gguf_file"):
            self.AUTO_MODEL_CLASS = GGUFCheckedAutoModel
        super().__init__(pretrained, **kwargs)
        if self.loop is not None and loop_config(self.model) is None:
            apply_loop(self.model, self.loop)
        self.args = args
        self.generation_options = generation_options(args.cache_implementation, args.compile, device=self.device)
        self.cost = loop_cost(self.model, self.loop.spec if self.loop else None)
        self.check_cache = args.check_cache and self.loop is not None
        self.cache_check_result = None
        self.budget_scale = args.budget_scale
        self.force_strings = forcing_strings(args.bf_string)
        self.force_ids = forcing_tokens(self.tokenizer, args.bf_string)
        if args.budget_forcing:
            try:
                check_forcing_against_eos(self.tokenizer, self.force_strings, [self.eot_token_id, *self._generation_eos()])
            except ValueError as exc:
                raise ValueError(f"looped: {exc}") from None
        self.weights = weights_fingerprint(self.model)
        self._trace_writer = None
        self._store = None
        if args.resume_dir is not None:
            self._store = ResponseStore(args.resume_dir, rank=self.rank, world_size=self.world_size)
        self._batch_contexts: list[str] = []
        self._pending = defaultdict(deque)
        self._plans: dict[str, _Plan] = {}

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
        template = self.tokenizer.chat_template
        return DecodingSettings.record(
            decoding_options(self.args),
            dtype=str(next(self.model.parameters()).dtype).replace("torch.", ""),
            batch_size=str(self.batch_size_used or self.batch_size),
            chat_template_sha=prompt_hash(template) if template and self.chat_template_applied else None,
            chat_template_args=dict(self.chat_template_args or {}) if self.chat_template_applied else {},
            seed=torch.initial_seed(),
            max_length=int(self.max_length),
            truncation=bool(self.truncation),
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
                                                   "error": check.error, "decided_in": check.decided_in,
                                                   "rounding_gap": check.rounding_gap},
            versions={"loopeval": loopeval.__version__, "python": platform.python_version(), "torch": torch.__version__},
            weights=self.weights,
            generation={"cache_implementation": self.args.cache_implementation, "compile": self.args.compile},
            files=self.files,
        )

    def _identity(self) -> dict:
        """Everything besides the request that changes a generation (:func:`loopeval.evaluation.identity.output_identity`):
        the response store's key."""
        return output_identity(self.trace_header())

    def _plan(self, request) -> tuple[str, dict, _Plan]:
        """The request's context, the kwargs lm-eval batches it by, and its plan (stop strings, reserve).

        The plan's key goes into the kwargs lm-eval groups batches by, so a batch never mixes
        requests with different stop strings or reserves; ``_model_generate`` takes it out again.
        """
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
                check_forcing_against_stops(self.force_strings, until)
            except ValueError as exc:
                raise ValueError(f"looped: task {request.task_name!r}: {exc}") from None
        if self.max_length <= budget:
            raise ValueError(
                f"looped: task {request.task_name!r}: the token budget max_gen_toks={budget} (budget_scale="
                f"{self.budget_scale:g}) leaves no room for a prompt within max_length={self.max_length}; "
                "lower budget_scale or raise max_length")
        plan = _Plan(tuple(until), reserve)
        self._plans[plan.key] = plan
        # Stop strings are applied by loopeval (never inside thinking); lm-eval keeps only EOS.
        gen_kwargs.update(max_gen_toks=budget, until=[], **{PLAN_KEY: plan.key})
        return context, gen_kwargs, plan

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        plans = [self._plan(r) for r in requests]  # every budget is checked before any work
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
        out = []
        for text, (context, _, plan) in zip(texts, plans):
            text = THINK_OPEN + text if _opens_thinking(context) else text
            out.append(cut_at_stop(text, list(plan.until)))
        return out

    def _detect_batch_size(self, *args, **kwargs):
        size = super()._detect_batch_size(*args, **kwargs)
        self.batch_size_used = size
        return size

    def apply_chat_template(self, *args, **kwargs):
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"looped: apply_chat_template, but the tokenizer of {self.pretrained} has no chat "
                             "template; give it one (tokenizer.chat_template) or evaluate without it")
        self.chat_template_applied = True
        return super().apply_chat_template(*args, **kwargs)

    def tok_batch_encode(self, strings, *args, **kwargs):
        self._batch_contexts = list(strings)
        return super().tok_batch_encode(strings, *args, **kwargs)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        plan = self._plans[generation_kwargs.pop(PLAN_KEY)]
        contexts = self._batch_contexts
        max_new = max_length - context.shape[1]
        entries = [self._pending[(plan.key, c)].popleft() for c in contexts]
        self._open_trace(contexts, max_new)
        mask = generation_kwargs.get("attention_mask")
        prompt_tokens = mask.sum(1).tolist() if mask is not None else [context.shape[1]] * len(contexts)
        keys = []
        if self._store is not None:
            identity = self._identity()
            keys = [request_key(identity, c, {"request": req.args[1], "run": kw})
                    for (req, kw), c in zip(entries, contexts)]
        stored = self._store.batch(keys) if self._store is not None else None
        if stored is not None and len({len(r["generated"]) for r in stored}) == 1:
            sequences = torch.cat([context, torch.tensor([r["generated"] for r in stored], device=context.device)], 1)
            outcomes = [RowOutcome(**r["outcome"]) for r in stored]
        else:
            sequences, outcomes = self._generate(context, max_length, stop, plan, generation_kwargs)
            if self._store is not None:
                generated = sequences[:, context.shape[1]:].tolist()
                self._store.add([(k, g, o.__dict__, int(p)) for k, g, o, p in zip(keys, generated, outcomes, prompt_tokens)])
        if self._trace_writer is not None:
            self._trace_writer.write([
                self._trace_item(req, c, p, o, max_new, plan.reserve)
                for (req, _), c, p, o in zip(entries, contexts, prompt_tokens, outcomes)
            ])
        return sequences

    def _generate(self, context, max_length, stop, plan, generation_kwargs):
        """One cached ``generate`` call with the decoding rules; the sequences and each row's outcome."""
        eos = {self.eot_token_id, *self._generation_eos()}
        a = self.args
        rules = DecodingRules(
            self.tokenizer,
            context,
            max_length - context.shape[1],
            budget_forcing=a.budget_forcing,
            reserve=plan.reserve or DEFAULT_RESERVE,
            force_string=a.bf_string,
            when_answered=a.bf_when_answered,
            repetition_stop=a.repetition_stop,
            stops=list(plan.until),
            eos_token_ids=[e for e in eos if e is not None],
        )
        processors = [rules] if rules.active else []
        max_new = max_length - context.shape[1]
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

    def _open_trace(self, contexts: list[str], max_new: int) -> None:
        """Once per evaluation, before its first forward: the cache check (on ``contexts``), then
        the trace file with its header, which records the check. A scoring-only run
        (loglikelihood) gets its header too, so what it ran (weights, loop, cost, settings) is
        on record and two runs can be compared by content."""
        if self.check_cache and self.cache_check_result is None:
            self._run_cache_check(contexts, max_new)
        if self.args.trace is not None and self._trace_writer is None:
            self._trace_writer = TraceWriter(self.args.trace, self.trace_header(), rank=self.rank,
                                             world_size=self.world_size)

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
