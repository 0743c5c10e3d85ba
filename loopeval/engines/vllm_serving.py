"""``serve_cost`` on vLLM: one ``LLM`` per model, timed generations of fixed length, and the
KV cache as vLLM allocates it. :func:`serve_cost` is
:func:`loopeval.evaluation.serving.serve_cost` with a :class:`VLLMServing` engine.

Each model gets its own in-process ``LLM`` (``distributed_executor_backend="uni"``,
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` from :data:`loopeval.engines.vllm_engine.ENV_DEFAULTS`),
looped by :func:`loopeval.engines.vllm_models.engine_overrides` as the lm-eval adapter
loops it, with prefix caching **off**: every repeat sends the same prompt ids, so a prefix
cache would serve the repeats' prompts from its blocks and time no prefill; and compiled
(:data:`FIXED`). Each row
generates exactly ``new_tokens`` tokens (``min_tokens = max_tokens``, ``ignore_eos``),
greedily, on the seeded random prompt ids the HF path uses.
"""

from __future__ import annotations

import os

from loopeval.engines.vllm_engine import INSTALL, configure_environment, engine_version
from loopeval.evaluation import serving
from loopeval.evaluation.serving import Clock

FIXED = {"distributed_executor_backend": "uni", "enable_prefix_caching": False, "enforce_eager": False}
"""``LLM`` settings serve-cost measures with; ``engine_args`` cannot change them. Compiled, as
vLLM serves by default (on GPUs with CUDA graphs): a looped model compiles exactly as its
base does (docs/engine.md, "Compilation"), so both sides run alike; the start-up, where
compilation happens, is not timed."""


def serve_cost(models, *, engine_args: dict | None = None, **kwargs) -> serving.ServeCost:
    """:func:`loopeval.evaluation.serving.serve_cost` on vLLM; ``engine_args`` are further
    ``LLM`` keywords (e.g. ``{"gpu_memory_utilization": 0.5}``) beside :data:`FIXED`."""
    return serving.serve_cost(models, engine=VLLMServing(engine_args), **kwargs)


class VLLMServing:
    """The serving backend :func:`loopeval.evaluation.serving.serve_cost` measures vLLM through
    (its protocol: :mod:`loopeval.evaluation.serving.measure`)."""

    name = "vllm"

    def __init__(self, engine_args: dict | None = None):
        fixed = sorted(set(engine_args or {}) & set(FIXED))
        if fixed:
            raise ValueError(f"engine_args {', '.join(fixed)}: serve-cost fixes them ({FIXED}); drop them")
        self.engine_args = dict(engine_args or {})

    def check(self, sources, sizes, *, cache, compile, device) -> None:
        """Refuse, before any model loads, what vLLM cannot measure: options of transformers'
        ``generate``, ``auto`` batch sizes, model objects, and a missing vLLM."""
        hf_only = [name for name, given in ((f"--cache {cache}", cache != "dynamic"), ("--compile", compile),
                                            (f"--device {device}", device is not None)) if given]
        if hf_only:
            raise ValueError(f"--engine vllm: {', '.join(hf_only)} set transformers' generate and mean nothing on "
                             "vLLM, which pages its own KV cache, compiles by its own settings and places itself on "
                             "the GPUs CUDA_VISIBLE_DEVICES shows; drop them")
        if sizes == "auto":
            raise ValueError("--engine vllm needs explicit --batch-sizes (e.g. 1,8,64): auto searches by "
                             "transformers' out-of-memory error and the HF path's throughput, not by vLLM's scheduler")
        objects = [type(s).__name__ for s in sources if not isinstance(s, (str, os.PathLike))]
        if objects:
            raise ValueError(f"--engine vllm loads checkpoint folders, not a {objects[0]} object: save it first "
                             "(loopeval.save_model)")
        self.version()

    def version(self) -> str:
        try:
            return engine_version()
        except ImportError:
            raise ValueError(f"--engine vllm: {INSTALL}") from None

    load_device = "cpu"  # the models loaded for their cost and weights; vLLM loads its own

    def load(self, sources, loaded, loops, *, dtype: str, max_model_len: int, seed: int) -> list:
        """One ``LLM`` per model (one source: the same checkpoint unlooped and looped)."""
        paths = sources if len(sources) > 1 else sources * 2
        return [engine(path, loop=config, dtype=dtype, max_model_len=max_model_len, seed=seed,
                       engine_args=self.engine_args) for path, config in zip(paths, loops)]

    def meter(self, loaded, vocab_size: int, prompt_tokens: int, seed: int) -> Meter:
        return Meter("cpu", vocab_size, prompt_tokens, seed)

    def memory_runs(self, new_tokens: int) -> int:
        return 0  # nothing generated: vLLM preallocates its KV cache

    def memory(self, meter, llm, *, prompt_tokens: int, new_tokens: int) -> tuple[int, None, int]:
        """(one row's KV bytes as vLLM allocates them, no measured growth, KV bytes per token)."""
        kv = kv_bytes_per_token(llm)
        return kv * (prompt_tokens + new_tokens), None, kv

    def settings(self, timed, meter) -> dict:
        """What the JSON's settings record of the engine."""
        return {"cache": "paged", "compile": not FIXED["enforce_eager"], "device": device_type(),
                "engine_args": {**FIXED, **self.engine_args},
                "kv_block_size": kv_cache_config(timed[0]).kv_cache_groups[0].kv_cache_spec.block_size,
                "memory": "weights + vLLM's KV bytes per token x (prompt_tokens + new_tokens)"}


