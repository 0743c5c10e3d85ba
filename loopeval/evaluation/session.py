"""One evaluation of lm-eval's ``looped`` model: every step but the forward, on any backend.

A :class:`Session` owns an lm-eval request from its model args to its last trace line:

* before any weights load, in this order: the model args parsed and checked once (unknown
  args named with the valid ones, :class:`loopeval.evaluation.model_args.LoopedArgs`
  typed), the local tasks' data, the checkpoint (and its GGUF file), the loop and its
  fixed exit, the backend's own refusals (:meth:`Backend.check`), the chat template under
  ``--apply_chat_template``, the process's thread decision
  (:func:`loopeval.common.threads.configure_threads`), and the fingerprint of every file
  loaded besides the weights (config, tokenizer, chat template: the trace header's ``files``);
* after the backend loads: the forcing string against the end-of-sequence ids, the resume store;
* per request: its plan (stop strings and forcing reserve, :meth:`plan`), the decoding
  rules (:meth:`rules`, built here only), the resume store and the trace (:meth:`serve`),
  the finished text (:meth:`finish`);
* the trace header, the decoding settings and the identity (:meth:`trace_header`), the same
  fields on every backend but the engine's name and version.

A backend (:class:`Backend`) supplies only what differs: the model args its loader takes,
its own refusals, loading, ``generate`` and log-likelihoods. The HF backend is
:mod:`loopeval.evaluation.hf_backend`; vLLM's is :mod:`loopeval.engines.vllm_backend`.
Refusals are :class:`loopeval.common.errors.UserError` whose message starts ``looped:``.
"""

from __future__ import annotations

import json
import platform
import sys
import warnings
from dataclasses import asdict, dataclass
from typing import Callable, Protocol

import loopeval
from loopeval.common.errors import UserError
from loopeval.common.threads import configure_threads
from loopeval.core.loop import check_source, resolve_loop
from loopeval.core.spec import LOOP_OPTIONS
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
from loopeval.evaluation.identity import loaded_fingerprint, output_identity
from loopeval.evaluation.model_args import (
    HF_ONLY,
    LoopedArgs,
    chat_template_requested,
    pilot_warning,
    requested_local_tasks,
)
from loopeval.evaluation.responses import ResponseStore, request_key
from loopeval.evaluation.settings import DEFAULT_RESERVE, THINK_CLOSE, THINK_OPEN
from loopeval.evaluation.trace import DecodingSettings, TraceHeader, TraceItem, TraceWriter, prompt_hash

PLAN_KEY = "loopeval_plan"
"""The generation kwarg that carries a request's plan key through lm-eval's batching (never reaches ``generate``)."""


def refusal(exc: Exception) -> UserError:
    """``exc``'s message as a :class:`UserError` that starts ``looped:``."""
    text = str(exc)
    return UserError(text if text.startswith("looped: ") else f"looped: {text}")


class Backend(Protocol):
    """What a backend tells the session before it loads (the rest is its lm-eval model)."""

    name: str
    """The backend's ``engine=`` value."""
    engine: str | None
    """The engine recorded in the decoding settings (``None``: transformers' ``generate``, as every
    run before the engine recorded it)."""

    def model_args(self) -> set[str]:
        """The model args its loader takes (beside :class:`LoopedArgs`)."""

    def check(self, session: Session) -> None:
        """Its own refusals, before any weights load (``ValueError`` naming the arg)."""

    def version(self) -> str | None:
        """The engine's version, recorded beside its name (``None`` on the HF path)."""

    def load(self, session: Session):
        """The loaded model, an lm-eval ``LM`` that generates through :meth:`Session.serve` and
        calls :meth:`Session.loaded` once loaded."""


@dataclass(frozen=True)
class Plan:
    """What ``looped`` does to one request beyond lm-eval: its stop strings and its forcing reserve.
    Requests of one batch share a plan (lm-eval batches by generation kwargs, which hold its key)."""

    until: tuple[str, ...]
    reserve: int | None

    @property
    def key(self) -> str:
        return json.dumps([list(self.until), self.reserve])


def end_of_sequence_ids(eot_token_id: int | None, generation_config) -> tuple[int, ...]:
    """Every id that ends a generation: the tokenizer's end-of-text and the generation config's ``eos_token_id``(s)."""
    eos = generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    return tuple(sorted({e for e in (eot_token_id, *eos) if e is not None}))


