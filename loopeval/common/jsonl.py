"""Reading JSON-lines files whose bad lines are errors that name the file and line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def read_jsonl(path: str | Path, parse: Callable[[int, dict], T | None], *, what: str) -> Iterator[tuple[int, T]]:
    """Yield ``(line number, parse(line number, record))`` for every non-blank line,
    skipping records ``parse`` maps to ``None``. Invalid JSON, or a ``KeyError``,
    ``TypeError`` or ``ValueError`` from ``parse``, raises ``ValueError`` naming
    ``path``, the line and ``what`` the file is."""
    path = Path(path)
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: {what} line is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
            if not line.strip():
                continue
            try:
                value = parse(lineno, json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: corrupt {what} line ({type(exc).__name__}: {exc})") from None
            if value is not None:
                yield lineno, value
