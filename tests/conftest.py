import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# pytest-xdist runs one test process per core: each, and what it starts, takes its share of the
# cores instead of torch's one thread per core (which thrashes); a user's setting stands
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import pytest  # noqa: E402


def pytest_collection_modifyitems(items):
    """Tests marked ``longest`` first: under xdist one worker runs them while the others take
    the rest, instead of the whole run waiting for them at its end (``--no-loadscope-reorder``
    in ``pyproject.toml`` keeps this order: xdist would otherwise send the files with the most
    tests first, and the engine's one long test last)."""
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)


@pytest.fixture(scope="session")
def tokenizer():
    from loopeval.tools.tiny import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests: tiny models on the shared 2-core machine run
    far slower with two (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def make_runs():
    """``tests/fixtures/runs/make_runs.py`` as a module: ``make_runs.make_run(...)`` runs lm-eval
    with a scripted model that writes a loopeval trace."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("make_runs", Path(__file__).parent / "fixtures" / "runs" / "make_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
