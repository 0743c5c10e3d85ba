"""Where the shipped data folders live, in a checkout and in an installed wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent  # loopeval/


def _shipped(name: str) -> Path:
    # A wheel carries the folder inside the package; a checkout or editable install has it
    # at the repository root, beside the package.
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"loopeval's {name}/ folder is missing from {_PACKAGE} and {_PACKAGE.parent}")


def tasks_path() -> Path:
    """The folder of lm-eval task YAMLs, for ``lm_eval --include_path``."""
    return _shipped("tasks")


def reports_path() -> Path:
    """The folder of Jinja2 report templates."""
    return _shipped("reports")


def installed_folders() -> list[Path]:
    """loopeval's own folders (the package, ``tasks/``, ``reports/``): no command writes into
    them (``loopeval.common.outputs.check_outputs``)."""
    return [_PACKAGE, _shipped("tasks"), _shipped("reports")]
