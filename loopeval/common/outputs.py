"""Outputs never overwrite inputs, and one output folder has one writer at a time.

:func:`check_outputs` refuses, before any work, an output path that is one of the command's
inputs (or a file inside an input folder) or another of its outputs. :func:`folder_lock`
holds ``FOLDER/.loopeval.lock`` (the holder's host, pid and process start time) while a
command writes into the folder; a second command is refused naming the holder, and a lock
is taken over only when its holder is provably gone.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import socket
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from loopeval.common.errors import UserError
from loopeval.common.jsonl import append_jsonl, read_jsonl, repair_tail
from loopeval.common.paths import installed_folders

LOCK_NAME = ".loopeval.lock"
PID_LIMIT = 2 ** 22
"""The largest pid Linux hands out on any host (``PID_MAX_LIMIT``); a lock naming a pid
outside 1..PID_LIMIT was not written by loopeval."""
WRITTEN_NAME = ".loopeval_written.jsonl"
"""The paths (relative to its folder) a command records before writing them, so that
``--overwrite`` removes only what loopeval wrote (:func:`record_written`)."""


def check_outputs(outputs: Mapping[str, str | Path | None], inputs: Iterable[str | Path | None] = ()) -> None:
    """``outputs`` maps a flag (``--out``) to its path; ``inputs`` are the files and folders read.
    Raises ``ValueError`` naming both flags or the input when two coincide, or when an
    output lies in one of loopeval's installed folders (:func:`check_not_installed`)."""
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        check_not_installed(path, flag)
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


def check_not_installed(path: str | Path, flag: str) -> None:
    """Refuse an output ``path`` inside loopeval's installed folders (its own task YAMLs,
    templates and code would be overwritten until a reinstall)."""
    resolved = Path(path).resolve()
    for folder in installed_folders():
        if resolved == folder or folder in resolved.parents:
            raise ValueError(f"{flag} {path} is inside loopeval's installed folder {folder}; write it elsewhere")


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux ``/proc``), or ``None``
    where it cannot be read; with the boot id it names one process, even after its pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])  # field 22; the name before ")" may hold spaces


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _me() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot": _boot_id(), "pid": pid, "started": _start_time(pid),
            "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_holder(text: str) -> dict | None:
    """The holder a lock file names, or ``None`` when loopeval did not write ``text``: a JSON
    object with a ``host`` (text), a ``pid`` (a whole number from 1 to
    ``PID_LIMIT``), and optionally a ``boot`` and ``since`` (text) and a ``started`` (a whole
    number); a lock of loopeval before issue 32 holds such a bare pid."""
    try:
        holder = json.loads(text)
    except ValueError:
        return None
    if _is_int(holder):
        holder = {"host": socket.gethostname(), "boot": _boot_id(), "pid": holder, "started": None}
    if not isinstance(holder, dict) or not isinstance(holder.get("host"), str) or not _is_int(holder.get("pid")):
        return None
    if not 1 <= holder["pid"] <= PID_LIMIT:
        return None
    optional = {"boot": str, "since": str, "started": int}
    if any(holder.get(k) is not None and not (isinstance(holder[k], kind) and not isinstance(holder[k], bool))
           for k, kind in optional.items()):
        return None
    return holder


def _gone(holder: dict) -> bool:
    """Whether the holder is provably gone: on this host (same boot) its pid is free or now
    belongs to a process started at another time; or this host has rebooted since."""
    if holder["host"] != socket.gethostname():
        return False  # another machine's process cannot be seen from here
    if holder.get("boot") and _boot_id() and holder["boot"] != _boot_id():
        return True
    if not _alive(holder["pid"]):
        return True
    started = holder.get("started")
    return started is not None and _start_time(holder["pid"]) not in (None, started)


_held: dict[Path, int] = {}
"""The folders this process holds the lock of, with their nesting depth (a demo holds its
folder while the study runner inside it takes the same lock)."""


