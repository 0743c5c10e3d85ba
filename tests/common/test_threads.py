"""The thread rule: the user's setting stands (checked); otherwise one thread per core,
never a count read from the machine's load, so outputs do not depend on other processes."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from loopeval.common import threads
from support import busy_machine


@pytest.fixture
def fresh(monkeypatch):
    """A process state where no call has decided yet, torch at its default, no env setting,
    8 cores; torch's thread count is restored afterwards."""
    saved = torch.get_num_threads()
    monkeypatch.setattr(threads, "_CHOICE", None)
    for name in threads.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    torch.set_num_threads(8)
    yield monkeypatch
    torch.set_num_threads(saved)


def machine(fresh, *snapshots):
    """Make ``_snapshot`` return these (wall, busy, all, own) tuples in turn."""
    it = iter(snapshots)
    fresh.setattr(threads, "_snapshot", lambda: next(it))


def test_environment_setting_is_honoured(fresh):
    fresh.setenv("OMP_NUM_THREADS", "3")
    choice = threads.configure_threads()
    assert (choice.threads, choice.source, torch.get_num_threads()) == (3, "OMP_NUM_THREADS", 3)


def test_explicit_torch_setting_is_honoured(fresh):
    torch.set_num_threads(5)
    choice = threads.configure_threads()
    assert (choice.threads, choice.source, torch.get_num_threads()) == (5, "torch.set_num_threads", 5)


@pytest.mark.parametrize("busy, own, workers, expected, warns", [
    (0.0, 0.0, 1, 8, False),     # idle
    (2.0, 2.0, 1, 8, False),     # only this process is busy
    (0.2, 0.0, 1, 8, False),     # noise below SLACK
    (2.6, 0.0, 1, 8, True),      # 2.6 cores used by others: the count stays, a warning names 5
    (8.0, 0.0, 1, 8, True),      # all of them
    (0.0, 0.0, 3, 2, False),     # shared by three workers
])
def test_the_count_never_follows_the_load(fresh, busy, own, workers, expected, warns, recwarn):
    # two snapshots 1 s apart on 8 cores: 800 jiffies in all, `busy` cores' worth busy
    machine(fresh, (0.0, 0.0, 0.0, 0.0), (1.0, busy * 100, 800.0, own))
    choice = threads.configure_threads(workers=workers)
    assert (choice.threads, choice.source, torch.get_num_threads()) == (expected, "default", expected)
    messages = [str(w.message) for w in recwarn.list if w.category is RuntimeWarning]
    assert bool(messages) == warns
    if busy == 2.6:
        assert "OMP_NUM_THREADS=5" in messages[0]


def test_first_call_decides(fresh):
    machine(fresh, (0.0, 0.0, 0.0, 0.0), (1.0, 0.0, 800.0, 0.0))
    first = threads.configure_threads()
    assert threads.configure_threads(workers=4) is first and torch.get_num_threads() == 8


@pytest.mark.parametrize("value", ["two", "0", "-1", "2.5", "33", "100000"])
def test_bad_environment_value_is_refused_before_torch_is_set(fresh, value):
    fresh.setenv("LOOPEVAL_THREADS", value)
    with pytest.raises(ValueError, match=rf"LOOPEVAL_THREADS='{value}': expected a whole number of threads from 1 to 32"):
        threads.configure_threads()
    assert torch.get_num_threads() == 8 and threads._CHOICE is None


@pytest.mark.parametrize("value, ok", [(1, True), (32, True), ("4", True), (0, False), (33, False), (2.5, False),
                                       (2.0, False), (True, False), (None, False)])
def test_check_threads(fresh, value, ok):
    if ok:
        assert threads.check_threads(value) == int(value)
    else:
        with pytest.raises(ValueError, match=rf"threads={value!r}"):
            threads.check_threads(value)


def test_snapshot_reads_this_machine():
    """On Linux, a real sample: this process's busy loop is its own, not another's."""
    before = threads._snapshot()
    if before is None:
        pytest.skip("no /proc/stat on this platform")
    end = time.process_time() + 0.3
    spins = 0
    while time.process_time() < end:  # keep this process busy for 0.3 s of its own CPU time
        spins += 1
    after = threads._snapshot()
    assert spins > 0 and after[3] - before[3] >= 0.25  # own CPU seconds counted (os.times ticks at 10 ms)
    assert 0.0 <= threads.others_busy(before, after) <= os.cpu_count()


_CHILD = ("import json, torch, warnings; warnings.simplefilter('ignore'); "
          "from loopeval.common.threads import configure_threads as c; x = c(); "
          "print(json.dumps([x.threads, x.source, torch.get_num_threads()]))")


@pytest.mark.slow
def test_fresh_process_honours_the_environment():
    """In a new process, as the entry points run it."""
    base = {k: v for k, v in os.environ.items() if k not in threads.ENV_VARS}
    out = subprocess.run([sys.executable, "-c", _CHILD], env={**base, "OMP_NUM_THREADS": "2"},
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [2, "OMP_NUM_THREADS", 2]


@pytest.mark.slow
@pytest.mark.skipif(threads.available_cores() < 2 or not os.path.exists("/proc/stat"),
                    reason="needs two cores and /proc/stat")
def test_fresh_process_next_to_a_busy_job_takes_the_idle_count():
    """A real competitor spinning on every core: a new process takes the count it takes on an
    idle machine (one per core), and warns."""
    base = {k: v for k, v in os.environ.items() if k not in threads.ENV_VARS}
    with busy_machine():
        out = subprocess.run([sys.executable, "-W", "always", "-c", _CHILD.replace("warnings.simplefilter('ignore'); ", "")],
                             env=base, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [threads.available_cores(), "default", threads.available_cores()]
    assert "other processes keep" in out.stderr


def _spin_count(code: str, **env) -> tuple[str, str]:
    """How long the OpenMP runtime of a fresh process running ``code`` lets an idle thread
    spin, as GNU OpenMP itself reports it at start-up (``OMP_DISPLAY_ENV=VERBOSE``), and what
    ``code`` printed; skips where torch's OpenMP runtime is not GNU's."""
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], env={**base, "OMP_DISPLAY_ENV": "VERBOSE", **env},
                         capture_output=True, text=True, check=True)
    counts = [line.split("'")[1] for line in out.stderr.splitlines() if line.strip().startswith("GOMP_SPINCOUNT =")]
    if not counts:
        pytest.skip("torch's OpenMP runtime here is not GNU OpenMP: it does not report its spin count")
    return counts[0], out.stdout.strip()


_SPINS = "; from loopeval.common.threads import threads_spin; print(threads_spin())"


@pytest.mark.slow
def test_idle_threads_sleep_in_loopevals_entry_points():
    """Issue 38: the ``loopeval`` command and lm-eval's ``looped`` model start torch's OpenMP
    runtime with passive waiting (spin count 0); where torch started first its threads spin
    (GNU's default, 300000) and loopeval knows it; a user's ``OMP_WAIT_POLICY`` stands."""
    assert _spin_count("import loopeval.cli, torch" + _SPINS) == ("0", "False")
    adapter = "from lm_eval.api.registry import get_model; get_model('looped'); import torch" + _SPINS
    assert _spin_count(adapter) == ("0", "False")
    count, spins = _spin_count("import torch, loopeval.cli" + _SPINS)
    assert int(count) > 0 and spins == "True"
    count, spins = _spin_count("import loopeval.cli, torch" + _SPINS, OMP_WAIT_POLICY="active")
    assert int(count) > 0 and spins == "True"
