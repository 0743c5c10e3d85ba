"""Training manifests: reading them and comparing twins. Torch-free, so the report can use it.

``loopeval.training`` writes ``training_manifest.json`` beside every checkpoint it trains;
it records what a report needs to confirm that two models are twins (hashes of the
data, the initial weights, the adapters' initialisation and every batch) and what
legitimately differs (the loop, its draws and its cost, and the results).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MANIFEST_NAME = "training_manifest.json"
MANIFEST_FORMAT = "loopeval-training/2"
_READABLE = (MANIFEST_FORMAT, "loopeval-training/1")  # format 1: full fine-tunes before recipes existed

RECIPES = ("full", "convert", "cpt", "joint", "loop-convert")
"""Training recipes (paper A.3): full fine-tuning, LoRA conversion through the loop,
and continued pretraining through the loop; ``joint`` (companion paper 002): the single
pass and the looped output of one model at once; ``loop-convert`` (companion paper
004): dense-to-loop conversion with learned input mixing and a smoothed exit loss."""


@dataclass(frozen=True)
class TwinRule:
    """What two manifests of one recipe may differ in and still be twins.

    ``may_differ``: the loop and what it changes (its draws, its cost, the losses and
    weights it leads to) and where and when training ran (paths are covered by hashes).
    ``must_share``: evidence both twins must carry, equal (missing from both is a
    mismatch too). Every other field must be equal where either manifest has it.
    ``capped``: fields that may also differ, and need not be shared, when a budget cap
    (``max_blocks``, ``max_seconds``) stopped either side early: then the sides ran
    different numbers of steps of the same batch stream (equal budgets, not equal steps).
    """

    may_differ: tuple[str, ...]
    must_share: tuple[str, ...]
    capped: tuple[str, ...] = ("budget", "batches_sha256", "tokens")


_LOOP = ("role", "loop", "flops", "blocks")
_RESULTS = ("loss_curve", "heldout_curve", "final_weights_sha256")
_RUN = ("base", "data.path", "heldout.path", "train_time_s", "step_seconds", "finished_at", "checkpoints", "adapters")
_SHARED = ("base_weights_sha256", "data.sha256", "batches_sha256", "tokens")

TWIN_RULES = {
    "full": TwinRule(_LOOP + _RESULTS + _RUN, _SHARED),
    # the curriculum's draws switch the loop on and off; the KL and NLL terms are results
    "convert": TwinRule(_LOOP + ("loop_draws", "loss_terms") + _RESULTS + _RUN,
                        _SHARED + ("lora.init_sha256", "lora.modules", "parameters")),
    # random depth draws the loop's passes per batch; both twins measure the same held-out rows
    "cpt": TwinRule(_LOOP + ("loop_draws",) + _RESULTS + _RUN, _SHARED + ("heldout.sha256",)),
    # the twin is ordinary single-pass CE at the same total weight (loopeval.training.joint); the looped
    # side's terms are per path
    "joint": TwinRule(_LOOP + ("loss_terms",) + _RESULTS + _RUN, _SHARED),
    # 004's twin: "Qwen3-1.7B-Base continued on exactly the same data for the same number of
    # steps" (the same recipe without the loop, i.e. on the plain NLL). The loop adds the exit
    # gate and the mix logit (parameters.added), its exit distribution and its loss terms.
    "loop-convert": TwinRule(_LOOP + ("loss_terms", "exit", "mix", "parameters.added") + _RESULTS + _RUN,
                             _SHARED + ("parameters.base",)),
}


def read_manifest(path: str | Path) -> dict:
    """The training manifest of a checkpoint folder (or the manifest file itself)."""
    path = Path(path)
    file = path / MANIFEST_NAME if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no training manifest ({MANIFEST_NAME}); was this checkpoint made by loopeval train?")
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in _READABLE:
        raise ValueError(f"{file}: not a {MANIFEST_FORMAT} training manifest")
    return manifest


def find_manifest(checkpoint: str | Path | None) -> dict | None:
    """The manifest beside an evaluated checkpoint, or ``None`` when it has none."""
    if checkpoint is None or not (Path(checkpoint) / MANIFEST_NAME).is_file():
        return None
    return read_manifest(checkpoint)


def manifest_recipe(manifest: dict) -> str:
    """The recipe a manifest was trained with (format 1 manifests are full fine-tunes)."""
    return manifest.get("recipe", "full")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _under(key: str, fields: tuple[str, ...]) -> bool:
    return any(key == f or key.startswith(f + ".") for f in fields)


def twin_mismatches(a: dict, b: dict) -> list[str]:
    """Every way two training manifests fail to be twins under their recipe's
    :class:`TwinRule` (:data:`TWIN_RULES`), as ``"field: A != B"`` lines; ``[]`` for twins.

    Manifests of different recipes are never twins. The arguments are symmetric.
    """
    recipe_a, recipe_b = manifest_recipe(a), manifest_recipe(b)
    if recipe_a != recipe_b:
        return [f"recipe: {recipe_a!r} != {recipe_b!r}"]
    if recipe_a not in TWIN_RULES:
        return [f"recipe: {recipe_a!r} is not one of {', '.join(RECIPES)}"]
    rule = TWIN_RULES[recipe_a]
    capped = tuple(rule.capped) if any((m.get("budget") or {}).get("stopped_by") for m in (a, b)) else ()
    fa, fb = _flatten(a), _flatten(b)
    # evidence missing from one side shows below as "<missing>"; missing from both, here
    lines = [f"{field}: missing from both manifests" for field in rule.must_share
             if field not in capped and not any(_under(k, (field,)) for k in fa.keys() | fb.keys())]
    missing = "<missing>"
    reported: tuple[str, ...] = ()
    for key in sorted(fa.keys() | fb.keys()):
        if _under(key, rule.may_differ + capped + reported):  # a field already reported whole (a value against an object)
            continue
        va, vb = fa.get(key, missing), fb.get(key, missing)
        if va != vb:
            lines.append(f"{key}: {va!r} != {vb!r}")
            reported += (key,)
    return lines
