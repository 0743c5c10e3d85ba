"""loopeval: does looping a trained language model pay for its inference compute?

The public API is imported lazily so that ``import loopeval`` (and the ``loopeval``
CLI) stays fast; torch and transformers load on first use.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    # loop a model
    "LoopSpec": "loopeval.loop",
    "apply_loop": "loopeval.loop",
    "remove_loop": "loopeval.loop",
    "loop_config": "loopeval.loop",
    "load_model": "loopeval.checkpoint",
    "save_model": "loopeval.checkpoint",
    "loop_cost": "loopeval.cost",
    "check_cache": "loopeval.cache_check",
    # train twins
    "TrainConfig": "loopeval.training",
    "train_twins": "loopeval.training",
    # compare evaluations (baseline first)
    "load_run": "loopeval.runs",
    "pair_runs": "loopeval.runs",
    "compare": "loopeval.protocol",
    "delta_param": "loopeval.protocol",
    "delta_flop": "loopeval.protocol",
    "verdict": "loopeval.protocol",
    # report
    "build_report": "loopeval.report",
    "write_report": "loopeval.report",
    "render": "loopeval.report",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'loopeval' has no attribute {name!r}")
