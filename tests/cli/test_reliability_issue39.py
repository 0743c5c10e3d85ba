"""Issue 39's classes as tables of malformed inputs run through the real command: lower-layer
exceptions named at the boundary where the input is known, loopeval's own files parsed
strictly, sibling commands agreeing on one option, a study checked in one pass."""

import json
import re
import os
import socket
from pathlib import Path

import pytest

from loopeval.cli import main
from loopeval.common.outputs import LOCK_NAME

HOST = socket.gethostname()


@pytest.mark.parametrize("lock", [
    b"0", b"-1", b"true", b"4194305", b"99999999999999999999999",
    json.dumps({"host": HOST, "pid": 0}).encode(),
    json.dumps({"host": HOST, "pid": True}).encode(),
    json.dumps({"host": HOST, "pid": -1}).encode(),
    json.dumps({"host": HOST, "pid": 10 ** 30}).encode(),
    json.dumps({"host": HOST, "pid": 12, "started": "soon"}).encode(),
    json.dumps({"host": 7, "pid": 12}).encode(),
    b"\xff\xfe{\x00", b"garbage", b"",
], ids=lambda b: b[:24].decode("latin-1"))
def test_a_lock_not_written_by_loopeval_is_named_with_how_to_remove_it(tmp_path, capsys, lock):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_bytes(lock)
    assert main(["place", "--model", str(tmp_path / "no-model"), "--data", str(tmp_path / "no-data"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out / LOCK_NAME} is not a lock written by loopeval" in err, err
    assert f"if no loopeval process uses {out}, delete {out / LOCK_NAME}" in err and "Traceback" not in err
    assert (out / LOCK_NAME).read_bytes() == lock  # nothing taken over or removed


def test_a_file_named_replaced_is_refused_naming_it(tmp_path):
    from loopeval.common.errors import UserError
    from loopeval.common.outputs import aside

    (tmp_path / ".replaced").write_text("mine")
    with pytest.raises(UserError, match=r"\.replaced is not a folder: .*move or delete that file"):
        aside(tmp_path, "report")
    assert (tmp_path / ".replaced").read_text() == "mine"


@pytest.mark.parametrize("value", ["²", "٣", "1_0", "0x4", " ", "+", "4.0", "1e1"])
def test_a_thread_value_that_is_not_ascii_digits_is_refused_naming_the_variable(value):
    from loopeval.common.errors import UserError
    from loopeval.common.threads import check_threads

    with pytest.raises(UserError, match=rf"LOOPEVAL_THREADS={re.escape(repr(value))}: expected a whole number of threads"
                       r".*in ASCII digits; set LOOPEVAL_THREADS to such a number or unset it"):
        check_threads(value, "LOOPEVAL_THREADS")


RUNS = Path(__file__).parents[1] / "fixtures" / "runs"
SIBLINGS = {  # one definition of a per-metric amount: compare's and report's --margin, power's --delta
    "compare": ["compare", str(RUNS / "twin"), str(RUNS / "looped"), "--n-resamples", "200"],
    "report": ["report", "--twin", str(RUNS / "twin"), "--looped", str(RUNS / "looped"), "--n-resamples", "200"],
    "power": ["power", str(RUNS / "twin"), str(RUNS / "looped")],
}
FLAG = {"compare": "--margin", "report": "--margin", "power": "--delta"}


@pytest.mark.parametrize("command", SIBLINGS)
@pytest.mark.parametrize(("values", "message"), [
    (["acc=0.05", "acc=0.01"], r"{flag} given twice for metric acc \(0.05 and 0.01\); give it once"),
    (["0.02", "0.03"], r"{flag} given twice for the accuracies' value \(0.02 and 0.03\); give it once"),
    (["nll=0.01"], r"{flag} nll=\.\.\.: no metric 'nll' in these runs \(their metrics: "),
    (["acc=2"], r"{flag} acc=2.0: expected a fraction in \(0, 1\) \(fractions, not points: 2 points is 0.02\)"),
    (["2"], r"{flag}=2.0: expected a fraction in \(0, 1\) \(fractions, not points: 2 points is 0.02\)"),
    (["-0.02"], r"{flag}=-0.02: expected a fraction in \(0, 1\)"),
    (["acc=0"], r"{flag} acc=0.0: expected a fraction in \(0, 1\)"),
])
def test_sibling_commands_refuse_one_bad_amount_alike(tmp_path, capsys, command, values, message):
    flag = FLAG[command]
    args = SIBLINGS[command] + (["--out", str(tmp_path / "r.html")] if command == "report" else [])
    for value in values:
        args += [flag, value]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert re.search(message.format(flag=flag), err), err
    assert "Traceback" not in err and not (tmp_path / "r.html").exists()


def _gsm8k_data(tmp_path, name: str, data: bytes) -> Path:
    folder = tmp_path / "data" / "gsm8k" / "main"
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data)
    return tmp_path / "data"


@pytest.mark.parametrize(("answer", "shown"), [
    ("#### eighteen", "'eighteen'"), ("#### 1 8", "'1 8'"), ("#### ١٨", "'١٨'"), ("#### 18 apples", "'18 apples'"),
    ("#### $18", "'$18'"), ("#### 1e3", "'1e3'"),
])
def test_local_tasks_refuses_a_gold_answer_that_is_not_a_number(tmp_path, capsys, answer, shown):
    data = _gsm8k_data(tmp_path, "test.jsonl", (json.dumps({"question": "Q?", "answer": "#### 2"}) + "\n" +
                                                json.dumps({"question": "Q2?", "answer": answer}) + "\n").encode())
    assert main(["local-tasks", "--data", str(data), "--out", str(tmp_path / "t"), "--tasks", "gsm8k_boxed"]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"test.jsonl:2: task gsm8k_boxed cannot read this record .*'#### <number>' line holds "
                     rf"{re.escape(shown)}, not a number in digits", err), err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("gold", ["18", "-3", "1,234", "2.5"])
def test_local_tasks_reads_a_number_and_a_csv_header_after_a_byte_order_mark(tmp_path, capsys, gold):
    row = f'question,answer\r\nWhat is it?,"#### {gold}"\r\n'
    data = _gsm8k_data(tmp_path, "test.csv", b"\xef\xbb\xbf" + row.encode())  # as a spreadsheet saves UTF-8
    assert main(["local-tasks", "--data", str(data), "--out", str(tmp_path / "t"), "--tasks", "gsm8k_boxed"]) == 0
    assert (tmp_path / "t" / "gsm8k_boxed.yaml").is_file()


@pytest.fixture(scope="module")
def study_world(tmp_path_factory):
    """A tiny checkpoint and a local task scored by exact_match, for ``protocol --dry-run``."""
    import yaml

    from loopeval import save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("study")
    tok = tiny_tokenizer()
    save_model(tiny_model("qwen3", vocab_size=len(tok), num_layers=2), tok, root / "model")
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "data.jsonl").write_text("".join(json.dumps({"question": f"{a}+{a}?", "answer": str(2 * a)}) + "\n"
                                              for a in range(3)))
    (tasks / "tiny_m.yaml").write_text(yaml.safe_dump({
        "task": "tiny_m", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(tasks / "data.jsonl")}},
        "output_type": "generate_until", "test_split": "test", "doc_to_text": "{{question}}", "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": [], "max_gen_toks": 4, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}]}))
    return root