def engine(path, *, loop, dtype: str, max_model_len: int, seed: int, engine_args: dict):
    """vLLM's ``LLM`` for the checkpoint at ``path``, looped by ``loop`` (a ``LoopConfig``, or
    ``None`` for the checkpoint as it is), at ``dtype``, with :data:`FIXED` and ``engine_args``."""
    from transformers import AutoConfig

    from loopeval.engines.vllm_models import engine_overrides, register

    configure_environment()
    register()
    from vllm import LLM

    overrides = None
    if loop is not None:
        overrides = engine_overrides((AutoConfig.from_pretrained(path).architectures or ["?"])[0], loop)
    return LLM(str(path), dtype=dtype, hf_overrides=overrides, max_model_len=max_model_len, seed=seed,
               **FIXED, **engine_args)


def kv_cache_config(llm):
    """The ``KVCacheConfig`` vLLM allocated the paged KV cache by (the in-process engine core's
    scheduler holds it)."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    if core is None:
        raise ValueError("serve-cost on vLLM reads the KV cache from the in-process engine core: unset "
                         "VLLM_ENABLE_V1_MULTIPROCESSING (loopeval sets it to 0)")
    return core.scheduler.kv_cache_config


def kv_bytes_per_token(llm) -> int:
    """KV cache bytes per token as vLLM allocates them: over its KV cache groups, the group's
    layers (every ``Attention``, the loop's call sites included) times the page size in bytes
    over the page's tokens (block size)."""
    return sum(len(g.layer_names) * g.kv_cache_spec.page_size_bytes // g.kv_cache_spec.block_size
               for g in kv_cache_config(llm).kv_cache_groups)


class Meter(Clock):
    """Times ``LLM.generate`` of exactly ``new_tokens`` tokens per row on the shared prompt ids."""

    def generate(self, llm, batch: int, new_tokens: int):
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True, temperature=0.0,
                                detokenize=False)
        prompts = [TokensPrompt(prompt_token_ids=row) for row in self.prompt(batch).tolist()]
        out = llm.generate(prompts, params, use_tqdm=False)
        if self.bar is not None:
            self.bar.update(batch * new_tokens)
        return out

    def generated(self, out) -> int:
        counts = {len(o.outputs[0].token_ids) for o in out}
        if len(counts) != 1:
            raise RuntimeError(f"vLLM generated rows of {sorted(counts)} tokens, not all the same")
        return counts.pop()


def device_type() -> str:
    """The device vLLM runs on (``cpu``, ``cuda``...)."""
    from vllm.platforms import current_platform

    return current_platform.device_type
