"""Serving cost: latency, throughput and memory of looped against unlooped decoding.

The paper checks its layer-pass charge against the clock (B.3, Table 10): "Latency is
the decode time per token at batch 1. We measure throughput at the largest batch that
fits in 80 GB, and memory as the peak at batch 1." One measurement protocol
(:func:`loopeval.evaluation.serving.measure.serve_cost`) measures the same figures for any
models through a serving backend object: transformers' ``generate``
(:class:`loopeval.evaluation.serving.hf.HFServing`, the default: the path lm-eval's
``looped`` model decodes by), or an engine's from a floor above (vLLM's:
:class:`loopeval.engines.vllm_serving.VLLMServing`). The result and its checks are
:mod:`loopeval.evaluation.serving.result`.
"""

from loopeval.evaluation.serving.hf import CACHES, HFServing, check_compile_backend, generation_options
from loopeval.evaluation.serving.clock import Clock
from loopeval.evaluation.serving.measure import serve_cost
from loopeval.evaluation.serving.result import ModelServing, RatioCheck, ServeCost, Spread, plausible_range, read_serve_cost

__all__ = ["CACHES", "Clock", "HFServing", "ModelServing", "RatioCheck", "ServeCost", "Spread", "check_compile_backend",
           "generation_options", "plausible_range", "read_serve_cost", "serve_cost"]
