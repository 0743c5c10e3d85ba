"""loopeval: does looping a trained language model pay for its inference compute?

The public API is imported lazily so that ``import loopeval`` (and the ``loopeval``
CLI) stays fast; torch and transformers load on first use.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "LoopSpec": "loopeval.loop",
    "apply_loop": "loopeval.loop",
    "remove_loop": "loopeval.loop",
    "loop_config": "loopeval.loop",
    "load_model": "loopeval.checkpoint",
    "save_model": "loopeval.checkpoint",
    "loop_cost": "loopeval.cost",
    "LoopCost": "loopeval.cost",
    "check_cache": "loopeval.cache_check",
    "CacheCheckResult": "loopeval.cache_check",
    "load_run": "loopeval.runs",
    "pair_runs": "loopeval.runs",
    "delta_param": "loopeval.protocol",
    "delta_flop": "loopeval.protocol",
    "verdict": "loopeval.protocol",
    "train_twins": "loopeval.train",
    "TrainConfig": "loopeval.train",
    "build_report": "loopeval.report",
    "render": "loopeval.report",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'loopeval' has no attribute {name!r}")