@dataclass(frozen=True)
class Loaded:
    """What the backend's loaded model tells the session: fixed for the evaluation."""

    tokenizer: object
    eos_ids: tuple[int, ...]  # end_of_sequence_ids()
    weights: str  # loopeval.core.checkpoint.weights_fingerprint of the evaluated weights
    cost: object  # loopeval.core.cost.LoopCost
    dtype: str
    seed: Callable[[], int]  # read when the header is written: lm-eval seeds torch after the model loads
    max_length: int
    max_gen_toks: int
    chat_template: str | None
    generation: dict  # the trace header's speed-only settings
    versions: dict  # the backend's library versions, beside loopeval's and Python's
    rank: int = 0
    world_size: int = 1


class Session:
    """One ``looped`` evaluation over ``backend`` (module docstring). ``model_args`` are lm-eval's,
    ``argv`` the command line (``sys.argv``; read for ``--apply_chat_template``, ``--limit``
    and local tasks). After construction ``backend_args`` holds the args the backend loads
    with; the backend calls :meth:`loaded` once its model is loaded."""

    def __init__(self, pretrained, model_args: dict, backend: Backend, *, argv: list[str] | None = None):
        argv = sys.argv if argv is None else argv
        self.backend = backend
        self.pretrained = pretrained
        raw = dict(model_args)
        valid = sorted({f for f in LoopedArgs.__dataclass_fields__} | backend.model_args())
        unknown = sorted(set(raw) - set(valid))
        if unknown:
            raise UserError(f"looped: unknown model arg(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
        try:
            self.args = LoopedArgs.parse(raw)
        except ValueError as exc:
            raise refusal(exc) from None
        if (local := requested_local_tasks(argv)) is not None:  # lm-eval reads task data after the model loads
            from loopeval.evaluation.local_data import check_local_tasks

            try:
                check_local_tasks([local[0]], tasks=local[1])
            except ValueError as exc:
                raise refusal(exc) from None
        if (pilot := pilot_warning(argv)) is not None:  # before the weights load: the compute is not spent yet
            warnings.warn(pilot, stacklevel=3)
        self.loop = _resolve(pretrained, self.args, raw)
        if backend.engine is not None:  # not transformers' generate
            for name, what in HF_ONLY.items():
                if getattr(self.args, name) != LoopedArgs.__dataclass_fields__[name].default:
                    raise UserError(f"looped: {name}={getattr(self.args, name)} sets transformers' {what}; "
                                    f"it has no meaning with engine={backend.name} (drop it)")
        self.raw = raw
        try:
            backend.check(self)
        except ValueError as exc:
            raise refusal(exc) from None
        self.chat_template_args = dict(raw.get("chat_template_args") or {})  # what templated prompts are given
        if raw.get("enable_thinking") is not None:
            from loopeval.common.args import as_bool

            self.chat_template_args["enable_thinking"] = as_bool("enable_thinking", raw["enable_thinking"])
            # Keep the thinking block in responses (the scorer needs it); lm-eval would demand
            # think_end_token and strip it.
            if raw.get("think_end_token") is None:
                raw.pop("enable_thinking")
                raw["chat_template_args"] = dict(self.chat_template_args)
        self.files = loaded_fingerprint({"pretrained": pretrained, **raw}, weights=False)
        tokenizer = raw.get("tokenizer") or pretrained
        if chat_template_requested(argv) and isinstance(tokenizer, str):
            from loopeval.core.gguf import check_chat_template

            try:
                check_chat_template(tokenizer, revision=raw.get("revision") or "main",
                                    trust_remote_code=raw.get("trust_remote_code", False),
                                    gguf_file=raw.get("gguf_file"))
            except ValueError as exc:
                raise refusal(exc) from None
        try:
            self.threads = configure_threads()  # once, before the weights load: the count is part of the numerics
        except ValueError as exc:
            raise refusal(exc) from None
        self.backend_args = raw
        self.engine_version = backend.version()
        self.model: Loaded | None = None
        self.batch_size: str | None = None  # what the backend batches by (auto: the size it found)
        self.chat_template_applied = False
        self.cache_check = None  # the HF backend's loopeval.core.cache_check result
        self.store: ResponseStore | None = None
        self._trace: TraceWriter | None = None
        self.plans: dict[str, Plan] = {}

    # -- after loading ---------------------------------------------------------------

    def loaded(self, model: Loaded) -> None:
        """Record the loaded model; check the forcing string against its end-of-sequence ids; open the store."""
        self.model = model
        self.force_strings = forcing_strings(self.args.bf_string)
        self.force_ids = forcing_tokens(model.tokenizer, self.args.bf_string)
        if self.args.budget_forcing:
            try:
                check_forcing_against_eos(model.tokenizer, self.force_strings, list(model.eos_ids))
            except ValueError as exc:
                raise refusal(exc) from None
        if self.args.resume_dir is not None:
            self.store = ResponseStore(self.args.resume_dir, rank=model.rank, world_size=model.world_size)

    def decoding_settings(self) -> DecodingSettings:
        """The settings both sides of a comparison must share (the engine and its version among them)."""
        m = self.model
        applied = self.chat_template_applied
        return DecodingSettings.record(
            self.args.decoding, dtype=m.dtype, batch_size=str(self.batch_size),
            chat_template_sha=prompt_hash(m.chat_template) if m.chat_template and applied else None,
            chat_template_args=dict(self.chat_template_args) if applied else {},
            seed=int(m.seed()), max_length=int(m.max_length), truncation=bool(self.args.truncation),
            engine=self.backend.engine, engine_version=self.engine_version)

    def trace_header(self) -> TraceHeader:
        """This evaluation's trace header: the shared decoding settings plus its loop, cost and files."""
        m, check = self.model, self.cache_check
        return TraceHeader(
            model=str(self.pretrained) if isinstance(self.pretrained, str) else type(self.pretrained).__name__,
            loop=self.loop.to_dict() if self.loop else None,
            exit_after=self.args.exit_after,
            cost=m.cost.summary(),
            decoding=self.decoding_settings(),
            cache_check=None if check is None else {"ok": check.ok, "max_abs_diff": check.max_abs_diff,
                                                   "error": check.error, "decided_in": check.decided_in,
                                                   "rounding_gap": check.rounding_gap},
            versions={"loopeval": loopeval.__version__, "python": platform.python_version(), **m.versions},
            weights=m.weights,
            generation=dict(m.generation),
            files=self.files,
        )

    def identity(self) -> dict:
        """Everything besides the request that changes a generation: the resume store's key."""
        return output_identity(self.trace_header())

    # -- requests ----------------------------------------------------------------------

    def plan(self, request) -> tuple[str, dict, Plan]:
        """The request's context, the kwargs to batch and generate it by, and its plan.

        The plan's key goes into the kwargs lm-eval groups batches by, so a batch never mixes
        requests with different stop strings or reserves; its stop strings are applied by
        :meth:`finish` (never inside thinking), so the kwargs keep none.
        """
        context, gen_kwargs = request.args
        gen_kwargs = dict(gen_kwargs)
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        scale, max_length = self.args.budget_scale, self.model.max_length
        budget = scaled_budget(int(gen_kwargs.get("max_gen_toks", self.model.max_gen_toks)), scale)
        reserve = None
        if self.args.budget_forcing:
            try:
                reserve = effective_reserve(self.args.bf_reserve, budget=budget, scale=scale,
                                            rule=self.args.bf_reserve_rule,
                                            minimum=max(len(ids) for ids in self.force_ids))
                check_forcing_against_stops(self.force_strings, until)
            except ValueError as exc:
                raise UserError(f"looped: task {request.task_name!r}: {exc}") from None
        if max_length <= budget:
            raise UserError(
                f"looped: task {request.task_name!r}: the token budget max_gen_toks={budget} (budget_scale="
                f"{scale:g}) leaves no room for a prompt within max_length={max_length}; "
                "lower budget_scale or raise max_length")
        plan = Plan(tuple(until), reserve)
        self.plans[plan.key] = plan
        gen_kwargs.update(max_gen_toks=budget, until=[], **{PLAN_KEY: plan.key})
        return context, gen_kwargs, plan

    def rules(self, prompt_ids, budget: int, plan: Plan) -> DecodingRules:
        """The decoding rules of ``prompt_ids`` (a batch, left-padded) generating ``budget`` tokens under ``plan``."""
        a = self.args
        return DecodingRules(self.model.tokenizer, prompt_ids, budget, budget_forcing=a.budget_forcing,
                             reserve=plan.reserve or DEFAULT_RESERVE, force_string=a.bf_string,
                             when_answered=a.bf_when_answered or "skip", repetition_stop=a.repetition_stop,
                             stops=list(plan.until), eos_token_ids=list(self.model.eos_ids))

    def open_trace(self, contexts: list[str], max_new: int, cache_check: Callable | None = None) -> None:
        """Once per evaluation, before its first forward: the backend's cache check (on ``contexts``),
        then the trace file with its header, which records the check. A scoring-only run
        (log-likelihoods) gets its header too, so what it ran is on record."""
        if cache_check is not None and self.cache_check is None:
            self.cache_check = cache_check(contexts, max_new)
        if self.args.trace is not None and self._trace is None:
            self._trace = TraceWriter(self.args.trace, self.trace_header(), rank=self.model.rank,
                                      world_size=self.model.world_size)

    def serve(self, requests: list, run_kwargs: list[dict], contexts: list[str], prompt_tokens: list[int],
              plans: list[Plan], budgets: list[int], generate: Callable[[], list[tuple[list[int], RowOutcome]]],
              *, same_length: bool = False) -> list[tuple[list[int], RowOutcome]]:
        """Each request's generated token ids and outcome: from the resume store when it holds the
        whole batch (``same_length``: and its rows are of one length), else from ``generate()``,
        then stored; every row traced."""
        keys = []
        if self.store is not None:
            identity = self.identity()
            keys = [request_key(identity, c, {"request": r.args[1], "run": kw})
                    for r, kw, c in zip(requests, run_kwargs, contexts)]
        stored = self.store.batch(keys) if self.store is not None else None
        if stored is not None and (not same_length or len({len(r["generated"]) for r in stored}) == 1):
            results = [(r["generated"], RowOutcome(**r["outcome"])) for r in stored]
        else:
            results = generate()
            if self.store is not None:
                self.store.add([(k, g, asdict(o), int(p)) for k, (g, o), p in zip(keys, results, prompt_tokens)])
        if self._trace is not None:
            self._trace.write([self._item(r, c, p, o, b, plan.reserve) for r, c, p, (_, o), b, plan
                               in zip(requests, contexts, prompt_tokens, results, budgets, plans)])
        return results

    def _item(self, request, context: str, prompt_tokens: int, outcome: RowOutcome, max_new: int,
              reserve: int | None) -> TraceItem:
        cost = self.model.cost
        return TraceItem(
            task=request.task_name, doc_id=int(request.doc_id), idx=int(request.idx), prompt_hash=prompt_hash(context),
            prompt_tokens=int(prompt_tokens), generated_tokens=outcome.generated_tokens, max_gen_toks=max_new,
            finished=outcome.finished, forced_at=outcome.forced_at, repetition_stop_at=outcome.repetition_stop_at,
            passes_per_token=cost.passes, flops=cost.generation_flops(int(prompt_tokens), outcome.generated_tokens),
            bf_reserve=reserve, forcing_skipped=outcome.forcing_skipped)

    @staticmethod
    def finish(text: str, context: str, plan: Plan) -> str:
        """A response as the scorer reads it: ``<think>`` first when the prompt opened a thinking
        block, cut at the first stop string outside thinking."""
        if context.rfind(THINK_OPEN) > context.rfind(THINK_CLOSE):
            text = THINK_OPEN + text
        return cut_at_stop(text, list(plan.until))

    def apply_chat_template(self) -> None:
        """Record that prompts are templated; refused when the tokenizer has none (an in-process
        run, whose command line the session could not read)."""
        if not self.model.chat_template:
            raise UserError(f"looped: apply_chat_template, but the tokenizer of {self.pretrained} has no chat "
                            "template; give it one (tokenizer.chat_template) or evaluate without it")
        self.chat_template_applied = True

    @staticmethod
    def refuse_use_cache(cache_hook) -> None:
        """lm-eval's ``--use_cache`` is refused: its key is the request alone."""
        if getattr(cache_hook, "dbdict", None) is not None:
            raise UserError(
                "looped: lm-eval's --use_cache keys a result on the request alone, so it would serve outputs "
                "made with another loop, budget or decoding rule; drop --use_cache and pass resume_dir=FOLDER "
                "in --model_args to resume a killed run safely")


def _resolve(pretrained, args, raw: dict):
    """The checkpoint (and its GGUF file) checked and the loop resolved from ``args`` (and its fixed
    exit), reading configs only: before any weights load."""
    hub = {"revision": raw.get("revision"), "trust_remote_code": raw.get("trust_remote_code", False),
           "gguf_file": raw.get("gguf_file")}
    if isinstance(pretrained, str):
        try:
            check_source(pretrained, **hub)
        except ValueError as exc:
            raise UserError(f"looped: pretrained={exc}") from None
    try:
        loop = resolve_loop(pretrained, args.loop, arg_prefix="loop_", **hub,
                            **{name: getattr(args, f"loop_{name}") for name in LOOP_OPTIONS})
    except ValueError as exc:
        raise refusal(exc) from None
    if args.exit_after is None:
        return loop
    if loop is None:
        raise UserError(f"looped: exit_after={args.exit_after} given for a model without a loop "
                        "(give loop= or a looped checkpoint)")
    try:
        return loop.exit_after(args.exit_after)
    except ValueError as exc:
        raise refusal(exc) from None
