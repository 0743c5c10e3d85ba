"""GGUF inputs refused before any loading; the import itself is checked on the real
SmolLM2 file (tests/real/test_real_models.py)."""

import pytest
from support import write_tiny_gguf

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
    from loopeval.model_adapters.looped import LoopedLM

    with pytest.raises(ValueError, match="looped: pretrained=.*absent.gguf: no such GGUF file"):
        LoopedLM(str(tmp_path), gguf_file="absent.gguf")


def test_a_damaged_gguf_is_refused_in_one_line_naming_the_file(tmp_path):
    """Cut anywhere, or with tensors its architecture does not have: one ValueError naming the
    file, from the header alone (a struct.error or a traceback from transformers before)."""
    whole = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    check_gguf(tmp_path / "whole.gguf")
    key = whole.index(b"llama.block_count")
    cases = {
        "magic.gguf": (b"GGUF", "not a whole GGUF file"),
        "in_metadata.gguf": (whole[:key + 5], "cut short in the value of metadata key|cut short in its header"),
        "in_table.gguf": (whole[:whole.index(b"blk.1.attn_q")], "cut short in its header or tensor table"),
        "in_data.gguf": (whole[:-100], r"cut short: tensor blk.1.ffn_up.weight needs bytes|cut short: tensor"),
        "relabelled.gguf": (whole.replace(b"\x00llama", b"\x00qwen2", 1), "architecture 'qwen2', but the metadata has no"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=rf"^{tmp_path / name}: .*({message})") as info:
            check_gguf(tmp_path / name)
        assert "\n" not in str(info.value)
    faults = {
        "foreign.gguf": ({"extra": {"blk.0.attn_q_norm.weight": (16,)}}, "has no tensor blk.0.attn_q_norm.weight"),
        "gap.gguf": ({"drop": ("blk.1.ffn_up.weight",)}, "block 1 of 2 differs from block 0 in tensor ffn_up.weight"),
        "beyond.gguf": ({"extra": {"blk.2.attn_norm.weight": (64,)}}, "has no tensor blk.2.attn_norm.weight"),
    }
    for name, (kwargs, message) in faults.items():
        with pytest.raises(ValueError, match=message):
            check_gguf(write_tiny_gguf(tmp_path / name, **kwargs))


def test_a_gguf_whose_tensors_do_not_make_its_architectures_model_is_refused(tmp_path):
    """A Llama file labelled qwen2 (metadata renamed too) passes the header, but Qwen2 has
    attention biases the file lacks: transformers would initialise them; the import refuses."""
    path = write_tiny_gguf(tmp_path / "q.gguf", "qwen2")
    with pytest.raises(ValueError, match=r"q.gguf: its tensors do not make a qwen2 model: \d+ weights are missing "
                                         r"\(e.g. model.layers.0.self_attn.\w_proj.bias\)"):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # every other loader of a GGUF refuses it too, rather than evaluating random attention biases
    from loopeval import load_model
    from loopeval.model_adapters.looped import LoopedLM

    with pytest.raises(ValueError, match=r"q.gguf: its tensors do not make a qwen2 model"):
        load_model(tmp_path, gguf_file="q.gguf")
    from loopeval.tools.tiny import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    with pytest.raises(ValueError, match=r"q.gguf: its tensors do not make a qwen2 model"):
        LoopedLM(pretrained=str(tmp_path), gguf_file="q.gguf", device="cpu", tokenizer=str(tmp_path / "tokenizer"))
