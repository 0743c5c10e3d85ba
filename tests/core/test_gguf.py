"""GGUF inputs refused before any loading; the import itself is checked on the real
SmolLM2 file (tests/real/test_real_models.py)."""

import pytest

from loopeval import load_model
from loopeval.core.gguf import check_gguf, import_gguf
from loopeval.core.loop import resolve_loop


def test_bad_gguf_inputs_are_refused_before_loading(tmp_path):
    (tmp_path / "text.gguf").write_text("not a model")
    (tmp_path / "m.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(ValueError, match="absent.gguf: no such GGUF file"):
        check_gguf(tmp_path / "absent.gguf")
    with pytest.raises(ValueError, match=r"text.gguf: not a GGUF file \(it starts with b'not '"):
        import_gguf(tmp_path / "text.gguf", tmp_path / "out")
    with pytest.raises(ValueError, match="dtype 'int8': choose one of float32, bfloat16, float16"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype="int8")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="full: exists and is not an empty folder"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "full")
    assert not (tmp_path / "out").exists()


def test_gguf_file_in_load_model_and_resolve_loop_is_checked_first(tmp_path):
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(ValueError, match="absent.gguf: no such GGUF file"):
        load_model(tmp_path, gguf_file="absent.gguf")
    with pytest.raises(ValueError, match="text.gguf: not a GGUF file"):
        resolve_loop(tmp_path, "1:2x2", gguf_file="text.gguf")


def test_looped_model_refuses_a_missing_gguf_file(tmp_path):
    from loopeval.evaluation.model_adapters.looped import LoopedLM

    with pytest.raises(ValueError, match="looped: pretrained=.*absent.gguf: no such GGUF file"):
        LoopedLM(str(tmp_path), gguf_file="absent.gguf")
