"""A fresh bad-input sweep of issue 39's classes (locks, thread values, Ray addresses, study
keys and margins, sibling options, local data, GGUF folders): new cases, none from the
issue's list or the table tests. Each prints VERDICT | case | what happened.

    PYTHONPATH=. python tests/sweeps/sweep_issue39.py
"""
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parents[1]))
import yaml  # noqa: E402
from support import write_tiny_gguf  # noqa: E402
from sweep_common import case, cli, results  # noqa: E402

T = Path(tempfile.mkdtemp())
RUNS = Path(__file__).parents[1] / "fixtures" / "runs"


def run(argv, expect=None, ok=False, env=None):
    """``ok``: the input is valid and must be accepted; else refused with ``expect`` in the message."""
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        code, err, _ = cli(argv)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    err = (err or [""])[0]
    if ok:
        return ("ACCEPTED" if code == 0 else f"WRONG({code})"), err
    good = code == 2 and "Traceback" not in err and (expect is None or expect in err)
    return ("REFUSED" if good else "TRACEBACK" if code == "TRACEBACK" else f"WRONG({code})"), err


def lock(name, text):
    out = T / f"lock_{name}"
    out.mkdir()
    (out / ".loopeval.lock").write_bytes(text)
    return run(["place", "--model", str(T / "none"), "--data", str(T / "none.jsonl"), "--out", str(out)],
               "is not a lock written by loopeval")


H = socket.gethostname()
case("lock with a float pid", lambda: lock("float", json.dumps({"host": H, "pid": 1.5}).encode()))
case("lock holding a JSON list", lambda: lock("list", b"[1234]"))
case("lock whose boot is a number", lambda: lock("boot", json.dumps({"host": H, "pid": 123, "boot": 5}).encode()))
case("lock holding a JSON string pid", lambda: lock("str", b'"1234"'))


def dangling_replaced():
    from loopeval.common.outputs import aside

    (T / "dangle").mkdir()
    (T / "dangle" / ".replaced").symlink_to(T / "nowhere")
    try:
        aside(T / "dangle", "x")
    except ValueError as exc:
        return ("REFUSED" if "is not a folder" in str(exc) else "WRONG"), str(exc)
    return "WRONG", "a dangling .replaced link was followed"


case(".replaced a dangling symlink", dangling_replaced)


def threads(value, ok):
    from loopeval.common.threads import check_threads

    try:
        n = check_threads(value, "LOOPEVAL_THREADS")
    except ValueError as exc:
        return ("WRONG" if ok else "REFUSED"), str(exc)
    return ("ACCEPTED" if ok else "WRONG"), f"read as {n}"


case("LOOPEVAL_THREADS=' 2 ' (spaces)", lambda: threads(" 2 ", True))
case("LOOPEVAL_THREADS fullwidth '２'", lambda: threads("２", False))
case("LOOPEVAL_THREADS='2 2'", lambda: threads("2 2", False))

# a tiny study world
from loopeval import save_model  # noqa: E402
from loopeval.tools.tiny import tiny_model, tiny_tokenizer  # noqa: E402

