"""Twin training, the public entry points: ``train_model`` and ``train_twins`` (paper §3, A.3).

The equal-parameter test compares a looped model with its twin: the same base checkpoint
trained by the same recipe on the same data, in the same batches and order, for the same
steps, with the same seeds, without the loop. ``train_twins`` trains both; ``train_model``
trains one (looped iff ``loop``), so the two can run as separate jobs and still be
twins. The ``loopeval train`` command calls these, so it and the Python API share one
code path. Everything is checked before any weights load.
"""

from __future__ import annotations

import json
from pathlib import Path

from loopeval.common.outputs import check_not_installed, remove_written
from loopeval.core.loop import resolve_loop
from loopeval.core.spec import LoopConfig, LoopSpec
from loopeval.common.threads import available_cores, check_threads, configure_threads, requested_threads
from loopeval.training.config import TrainConfig
from loopeval.training.data import TrainData, check_separate, load_data
from loopeval.training.manifest import MANIFEST_NAME
from loopeval.training.recipes import Recipe
from loopeval.training.registry import RECIPE_OPERATORS, make_recipe
from loopeval.training.runner import LOOPED, TWIN, TrainResult, check_first_step, train_one


def _previous_run(out: Path) -> list[str]:
    """What the previous training's manifest in ``out`` records writing beside the files
    every run rewrites: its intermediate checkpoints and kept adapters."""
    try:
        manifest = json.loads((out / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(manifest, dict):
        return []
    checkpoints = manifest.get("checkpoints") if isinstance(manifest.get("checkpoints"), list) else []
    return [c["path"] for c in checkpoints if isinstance(c, dict) and isinstance(c.get("path"), str)] + \
        [a for a in [manifest.get("adapters")] if isinstance(a, str)]


def _check_out(out: Path, overwrite: bool) -> None:
    """Refuse a non-empty ``out`` unless ``overwrite``; with it, remove only what an earlier
    training recorded writing there (its checkpoints and adapters, even from an
    interrupted run), never a user's files that happen to share a name pattern."""
    check_not_installed(out, "--out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ValueError(f"output folder {out} exists and is not empty; choose another or pass overwrite=True (--overwrite)")
    if overwrite and out.is_dir():
        remove_written(out, _previous_run(out))


def _resolve(base: str | Path, loop, recipe: str, options: dict) -> LoopConfig | None:
    """The loop to train (``None``: the twin), checked against ``base`` before weights load.
    Twins start from an unlooped checkpoint, so a looped base is refused. A recipe that
    fixes its operator (:data:`loopeval.training.registry.RECIPE_OPERATORS`) gives the
    operator when none is given."""
    stored = resolve_loop(base)
    if stored is not None:
        raise ValueError(f"base checkpoint {base} is looped ({stored.spec}); twins start from an unlooped checkpoint")
    if loop is None:
        return None
    if options.get("operator") is None and recipe in RECIPE_OPERATORS:
        options = {**options, "operator": RECIPE_OPERATORS[recipe]}
    return resolve_loop(base, loop, **options)


def _prepare(base, data, heldout, loops: list[LoopConfig | None], config: TrainConfig,
             keep_adapters: bool) -> tuple[list[Recipe], TrainData, TrainData | None]:
    """One checked recipe per model to train, and the tokenised data and held-out rows."""
    if keep_adapters and config.recipe != "convert":
        raise ValueError(f"keep_adapters: recipe {config.recipe!r} trains no adapters (only convert does)")
    recipes = [make_recipe(config, loop) for loop in loops]
    for recipe in recipes:
        recipe.preflight(base, heldout=heldout)
    if heldout is not None:
        check_separate(data, heldout)
    from transformers import AutoConfig, AutoTokenizer

    if config.max_blocks is not None:
        for recipe, loop in zip(recipes, loops):
            check_first_step(AutoConfig.from_pretrained(base), loop, config, recipe)
    tokenizer = AutoTokenizer.from_pretrained(base)
    pack = config.recipe == "cpt"
    rows = load_data(data, tokenizer, max_length=config.max_length, pack=pack)
    held = load_data(heldout, tokenizer, max_length=config.max_length, pack=pack) if heldout is not None else None
    return recipes, rows, held


def train_model(base: str | Path, data: str | Path, *, out: str | Path, loop: str | LoopSpec | None = None,
                config: TrainConfig | None = None, heldout: str | Path | None = None, accelerator=None,
                overwrite: bool = False, progress: bool = True, keep_adapters: bool = False,
                **loop_options) -> TrainResult:
    """Train the unlooped checkpoint ``base`` on the JSONL file ``data`` by
    ``config.recipe``, looped iff ``loop`` (a spec with the loop options ``operator``, ``beta``,
    ``mix``, ``mix_source`` as in ``apply_loop``), and save it with its
    manifest to ``out``. The recipe sets where its loop starts (``loop-convert``: the
    mix logit at ``mix_init``, learned), and that loop is the one trained and recorded.

    ``heldout`` (JSONL, no row shared with ``data``; required by ``cpt``) is measured at
    every checkpoint. ``keep_adapters`` (``convert``) also saves the unmerged adapters
    to ``out/adapter``. The loop, ``out`` (must be empty unless ``overwrite``), the
    base, the recipe's options and every data row are checked before any weights load.
    """
    config = config or TrainConfig()
    out = Path(out)
    _check_out(out, overwrite)
    looped = _resolve(base, loop, config.recipe, loop_options)
    configure_threads()
    (recipe,), rows, held = _prepare(base, data, heldout, [looped], config, keep_adapters)
    return train_one(base, rows, held, recipe.loop, out, config, recipe, accelerator=accelerator, progress=progress,
                     keep_adapters=keep_adapters)


def train_twins(base: str | Path, data: str | Path, *, loop: str | LoopSpec, out: str | Path,
                config: TrainConfig | None = None, heldout: str | Path | None = None, accelerator=None,
                overwrite: bool = False, progress: bool = True, keep_adapters: bool = False,
                parallel: bool = False, threads: int | None = None, on_trained=None,
                **loop_options) -> tuple[TrainResult, TrainResult]:
    """Train the unlooped twin into ``out/twin`` and the looped model into ``out/looped``,
    each from a fresh load of ``base``, by the same recipe on the same tokenised rows
    and batches (options as in :func:`train_model`). Returns ``(twin, looped)``.
    Everything is checked before the twin starts.

    ``parallel``: train both at once, in two local processes of ``threads`` torch threads
    each (default: ``LOOPEVAL_THREADS``/``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` if set,
    else half the available cores, at least one), a count fixed for the whole
    run, so the weights do not depend on the machine's load. On a CPU with small
    matrices, two one-thread processes use two cores better than one two-thread process.
    Not with an ``accelerator`` (a distributed job trains one side per launch).

    ``on_trained(result)`` is called in this process with each side's result as soon as
    that side is saved, the twin first: with ``parallel``, while the looped model still
    trains (the demo evaluates its twin then). An exception it raises stops the training."""
    if parallel and accelerator is not None:
        raise ValueError("parallel: the twin and the looped model run as two local processes; "
                         "pass no accelerator (a distributed job trains one side: train_model or --only)")
    if threads is not None and not parallel:
        raise ValueError(f"threads={threads!r}: the per-process thread count of parallel=True")
    if parallel:
        requested = requested_threads()
        threads = (check_threads(threads) if threads is not None else
                   requested[0] if requested else max(1, available_cores() // 2))
    else:
        configure_threads()
    config = config or TrainConfig()
    out = Path(out)
    for sub in (TWIN, LOOPED):
        _check_out(out / sub, overwrite)
    looped = _resolve(base, loop, config.recipe, loop_options)
    if looped is None:
        raise ValueError("train_twins needs a loop; train_model(..., loop=None) trains a twin alone")
    (twin_recipe, looped_recipe), rows, held = _prepare(base, data, heldout, [None, looped], config, keep_adapters)
    sides = [(base, rows, held, None, out / TWIN, config, twin_recipe),
             (base, rows, held, looped_recipe.loop, out / LOOPED, config, looped_recipe)]
    if parallel:
        import multiprocessing

        pool = multiprocessing.get_context("spawn").Pool(2)
        try:
            pending = [pool.apply_async(_train_side, (threads, side, dict(progress=progress, keep_adapters=keep_adapters,
                                                                           bar_position=i))) for i, side in enumerate(sides)]
            results = []
            for side in pending:
                results.append(side.get())
                if on_trained is not None:
                    on_trained(results[-1])
        except BaseException:  # Ctrl-C or a failed side: stop the other at once, not after its last step
            pool.terminate()
            raise
        finally:
            pool.close()
            pool.join()
        return results[0], results[1]
    options = dict(accelerator=accelerator, progress=progress, keep_adapters=keep_adapters)
    results = []
    for side in sides:
        results.append(train_one(*side, **options))
        if on_trained is not None:
            on_trained(results[-1])
    return results[0], results[1]


def _train_side(threads: int, side: tuple, options: dict) -> TrainResult:
    """One side of ``train_twins(parallel=True)``, in its own process at ``threads`` threads;
    on Linux it dies with its parent, so a killed run leaves no training behind."""
    import contextlib
    import ctypes
    import signal

    import torch

    with contextlib.suppress(OSError, AttributeError):  # not Linux: the pool's terminate() still stops it on Ctrl-C
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    torch.set_num_threads(threads)
    return train_one(*side, **options)
