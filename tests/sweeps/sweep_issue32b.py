"""A fresh bad-input sweep of issue 32's doors (GGUF, local data, study keys, writes, locks):
new cases, none from the issue's list. Each prints VERDICT | case | what happened.

    PYTHONPATH=. python tests/sweeps/sweep_issue32b.py
"""
import json
import os
import struct
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parents[1]))
import yaml  # noqa: E402
from support import write_tiny_gguf  # noqa: E402
from sweep_common import case, cli, results  # noqa: E402

T = Path(tempfile.mkdtemp())


def refused(argv, expect=None):
    code, err, _ = cli(argv)
    err = (err or [""])[0]
    ok = code == 2 and "Traceback" not in err and (expect is None or expect in err)
    return ("REFUSED" if ok else "TRACEBACK" if code == "TRACEBACK" else f"WRONG({code})"), err


WHOLE = write_tiny_gguf(T / "whole.gguf").read_bytes()


def gguf(name, data):
    (T / name).write_bytes(data)
    return ["import-gguf", str(T / name), "--out", str(T / f"out_{name}")]


def tensor_field(data, tensor, offset, fmt, value):
    """``data`` with one field of ``tensor``'s table entry (n_dims at 0, dim 0 at 4, type at 12, offset at 16 for 1-D) set."""
    at = data.index(tensor.encode()) + len(tensor) + offset
    return data[:at] + struct.pack(fmt, value) + data[at + struct.calcsize(fmt):]


case("GGUF header claims 2**40 tensors", lambda: refused(gguf("many.gguf", WHOLE[:8] + struct.pack("<Q", 2 ** 40) + WHOLE[16:]),
                                                          "the header claims 1099511627776 tensors"))
case("GGUF header claims one tensor more than its table holds", lambda: refused(gguf(
    "more.gguf", WHOLE[:8] + struct.pack("<Q", struct.unpack("<Q", WHOLE[8:16])[0] + 1) + WHOLE[16:]), "tensor 21 of 21"))
case("GGUF version 1", lambda: refused(gguf("v1.gguf", WHOLE[:4] + struct.pack("<I", 1) + WHOLE[8:]), "GGUF version 1"))
case("GGUF tensor of unknown type 99", lambda: refused(gguf("type.gguf", tensor_field(WHOLE, "output_norm.weight", 12, "<I", 99)), "unknown tensor type 99"))
case("GGUF tensor with 7 dimensions", lambda: refused(gguf("dims.gguf", tensor_field(WHOLE, "output_norm.weight", 0, "<I", 7)), "7 dimensions"))
case("GGUF tensor offset not aligned", lambda: refused(gguf("align.gguf", tensor_field(WHOLE, "output_norm.weight", 16, "<Q", 3)), "alignment"))
case("GGUF tensor offset past the end", lambda: refused(gguf("past.gguf", tensor_field(WHOLE, "output_norm.weight", 16, "<Q", 2 ** 30)), "cut short: tensor output_norm.weight"))
case("GGUF key that is not UTF-8", lambda: refused(gguf("utf8.gguf", WHOLE.replace(b"general.architecture", b"general.architectur\xff", 1)), "not UTF-8"))
case("GGUF with no tensors", lambda: refused(gguf("empty.gguf", WHOLE[:8] + struct.pack("<Q", 0) + WHOLE[16:]), "no tensors"))


