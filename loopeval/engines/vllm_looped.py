"""The looped vLLM model classes, written out: ``Looped<Base>`` for each of
:data:`loopeval.engines.vllm_models.BASES`.

Each is vLLM's own class with its decoder forward replaced by the loop's
(:class:`CompiledLoop`, built from ``hf_overrides["loopeval_loop"]``:
:func:`loopeval.engines.vllm_models.engine_overrides`). vLLM imports this module when it
builds one (:func:`loopeval.engines.vllm_models.register` registers them by name).
"""

from __future__ import annotations

from vllm.compilation.decorators import support_torch_compile
from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from loopeval.core.spec import LoopConfig
from loopeval.engines.vllm_models import CONFIG_KEY, PRE_NORM, SANDWICH_NORM, Loop


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1, "inputs_embeds": 0})
class CompiledLoop(Loop):
    """The loop's decoder forward under vLLM's ``@support_torch_compile``, the decorator of every
    base's decoder model (with the same dynamic token dimension), so vLLM compiles a looped model
    whenever it compiles the unlooped one (its compilation mode; ``enforce_eager`` runs both eager):
    one graph over the whole loop, every call site's attention an opaque op by its layer name."""


class _Looped:
    """The loop over a vLLM decoder model class (the second base); ``NORMS``: its decoder layers' norms."""

    NORMS: tuple

    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        stored = getattr(vllm_config.model_config.hf_config, CONFIG_KEY, None)
        if stored is None:
            raise ValueError(f"{type(self).__name__} needs hf_overrides[{CONFIG_KEY!r}] "
                             "(loopeval.engines.vllm_models.engine_overrides)")
        model_prefix = f"{prefix}.model" if prefix else "model"
        self.loop = CompiledLoop(model=self.model, norms=self.NORMS, config=LoopConfig.from_dict(dict(stored)),
                                 vllm_config=vllm_config, prefix=model_prefix)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        return self.loop(input_ids, positions, inputs_embeds)


class LoopedLlamaForCausalLM(_Looped, LlamaForCausalLM):
    """vLLM's Llama looped exactly."""

    NORMS = PRE_NORM


class LoopedMistralForCausalLM(_Looped, MistralForCausalLM):
    """vLLM's Mistral looped exactly."""

    NORMS = PRE_NORM


class LoopedQwen2ForCausalLM(_Looped, Qwen2ForCausalLM):
    """vLLM's Qwen2 looped exactly."""

    NORMS = PRE_NORM


class LoopedQwen3ForCausalLM(_Looped, Qwen3ForCausalLM):
    """vLLM's Qwen3 looped exactly."""

    NORMS = PRE_NORM


class LoopedGemma3ForCausalLM(_Looped, Gemma3ForCausalLM):
    """vLLM's Gemma 3 looped exactly (sandwich norms; its embedding scale and logits soft cap its own)."""

    NORMS = SANDWICH_NORM
