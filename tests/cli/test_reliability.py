"""The bad-input table (docs/reliability.md), re-run as a script: every bad input to a
loopeval command ends in one line on stderr that names the input, exit status 2, no
traceback and no silently wrong result. Rows of other test files are listed in the docs
with their test names; ``test_the_docs_list_every_row`` keeps the two in step."""

import json
import re
import shutil
from pathlib import Path

import pytest

from loopeval.cli import main
from loopeval.common.paths import tasks_path

HERE = Path(__file__).parents[1]
RUNS = HERE / "fixtures" / "runs"
DOCS = HERE.parent / "docs" / "reliability.md"


def _corrupt_trace(tmp: Path) -> list[str]:
    run = tmp / "twin"
    shutil.copytree(RUNS / "twin", run)
    (run / "loopeval_trace_crashed.jsonl").write_text('{"kind": "header", "format": 2, "created": 1.0}\n{"ki')
    return ["compare", str(run), str(RUNS / "looped")]


def _bad_loop_config(tmp: Path) -> list[str]:
    from loopeval import save_model
    from loopeval.tools.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    save_model(tiny_model("qwen3", vocab_size=len(tok), num_layers=4), tok, tmp / "ckpt")
    (tmp / "ckpt" / "loop_config.json").write_text(json.dumps({"loop": "1:3x2", "mix": "x"}))
    return ["check-cache", "--model", str(tmp / "ckpt")]


def _file(tmp: Path) -> Path:
    (tmp / "a_file").write_text("x")
    return tmp / "a_file"


