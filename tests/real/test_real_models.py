"""loopeval on real trained weights (SmolLM2-135M-Instruct, Gemma 3 270M) and real GSM8K
prompts: GGUF import, ``--model looped`` against ``--model hf``, cached looped decoding,
placement's prefix reuse, and the NLL task against a hand computation. Few tokens each:
about three minutes together on one thread."""

import json
import shutil

import lm_eval
import pytest
import torch
from lm_eval.tasks import TaskManager

from loopeval import apply_loop, check_cache, load_model, remove_loop
from loopeval.evaluation.local_data import write_local_tasks
from loopeval.evaluation.scoring import gsm8k_solution, user_prompt
from loopeval.core.unroll import unrolled_copy
from support import assert_close_in_float32

from .conftest import GSM8K_8, imported

ROWS = [json.loads(line) for line in GSM8K_8.read_text().splitlines()]
PROMPTS = [ROWS[0]["question"], ROWS[1]["question"]]


@pytest.fixture(scope="module")
def local_gsm8k(tmp_path_factory):
    """gsm8k_boxed and gsm8k_nll on the first 8 real GSM8K test rows, through local-tasks."""
    root = tmp_path_factory.mktemp("gsm8k")
    (root / "data" / "gsm8k" / "main").mkdir(parents=True)
    shutil.copyfile(GSM8K_8, root / "data" / "gsm8k" / "main" / "test.jsonl")
    write_local_tasks(root / "data", root / "tasks", tasks=["gsm8k_boxed", "gsm8k_nll"])
    return root / "tasks"


def test_imported_checkpoint_equals_transformers_own_gguf_load(smollm2, smollm2_gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                                dtype=torch.float32).eval()
    gguf_tok = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    model, tok = load_model(smollm2)
    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert tok.chat_template == gguf_tok.chat_template and tok.chat_template
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    assert torch.equal(enc.input_ids, gguf_tok(PROMPTS, return_tensors="pt", padding=True).input_ids)
    with torch.no_grad():
        torch.testing.assert_close(model(**enc).logits, gguf(**enc).logits, rtol=0, atol=0)


def test_the_real_gguf_without_one_tensor_is_refused_before_any_weights_load(smollm2_gguf, tmp_path, monkeypatch):
    """SmolLM2's file passes the unset-weight check; a copy whose table lacks output_norm.weight
    (a header that is otherwise whole) is refused by the import and by lm-eval's ``looped``,
    naming the file and the weight, before any weights load (transformers would keep
    model.norm.weight at its initial value)."""
    import re

    from transformers import AutoModelForCausalLM

    from loopeval.core.gguf import check_gguf, import_gguf
    from loopeval.core.gguf_header import check_header
    from loopeval.model_adapters.looped import LoopedLM
    from support import drop_gguf_tensor

    check_gguf(smollm2_gguf)
    cut = drop_gguf_tensor(smollm2_gguf, tmp_path / "m.gguf", "output_norm.weight")
    assert len(check_header(cut).tensors) == len(check_header(smollm2_gguf).tensors) - 1
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    message = (f"{cut}: its tensors leave 1 weight(s) of transformers' llama model unset (they would keep their random "
               "initial values): no tensor output_norm.weight (model.norm.weight); is general.architecture right, "
               "or was a tensor dropped?")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        import_gguf(cut, tmp_path / "out")
    with pytest.raises(ValueError, match=f"^looped: pretrained={re.escape(message)}$"):
        LoopedLM(pretrained=str(tmp_path), gguf_file="m.gguf", device="cpu")
    assert not (tmp_path / "out").exists()


def test_the_import_records_the_gguf_chat_template(smollm2, gemma3_gguf):
    """SmolLM2's GGUF carries a chat template, Gemma 3 270M's none; the import records which,
    and ``--apply_chat_template`` on Gemma is refused before its weights load."""
    import sys

    from loopeval.core.gguf import IMPORT_RECORD
    from loopeval.model_adapters.looped import LoopedLM

    assert json.loads((smollm2 / IMPORT_RECORD).read_text())["chat_template"] is True
    gemma = imported(gemma3_gguf)
    assert json.loads((gemma / IMPORT_RECORD).read_text())["chat_template"] is False
    argv = sys.argv
    sys.argv = ["lm_eval", "--model", "looped", "--apply_chat_template"]
    try:
        with pytest.raises(ValueError, match="has no chat template .* Gemma 3 270M's"):
            LoopedLM(pretrained=str(gemma))
    finally:
        sys.argv = argv


def _evaluate(model: str, pretrained, tasks_folder, tasks, **model_args):
    manager = TaskManager(include_path=[str(tasks_folder)], include_defaults=False)
    return lm_eval.simple_evaluate(
        model=model, model_args={"pretrained": str(pretrained), "dtype": "float32", "device": "cpu", **model_args},
        tasks=tasks, task_manager=manager, apply_chat_template=True, limit=8, gen_kwargs="max_gen_toks=12",
        batch_size=8, bootstrap_iters=0, log_samples=True)


TASKS = ["gsm8k_boxed", "gsm8k_nll"]


