"""``loopeval serve``: real clients (the ``openai`` client, lm-eval's API models) get the engine's tokens.

Runs where vLLM is installed (from elsewhere: ``test_engine_environment.py``). A server start
costs about a minute here, so there are few: the tiny Llama looped (one for the module) and
unlooped (which the SIGTERM test then stops), SmolLM2 looped, and one that dies at start
(:func:`loopeval.engines.server.running_server`, 127.0.0.1 only). Every wait is bounded by
:data:`START`, :data:`REQUEST` or :data:`STOP`.
"""

import gc
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support import QUESTIONS

START = 900.0
"""Seconds a server may take to answer /health (measured: 75 s for the tiny model on a loaded 2-core machine)."""
REQUEST = 300.0
"""Seconds one request may take."""
STOP = 120.0
"""Seconds a stopped server's processes may take to exit."""
TIE = 1e-3
"""Two top log-probabilities closer than this (nats) are a numerical tie: a batch of two and a
batch of one round float32 sums in another order (about 1e-6 of a logit of size ~10), so the
greedy token there may go either way; the rest of that row is not compared."""
ENGINE = ("--dtype", "float32", "--max-model-len", "1024", "--enforce-eager")
"""The vLLM options of every server here; the in-process engine gets the same."""
LOOP = ("--loop", "1:3x2")


pytestmark = pytest.mark.usefixtures("needs_vllm")


@pytest.fixture(scope="module")
def looped_server(workdir):
    from loopeval.engines.server import running_server

    with running_server(workdir / "base", *LOOP, *ENGINE, timeout=START) as server:
        yield server


def _client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=REQUEST, max_retries=0)


IDS = {"return_token_ids": True}
"""vLLM's extra: the prompt's and the completion's token ids in the answer."""


def _in_process(path, loop, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy tokens of the in-process engine (vLLM's ``LLM``, looped as the lm-eval adapter loops it)."""
    from vllm import SamplingParams, TokensPrompt

    from loopeval.core.spec import LoopConfig
    from loopeval.engines.vllm_serving import engine

    llm = engine(path, loop=LoopConfig(loop) if loop else None, dtype="float32", max_model_len=1024, seed=0,
                 engine_args={})
    out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                       SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    del llm
    gc.collect()
    return [list(o.outputs[0].token_ids) for o in out]


def _assert_openai_gets_the_in_process_engines_tokens(server, path, loop: str | None) -> None:
    """Completions of three questions and a chat completion of a fourth, at temperature 0 through
    the ``openai`` client: the prompt ids are the tokenizer's (its chat template's for the chat),
    and the answers the in-process engine's greedy tokens for those ids."""
    from transformers import AutoTokenizer

    client = _client(server)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts, answers = [], []
    for q in QUESTIONS[:3]:
        r = client.completions.create(model=server.model, prompt=q, max_tokens=16, temperature=0, extra_body=IDS)
        prompts.append(r.choices[0].prompt_token_ids)
        answers.append(r.choices[0].token_ids)
        assert prompts[-1] == tokenizer(q).input_ids
    messages = [{"role": "user", "content": QUESTIONS[3]}]
    r = client.chat.completions.create(model=server.model, messages=messages, max_tokens=16, temperature=0,
                                       extra_body=IDS)
    prompts.append(r.prompt_token_ids)
    answers.append(r.choices[0].token_ids)
    assert prompts[-1] == tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                        return_dict=True)["input_ids"]
    assert all(answers)
    assert answers == _in_process(path, loop, prompts, 16)


@pytest.mark.slow
def test_openai_completions_and_chat_give_the_in_process_engines_tokens(workdir, looped_server):
    _assert_openai_gets_the_in_process_engines_tokens(looped_server, workdir / "base", LOOP[1])


@pytest.mark.slow
def test_an_unlooped_server_gives_the_engines_tokens_and_sigterm_leaves_no_process(workdir):
    """The unlooped checkpoint behind the server answers as the in-process engine does; then
    ``kill PID`` (SIGTERM to the server alone): it exits, its engine process with it."""
    from loopeval.engines.server import running_server

    with running_server(workdir / "base", *ENGINE, timeout=START) as server:
        _assert_openai_gets_the_in_process_engines_tokens(server, workdir / "base", None)
        _assert_stops_leaving_no_process(server, lambda: server.process.send_signal(signal.SIGTERM))


def _assert_stops_leaving_no_process(server, signal_it) -> None:
    """After ``signal_it()`` the server exits, and every process of its group with it (the API
    server and vLLM's engine process, which the server leads: ``start_new_session``)."""
    group = _group(server.process.pid)
    assert len(group) >= 2, group
    signal_it()
    assert server.process.wait(timeout=STOP) is not None
    deadline = time.monotonic() + STOP
    while _group(server.process.pid) and time.monotonic() < deadline:
        time.sleep(0.5)  # polls for an event (the processes' exit), bounded by STOP
    assert _group(server.process.pid) == []


@pytest.mark.slow
def test_two_concurrent_clients_get_the_answers_of_one_at_a_time(looped_server):
    """The same prompts sent one at a time and from two threads at once (vLLM batches them): the
    same tokens, each row up to its first numerical tie (:data:`TIE`) in the one-at-a-time run."""
    client = _client(looped_server)

    def ask(prompt):
        r = client.completions.create(model=looped_server.model, prompt=prompt, max_tokens=24, temperature=0,
                                      logprobs=2, extra_body=IDS)
        c = r.choices[0]
        return c.token_ids, [sorted(top.values(), reverse=True) for top in c.logprobs.top_logprobs]

    alone = [ask(q) for q in QUESTIONS]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(ask, QUESTIONS * 2))
    compared = 0
    for (tokens, tops), (other, _) in zip(alone * 2, together):
        n = next((i for i, t in enumerate(tops) if len(t) > 1 and t[0] - t[1] < TIE), len(tokens))
        assert other[:n] == tokens[:n]
        compared += n
    assert compared >= len(QUESTIONS) * 2 * 8, f"only {compared} tokens before numerical ties"


