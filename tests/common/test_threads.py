"""The thread policy: the user's setting stands; otherwise small models get one thread and
larger ones the cores the load average leaves free."""

import json
import os
import subprocess
import sys

import pytest
import torch

from loopeval.common import threads


@pytest.fixture
def fresh(monkeypatch):
    """A process state where no call has decided yet, torch at its default, no env setting;
    torch's thread count is restored afterwards."""
    saved = torch.get_num_threads()
    monkeypatch.setattr(threads, "_CHOICE", None)
    for name in threads.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    torch.set_num_threads(8)
    yield monkeypatch
    torch.set_num_threads(saved)


def test_environment_setting_is_honoured(fresh):
    fresh.setenv("OMP_NUM_THREADS", "3")
    choice = threads.configure_threads(hidden_size=64)  # a small model would get 1 by the policy
    assert (choice.threads, choice.source, torch.get_num_threads()) == (3, "OMP_NUM_THREADS", 3)


def test_explicit_torch_setting_is_honoured(fresh):
    torch.set_num_threads(5)
    choice = threads.configure_threads(hidden_size=64)
    assert (choice.threads, choice.source, torch.get_num_threads()) == (5, "torch.set_num_threads", 5)


def test_small_model_gets_one_thread(fresh):
    fresh.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    choice = threads.configure_threads(hidden_size=threads.SMALL_HIDDEN - 1)
    assert (choice.threads, choice.source, torch.get_num_threads()) == (1, "policy", 1)


@pytest.mark.parametrize("load, workers, expected", [(0.0, 1, 8), (2.6, 1, 5), (7.9, 1, 1), (30.0, 1, 1), (0.2, 3, 2)])
def test_large_model_gets_the_free_cores(fresh, load, workers, expected):
    fresh.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    choice = threads.configure_threads(hidden_size=threads.SMALL_HIDDEN, workers=workers)
    assert (choice.threads, torch.get_num_threads()) == (expected, expected)


def test_first_call_decides(fresh):
    first = threads.configure_threads(hidden_size=64)
    assert threads.configure_threads(hidden_size=4096) is first and torch.get_num_threads() == 1


def test_bad_environment_value_is_refused(fresh):
    fresh.setenv("LOOPEVAL_THREADS", "two")
    with pytest.raises(ValueError, match="LOOPEVAL_THREADS='two'"):
        threads.configure_threads()


@pytest.mark.slow
@pytest.mark.parametrize("env, expected", [({"OMP_NUM_THREADS": "2"}, (2, "OMP_NUM_THREADS")), ({}, (1, "policy"))])
def test_fresh_process(env, expected):
    """In a new process, as the entry points run it: torch's own default is recognised as no setting."""
    base = {k: v for k, v in os.environ.items() if k not in threads.ENV_VARS}
    code = ("import json, torch; from loopeval.common.threads import configure_threads as c; x = c(hidden_size=128); "
            "print(json.dumps([x.threads, x.source, torch.get_num_threads()]))")
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, check=True)
    n, source, actual = json.loads(out.stdout)
    assert (n, source) == expected and actual == n
