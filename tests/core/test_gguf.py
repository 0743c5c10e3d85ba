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


@pytest.mark.parametrize("case", ["norm", "gate", "qwen2"])
def test_a_gguf_that_leaves_a_weight_unset_is_refused_before_any_weights_load(tmp_path, monkeypatch, case):
    """A file without its final norm, without a tensor in every block (the header's per-block
    check cannot see it), or a Llama file labelled qwen2 (Qwen2 has attention biases the file
    lacks): transformers would keep those weights at their random initial values. Every loader
    refuses the file before any weights load, naming it and the weights; the weights named
    are the ones transformers' own load reports missing."""
    import re

    import transformers

    from loopeval.common.errors import UserError
    from loopeval.model_adapters.looped import LoopedLM
    from loopeval.tools.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    kwargs = {"norm": {"drop": ("output_norm.weight",)},
              "gate": {"drop": ("blk.0.ffn_gate.weight", "blk.1.ffn_gate.weight")},
              "qwen2": {"arch": "qwen2"}}[case]
    path = write_tiny_gguf(tmp_path / "m.gguf", vocab=len(tokenizer),
                           tokens=tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))), **kwargs)
    tokenizer.save_pretrained(tmp_path)  # the file's own tokenizer, beside it
    model, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf",
                                                                   output_loading_info=True)
    truth = sorted(set(info["missing_keys"]) - set(model._tied_weights_keys or {}))
    assert truth

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded before the refusal")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    with pytest.raises(ValueError) as info:
        check_gguf(path)
    message = str(info.value)
    arch = "qwen2" if case == "qwen2" else "llama"
    assert message.startswith(f"{path}: its tensors leave {len(truth)} weight(s) of transformers' {arch} model unset "
                              "(they would keep their random initial values): no tensor ")
    named = re.findall(r"\((model\.[\w.]+)\)", message)
    assert set(named) <= set(truth) and len(set(named)) == min(len(truth), 4)
    for load in (lambda: import_gguf(path, tmp_path / "out"), lambda: load_model(tmp_path, gguf_file="m.gguf"),
                 lambda: LoopedLM(pretrained=str(tmp_path), gguf_file="m.gguf", device="cpu")):
        with pytest.raises((ValueError, UserError), match=re.escape(message)):
            load()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arch,error", [("bert", "ValueError"), ("lfm2", "TypeError"), ("phi3", "AssertionError")])
def test_a_gguf_transformers_builds_no_model_from_is_refused_in_one_line(tmp_path, arch, error):
    """A sound header whose metadata transformers cannot build a causal LM from (bert: no GGUF
    support; lfm2 without its layer types: a TypeError; phi3 with its default padding id past a
    64-token vocabulary: torch's assertion) is refused in one line naming the file and
    transformers' own error, whatever its type."""
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / f"{arch}.gguf"
    w = GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(64)
    w.add_tensor("token_embd.weight", np.zeros((64, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=rf"^{path}: transformers builds no model from it \({error}: .+\)$"):
        check_gguf(path)


def test_a_gguf_without_a_tokenizer_or_beside_another_models_files_is_refused_before_weights_load(tmp_path, monkeypatch):
    """transformers takes a folder's tokenizer files before the file's own, and loopeval the
    folder's loop: a GGUF beside another model's files loaded and crashed mid-generation
    in tokenizer.decode; one without tokenizer metadata failed after its weights loaded."""
    import transformers

    from loopeval.common.errors import UserError
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded before the refusal")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    bare = tmp_path / "bare"
    bare.mkdir()
    write_tiny_gguf(bare / "m.gguf")
    with pytest.raises(UserError, match=r"gguf_file=m.gguf: .*m.gguf carries no tokenizer .*holds no tokenizer.json; "
                                        r"put the model's tokenizer files"):
        load_model(bare, gguf_file="m.gguf")
    with pytest.raises(UserError, match=r"carries no tokenizer"):
        import_gguf(bare / "m.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    write_tiny_gguf(bare / "m.gguf", tokens=[f"t{i}" for i in range(64)], scores=False)  # no merges, no scores
    with pytest.raises(UserError, match=r"gguf_file=m.gguf: the tokenizer of .*m.gguf does not load \(KeyError: "):
        load_model(bare, gguf_file="m.gguf")

    other = tmp_path / "other"  # another model's checkpoint: its tokenizer has more tokens than the file's 64 rows
    model, tokenizer = tiny_model(), tiny_tokenizer()
    size = len(tokenizer)
    model.save_pretrained(other)
    tokenizer.save_pretrained(other)
    write_tiny_gguf(other / "m.gguf")
    with pytest.raises(UserError, match=r"gguf_file=m.gguf: .*config.json describes another model than .*m.gguf "
                                        r"\(.*vocabulary \d+ vs 64\).*in a folder of its own"):
        load_model(other, gguf_file="m.gguf")
    (other / "config.json").unlink()
    with pytest.raises(UserError, match=r"the tokenizer in .*other \(431 tokens\) is not the tokenizer of .*m.gguf "
                                        r"\(an embedding of 64 rows\)"):
        load_model(other, gguf_file="m.gguf")
    # as many tokens as rows, but other tokens than the file lists
    write_tiny_gguf(other / "m.gguf", vocab=size, tokens=[f"t{i}" for i in range(size)])
    with pytest.raises(UserError, match=rf"is not the tokenizer of .*{size} listed tokens"):
        load_model(other, gguf_file="m.gguf")
    # the file's own tokens pass the check (and reach the weights)
    write_tiny_gguf(other / "m.gguf", vocab=size, tokens=tokenizer.convert_ids_to_tokens(list(range(size))))
    with pytest.raises(AssertionError, match="weights loaded"):
        load_model(other, gguf_file="m.gguf")