def _gguf(tmp: Path) -> Path:
    """A file with GGUF's magic bytes (the refusal of a non-empty --out comes before any reading)."""
    (tmp / "m.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    return tmp / "m.gguf"


def _magic_only(tmp: Path) -> Path:
    (tmp / "m.gguf").write_bytes(b"GGUF")
    return tmp / "m.gguf"


def _cut_gguf(tmp: Path) -> Path:
    from support import write_tiny_gguf

    whole = write_tiny_gguf(tmp / "whole.gguf").read_bytes()
    (tmp / "cut.gguf").write_bytes(whole[:whole.index(b"llama.block_count") + 20])
    return tmp / "cut.gguf"


def _gsm8k(tmp: Path, text: str, name: str = "test.jsonl") -> Path:
    folder = tmp / "data" / "gsm8k" / "main"
    folder.mkdir(parents=True)
    (folder / name).write_text(text)
    return tmp / "data"


GSM8K_ROW = json.dumps({"question": "What is 1 + 1?", "answer": "#### 2"}) + "\n"

REPORT = ["report", "--twin", str(RUNS / "twin"), "--looped", str(RUNS / "looped")]

# id: (argv, or a function of a temporary folder returning argv; the message, a regex; exit status)
TABLE = {
    "compare-same-run": (["compare", str(RUNS / "twin"), str(RUNS / "twin")], r"baseline and candidate are the same run", 2),
    "compare-limit": (["compare", str(RUNS / "twin"), str(RUNS / "limited")],
                      r"task toy_aime: the run was cut by --limit .*\(a pilot: --allow-subset\)", 2),
    "compare-pilot-against-full": (["compare", str(RUNS / "twin"), str(RUNS / "limited"), "--allow-subset"],
                                   r"task toy_aime: baseline has 12 items and candidate has 10 .*evaluated different items", 2),
    "compare-missing-run": (["compare", str(RUNS / "twin"), "no/such/run"], r"no such run: no/such/run", 2),
    "compare-corrupt-trace": (_corrupt_trace, r"twin: no loopeval trace \(cannot read the cost traces: .*loopeval_trace_crashed.jsonl:\d: corrupt", 0),
    "report-larger-looped": ([*REPORT, "--larger", str(RUNS / "looped")], r"given as --larger, but its trace records a loop", 2),
    "report-out-folder": (lambda tmp: [*REPORT, "--out", str(tmp)], r"--out .*: is a folder", 2),
    "report-out-under-file": (lambda tmp: [*REPORT, "--out", str(_file(tmp) / "r.html")], r"--out .*a_file/r.html: .*a_file is a file", 2),
    "report-json-under-file": (lambda tmp: [*REPORT, "--json", str(_file(tmp) / "r.json")], r"--json .*a_file is a file", 2),
    "report-missing-template": ([*REPORT, "--template", "no_such.j2"], r"--template no_such.j2: no such template", 2),
    "report-same-run-twice": (["report", "--twin", str(RUNS / "twin"), "--looped", str(RUNS / "looped"), str(RUNS / "looped")],
                              r"looped is given twice", 2),
    "check-cache-empty-prompt": (["check-cache", "--prompt", ""], r"prompt 0 is empty", 2),
    "check-cache-bad-spec": (["check-cache", "--loop", "4:2x2"], r"loop spec '4:2x2': window '4:2x2' has end 2 <= start 4", 2),
    "check-cache-unbounded-loop": (["check-cache", "--loop", "2:4x1000000000000"],
                                   r"runs 1000000000000 times; more than 64 passes per layer is refused", 2),
    "check-cache-huge-window": (["check-cache", "--loop", "0:100000x3"], r"adds 200000 call sites per token", 2),
    "check-cache-bad-loop-config": (_bad_loop_config, r"ckpt/loop_config.json: not a valid loop configuration \(loop mix 'x'", 2),
    "place-missing-model": (lambda tmp: ["place", "--model", str(tmp / "no_such_ckpt"), "--data", str(_file(tmp)),
                                         "--out", str(tmp / "out")], r"no_such_ckpt: no such local folder", 2),
    "place-missing-relative-model": (["place", "--model", "base", "--data", "x.jsonl", "--out", "out"],
                                     r"base: no such local folder \(a hub id has the form org/name\)", 2),
    "check-cache-missing-model": (["check-cache", "--model", "ckpt/looped"],
                                  r"ckpt/looped: neither a local folder nor a hub model whose config can be read", 2),
    "report-out-input": (lambda tmp: [*REPORT, "--out", str(next((RUNS / "twin").rglob("results_*.json")))],
                         r"--out .*results_.*json would overwrite the input", 2),
    "report-json-is-out": (lambda tmp: [*REPORT, "--out", str(tmp / "r.html"), "--json", str(tmp / "r.html")],
                           r"--json .*r.html is also --out", 2),
    "serve-cost-operator-without-loop": (lambda tmp: ["serve-cost", "--model", str(tmp), "--operator", "damped",
                                                      "--out", str(tmp / "serve")],
                                         r"--operator given without --loop", 2),
    "serve-cost-engine-static-cache": (lambda tmp: ["serve-cost", "--model", str(tmp), "--loop", "0:1x2", "--engine",
                                                    "vllm", "--cache", "static", "--compile", "--batch-sizes", "1",
                                                    "--out", str(tmp / "serve")],
                                       r"--engine vllm: --cache static, --compile set transformers' generate", 2),
    "power-bad-delta": (["power", str(RUNS / "twin"), str(RUNS / "looped"), "--delta", "2"], r"--delta=2.0: expected a fraction in \(0, 1\) \(fractions, not points: 2 points is 0.02\)", 2),
    "import-gguf-missing": (lambda tmp: ["import-gguf", str(tmp / "no.gguf"), "--out", str(tmp / "out")],
                            r"no.gguf: no such GGUF file", 2),
    "import-gguf-not-gguf": (lambda tmp: ["import-gguf", str(_file(tmp)), "--out", str(tmp / "out")],
                             r"a_file: not a GGUF file \(it starts with b'x', not b'GGUF'\)", 2),
    "import-gguf-out-not-empty": (lambda tmp: ["import-gguf", str(_gguf(tmp)), "--out", str(_file(tmp).parent)],
                                  r"exists and is not an empty folder; choose another --out", 2),
    "import-gguf-magic-only": (lambda tmp: ["import-gguf", str(_magic_only(tmp)), "--out", str(tmp / "o")],
                               r"m.gguf: not a whole GGUF file \(4 bytes; the header alone takes 24\)", 2),
    "import-gguf-cut-metadata": (lambda tmp: ["import-gguf", str(_cut_gguf(tmp)), "--out", str(tmp / "o")],
                                 r"cut.gguf: the GGUF file is cut short in the value of metadata key 'llama.block_count'", 2),
    "local-tasks-empty-file": (lambda tmp: ["local-tasks", "--data", str(_gsm8k(tmp, "")), "--out", str(tmp / "t")],
                               r"gsm8k/main/test.jsonl: holds no records \(an empty file\)", 2),
    "local-tasks-bad-line": (lambda tmp: ["local-tasks", "--data", str(_gsm8k(tmp, GSM8K_ROW + '{"question": "x"\n')),
                                          "--out", str(tmp / "t")], r"gsm8k/main/test.jsonl:2: corrupt data line", 2),
    "local-tasks-missing-field": (lambda tmp: ["local-tasks", "--data", str(_gsm8k(tmp, GSM8K_ROW + '{"question": "x"}\n')),
                                               "--out", str(tmp / "t")],
                                  r"test.jsonl:2: no field 'answer' \(task gsm8k_boxed reads it; fields: question\)", 2),
    "local-tasks-json-list-non-object": (lambda tmp: ["local-tasks", "--data", str(_gsm8k(tmp, "[" + GSM8K_ROW.strip() + ", 3]",
                                                                                           "test.json")), "--out", str(tmp / "t")],
                                         r"test.json: record 2: expected a JSON object", 2),
    "local-tasks-out-installed": (lambda tmp: ["local-tasks", "--data", str(_gsm8k(tmp, GSM8K_ROW)), "--out",
                                               str(tasks_path())],
                                  r"--out .*tasks is inside loopeval's installed folder", 2),
    "local-tasks-no-data": (lambda tmp: ["local-tasks", "--data", str(tmp), "--out", str(tmp / "t")],
                            r"holds no task's files; e.g. GSM8K is DATA/gsm8k/main/test", 2),
    "local-tasks-missing-task-data": (lambda tmp: ["local-tasks", "--data", str(tmp), "--out", str(tmp / "t"),
                                                   "--tasks", "gsm8k_nll"], r"task gsm8k_nll: no .*gsm8k/main/test", 2),
}


@pytest.mark.parametrize("row", sorted(TABLE))
def test_bad_input_gets_one_clear_line(row, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LOOPEVAL_DEBUG", raising=False)
    argv, message, status = TABLE[row]
    argv = argv(tmp_path) if callable(argv) else argv
    capsys.readouterr()  # what setting up the bad input printed
    assert main(argv) == status
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert "Traceback" not in err
    if status == 2:
        assert err.count("\n") == 1 and err.startswith(f"loopeval {argv[0]}: error: ")


def test_argparse_refusals_name_the_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["check-cache", "--dtype", "float77"])
    assert exit_.value.code == 2 and "argument --dtype: invalid choice: 'float77'" in capsys.readouterr().err


def test_debug_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("LOOPEVAL_DEBUG", "1")
    with pytest.raises(ValueError, match="same run"):
        main(["compare", str(RUNS / "twin"), str(RUNS / "twin")])


def test_the_docs_list_every_row():
    docs = DOCS.read_text()
    missing = [row for row in TABLE if f"`{row}`" not in docs]
    assert not missing, f"docs/reliability.md lacks rows {missing}"
