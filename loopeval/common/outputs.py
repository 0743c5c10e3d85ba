"""Outputs never overwrite inputs, and one output folder has one writer at a time.

:func:`check_outputs` refuses, before any work, an output path that is one of the command's
inputs (or a file inside an input folder) or another of its outputs. :func:`folder_lock`
holds ``FOLDER/.loopeval.lock`` (the holder's pid) while a command writes into the folder;
a second command is refused naming that pid, and the lock of a process that died is taken over.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

LOCK_NAME = ".loopeval.lock"


def check_outputs(outputs: Mapping[str, str | Path | None], inputs: Iterable[str | Path | None] = ()) -> None:
    """``outputs`` maps a flag (``--out``) to its path; ``inputs`` are the files and folders read.
    Raises ``ValueError`` naming both flags or the input when two coincide."""
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        resolved = Path(path).resolve()
        if resolved in seen:
            raise ValueError(f"{flag} {path} is also {seen[resolved]}; give each output its own file")
        seen[resolved] = f"{flag} {path}"
    for given in inputs:
        if given is None:
            continue
        source = Path(given).resolve()
        for resolved, where in seen.items():
            if resolved == source or (source.is_dir() and resolved.exists() and source in resolved.parents):
                raise ValueError(f"{where} would overwrite the input {given}"
                                 + ("" if resolved == source else f" (it holds {resolved.name})")
                                 + "; write it elsewhere")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def folder_lock(folder: str | Path, what: str):
    """Hold ``folder``'s lock while the body writes; ``what`` names the command in the refusal."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_NAME
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                holder = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                holder = 0
            if holder and holder != os.getpid() and _alive(holder):
                raise ValueError(f"{what}: {folder} is in use by another loopeval process (pid {holder}); "
                                 f"wait for it, or give another output folder") from None
            lock.unlink(missing_ok=True)  # a dead holder's lock is taken over
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        break
    else:
        raise ValueError(f"{what}: cannot take the lock {lock}")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if lock.read_text().strip() == str(os.getpid()):
                lock.unlink()