STUDY_CASES = {  # id: (change to the study, environment, the refusal after "study.yaml: ")
    "margins-unknown-metric": ({"statistics": {"margins": {"nll_per_byte": 0.01}}}, {},
                               r"statistics.margins.nll_per_byte: no task of this study reports metric 'nll_per_byte' "
                               r"\(their metrics: tiny_m exact_match\)"),
    "margins-in-points": ({"statistics": {"margins": {"exact_match": 2}}}, {},
                          r"statistics.margins.exact_match: margins.exact_match=2(\.0)?: expected a fraction in \(0, 1\) "
                          r"\(fractions, not points: 2 points is 0.02\)"),
    "margins-at-top-level": ({"margins": {"exact_match": 0.01}}, {},
                             r"margins: unknown key; a study takes .* \(margins belongs under statistics: "
                             r"statistics.margins\)"),
    "device-at-top-level": ({"device": "cpu"}, {}, r"device: unknown key; .*\(device belongs under lm_eval: lm_eval.device\)"),
    "ray-yes": ({"ray": "yes"}, {}, r"ray: ray='yes': expected a Ray address: auto, local, HOST:PORT or "
                                    r"ray://HOST:PORT \(a yes is not an address"),
    "ray-number": ({"ray": 5}, {}, r"ray: 5: expected true, an address"),
    "ray-address-number": ({"ray": {"address": 6379}}, {}, r"ray.address: address=6379: expected a Ray address"),
    "ray-address-port": ({"ray": {"address": "head:99999"}}, {}, r"ray.address: address='head:99999': expected a Ray address"),
    "ray-address-spaces": ({"ray": {"address": "my head:6379"}}, {}, r"ray.address: address='my head:6379'"),
    "ray-cpus": ({"ray": {"cpus": 0}}, {}, r"ray.cpus: cpus=0: must be > 0"),
    "device-gpu": ({"lm_eval": {"device": "gpu"}}, {}, r"lm_eval.device: device='gpu': expected a device: cpu, cuda"),
    "device-number": ({"lm_eval": {"device": 0}}, {}, r"lm_eval.device: device=0: expected a device"),
    "gen-kwargs-list": ({"lm_eval": {"gen_kwargs": ["temperature=0"]}}, {},
                        r"lm_eval.gen_kwargs: gen_kwargs=\['temperature=0'\]: expected a mapping of generation settings"),
    "gen-kwargs-no-value": ({"lm_eval": {"gen_kwargs": "temperature"}}, {}, r"lm_eval.gen_kwargs: gen_kwargs='temperature'"),
    "gen-kwargs-nested": ({"lm_eval": {"gen_kwargs": {"until": ["a"]}}}, {}, r"lm_eval.gen_kwargs: "),
}