@contextlib.contextmanager
def folder_lock(folder: str | Path, what: str):
    """Hold ``folder``'s lock while the body writes; ``what`` names the command in the refusal.

    The lock file names the holder's host, boot, pid and process start time, and is put in
    place whole (a hard link of a written file, atomic also on NFS). A lock is taken over
    only when its holder is provably gone (:func:`_gone`); a holder on another host, or a
    lock file that cannot be read, is refused with the file to delete if no loopeval
    process uses the folder. The same process may take a lock it holds again.
    """
    folder = Path(folder)
    check_not_installed(folder, what)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_NAME
    key = lock.resolve()
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    me = _me()
    mine = json.dumps(me)
    for _ in range(3):
        staging = folder / f"{LOCK_NAME}.{me['host']}.{me['pid']}"
        staging.write_text(mine)
        try:
            os.link(staging, lock)
            taken = True
        except FileExistsError:
            taken = False
        finally:
            staging.unlink(missing_ok=True)
        if taken:
            break
        try:
            text = lock.read_bytes().decode("utf-8")
        except FileNotFoundError:
            continue  # released meanwhile
        except OSError as exc:
            raise UserError(f"{what}: cannot read the lock {lock} ({exc})") from None
        except UnicodeDecodeError:
            text = None
        holder = None if text is None else _read_holder(text)
        if holder is None:
            shown = repr(text[:60]) if text is not None else "not UTF-8 text"
            raise UserError(f"{what}: {lock} is not a lock written by loopeval ({shown}; loopeval writes "
                            f"a JSON object naming host and pid, a pid from 1 to {PID_LIMIT})",
                            fix=f"if no loopeval process uses {folder}, delete {lock}") from None
        if not _gone(holder):
            where = "" if holder["host"] == me["host"] else f" on host {holder['host']}"
            since = f", since {holder['since']}" if holder.get("since") else ""
            hint = "" if not where else (f"; loopeval cannot tell from {me['host']} whether it still runs: "
                                         f"if it does not, delete {lock}")
            raise ValueError(f"{what}: {folder} is in use by another loopeval process (pid {holder['pid']}{where}"
                             f"{since}); wait for it, or give another output folder{hint}") from None
        _take_over(lock, text)
    else:
        raise ValueError(f"{what}: cannot take the lock {lock}")
    _held[key] = 1
    try:
        yield
    finally:
        del _held[key]
        with contextlib.suppress(OSError):
            if lock.read_text() == mine:
                lock.unlink()


def _take_over(lock: Path, stale: str) -> None:
    """Remove the stale lock ``stale``; a fresh lock another process put there meanwhile is put back."""
    moved = lock.with_name(f"{lock.name}.stale.{os.getpid()}")
    try:
        os.rename(lock, moved)
    except FileNotFoundError:
        return
    if moved.read_text() != stale:
        with contextlib.suppress(FileExistsError):
            os.link(moved, lock)
    moved.unlink()


def aside(folder: str | Path, stem: str | None = None) -> Path:
    """A new, empty folder ``folder/.replaced/STEM.TIME`` (``TIME`` alone without a stem) to
    move superseded results into; a name already taken (two moves within one second) gets
    ``-2``, ``-3``, ... so that nothing moved aside earlier is overwritten or refused. A file
    (not a folder) named ``.replaced`` is refused, naming it, before anything moves."""
    base = Path(folder) / ".replaced"
    if (base.exists() or base.is_symlink()) and not base.is_dir():
        raise UserError(f"{base} is not a folder: loopeval moves superseded results into a folder of that name",
                        fix="move or delete that file, then run again")
    base.mkdir(parents=True, exist_ok=True)
    name = ".".join(filter(None, (stem, time.strftime("%Y%m%dT%H%M%S"))))
    for n in itertools.count(1):
        candidate = base / (name if n == 1 else f"{name}-{n}")
        with contextlib.suppress(FileExistsError):
            candidate.mkdir()
            return candidate


def record_written(folder: str | Path, name: str) -> None:
    """Record, before writing it, that loopeval writes ``folder/name`` (a file or folder)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    append_jsonl(Path(folder) / WRITTEN_NAME, [name])


def remove_written(folder: str | Path, names: Iterable[str] = ()) -> list[str]:
    """Remove what :func:`record_written` recorded in ``folder`` and the entries ``names``
    (e.g. a manifest's record), then the record itself; return the names removed. Only
    direct entries of ``folder`` are removed: a recorded name with a path separator or
    ``..`` is ignored, and nothing else in the folder is touched."""
    folder = Path(folder)
    ledger = folder / WRITTEN_NAME
    recorded = list(names)
    if ledger.is_file():
        repair_tail(ledger)
        recorded += [name for _, name in read_jsonl(ledger, lambda lineno, name: name, what="written-files")]
    removed = []
    for name in dict.fromkeys(recorded):
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            continue
        target = folder / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        else:
            continue
        removed.append(name)
    ledger.unlink(missing_ok=True)
    ledger.with_name(ledger.name + ".cut").unlink(missing_ok=True)
    return removed
