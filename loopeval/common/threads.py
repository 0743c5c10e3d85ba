"""How many intra-op threads loopeval's own entry points give torch.

torch starts one OpenMP thread per core. When another job holds some of those cores,
every parallel region waits for a descheduled thread, and a tiny model's step, whose
matrices are too small to gain from a second thread anyway, becomes 15-25x slower
(docs/benchmarks.md, "Threads"). ``configure_threads`` is called once at the start of
``demo``, ``train``, ``place``, ``serve-cost``, each protocol worker and the looped
lm-eval model:

* the user's choice stands: ``LOOPEVAL_THREADS``, ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the
  environment, or a ``torch.set_num_threads`` made before the call (a count other than
  torch's default, one per available core);
* otherwise a model with hidden size below ``SMALL_HIDDEN`` gets one thread, and a larger
  one the cores that are free now: available cores (CPU affinity) less the 1-minute
  load average of the other processes, at least one, shared evenly by ``workers``
  processes.

The first call in a process decides; later calls return its choice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

SMALL_HIDDEN = 512
"""Hidden sizes below this run one thread: measured in docs/benchmarks.md, a second thread
gains little on such matrices alone and costs the most when the cores are shared."""

ENV_VARS = ("LOOPEVAL_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class ThreadChoice:
    """``threads`` torch uses; ``source`` is ``"LOOPEVAL_THREADS"``, ``"OMP_NUM_THREADS"``,
    ``"torch.set_num_threads"`` (the caller's) or ``"policy"``; ``reason`` says why."""

    threads: int
    source: str
    reason: str

    def to_dict(self) -> dict:
        return {"threads": self.threads, "source": self.source, "reason": self.reason}


_CHOICE: ThreadChoice | None = None


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def free_cores() -> int:
    """Available cores less the 1-minute load average (rounded), at least one."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return max(1, min(available_cores(), available_cores() - round(load)))


def policy_threads(hidden_size: int | None, *, workers: int = 1) -> tuple[int, str]:
    """The policy's count and its reason, without the user's settings."""
    if hidden_size is not None and hidden_size < SMALL_HIDDEN:
        return 1, f"hidden size {hidden_size} < {SMALL_HIDDEN}: one thread"
    free = free_cores()
    n = max(1, free // max(1, workers))
    return n, f"{free} of {available_cores()} cores free (1-min load average)" + (
        f", shared by {workers} workers" if workers > 1 else "")


def _hidden_size(model) -> int | None:
    """The hidden size of a model, a config, or a checkpoint path (its config alone is read)."""
    if model is None:
        return None
    if isinstance(model, (str, os.PathLike)):
        from transformers import AutoConfig

        try:
            model = AutoConfig.from_pretrained(str(model))
        except (OSError, ValueError):
            return None
    config = getattr(model, "config", model)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(config, "hidden_size", None)
    return size if isinstance(size, int) else None


def configure_threads(model=None, *, hidden_size: int | None = None, workers: int = 1) -> ThreadChoice:
    """Set torch's intra-op thread count once per process and return the choice.
    ``model`` (a model or its config) or ``hidden_size`` sizes the work; ``workers`` is
    the number of processes sharing the cores."""
    global _CHOICE
    import torch

    if _CHOICE is not None:
        return _CHOICE
    for name in ENV_VARS:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                n = int(value)
            except ValueError:
                raise ValueError(f"{name}={value!r}: expected a whole number of threads >= 1") from None
            if n < 1:
                raise ValueError(f"{name}={value!r}: expected a whole number of threads >= 1")
            torch.set_num_threads(n)
            _CHOICE = ThreadChoice(n, name, f"{name}={n} in the environment")
            return _CHOICE
    current = torch.get_num_threads()
    if current != available_cores():
        _CHOICE = ThreadChoice(current, "torch.set_num_threads", f"set to {current} before loopeval started")
        return _CHOICE
    n, reason = policy_threads(hidden_size if hidden_size is not None else _hidden_size(model), workers=workers)
    torch.set_num_threads(n)
    _CHOICE = ThreadChoice(n, "policy", reason)
    return _CHOICE