@pytest.mark.parametrize("case", sorted(STUDY_CASES))
def test_protocol_dry_run_refuses_what_the_run_would_refuse_naming_file_key_and_value(study_world, tmp_path, capsys,
                                                                                        monkeypatch, case):
    import yaml

    change, env, message = STUDY_CASES[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    study = {"name": "s", "output": str(tmp_path / "out"), "tasks": ["tiny_m"],
             "include_path": [str(study_world / "tasks")],
             "models": [{"name": "m", "role": "twin", "path": str(study_world / "model")}], **change}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    assert main(["protocol", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"^loopeval protocol: error: {re.escape(str(path))}: {message}", err, re.M), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("env", "message"), [
    ({"LOOPEVAL_THREADS": "²"}, r"LOOPEVAL_THREADS='²': expected a whole number of threads"),
    ({"OMP_NUM_THREADS": "0"}, r"OMP_NUM_THREADS='0': expected a whole number of threads"),
    ({"RAY_ADDRESS": "not an address"}, r"RAY_ADDRESS='not an address': expected a Ray address"),
    ({"RAY_ADDRESS": "head:0"}, r"RAY_ADDRESS='head:0': expected a Ray address"),
])
def test_protocol_dry_run_refuses_a_bad_environment_variable_naming_it(study_world, tmp_path, capsys, monkeypatch,
                                                                        env, message):
    import yaml

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    study = {"name": "s", "output": str(tmp_path / "out"), "tasks": ["tiny_m"], "include_path": [str(study_world / "tasks")],
             "models": [{"name": "m", "role": "twin", "path": str(study_world / "model")}], "ray": True}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    assert main(["protocol", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err, err


def test_protocol_refuses_one_checkpoint_listed_as_two_seeds_by_content(study_world, tmp_path, capsys):
    import shutil

    import yaml

    copy = tmp_path / "copy"
    shutil.copytree(study_world / "model", copy)  # the same content in another folder
    study = {"name": "s", "output": str(tmp_path / "out"), "tasks": ["tiny_m"], "include_path": [str(study_world / "tasks")],
             "models": [{"name": "m0", "role": "twin", "path": str(study_world / "model"), "seed": 0},
                        {"name": "m1", "role": "twin", "path": str(copy), "seed": 1}]}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    assert main(["protocol", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"models\[1\] \(m1, seed 1\) is the checkpoint of models\[0\] \(m0, seed 0\): the same content "
                     r".*; one checkpoint is one seed", err), err
    (copy / "model.safetensors").write_bytes((copy / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\x40")
    assert main(["protocol", str(path), "--dry-run"]) == 0  # another seed's weights


@pytest.mark.parametrize("value", ["2", "0", "1", "-0.5"])
def test_a_margin_is_refused_alike_by_a_study_the_library_and_every_command(tmp_path, capsys, value):
    """One check of an accuracies' margin (Unit.check_margin): the same reason whatever the door."""
    import yaml

    from loopeval.analysis.compared import compare_runs
    from loopeval.tools.study import load_study

    reasons = []
    for command in SIBLINGS:
        args = SIBLINGS[command] + (["--out", str(tmp_path / "r.html")] if command == "report" else [])
        assert main(args + [FLAG[command], value]) == 2
        reasons.append(capsys.readouterr().err.split(": expected ", 1)[1].strip())
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"output": "out", "tasks": ["t"], "models": [{"name": "a", "role": "twin", "path": "a"}],
                                    "statistics": {"margin": float(value)}}))
    for call in (lambda: load_study(path), lambda: compare_runs(RUNS / "twin", RUNS / "looped", margin=float(value))):
        with pytest.raises(ValueError) as info:
            call()
        reasons.append(str(info.value).split(": expected ", 1)[1])
    assert len(set(reasons)) == 1 and reasons[0].startswith("a fraction in (0, 1)"), reasons


TRACE_FAULTS = {  # a line of the looped run's trace, changed: (which line, new text)
    "a second header": (2, lambda line: line.replace('"kind": "item"', '"kind": "header"')),
    "an item without kind": (2, lambda line: line.replace('"kind": "item", ', "")),
    "a field of the wrong type": (2, lambda line: line.replace('"finished": true', '"finished": "yes"')
                                  .replace('"finished": false', '"finished": "no"')),
    "bytes that are not UTF-8": (2, lambda line: "\udcff"),
    "a first line that is an item": (1, lambda line: '{"kind": "item"}'),
    "an unknown field": (2, lambda line: line.replace('{"', '{"extra": 1, "', 1)),
}


@pytest.mark.parametrize("fault", sorted(TRACE_FAULTS))
def test_a_trace_not_as_loopeval_writes_it_is_named_with_how_to_remove_it(tmp_path, capsys, fault):
    import shutil

    shutil.copytree(RUNS / "looped", tmp_path / "looped")
    trace = sorted((tmp_path / "looped").rglob("loopeval_trace_*.jsonl"))[-1]
    lines = trace.read_text().splitlines()
    at, change = TRACE_FAULTS[fault]
    lines[at - 1] = change(lines[at - 1])
    assert lines[at - 1] != trace.read_text().splitlines()[at - 1]
    trace.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape") + b"\n")
    args = ["report", "--twin", str(RUNS / "twin"), "--looped", str(tmp_path / "looped"), "--out", str(tmp_path / "r.html")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{trace}:{at}:" in err and f"not a trace as loopeval writes it: move {trace.name} out of {trace.parent}, " \
                                       "or evaluate again" in err, err
    assert "Traceback" not in err and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize(("flag", "values", "message"), [
    ("--seed", ["RUN=1", "RUN=2"], r"--seed given twice for run {run} \(1 and 2\); give it once"),
    ("--variant", ["RUN=a", "RUN=b"], r"--variant given twice for run {run} \('a' and 'b'\); give it once"),
])
def test_report_refuses_a_run_assignment_given_twice(tmp_path, capsys, flag, values, message):
    run = str(RUNS / "looped")
    args = ["report", "--twin", str(RUNS / "twin"), "--looped", run, "--out", str(tmp_path / "r.html")]
    for value in values:
        args += [flag, value.replace("RUN", run)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert re.search(message.format(run=re.escape(run)), err), err


@pytest.mark.parametrize("name", ["test.jsonl", "test.json"])
def test_local_tasks_reads_json_after_a_byte_order_mark(tmp_path, name):
    row = {"question": "What is it?", "answer": "#### 18"}
    text = json.dumps([row]) if name.endswith(".json") else json.dumps(row) + "\n"
    data = _gsm8k_data(tmp_path, name, b"\xef\xbb\xbf" + text.encode())
    assert main(["local-tasks", "--data", str(data), "--out", str(tmp_path / "t"), "--tasks", "gsm8k_boxed"]) == 0


GGUF_FOLDERS = {  # id: (write_tiny_gguf options, files beside the GGUF, the refusal)
    "no tokenizer": ({}, {}, r"carries no tokenizer \(no tokenizer.ggml.model and tokenizer.ggml.tokens metadata\) "
                             r"and .* holds no tokenizer.json; put the model's tokenizer files"),
    "tokens without merges or scores": ({"tokens": [f"t{i}" for i in range(64)], "scores": False}, {},
                                        r"the tokenizer of .*m.gguf does not load \(KeyError: "),
    "another model's config": ({}, {"config.json": json.dumps({"num_hidden_layers": 30, "vocab_size": 49152})},
                               r"config.json describes another model than .*m.gguf \(layers 30 vs 2, vocabulary "
                               r"49152 vs 64\)"),
    "a config that is not JSON": ({}, {"config.json": "{"}, r"config.json: not a JSON config"),
    "a tokenizer.json that is not JSON": ({}, {"tokenizer.json": "{"}, r"the tokenizer in .*, which transformers takes "
                                                                      r"before the file's own, does not load"),
}


@pytest.mark.parametrize("case", sorted(GGUF_FOLDERS))
def test_import_gguf_refuses_a_file_whose_folder_or_tokenizer_is_not_its_own(tmp_path, capsys, monkeypatch, case):
    import transformers
    from support import write_tiny_gguf

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded before the refusal")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    options, files, message = GGUF_FOLDERS[case]
    folder = tmp_path / "g"
    folder.mkdir()
    write_tiny_gguf(folder / "m.gguf", **options)
    for name, text in files.items():
        (folder / name).write_text(text)
    assert main(["import-gguf", str(folder / "m.gguf"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_protocol_refuses_a_device_list_naming_the_bad_device(study_world, tmp_path, capsys):
    import yaml

    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"output": str(tmp_path / "out"), "tasks": ["tiny_m"],
                                    "include_path": [str(study_world / "tasks")],
                                    "models": [{"name": "m", "role": "twin", "path": str(study_world / "model")}]}))
    assert main(["protocol", str(path), "--dry-run", "--devices", "cuda:0,gpu"]) == 2
    assert "--devices='gpu': expected a device: cpu, cuda, cuda:N, mps or xpu[:N]" in capsys.readouterr().err


def test_the_docs_list_every_test_of_this_file():
    docs = (Path(__file__).parents[2] / "docs" / "reliability.md").read_text()
    names = re.findall(r"^def (test_\w+)", Path(__file__).read_text(), re.M)
    assert [n for n in names if n not in docs] == [], "docs/reliability.md lacks these tests"
