import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread_for_training(one_thread):
    """Every training test runs its tiny models on one torch thread."""


@pytest.fixture(scope="module")
def make_work(tmp_path_factory, tokenizer):
    """``make_work(name, data=..., held=..., num_layers=...)``: a folder holding a tiny Qwen3 base
    checkpoint ``base`` and the JSONL files named by keyword (``data.jsonl``, ``held.jsonl``)."""
    from loopeval import save_model
    from loopeval.tools.tiny import tiny_model
    from support import write_jsonl

    def make(name: str, *, num_layers: int | None = None, **files):
        root = tmp_path_factory.mktemp(name)
        layers = {} if num_layers is None else {"num_layers": num_layers}
        save_model(tiny_model("qwen3", vocab_size=len(tokenizer), **layers), tokenizer, root / "base")
        for stem, rows in files.items():
            write_jsonl(root / f"{stem}.jsonl", rows)
        return root

    return make
