"""``looped`` without a side channel: a mixed-task run gives each task its solo outputs, and
a stop string can never cut a forced answer (issue 23, cases 3 and 7)."""

import pytest
import yaml

from support import write_generate_task

from loopeval import save_model
from loopeval.tools.tiny import tiny_model

QUESTIONS = ["Tom has 3 apples and buys 4 more. How many?", "What is 12 + 30?", "2 + 2 =",
             "A box holds 8 eggs; 3 boxes hold?", "Sara reads 5 pages a day for 6 days. Pages?"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, one_thread):
    from lm_eval.tasks import TaskManager

    from loopeval.tools.tiny import tiny_tokenizer

    root = tmp_path_factory.mktemp("plans")
    tokenizer = tiny_tokenizer()
    save_model(tiny_model("qwen3", vocab_size=len(tokenizer), num_layers=2), tokenizer, root / "base")
    rows = [{"question": q, "answer": "7"} for q in QUESTIONS]
    write_generate_task(root / "tasks", "task_a", rows, max_gen_toks=24)
    return root, rows, TaskManager


def _with_stop(root, rows, name, until, max_gen_toks=24):
    write_generate_task(root / "tasks", name, rows, max_gen_toks=max_gen_toks)
    path = root / "tasks" / f"{name}.yaml"
    config = yaml.safe_load(path.read_text())
    config["generation_kwargs"]["until"] = until
    path.write_text(yaml.safe_dump(config))


def _run(root, manager_cls, tasks, model="looped", **args):
    from lm_eval import simple_evaluate

    result = simple_evaluate(model=model, model_args={"pretrained": str(root / "base"), "device": "cpu", **args},
                             tasks=list(tasks), task_manager=manager_cls(include_path=str(root / "tasks"), include_defaults=False),
                             log_samples=True, verbosity="ERROR", batch_size=2)
    return {t: {s["doc_id"]: s["resps"] for s in result["samples"][t]} for t in tasks}


def test_a_mixed_run_gives_every_task_its_solo_outputs(setup):
    root, rows, manager = setup
    solo_a = _run(root, manager, ["task_a"])["task_a"]
    text = solo_a[0][0][0]
    stop = text[len(text) // 2: len(text) // 2 + 1]  # a string task A's own answers hold
    assert stop and stop in text
    _with_stop(root, rows, "task_b", [stop])
    solo_b = _run(root, manager, ["task_b"])["task_b"]
    mixed = _run(root, manager, ["task_a", "task_b"])
    assert mixed["task_a"] == solo_a  # before the fix every answer of A was cut at B's stop string
    assert mixed["task_b"] == solo_b
    assert any(len(solo_b[d][0][0]) < len(solo_a[d][0][0]) for d in solo_a)  # B's stop does cut B
    hf = _run(root, manager, ["task_a", "task_b"], model="hf")
    assert hf == mixed


@pytest.mark.parametrize("until", [["\n\n"], ["time"], ["?\n"]])
def test_a_stop_string_that_would_cut_the_forced_answer_is_refused(setup, until):
    root, rows, manager = setup
    _with_stop(root, rows, "task_c", until, max_gen_toks=64)
    with pytest.raises(ValueError, match="would cut the forced answer"):
        _run(root, manager, ["task_c"], budget_forcing=True, bf_reserve=40)


def test_a_forcing_string_holding_eos_is_refused(setup):
    from transformers import AutoTokenizer

    root, _, manager = setup
    eos = AutoTokenizer.from_pretrained(root / "base").eos_token
    with pytest.raises(ValueError, match="end-of-sequence"):
        _run(root, manager, ["task_a"], budget_forcing=True, bf_reserve=12, bf_string=f"Answer: {eos}")


def test_forcing_with_a_harmless_stop_string_runs(setup):
    root, rows, manager = setup
    _with_stop(root, rows, "task_d", ["Question:"])
    out = _run(root, manager, ["task_d"], budget_forcing=True, bf_reserve=12, bf_string=" The answer is")
    assert len(out["task_d"]) == len(QUESTIONS)


def test_check_forcing_against_stops_by_brute_force():
    """Against a direct search: a stop overlaps the forced span of some text around it."""
    from loopeval.evaluation.decoding import check_forcing_against_stops

    forced = "\n\nSo x="
    for stop in ["\n", "\n\n", "=", "x=1", "a\n", "So", "Q:", "1", "=\n", "zz"]:
        overlaps = False
        for before in ["", "a", "\n", "Q", "z"]:
            for after in ["", "1", "\n", "z"]:
                text = before + forced + after
                start = len(before)
                for i in range(len(text)):
                    if text.startswith(stop, i) and i < start + len(forced) and i + len(stop) > start:
                        overlaps = True
        try:
            check_forcing_against_stops([forced], [stop])
            refused = False
        except ValueError:
            refused = True
        assert refused == overlaps, stop



def test_the_resume_store_key_holds_the_seed_and_max_length_and_auto_batch_size_is_recorded(setup, tmp_path):
    """Case 4: a store made under another seed or max_length is not served; batch_size=auto
    records the size used (case 10)."""
    from lm_eval import simple_evaluate

    from loopeval.evaluation.trace import find_traces

    root, _, manager = setup
    store = tmp_path / "store"

    def run(seed, trace, batch_size=2, **args):
        simple_evaluate(model="looped", model_args={"pretrained": str(root / "base"), "device": "cpu",
                                                    "resume_dir": str(store), "trace": str(tmp_path / trace), **args},
                        tasks=["task_a"], task_manager=manager(include_path=str(root / "tasks"), include_defaults=False),
                        verbosity="ERROR", batch_size=batch_size, torch_random_seed=seed)
        return len((store / "loopeval_responses.jsonl").read_text().splitlines())

    n = len(QUESTIONS)
    assert run(1, "a") == n
    assert run(1, "b") == n  # served
    assert run(2, "c") == 2 * n  # another seed: generated again
    assert run(1, "d", max_length=64) == 3 * n  # another max_length: generated again
    assert {t.header.decoding.seed for t in find_traces(tmp_path / "c")} == {2}
    run(1, "e", batch_size="auto")
    (trace,) = find_traces(tmp_path / "e")
    assert trace.header.decoding.batch_size.isdigit()


def test_the_chat_template_is_recorded_as_applied(setup, tmp_path):
    """Case 2: chat_template_sha records the template only when prompts were templated, and the
    two runs' prompts differ item by item, which compare and the report see."""
    from lm_eval import simple_evaluate

    from loopeval.evaluation.trace import find_traces

    root, _, manager = setup
    for name, templated in (("plain", False), ("chat", True)):
        simple_evaluate(model="looped", model_args={"pretrained": str(root / "base"), "device": "cpu",
                                                    "trace": str(tmp_path / name)},
                        tasks=["task_a"], task_manager=manager(include_path=str(root / "tasks"), include_defaults=False), verbosity="ERROR",
                        batch_size=2, apply_chat_template=templated)
    (plain,), (chat,) = find_traces(tmp_path / "plain"), find_traces(tmp_path / "chat")
    assert plain.header.decoding.chat_template_sha is None and chat.header.decoding.chat_template_sha is not None
    assert {i.prompt_hash for i in plain.items}.isdisjoint(i.prompt_hash for i in chat.items)
