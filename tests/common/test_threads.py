"""The thread policy: the user's setting stands; otherwise the cores other processes leave
free now, re-measured as long loops go on."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from loopeval.common import threads


@pytest.fixture
def fresh(monkeypatch):
    """A process state where no call has decided yet, torch at its default, no env setting,
    8 cores; torch's thread count is restored afterwards."""
    saved = torch.get_num_threads()
    monkeypatch.setattr(threads, "_CHOICE", None)
    monkeypatch.setattr(threads, "_LAST", None)
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
    assert threads.adjust_threads() is None and torch.get_num_threads() == 3  # never re-measured


def test_explicit_torch_setting_is_honoured(fresh):
    torch.set_num_threads(5)
    choice = threads.configure_threads()
    assert (choice.threads, choice.source, torch.get_num_threads()) == (5, "torch.set_num_threads", 5)


@pytest.mark.parametrize("busy, own, workers, expected", [
    (0.0, 0.0, 1, 8),     # idle
    (2.0, 2.0, 1, 8),     # only this process is busy: nothing is taken from it
    (0.2, 0.0, 1, 8),     # noise below SLACK
    (2.6, 0.0, 1, 5),     # 2.6 cores used by others: three taken
    (8.0, 1.0, 1, 1),     # others hold 7 of 8 cores
    (8.0, 0.0, 1, 1),     # all of them: still one
    (0.0, 0.0, 3, 2),     # shared by three workers
])
def test_free_cores_from_a_sample(fresh, busy, own, workers, expected):
    # two snapshots 1 s apart on 8 cores: 800 jiffies in all, `busy` cores' worth busy
    machine(fresh, (0.0, 0.0, 0.0, 0.0), (1.0, busy * 100, 800.0, own))
    choice = threads.configure_threads(workers=workers)
    assert (choice.threads, choice.source, torch.get_num_threads()) == (expected, "policy", expected)


def test_load_average_stands_in_without_proc_stat(fresh):
    fresh.setattr(threads, "_snapshot", lambda: None)
    fresh.setattr(os, "getloadavg", lambda: (2.6, 0.0, 0.0))
    assert threads.configure_threads().threads == 5


def test_adjust_follows_a_job_that_starts_and_ends(fresh):
    clock = [0.0]
    fresh.setattr(threads.time, "monotonic", lambda: clock[0])
    machine(fresh, (0.0, 0.0, 0.0, 0.0), (0.25, 0.0, 200.0, 0.0),   # configure: idle
            (3.0, 800.0, 2400.0, 3.0),       # others start: 1.82 cores besides this process's 1.09
            (6.0, 2900.0, 4800.0, 24.0))     # others gone: all 7 busy cores are this process's
    assert threads.configure_threads().threads == 8
    clock[0] = 1.0
    assert threads.adjust_threads().threads == 8 and torch.get_num_threads() == 8  # too soon to look
    clock[0] = 3.0
    # 2.75 s: 800 of 2200 jiffies busy = 2.91 cores; own 3/2.75 = 1.09: others 1.82 -> two taken
    assert threads.adjust_threads().threads == 6 and torch.get_num_threads() == 6
    clock[0] = 6.0
    assert threads.adjust_threads().threads == 8 and torch.get_num_threads() == 8


def test_first_call_decides(fresh):
    machine(fresh, (0.0, 0.0, 0.0, 0.0), (1.0, 700.0, 800.0, 0.0))
    first = threads.configure_threads()
    assert threads.configure_threads(workers=4) is first and torch.get_num_threads() == 1


def test_bad_environment_value_is_refused(fresh):
    fresh.setenv("LOOPEVAL_THREADS", "two")
    with pytest.raises(ValueError, match="LOOPEVAL_THREADS='two'"):
        threads.configure_threads()


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


_CHILD = ("import json, torch; from loopeval.common.threads import configure_threads as c; x = c(); "
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
def test_fresh_process_next_to_a_busy_job_leaves_it_its_cores():
    """A real competitor spinning on every core: a new process takes one thread, not one per core
    (torch's default, which would thrash)."""
    base = {k: v for k, v in os.environ.items() if k not in threads.ENV_VARS}
    spin = "import os, multiprocessing as m\ndef f(_):\n    while True: pass\nm.Pool(os.cpu_count()).map(f, range(os.cpu_count()))"
    competitor = subprocess.Popen([sys.executable, "-c", spin], env=base, start_new_session=True)
    try:
        time.sleep(1.5)
        out = subprocess.run([sys.executable, "-c", _CHILD], env=base, capture_output=True, text=True, check=True)
    finally:
        os.killpg(competitor.pid, signal.SIGKILL)  # the pool's workers too
        competitor.wait()
    n, source, actual = json.loads(out.stdout)
    assert source == "policy" and n == actual < threads.available_cores()