tok = tiny_tokenizer()
save_model(tiny_model("qwen3", vocab_size=len(tok), num_layers=2), tok, T / "model")
(T / "tasks").mkdir()
(T / "tasks" / "data.jsonl").write_text("".join(json.dumps({"q": f"{a}?", "a": str(a)}) + "\n" for a in range(3)))
(T / "tasks" / "sw.yaml").write_text(yaml.safe_dump({
    "task": "sw", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(T / "tasks" / "data.jsonl")}},
    "output_type": "generate_until", "test_split": "test", "doc_to_text": "{{q}}", "doc_to_target": "{{a}}",
    "generation_kwargs": {"until": [], "max_gen_toks": 4, "do_sample": False},
    "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}]}))


def study(name, expect=None, ok=False, env=None, argv=(), **change):
    body = {"name": "s", "output": str(T / f"out_{name}"), "tasks": ["sw"], "include_path": [str(T / "tasks")],
            "models": [{"name": "m", "role": "twin", "path": str(T / "model")}], **change}
    path = T / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return run(["protocol", str(path), "--dry-run", *argv], expect, ok=ok, env=env)


case("--ray 'ray://:10001' (no host)", lambda: study("rayhost", "expected a Ray address", argv=["--ray", "ray://:10001"]))
case("ray.address 'localhost:6379'", lambda: study("raylocal", ok=True, ray={"address": "localhost:6379"}))
case("RAY_ADDRESS=auto with ray: true", lambda: study("rayauto", ok=True, ray=True, env={"RAY_ADDRESS": "auto"}))
case("statistics.margins exact_match 0.5", lambda: study("m05", ok=True, statistics={"margins": {"exact_match": 0.5}}))
case("top-level alpha: 0.1", lambda: study("alpha", "belongs under statistics", alpha=0.1))
case("top-level retries: 2", lambda: study("retries", "belongs under ray", retries=2))
case("statistics.margins {exact_match: '2%'}", lambda: study("pct", "statistics.margins", statistics={"margins": {"exact_match": "2%"}}))

SIB = [str(RUNS / "twin"), str(RUNS / "looped")]
case("compare --margin acc=inf", lambda: run(["compare", *SIB, "--margin", "acc=inf"], "expected a fraction"))
case("power --delta acc=0.05 twice, same value", lambda: run(["power", *SIB, "--delta", "acc=0.05", "--delta", "acc=0.05"],
                                                              "given twice"))
case("report --margin 0.03 twice", lambda: run(["report", "--twin", SIB[0], "--looped", SIB[1], "--out", str(T / "r.html"),
                                                "--margin", "0.03", "--margin", "0.03"], "given twice"))


def local(name, rows, expect=None, ok=False, ext="jsonl", raw=None):
    folder = T / f"data_{name}" / "gsm8k" / "main"
    folder.mkdir(parents=True)
    (folder / f"test.{ext}").write_bytes(raw if raw is not None else "".join(json.dumps(r) + "\n" for r in rows).encode())
    return run(["local-tasks", "--data", str(folder.parents[1]), "--out", str(T / f"lt_{name}"), "--tasks", "gsm8k_boxed"],
               expect, ok=ok)


case("gold '#### 1,000'", lambda: local("comma", [{"question": "q", "answer": "x\n#### 1,000"}], ok=True))
case("gold '#### -5'", lambda: local("neg", [{"question": "q", "answer": "#### -5"}], ok=True))
case("gold '####' alone", lambda: local("empty", [{"question": "q", "answer": "####"}], "no '#### <number>' line"))
case("gold '#### ½'", lambda: local("half", [{"question": "q", "answer": "#### ½"}], "not a number in digits"))
case("CSV with a byte-order mark and no answer column", lambda: local(
    "bom", None, "no field 'answer'", ext="csv", raw=b"\xef\xbb\xbfquestion\r\nq\r\n"))


def gguf_folder(name, files, expect):
    folder = T / f"g_{name}"
    folder.mkdir()
    write_tiny_gguf(folder / "m.gguf", **files.pop("gguf", {}))
    for file, text in files.items():
        (folder / file).write_text(text)
    from loopeval import load_model

    try:
        load_model(folder, gguf_file="m.gguf")
    except ValueError as exc:
        return ("REFUSED" if expect in str(exc) else "WRONG"), str(exc)
    return "WRONG", "loaded"


case("GGUF without tokenizer metadata beside a README", lambda: gguf_folder(
    "readme", {"README.md": "# my model"}, "carries no tokenizer"))
case("GGUF without tokenizer metadata beside a tokenizer_config.json alone", lambda: gguf_folder(
    "tokcfg", {"tokenizer_config.json": json.dumps({"model_max_length": 8})}, "carries no tokenizer"))
case("GGUF listing 64 tokens without merges or scores, bare folder", lambda: gguf_folder(
    "nomerges", {"gguf": {"tokens": [f"t{i}" for i in range(64)], "scores": False}}, "does not load"))
case("GGUF beside a tokenizer.json that is not JSON", lambda: gguf_folder(
    "tokjson", {"tokenizer.json": "{"}, "does not load"))
case("GGUF beside a config.json that is not JSON", lambda: gguf_folder("badcfg", {"config.json": "{"}, "not a JSON config"))
case("GGUF beside a config.json of another width", lambda: gguf_folder(
    "width", {"config.json": json.dumps({"hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 64})}, "width 32 vs 64"))

print({v: results.count(v) for v in sorted(set(results))})
