import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


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


def write_generate_task(folder, name: str, rows: list[dict], *, max_gen_toks: int) -> None:
    """A greedy lm-eval generation task ``name`` over ``rows`` ({"question", "answer"}), in ``folder``."""
    import json
    from pathlib import Path

    import yaml

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{name}.yaml").write_text(yaml.safe_dump({
        "task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test", "output_type": "generate_until",
        "doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": [], "max_gen_toks": max_gen_toks, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }))
