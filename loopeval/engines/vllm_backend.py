"""The vLLM backend of lm-eval's ``looped`` model (``engine=vllm``), before loading.

:class:`VLLMBackend` tells the session (:class:`loopeval.evaluation.session.Session`) the
model args vLLM takes (lm-eval's ``vllm`` model's and ``LLM``'s engine args: so
``tensor_parallel_size``, ``data_parallel_size``, ``gpu_memory_utilization`` ... pass
through) and refuses, before any weights load, what the engine does not run: a GGUF file,
an exit gate, an architecture without a looped vLLM class, a device vLLM does not place
itself on. Loading gives :class:`loopeval.engines.vllm_lm.VLLMLooped`. The HF path's
cache check does not apply (the engine's exactness is tested in tests/engines).
"""

from __future__ import annotations

from pathlib import Path

from loopeval.common.errors import UserError
from loopeval.core.exit_gate import EXIT_GATE_NAME
from loopeval.engines.vllm_engine import INSTALL, engine_version


class VLLMBackend:
    """The ``vllm`` backend (:class:`loopeval.evaluation.session.Backend`)."""

    name = "vllm"
    engine = "vllm"

    def version(self) -> str:
        try:
            return engine_version()
        except ImportError:
            raise UserError(f"looped: engine=vllm: {INSTALL}") from None

    def model_args(self) -> set[str]:
        import dataclasses
        import inspect

        self.version()  # names the install when vLLM is missing
        from vllm.engine.arg_utils import EngineArgs

        from loopeval.engines.vllm_lm import VLLM

        own = {p for p in inspect.signature(VLLM.__init__).parameters if p not in ("self", "kwargs")}
        # device: lm-eval's own flag (vLLM ignores it); gguf_file: refused by check() with its reason
        return own | {f.name for f in dataclasses.fields(EngineArgs) if f.name != "model"} | {"device", "gguf_file"}

    def check(self, session) -> None:
        from transformers import AutoConfig

        from loopeval.engines.vllm_models import looped_architecture

        raw, pretrained = session.raw, session.pretrained
        device = str(raw.get("device") or "")
        if device.startswith("cuda:") and device != "cuda:0":
            raise ValueError(f"device={device}: vLLM places itself on the GPUs that CUDA_VISIBLE_DEVICES shows; "
                             "set that (or tensor_parallel_size=, data_parallel_size=) instead, and run one "
                             "loopeval protocol worker per engine")
        if raw.get("gguf_file") is not None:
            raise ValueError("engine=vllm reads a float checkpoint folder, not gguf_file=; "
                             "convert it first with loopeval import-gguf")
        if session.loop is None:
            return
        if (Path(str(pretrained)) / EXIT_GATE_NAME).is_file():
            raise ValueError(f"{pretrained} carries an exit gate ({EXIT_GATE_NAME}); the vLLM engine "
                             "does not run exit gates: drop engine=vllm")
        config = AutoConfig.from_pretrained(pretrained, revision=raw.get("revision"),
                                            trust_remote_code=raw.get("trust_remote_code", False))
        looped_architecture((config.architectures or ["?"])[0])

    def load(self, session):
        from loopeval.engines.vllm_lm import VLLMLooped

        return VLLMLooped(session)
