"""JSON-lines files: reading them with errors that name the file and line, and appending
to them so that a crash never costs a record already written.

A crash can cut the last line of a file being appended to. :func:`append_jsonl` starts
every record on a fresh line, and :func:`repair_tail` (which it runs first) moves a cut
last line into ``FILE.cut``, where it can still be read, so the file stays readable and
the next record does not land on the cut one. Both hold an exclusive ``flock`` on the
file, so two processes appending to one file never interleave or repair each other's
line mid-write.
"""

from __future__ import annotations

import fcntl
import json
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def read_jsonl(path: str | Path, parse: Callable[[int, dict], T | None], *, what: str,
               byte_order_mark: bool = False) -> Iterator[tuple[int, T]]:
    """Yield ``(line number, parse(line number, record))`` for every non-blank line,
    skipping records ``parse`` maps to ``None``. Invalid JSON, or a ``KeyError``,
    ``TypeError`` or ``ValueError`` from ``parse``, raises ``ValueError`` naming
    ``path``, the line and ``what`` the file is. ``byte_order_mark``: a UTF-8 byte-order
    mark before the first line is read as lm-eval's loader reads it (data files; loopeval
    writes none in its own)."""
    path = Path(path)
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and byte_order_mark:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
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


CUT_SUFFIX = ".cut"


def _repair_locked(fd: int, path: Path) -> Path | None:
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return None
    data = os.pread(fd, size, 0)
    start = data.rfind(b"\n") + 1
    tail = data[start:]
    try:
        json.loads(tail)
    except ValueError:  # cut mid-record (a JSON or UTF-8 error): move it aside
        cut = path.with_name(path.name + CUT_SUFFIX)
        with cut.open("ab") as f:
            f.write(tail + b"\n")
        os.ftruncate(fd, start)
        warnings.warn(f"{path}: its last line was cut (a crash while writing?); moved it to {cut}", stacklevel=4)
        return cut
    os.pwrite(fd, b"\n", size)  # a whole record that lost only its newline
    return None


def repair_tail(path: str | Path) -> Path | None:
    """Make ``path`` end with a whole line: a last line without its newline gets one if it
    is a whole JSON record, and otherwise is moved to ``path.cut`` (returned, with a
    warning naming both files). A missing file is left alone."""
    path = Path(path)
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _repair_locked(fd, path)
    finally:
        os.close(fd)


def append_jsonl(path: str | Path, records: list) -> None:
    """Append ``records`` to ``path``, one JSON line each, in one write after
    :func:`repair_tail`; the file is created if missing."""
    path = Path(path)
    payload = "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _repair_locked(fd, path)
        while payload:
            payload = payload[os.write(fd, payload):]
    finally:
        os.close(fd)
