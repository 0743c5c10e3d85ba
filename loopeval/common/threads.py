"""How many intra-op threads loopeval's own entry points give torch.

The count changes float reduction order (torch's parallel sums, MKL's small matrix
products), hence outputs: a greedy response, a trained weight, a placement score. So a
run's count is decided once, at its start, before any weights load, and never from the
machine's load, so that a run's outputs do not depend on other processes.
``configure_threads`` is called once at the start of ``demo``, ``train``, ``place``,
``serve-cost``, each protocol worker and the looped lm-eval model:

* the user's choice stands: ``LOOPEVAL_THREADS``, ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the
  environment (a whole number from 1 to ``MAX_PER_CORE`` times the available cores, else
  refused), or a ``torch.set_num_threads`` made before the call (a count other than
  torch's default, one per available core);
* otherwise torch's own default, one thread per available core (what ``--model hf``
  uses), shared evenly by ``workers`` processes.

Idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, set when
``loopeval`` is imported, unless the environment sets it): a spinning thread takes a core
that another job needs, and next to one all-core job training ran 27x slower than alone
with spinning threads, 2x with sleeping ones (docs/benchmarks.md, "Threads"). The policy
decides only what a waiting thread does, never a reduction order, so it changes no output.
The OpenMP runtime reads it once, when it starts (torch's import): where torch was
imported before loopeval, its threads spin, and the warning below says so.

Other processes on the machine slow a run that uses every core (a descheduled thread
holds up each parallel region; docs/benchmarks.md, "Threads"); when a short sample of
``/proc/stat`` finds them busy at the start, a warning names an ``OMP_NUM_THREADS`` that
would leave them their cores (set for every run compared: ``--model hf`` honours it too). The count stays as decided: the user picks speed or
agreement with runs made on an idle machine.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import time
import warnings
from dataclasses import dataclass

from loopeval.common.errors import UserError, whole_number

ENV_VARS = ("LOOPEVAL_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
MAX_PER_CORE = 4
"""A thread count above this many per available core is refused (oversubscription only
slows, and a count in the thousands crashes torch's thread pool)."""
SAMPLE_SECONDS = 0.25
"""How long ``configure_threads`` watches the machine before warning of other processes."""
SLACK = 0.25
"""Cores other processes may use without a warning (system noise)."""


@dataclass(frozen=True)
class ThreadChoice:
    """``threads`` torch uses; ``source`` is ``"LOOPEVAL_THREADS"``, ``"OMP_NUM_THREADS"``,
    ``"MKL_NUM_THREADS"``, ``"torch.set_num_threads"`` (the caller's) or ``"default"``;
    ``reason`` says why."""

    threads: int
    source: str
    reason: str

    def to_dict(self) -> dict:
        return {"threads": self.threads, "source": self.source, "reason": self.reason}


_CHOICE: ThreadChoice | None = None

WAIT_POLICY = "PASSIVE"
"""``OMP_WAIT_POLICY`` for every process loopeval starts or runs in (module docstring)."""
_SPINNING: bool | None = None  # whether the OpenMP runtime had started with another policy when loopeval set it


def set_wait_policy() -> None:
    """Make idle OpenMP threads sleep (:data:`WAIT_POLICY`) unless ``OMP_WAIT_POLICY`` is
    set; effective only before torch is first imported (``loopeval/__init__`` calls it),
    and inherited by every process loopeval starts."""
    global _SPINNING
    if _SPINNING is None:
        _SPINNING = "torch" in sys.modules and "OMP_WAIT_POLICY" not in os.environ
    os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)


def threads_spin() -> bool:
    """Whether this process's idle OpenMP threads spin: torch started before loopeval could
    set :data:`WAIT_POLICY`, or the environment asks for it."""
    asked = os.environ.get("OMP_WAIT_POLICY", "").strip().upper()
    return bool(_SPINNING) or asked == "ACTIVE"


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_threads(value, name: str = "threads") -> int:
    """``value`` (an int, or the text of one) as a thread count, or ``ValueError`` naming
    ``name``: a whole number from 1 to ``MAX_PER_CORE`` times the available cores."""
    n = None
    if isinstance(value, str):
        n = whole_number(value)
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        n = int(value)
    limit = MAX_PER_CORE * available_cores()
    if n is None or not 1 <= n <= limit:
        raise UserError(f"{name}={value!r}: expected a whole number of threads from 1 to {limit} "
                        f"({MAX_PER_CORE} per available core), in ASCII digits", fix=f"set {name} to such a number or unset it")
    return n


def requested_threads() -> tuple[int, str] | None:
    """The user's thread count from the environment and the variable that set it, checked
    (``check_threads``); None when no variable is set."""
    for name in ENV_VARS:
        value = os.environ.get(name, "")
        if value.strip():
            return check_threads(value, name), name
    return None


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


def busy_elsewhere() -> float | None:
    """Cores other processes keep busy over a ``SAMPLE_SECONDS`` sample; None without /proc/stat."""
    before = _snapshot()
    if before is None:
        return None
    time.sleep(SAMPLE_SECONDS)
    return others_busy(before, _snapshot())


def configure_threads(*, workers: int = 1) -> ThreadChoice:
    """Set torch's intra-op thread count once per process and return the choice;
    ``workers`` is the number of processes sharing the cores. A bad environment value is
    refused (``ValueError``) before torch is touched."""
    global _CHOICE
    if _CHOICE is not None:
        return _CHOICE
    requested = requested_threads()
    import torch

    if requested is not None:
        n, name = requested
        torch.set_num_threads(n)
        _CHOICE = ThreadChoice(n, name, f"{name}={n} in the environment")
        return _CHOICE
    current = torch.get_num_threads()
    cores = available_cores()
    if current != cores:
        _CHOICE = ThreadChoice(current, "torch.set_num_threads", f"set to {current} before loopeval started")
        return _CHOICE
    n = max(1, cores // max(1, workers))
    torch.set_num_threads(n)
    _CHOICE = ThreadChoice(n, "default", f"one per available core ({cores})"
                           + (f", shared by {workers} workers" if workers > 1 else ""))
    others = busy_elsewhere()
    taken = 0 if others is None else max(0, math.ceil(others - SLACK))
    free = max(1, (cores - taken) // max(1, workers))
    if free < n:
        warnings.warn(f"other processes keep {others:.1f} of {cores} cores busy; torch uses {n} thread(s) "
                      f"regardless, so outputs match an idle machine's but run slower. OMP_NUM_THREADS={free} "
                      "would leave them their cores; a count changes float rounding, so set it for every run "
                      "you compare (lm_eval --model hf honours it too)", RuntimeWarning, stacklevel=2)
    return _CHOICE
