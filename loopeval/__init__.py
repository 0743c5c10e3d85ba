"""loopeval: does looping a trained language model pay for its inference compute?

The public API is imported lazily so that ``import loopeval`` (and the ``loopeval``
CLI) stays fast; torch and transformers load on first use.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    # loop a model
    "LoopSpec": "loopeval.core.spec",
    "apply_loop": "loopeval.core.loop",
    "remove_loop": "loopeval.core.loop",
    "loop_config": "loopeval.core.loop",
    "load_model": "loopeval.core.checkpoint",
    "save_model": "loopeval.core.checkpoint",
    "loop_cost": "loopeval.core.cost",
    "check_cache": "loopeval.core.cache_check",
    # train twins
    "TrainConfig": "loopeval.training",
    "train_twins": "loopeval.training",
    # compare evaluations (baseline first)
    "load_run": "loopeval.analysis.runs",
    "pair_runs": "loopeval.analysis.runs",
    "compare": "loopeval.analysis.protocol",
    "delta_param": "loopeval.analysis.protocol",
    "delta_flop": "loopeval.analysis.protocol",
    "verdict": "loopeval.analysis.protocol",
    # report
    "build_report": "loopeval.analysis.report",
    "write_report": "loopeval.analysis.report",
    "render": "loopeval.analysis.report",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'loopeval' has no attribute {name!r}")
