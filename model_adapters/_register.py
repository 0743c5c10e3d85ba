"""Register lm-eval's ``looped`` model at start-up, with no flag and no wrapper command.

lm-eval 0.4.13 does not read entry points, and its registry imports the built-in
models only while it is empty, so registering early would hide them. Instead, the
installed ``loopeval-lm-eval.pth`` imports this module at interpreter start-up; it
waits for ``lm_eval.models`` to be imported and then adds ``looped`` as a lazy
placeholder, as lm-eval does for its own models.

Registering also installs :func:`excepthook`: a loopeval refusal
(:class:`loopeval.common.errors.UserError`) that reaches the top of an ``lm_eval`` run
prints its one-line message alone, not lm-eval's traceback (the process exits with 1,
as on any uncaught exception).

Every Python start in the environment runs this, so it imports nothing but ``sys``:
the finder is duck-typed rather than an ``importlib.abc.MetaPathFinder``, whose import
alone costs milliseconds.
"""

import sys

TARGET = "lm_eval.models"
PLACEHOLDER = "loopeval.model_adapters.looped:LoopedLM"


def excepthook(kind, value, traceback, _previous=sys.excepthook):
    """``sys.excepthook`` that prints a :class:`~loopeval.common.errors.UserError` as its message alone."""
    from loopeval.common.errors import UserError

    if isinstance(value, UserError):
        print(value, file=sys.stderr)
        return
    _previous(kind, value, traceback)


def register(module=None) -> None:
    from lm_eval.api.registry import model_registry

    if "looped" not in model_registry:
        model_registry.register("looped", target=PLACEHOLDER)
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = excepthook


class _AfterImport:
    """A meta path finder that runs :func:`register` right after ``lm_eval.models`` executes."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            register(module)

        spec.loader.exec_module = exec_then_register
        return spec


def install() -> None:
    if TARGET in sys.modules:
        register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


install()
