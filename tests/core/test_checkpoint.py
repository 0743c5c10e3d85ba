"""save_model / load_model round trips, and the check-cache command."""

import json
import subprocess
import sys

import pytest
import torch

from loopeval import load_model, loop_config, save_model
from loopeval.tools.tiny import tiny_model


@pytest.fixture
def base_dir(tmp_path, tokenizer):
    model = tiny_model("qwen3", vocab_size=len(tokenizer))
    save_model(model, tokenizer, tmp_path / "base")
    return tmp_path / "base"


def test_looped_checkpoint_needs_only_its_path(tmp_path, base_dir, tokenizer):
    model, tok = load_model(base_dir, "1:4x2", operator="damped", beta=0.25, mix=3.0)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        before = model(ids).logits
    out = save_model(model, tok, tmp_path / "looped")
    assert json.loads((out / "loop_config.json").read_text()) == {"loop": "1:4x2", "operator": "damped", "beta": 0.25, "mix": 3.0}
    # the weights are the base weights, written once
    base_files = sorted(p.name for p in base_dir.glob("*.safetensors"))
    assert sorted(p.name for p in out.glob("*.safetensors")) == base_files
    assert (out / base_files[0]).stat().st_size == (base_dir / base_files[0]).stat().st_size
    again, _ = load_model(out)
    assert str(loop_config(again).spec) == "1:4x2" and loop_config(again).beta == 0.25
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, before, rtol=0, atol=0)


def test_loop_on_a_looped_checkpoint_is_an_error(tmp_path, base_dir, tokenizer):
    model, tok = load_model(base_dir, "1:3x2")
    save_model(model, tok, tmp_path / "looped")
    with pytest.raises(ValueError, match="already has the loop 1:3x2"):
        load_model(tmp_path / "looped", "2:4x2")


def test_bad_spec_fails_before_weights_load(tmp_path, base_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    def boom(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)
    with pytest.raises(ValueError, match="past the last layer"):
        load_model(base_dir, "4:9x2")
    with pytest.raises(ValueError, match="cannot parse"):
        load_model(base_dir, "four")


def test_unlooped_save_drops_a_stale_loop_config(tmp_path, base_dir, tokenizer):
    model, tok = load_model(base_dir, "1:3x2")
    save_model(model, tok, tmp_path / "x")
    plain = tiny_model("qwen3", vocab_size=len(tokenizer))
    save_model(plain, tok, tmp_path / "x")
    assert not (tmp_path / "x" / "loop_config.json").exists()
    assert loop_config(load_model(tmp_path / "x")[0]) is None


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "loopeval", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_check_cache_cli(tmp_path, base_dir):
    ok = _cli("check-cache", "--model", str(base_dir), "--loop", "1:4x3", "--max-new-tokens", "8")
    assert ok.returncode == 0, ok.stderr
    assert "cache check OK" in ok.stdout and "loop 1:4x3" in ok.stdout
    bad = _cli("check-cache", "--model", str(base_dir), "--loop", "4:2x2")
    assert bad.returncode == 2
    assert "'4:2x2'" in bad.stderr and "end 2 <= start 4" in bad.stderr


def test_a_bad_loop_config_names_the_file(tmp_path, base_dir):
    model, tok = load_model(base_dir, "1:3x2")
    save_model(model, tok, tmp_path / "looped")
    (tmp_path / "looped" / "loop_config.json").write_text('{"loop": "1:3x2", "mix": "x"}')
    with pytest.raises(ValueError, match=r"loop_config.json: not a valid loop configuration \(loop mix 'x': must be a finite"):
        load_model(tmp_path / "looped")
    (tmp_path / "looped" / "loop_config.json").write_text('{"loop": "1:3x2", "beta": 0.5, "extra": 1}')
    with pytest.raises(ValueError, match=r"unknown key\(s\) extra"):
        load_model(tmp_path / "looped")