def data_case(relative, content):
    root = T / f"data{len(results)}"
    path = root / relative
    path.parent.mkdir(parents=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return ["local-tasks", "--data", str(root), "--out", str(T / f"lt{len(results)}")]


GSM = json.dumps({"question": "What is 1 + 1?", "answer": "#### 2"}) + "\n"
case("local CSV with a header only", lambda: refused(data_case("gsm8k/main/test.csv", "question,answer\n"), "holds no records"))
case("local .json holding a number", lambda: refused(data_case("gsm8k/main/test.json", "7"), "holds a JSON int"))
case("local .json list whose second record is a number", lambda: refused(data_case(
    "gsm8k/main/test.json", "[" + GSM.strip() + ", 3]"), "test.json: record 2: expected a JSON object"))
case("local parquet of garbage bytes", lambda: refused(data_case("gsm8k/main/test.parquet", b"PAR1garbage"), "not a readable parquet file"))
case("local JSONL line not UTF-8", lambda: refused(data_case("gsm8k/main/test.jsonl", GSM.encode() + b'{"question": "\xff"}\n'), "test.jsonl:2"))
case("local ARC record whose answerKey is no label", lambda: refused(data_case(
    "ai2_arc/ARC-Challenge/test.jsonl", json.dumps({"id": "x", "question": "q", "choices": {"label": ["A", "B"], "text": ["a", "b"]},
                                                    "answerKey": "E"}) + "\n"), "test.jsonl:1: task arc_challenge_letter cannot read"))


def two_shards():
    argv = data_case("gsm8k/main/test-00000-of-00002.jsonl", GSM)
    (Path(argv[2]) / "gsm8k/main/test-00001-of-00002.jsonl").write_text(GSM)
    (Path(argv[2]) / "gsm8k/main/test-old.jsonl").write_text(GSM)
    code, err, _ = cli(argv)
    yaml_file = Path(argv[4]) / "gsm8k_boxed.yaml"
    files = yaml.safe_load(yaml_file.read_text())["dataset_kwargs"]["data_files"]["test"] if yaml_file.is_file() else []
    return ("ACCEPTED-CORRECTLY" if code == 0 and [Path(f).name for f in files] == [
        "test-00000-of-00002.jsonl", "test-00001-of-00002.jsonl"] else f"WRONG({code})"), files


case("local hub shards 0 and 1 of 2 beside test-old.jsonl", two_shards)


def study(**changes):
    base = {"output": str(T / "sout"), "models": [{"name": "twin", "role": "twin", "path": str(T / "m")},
                                                   {"name": "looped", "role": "looped", "base": str(T / "m"), "loop": "1:3x2"}],
            "tasks": ["gsm8k_boxed"], "lm_eval": {"device": "cpu"}}
    base.update(changes)
    path = T / f"study{len(results)}.yaml"
    path.write_text(yaml.safe_dump(base))
    return ["protocol", str(path), "--dry-run"]


case("study models[1].model_args.resume_dir", lambda: refused(study(models=[
    {"name": "twin", "role": "twin", "path": str(T / "m")},
    {"name": "looped", "role": "looped", "base": str(T / "m"), "loop": "1:3x2", "model_args": {"resume_dir": "r"}}]),
    "models[1].model_args.resume_dir: set by the runner"))
case("study include_path a file", lambda: refused(study(include_path=[str(T / "whole.gguf")]), "no such folder"))
case("study intended_differences: [42]", lambda: refused(study(intended_differences=[42]), "42 is not a setting"))


def overwrite_keeps_an_unrecorded_checkpoint():
    from loopeval.training.twins import _check_out

    out = T / "train_out"
    (out / "checkpoint-3").mkdir(parents=True)
    (out / "checkpoint-3" / "model.safetensors").write_text("the user's own")
    _check_out(out, True)
    return ("ACCEPTED-CORRECTLY" if (out / "checkpoint-3" / "model.safetensors").is_file() else "DATA-LOSS"), "kept"


case("train --overwrite over a user's checkpoint-3/ that no manifest records", overwrite_keeps_an_unrecorded_checkpoint)


def empty_lock():
    from loopeval.common.outputs import LOCK_NAME, folder_lock

    (T / "locked").mkdir()
    (T / "locked" / LOCK_NAME).write_text("")
    try:
        with folder_lock(T / "locked", "place"):
            return "WRONG", "an unreadable lock was taken over"
    except ValueError as exc:
        return ("REFUSED" if "delete it" in str(exc) else "WRONG"), str(exc)


case("an empty lock file", empty_lock)


def store_bad_middle_line():
    from loopeval.evaluation.responses import ResponseStore

    folder = T / "store"
    folder.mkdir()
    outcome = {"generated_tokens": 1, "finished": True, "forced_at": None, "repetition_stop_at": None}
    good = json.dumps({"key": "a", "generated": [1], "outcome": outcome, "prompt_tokens": 1})
    (folder / "loopeval_responses.jsonl").write_text(good + "\n{bad\n" + good + "\n")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ResponseStore(folder)
    except ValueError as exc:
        return ("REFUSED" if "loopeval_responses.jsonl:2" in str(exc) else "WRONG"), str(exc)
    return "WRONG", "a corrupt middle line was accepted"


case("a resume store with a corrupt line in the middle (not a crash's cut)", store_bad_middle_line)

print({v: results.count(v) for v in sorted(set(results))})