@pytest.mark.slow
@pytest.mark.parametrize("api,chat", [("completions", False), ("chat/completions", True)],
                         ids=["local-completions", "local-chat-completions"])
def test_lm_eval_through_the_server_gives_the_looped_models_responses(workdir, looped_server, api, chat):
    """``lm_eval --model local-completions`` (and ``local-chat-completions`` under
    ``--apply_chat_template``, the server applying the checkpoint's template) through the server
    against ``--model looped ...,engine=vllm`` in process, on the same items: the same responses."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from loopeval.model_adapters.looped import LoopedLM

    manager = TaskManager(include_path=str(workdir / "tasks"), include_defaults=False)
    common = dict(tasks=["tiny_gen"], task_manager=manager, log_samples=True, verbosity="ERROR", limit=4,
                  apply_chat_template=chat)
    served = simple_evaluate(model=f"local-{'chat-' if chat else ''}completions", model_args={
        "model": looped_server.model, "base_url": f"{looped_server.url}/v1/{api}",
        "tokenizer": str(workdir / "base"), "num_concurrent": 1, "max_retries": 1, "timeout": int(REQUEST)}, **common)
    lm = LoopedLM(pretrained=str(workdir / "base"), engine="vllm", loop=LOOP[1], dtype="float32", enforce_eager=True,
                  max_model_len=1024, batch_size=1)
    try:
        local = simple_evaluate(model=lm, **common)
    finally:
        del lm.lm.model  # free vLLM's memory before the next engine starts
        gc.collect()
    responses = [{s["doc_id"]: _text(s["resps"][0][0]) for s in run["samples"]["tiny_gen"]} for run in (served, local)]
    assert responses[0] == responses[1] and len(responses[0]) == 4
    assert all(responses[0].values())


def _text(response: str) -> str:
    """A response without U+FFFD: the tiny model's byte tokens often form no UTF-8 character; the
    in-process adapter decodes them at once (one U+FFFD per undecodable byte), the server
    incrementally (holding back a last incomplete character), so only those marks differ. The
    tokens themselves are compared exactly above."""
    return response.replace("\ufffd", "")


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


# -- refused before vLLM starts ----------------------------------------------------------------


@pytest.fixture
def no_engine(monkeypatch):
    """Fail a test that starts vLLM's server."""
    from loopeval.engines import server

    monkeypatch.setattr(server, "serve", lambda prepared: pytest.fail("vLLM started"))


def _refused(capsys, *argv) -> str:
    from loopeval.cli import main

    assert main(["serve", *map(str, argv)]) == 2
    return capsys.readouterr().err


def test_bad_input_is_refused_before_vllm_starts(workdir, tmp_path, capsys, no_engine):
    import shutil
    import socket

    from loopeval import save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    assert "no such local folder" in _refused(capsys, tmp_path / "absent", *LOOP)
    assert "reaches past the last layer" in _refused(capsys, workdir / "base", "--loop", "1:9x2")
    assert "exit_after=2 given for a model without a loop" in _refused(capsys, workdir / "base", "--exit-after", "2")
    gated = tmp_path / "gated"
    shutil.copytree(workdir / "looped", gated)
    (gated / "exit_gate.safetensors").write_bytes(b"")
    assert "carries an exit gate" in _refused(capsys, gated)
    tokenizer = tiny_tokenizer()
    save_model(tiny_model("qwen3_5", vocab_size=len(tokenizer), num_layers=4, hidden=128), tokenizer, tmp_path / "q")
    assert "no looped variant of Qwen3_5ForCausalLM" in _refused(capsys, tmp_path / "q", "--loop", "0:2x2")
    assert "loopeval writes the loop's hf_overrides" in _refused(capsys, workdir / "base", *LOOP, "--hf-overrides",
                                                                  '{"a": 1}')
    assert "runs one API server" in _refused(capsys, workdir / "base", "--headless")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert f"cannot listen on 127.0.0.1:{port}" in _refused(capsys, workdir / "base", "--port", port)


