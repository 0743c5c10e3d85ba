"""Training that feeds checkpoints in: twins by three recipes (paper A.3) and the joint
recipe (companion paper 002), decontamination (A.4) and the token exchange rate (C.2).

* :mod:`~loopeval.training.config`: ``TrainConfig`` (recipe name and options);
* :mod:`~loopeval.training.data`: tokenising, packing, batch order, held-out separation;
* :mod:`~loopeval.training.decontamination`: n-gram decontamination against lm-eval tasks;
* :mod:`~loopeval.training.objectives`: NLL and KL to a teacher;
* :mod:`~loopeval.training.recipes`: ``full``, ``convert`` and ``cpt``;
* :mod:`~loopeval.training.joint`: ``joint`` (companion paper 002), its shared-prefix forward and matched-CE control;
* :mod:`~loopeval.training.runner`: the step loop under ``accelerate``;
* :mod:`~loopeval.training.twins`: ``train_model`` and ``train_twins``.

Manifests (:mod:`loopeval.training.manifest`) and the exchange rate (:mod:`loopeval.training.exchange`)
live outside this package, torch-free, so the report never imports training code; they
are re-exported here. Imports are lazy: ``import loopeval.training`` loads no torch.
"""

from importlib import import_module

_EXPORTS = {
    "TrainConfig": "loopeval.training.config",
    "RECIPES": "loopeval.training.manifest",
    "train_model": "loopeval.training.twins",
    "train_twins": "loopeval.training.twins",
    "TrainResult": "loopeval.training.runner",
    "load_data": "loopeval.training.data",
    "batch_order": "loopeval.training.data",
    "weights_sha256": "loopeval.training.hashing",
    "decontaminate": "loopeval.training.decontamination",
    "read_manifest": "loopeval.training.manifest",
    "twin_mismatches": "loopeval.training.manifest",
    "exchange_rate": "loopeval.training.exchange",
    "training_curves": "loopeval.training.exchange",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'loopeval.training' has no attribute {name!r}")
