"""Training manifests: reading them and comparing twins. Torch-free, so the report can use it.

``loopeval.train`` writes ``training_manifest.json`` beside every checkpoint it trains;
it records what a report needs to confirm that two models are twins (hashes of the
data, the initial weights and every batch) and what legitimately differs (the loop,
FLOPs, losses).
"""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST_NAME = "training_manifest.json"
MANIFEST_FORMAT = "loopeval-training/1"

# Manifest fields that legitimately differ between twins: the loop and what it changes,
# and where and when things ran. Paths are covered by the data and weight hashes.
TWIN_DIFFERENCES = ("role", "loop", "flops", "loss_curve", "final_weights_sha256", "train_time_s", "finished_at",
                    "base", "data.path")


def read_manifest(path: str | Path) -> dict:
    """The training manifest of a checkpoint folder (or the manifest file itself)."""
    path = Path(path)
    file = path / MANIFEST_NAME if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no training manifest ({MANIFEST_NAME}); was this checkpoint made by loopeval train?")
    try:
        manifest = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}: not valid JSON ({exc.msg})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{file}: not a {MANIFEST_FORMAT} training manifest")
    return manifest


def find_manifest(checkpoint: str | Path | None) -> dict | None:
    """The manifest beside an evaluated checkpoint, or ``None`` when it has none."""
    if checkpoint is None or not (Path(checkpoint) / MANIFEST_NAME).is_file():
        return None
    return read_manifest(checkpoint)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def twin_mismatches(a: dict, b: dict) -> list[str]:
    """Every difference between two training manifests other than the loop and what it
    legitimately changes (:data:`TWIN_DIFFERENCES`: FLOPs, losses, final weights, timing,
    paths), as ``"field: A != B"`` lines; ``[]`` for true twins."""
    fa, fb = _flatten(a), _flatten(b)
    missing = "<missing>"
    lines = []
    for key in sorted(fa.keys() | fb.keys()):
        if any(key == p or key.startswith(p + ".") for p in TWIN_DIFFERENCES):
            continue
        va, vb = fa.get(key, missing), fb.get(key, missing)
        if va != vb:
            lines.append(f"{key}: {va!r} != {vb!r}")
    return lines