@pytest.fixture(scope="module")
def hf_run(smollm2, local_gsm8k):
    """``--model hf`` on both tasks, shared by the tests that compare with it."""
    return _evaluate("hf", smollm2, local_gsm8k, TASKS)


def test_looped_without_a_loop_equals_hf_on_real_gsm8k(smollm2, local_gsm8k, hf_run):
    """8 real GSM8K questions in SmolLM2's chat template: the same prompts, the same
    generations (12 tokens) and the same log-likelihoods of the reference solutions."""
    hf = hf_run
    looped = _evaluate("looped", smollm2, local_gsm8k, TASKS, check_cache=False)
    for task in TASKS:
        a = sorted(hf["samples"][task], key=lambda s: s["doc_id"])
        b = sorted(looped["samples"][task], key=lambda s: s["doc_id"])
        assert len(a) == len(b) == 8
        assert [s["arguments"] for s in a] == [s["arguments"] for s in b]
        context = a[0]["arguments"][0][0]
        assert f"<|im_start|>user\n{ROWS[0]['question']}" in context and context.endswith("<|im_start|>assistant\n")
        assert [s["resps"] for s in a] == [s["resps"] for s in b]


def test_nll_task_equals_a_hand_computation_on_the_real_model(smollm2, hf_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    samples = sorted(hf_run["samples"]["gsm8k_nll"], key=lambda s: s["doc_id"])[:2]
    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    for s, row in zip(samples, ROWS):
        context = tok.apply_chat_template([{"role": "user", "content": user_prompt(row["question"])}],
                                          tokenize=False, add_generation_prompt=True)
        solution = gsm8k_solution(row["answer"])
        # lm-eval scores the prompt's trailing newline with the continuation (docs/tasks.md)
        head, tail = context.rstrip(), context[len(context.rstrip()):] + solution
        ctx = tok(head, add_special_tokens=False).input_ids
        whole = tok(head + tail, add_special_tokens=False).input_ids
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([whole])).logits[0].double(), -1)
        total = sum(logp[i - 1, whole[i]].item() for i in range(len(ctx), len(whole)))
        assert s["nll_per_byte"] == pytest.approx(-total / len(solution.encode()), rel=1e-4)
        assert 0 < s["nll_per_byte"] < 2  # a trained model: well under a nat per byte of arithmetic prose


def test_looped_smollm2_cached_decoding_equals_recomputation(smollm2):
    model, tok = load_model(smollm2, "6:8x2")
    result = check_cache(model, tok, PROMPTS, max_new_tokens=8)
    assert result.ok and result.max_abs_diff < 1e-3, result


def test_gemma3_loops_across_sliding_and_global_layers_past_the_window(gemma3):
    """Layers 4-6 hold the global layer 5 between sliding ones; a 530-token prompt passes
    the 512-token window, so every sliding slot wraps while the loop decodes."""
    model, tok = gemma3
    assert model.config.sliding_window == 512 and model.config.layer_types[5] == "full_attention"
    text = " ".join(r["question"] for r in ROWS) * 3
    ids = tok(text, return_tensors="pt").input_ids[:, :530]
    assert ids.shape[1] == 530
    spec = "4:7x2"
    reference = unrolled_copy(model, spec)
    apply_loop(model, spec, operator="repeat")  # the operator the unrolled copy reproduces
    try:
        with torch.no_grad():
            kwargs = dict(max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
            a = model.generate(ids, **kwargs)
            b = reference.generate(ids, **kwargs)
            full = model(a.sequences, use_cache=False).logits[0, 529:533]
        assert torch.equal(a.sequences, b.sequences)
        assert_close_in_float32(torch.stack(a.logits)[:, 0], torch.stack(b.logits)[:, 0])
        assert_close_in_float32(torch.stack(a.logits)[:, 0], full)
        kinds = [type(layer).__name__ for layer in a.past_key_values.layers]
        assert kinds[18:] == ["DynamicSlidingWindowLayer", "DynamicLayer", "DynamicSlidingWindowLayer"]
    finally:
        remove_loop(model)


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_placement_prefix_reuse_equals_naive_forwards_on_real_weights(which, request):
    from loopeval.tools.placement import build_grid
    from loopeval.tools.placement.engine import NaiveEngine, PrefixEngine

    if which == "smollm2":
        model, tok = load_model(request.getfixturevalue("smollm2"))
    else:
        model, tok = request.getfixturevalue("gemma3")
    layers = model.config.num_hidden_layers
    grid = [c for c in build_grid(layers, widths=[2], times=[2], betas=[0.0, 0.5]) if c.start in (0, layers // 2)]
    ids = tok(" ".join(r["question"] for r in ROWS), return_tensors="pt").input_ids[0, :48].reshape(2, 24)
    fast, slow = PrefixEngine(model, batch_tokens=96), NaiveEngine(model, batch_tokens=96)
    with torch.no_grad():
        fast.unlooped(0, ids)
        for end in sorted({c.end for c in grid}):
            for group, finals in fast.round(0, ids, [c for c in grid if c.end == end]):
                for c, final in zip(group, finals):
                    (_, expected), = slow.round(0, ids, [c])
                    assert_close_in_float32(final, expected[0])