def test_a_bad_option_is_refused_by_name(workdir, capsys, no_engine):
    from loopeval.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", str(workdir / "base"), *LOOP, "--operator", "bogus"])
    assert exit_.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["serve", str(workdir / "base"), *LOOP, "--loop-beta", "0.5"])
    assert exit_.value.code == 2 and "unrecognized arguments: --loop-beta" in capsys.readouterr().err


def test_vllm_help_lists_vllms_serve_options(capsys):
    """``--vllm-help[=KEYWORD]`` prints vLLM's serve options (the CPU build's ``vllm serve --help``
    fails on its package name) and exits 0, as ``--help`` does, with no checkpoint given."""
    from loopeval.cli import main

    for keyword, present, absent in (("all", ("--max-model-len", "--port", "--dtype"), ()),
                                     ("port", ("--port",), ("--dtype", "--max-model-len"))):
        with pytest.raises(SystemExit) as exit_:
            main(["serve", f"--vllm-help={keyword}"])
        out = capsys.readouterr().out
        assert exit_.value.code == 0
        assert all(f"{o} " in out for o in present) and not any(f"{o} " in out for o in absent), keyword
    with pytest.raises(SystemExit):
        main(["serve", "--vllm-help=no-such-option"])
    out = capsys.readouterr().out
    assert "No group or arguments matching 'no-such-option'" in out and "'--vllm-help=all'" in out
    assert "'--help" not in out  # loopeval's --help lists loopeval's options, not these


def test_a_server_that_dies_at_start_is_reported_with_its_log(workdir, tmp_path):
    """:func:`running_server` waits for /health, not for a server that has exited: the error
    carries the log's tail (here vLLM's refusal of a model length past the model's positions)."""
    from loopeval.engines.server import running_server

    starting = running_server(workdir / "base", "--max-model-len", "10000000", timeout=START, log=tmp_path / "log")
    with pytest.raises(RuntimeError, match=r"exited \(\d+\) before answering /health(.|\n)*max_model_len"):
        starting.__enter__()  # the start itself raises (and stops what it started)


@pytest.mark.slow
def test_smollm2_served_looped_answers_chat_with_the_in_process_engines_tokens():
    """Real weights: SmolLM2 looped 14:16x2 behind the server, a GSM8K question through the chat
    completions API, against the in-process engine on the same prompt ids; then Ctrl-C in the
    server's terminal (SIGINT to its whole process group) stops it, leaving no process."""
    import json
    import os

    from loopeval.engines.server import running_server
    from real.conftest import GSM8K_8, _absent, _smollm2_file, imported

    gguf = _smollm2_file()
    if gguf is None or not gguf.is_file():
        _absent(f"SmolLM2 GGUF not found at {gguf} (set LOOPEVAL_SMOLLM2_GGUF)")
    model = imported(gguf)
    question = json.loads(GSM8K_8.read_text().splitlines()[0])["question"]
    with running_server(model, "--loop", "14:16x2", *ENGINE, timeout=START) as server:
        r = _client(server).chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": question}], max_tokens=32, temperature=0,
            extra_body=IDS)
        _assert_stops_leaving_no_process(server, lambda: os.killpg(server.process.pid, signal.SIGINT))
    assert len(r.choices[0].token_ids) > 8
    assert r.choices[0].token_ids == _in_process(model, "14:16x2", [r.prompt_token_ids], 32)[0]


def test_serve_cost_server_refuses_before_any_server_starts(workdir, tmp_path, capsys, monkeypatch):
    from loopeval.cli import main
    from loopeval.engines import server

    monkeypatch.setattr(server, "running_server", lambda *a, **k: pytest.fail("a server started"))
    base = ["serve-cost", "--server", "--model", str(workdir / "base"), "--out", str(tmp_path / "out")]
    for extra, message in ((["--batch-sizes", "1"], "--server needs --loop SPEC"),
                           (["--loop", "1:3x2"], "--server needs explicit --batch-sizes"),
                           (["--loop", "1:3x2", "--batch-sizes", "1", "--cache", "static"],
                            "--server: --cache set the in-process measurement"),
                           (["--loop", "1:3x2", "--batch-sizes", "0"], "batch sizes [0]: expected"),
                           (["--loop", "1:9x2", "--batch-sizes", "1"], "reaches past the last layer")):
        assert main(base + extra) == 2
        assert message in capsys.readouterr().err, extra
    looped = ["serve-cost", "--server", "--model", str(workdir / "looped"), "--loop", "1:3x2", "--batch-sizes", "1",
              "--out", str(tmp_path / "out")]
    assert main(looped) == 2
    assert "carries its own loop (loop_config.json), so it cannot be served unlooped" in capsys.readouterr().err
