"""How many intra-op threads loopeval's own entry points give torch.

torch starts one OpenMP thread per core. When another job holds some of those cores,
every parallel region waits for a descheduled thread, and a step becomes 15-25x slower
(docs/benchmarks.md, "Threads"). ``configure_threads`` is called once at the start of
``demo``, ``train``, ``place``, ``serve-cost``, each protocol worker and the looped
lm-eval model:

* the user's choice stands: ``LOOPEVAL_THREADS``, ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the
  environment, or a ``torch.set_num_threads`` made before the call (a count other than
  torch's default, one per available core);
* otherwise the cores that are free now: available cores (CPU affinity) less the cores
  other processes used over a short sample of ``/proc/stat`` (this process's own CPU
  time is not counted against it), at least one, shared evenly by ``workers`` processes.
  Where ``/proc/stat`` cannot be read, the 1-minute load average stands in for the sample.

Long loops (training steps, placement candidates) call ``adjust_threads`` as they go: a
policy choice is re-measured over the time since the last look (every
``RECHECK_SECONDS`` at most, no extra waiting), so a job that starts next to loopeval
later takes its threads back within seconds, and they return when it ends. The first
``configure_threads`` in a process decides the source; later calls return the current
choice.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

ENV_VARS = ("LOOPEVAL_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
SAMPLE_SECONDS = 0.25
"""How long ``configure_threads`` watches the machine before choosing."""
RECHECK_SECONDS = 2.0
"""The shortest interval between two looks of ``adjust_threads``."""
SLACK = 0.25
"""Cores other processes may use without taking a thread away (system noise)."""


@dataclass(frozen=True)
class ThreadChoice:
    """``threads`` torch uses; ``source`` is ``"LOOPEVAL_THREADS"``, ``"OMP_NUM_THREADS"``,
    ``"MKL_NUM_THREADS"``, ``"torch.set_num_threads"`` (the caller's) or ``"policy"``;
    ``reason`` says why."""

    threads: int
    source: str
    reason: str

    def to_dict(self) -> dict:
        return {"threads": self.threads, "source": self.source, "reason": self.reason}


_CHOICE: ThreadChoice | None = None
_WORKERS = 1
_LAST: tuple[float, float, float, float] | None = None  # wall, busy jiffies, all jiffies, own CPU s


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _snapshot() -> tuple[float, float, float, float] | None:
    """(wall, busy jiffies, all jiffies, this process's CPU seconds), or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    if len(fields) < 4:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    times = os.times()
    return time.monotonic(), sum(fields) - idle, sum(fields), times.user + times.system


def others_busy(before, after) -> float:
    """Cores that processes other than this one kept busy between two snapshots."""
    wall = after[0] - before[0]
    total = after[2] - before[2]
    if wall <= 0 or total <= 0:
        return 0.0
    machine = (after[1] - before[1]) / total * (os.cpu_count() or 1)
    own = (after[3] - before[3]) / wall
    return max(0.0, machine - own)


def free_cores(others: float | None = None) -> tuple[int, str]:
    """Available cores less those other processes use (sampled for ``SAMPLE_SECONDS`` when
    ``others`` is not given), at least one, and how it was measured."""
    global _LAST
    if others is None:
        before = _snapshot()
        if before is not None:
            time.sleep(SAMPLE_SECONDS)
            _LAST = _snapshot()
            others = others_busy(before, _LAST)
    if others is None:
        try:
            others, how = os.getloadavg()[0], "1-min load average"
        except (AttributeError, OSError):
            others, how = 0.0, "no load measure"
    else:
        how = f"other processes busy on {others:.2f} cores"
    cores = available_cores()
    taken = max(0, math.ceil(others - SLACK))
    return max(1, min(cores, cores - taken)), how


def policy_threads(*, workers: int = 1, others: float | None = None) -> tuple[int, str]:
    """The policy's count and its reason, without the user's settings."""
    free, how = free_cores(others)
    n = max(1, free // max(1, workers))
    return n, f"{free} of {available_cores()} cores free ({how})" + (
        f", shared by {workers} workers" if workers > 1 else "")


def configure_threads(*, workers: int = 1) -> ThreadChoice:
    """Set torch's intra-op thread count once per process and return the choice;
    ``workers`` is the number of processes sharing the cores."""
    global _CHOICE, _WORKERS
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
    _WORKERS = workers
    n, reason = policy_threads(workers=workers)
    torch.set_num_threads(n)
    _CHOICE = ThreadChoice(n, "policy", reason)
    return _CHOICE


def adjust_threads() -> ThreadChoice | None:
    """Re-measure a policy choice over the time since the last look (at most every
    ``RECHECK_SECONDS``) and set torch's count to the cores free now. A user's setting,
    or no ``configure_threads`` yet, is left alone (returns None)."""
    global _CHOICE, _LAST
    if _CHOICE is None or _CHOICE.source != "policy":
        return None
    now = time.monotonic()
    if _LAST is not None and now - _LAST[0] < RECHECK_SECONDS:
        return _CHOICE
    snap = _snapshot()
    if snap is None:
        return _CHOICE
    if _LAST is None:
        _LAST = snap
        return _CHOICE
    others = others_busy(_LAST, snap)
    _LAST = snap
    n, reason = policy_threads(workers=_WORKERS, others=others)
    if n != _CHOICE.threads:
        import torch

        torch.set_num_threads(n)
        _CHOICE = ThreadChoice(n, "policy", reason)
    return _CHOICE
