"""Decontamination (paper A.4): planted 13-gram overlaps go, 12-gram near misses stay;
the fast scan equals a brute-force set intersection; test documents come through
lm-eval task configs (loopeval's YAML on a local fixture file, and a user task)."""

import json
import random
from pathlib import Path

import pytest
import yaml

import loopeval.training.decontamination as dc
from loopeval.common.paths import tasks_path
from loopeval.training.decontamination import EvalDocument, NgramIndex, decontaminate, decontamination_record, words
from support import write_jsonl, read_records

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"
GSM8K = read_records(FIXTURES / "gsm8k.jsonl")
TOY = [{"question": "Which planet in the solar system has the largest number of confirmed moons orbiting it today?",
        "answer": "Saturn"},
       {"question": "Name the chemical element whose symbol is Fe.", "answer": "Iron"}]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """An include path with loopeval's gsm8k_boxed on the fixture file and a user task."""
    folder = tmp_path_factory.mktemp("tasks")
    cache = str(folder.parent / f"{folder.name}_hf")
    (folder / "gsm8k_boxed.yaml").write_text(yaml.safe_dump({
        "include": str(tasks_path() / "gsm8k_boxed.yaml"), "task": "gsm8k_boxed", "dataset_path": "json",
        "dataset_name": None, "dataset_kwargs": {"data_files": {"test": str(FIXTURES / "gsm8k.jsonl")}, "cache_dir": cache}}))
    (folder / "math500_boxed.yaml").write_text(yaml.safe_dump({
        "include": str(tasks_path() / "math500_boxed.yaml"), "task": "math500_boxed", "dataset_path": "json",
        "dataset_name": None, "dataset_kwargs": {"data_files": {"test": str(FIXTURES / "math500.jsonl")}, "cache_dir": cache}}))
    (folder / "toy_qa.yaml").write_text(yaml.safe_dump({
        "task": "toy_qa", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(write_jsonl(folder / "toy.jsonl", TOY))},
                                                                     "cache_dir": cache},
        "test_split": "test", "output_type": "generate_until", "doc_to_text": "{{question}}", "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "exact_match"}]}))
    return folder


def planted_rows():
    natalia = GSM8K[0]["question"]  # "Natalia sold clips to 48 of her friends in April, and then she sold half ..."
    w = words(natalia)
    moons = words(TOY[0]["question"])
    return [
        {"text": "An unrelated sentence about cooking pasta with olive oil and garlic for dinner tonight, all of it."},
        # 13 words of the GSM8K question, other case and punctuation: removed
        {"text": "Story: " + " ".join(w[2:15]).upper().replace(" ", ", ") + " -- end."},
        # 12 words of it only: kept
        {"text": "Story: " + " ".join(w[2:14]) + " and then something else happened entirely."},
        # 13 words with one changed: kept
        {"text": " ".join(w[2:8] + ["xylophone"] + w[9:15])},
        # 12 words in the prompt and the 13th in the completion: fields are separate, kept
        {"prompt": " ".join(w[2:14]), "completion": " ".join(w[14:20])},
        # in a completion, and a 13-gram of the solution text: removed
        {"prompt": "Solve it.", "completion": "Natalia sold 48/2 = <<48/2=24>>24 clips in May. Natalia sold 48+24 = "
                                             "<<48+24=72>>72 clips altogether in April and May."},
        # the user task: removed
        {"text": "Trivia: " + " ".join(moons[:13])},
        # both tasks: removed once, listed twice
        {"text": " ".join(w[:13]) + " ... " + " ".join(moons[1:14])},
        # loopeval's instruction is in every prompt, but not in the test documents: kept
        {"prompt": "Tom has 3 apples and buys 4 more. How many apples does he have now in total after buying?\n"
                   "Please reason step by step, and put your final answer within \\boxed{}.", "completion": "7"},
    ]


def test_planted_13_grams_are_removed_and_12_gram_near_misses_kept(tmp_path, tasks):
    rows = planted_rows()
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    result = decontaminate(data, out=tmp_path / "clean.jsonl", against=["gsm8k_boxed", "toy_qa"], include_path=tasks)
    kept = read_records(tmp_path / "clean.jsonl")
    assert kept == [rows[i] for i in (0, 2, 3, 4, 8)]
    assert (result.rows, result.kept, result.removed) == (9, 5, 4)
    assert result.removed_by_task == {"gsm8k_boxed": 3, "toy_qa": 2}
    removed = read_records(result.removed_path)
    assert [(r["row"], r["task"], r["doc_id"]) for r in removed] == [
        (2, "gsm8k_boxed", 0), (6, "gsm8k_boxed", 0), (7, "toy_qa", 0), (8, "gsm8k_boxed", 0), (8, "toy_qa", 0)]
    assert removed[0]["ngram"] == " ".join(words(GSM8K[0]["question"])[2:15])
    assert all(len(r["ngram"].split()) == 13 for r in removed)
    # kept rows are the original bytes, in order
    lines = data.read_text().splitlines(keepends=True)
    assert (tmp_path / "clean.jsonl").read_text() == "".join(lines[i] for i in (0, 2, 3, 4, 8))
    record = json.loads(result.record_path.read_text())
    assert record["test_documents"] == {"gsm8k_boxed": len(GSM8K), "toy_qa": 2} and record["n"] == 13


def test_the_scan_equals_a_brute_force_intersection(monkeypatch):
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(12)] + ["Apple", "apple", "x_y", "ÉTÉ"]
    docs = [EvalDocument(f"t{d % 2}", d, tuple(" ".join(rng.choices(vocab, k=rng.randint(2, 30))) for _ in range(2)))
            for d in range(6)]
    rows = [[" ".join(rng.choices(vocab + ["zz", "q"], k=rng.randint(0, 25))) for _ in range(rng.randint(0, 3))]
            for _ in range(400)]
    rows[5] = ["w1 \x01 w2 \x00 w3"]  # separator characters inside a row change nothing
    monkeypatch.setattr(dc, "_CHUNK_ROWS", 7)
    for n in (1, 3, 4):
        grams = {}
        for doc in docs:
            for text in doc.texts:
                w = words(text)
                for i in range(len(w) - n + 1):
                    grams.setdefault(tuple(w[i:i + n]), {}).setdefault(doc.task, doc.doc_id)
        index = NgramIndex(docs, n=n)
        assert len(index) == len(grams)
        hits = index.scan(rows)
        for row, hit in zip(rows, hits):
            shared = {}
            for text in row:
                w = words(text)
                for i in range(len(w) - n + 1):
                    for task, doc_id in grams.get(tuple(w[i:i + n]), {}).items():
                        shared.setdefault(task, (doc_id, " ".join(w[i:i + n])))
            assert hit == shared
        assert 0 < sum(bool(h) for h in hits) < len(rows)


def test_training_records_the_decontamination_of_its_data(tmp_path, tasks, tokenizer):
    from loopeval.training import load_data

    data = write_jsonl(tmp_path / "train.jsonl", planted_rows())
    decontaminate(data, out=tmp_path / "clean.jsonl", against=["toy_qa"], include_path=tasks, n=13)
    clean = load_data(tmp_path / "clean.jsonl", tokenizer, max_length=64)
    assert clean.decontamination["against"] == ["toy_qa"] and clean.decontamination["removed"] == 2
    assert clean.summary()["decontamination"] == clean.decontamination
    assert load_data(data, tokenizer, max_length=64).decontamination is None
    with (tmp_path / "clean.jsonl").open("a") as f:
        f.write(json.dumps({"text": "a row added later"}) + "\n")
    with pytest.warns(UserWarning, match="changed after decontamination"):
        assert load_data(tmp_path / "clean.jsonl", tokenizer, max_length=64).decontamination is None
    assert decontamination_record(tmp_path / "train.jsonl", "0" * 64) is None


def test_groups_expand_to_their_tasks(tasks):
    from loopeval.training.decontamination import eval_documents

    docs = eval_documents(["loop_core"], include_path=tasks)  # loopeval's group over the local task files
    math500 = read_records(FIXTURES / "math500.jsonl")
    assert [(d.task, d.doc_id) for d in docs] == [("gsm8k_boxed", i) for i in range(len(GSM8K))] + [
        ("math500_boxed", i) for i in range(len(math500))]
    assert GSM8K[1]["question"] in docs[1].texts and math500[0]["solution"] in docs[len(GSM8K)].texts


def test_bad_input(tmp_path, tasks):
    data = write_jsonl(tmp_path / "train.jsonl", [{"text": "a"}])
    with pytest.raises(ValueError, match="unknown lm-eval task"):
        decontaminate(data, out=tmp_path / "o.jsonl", against=["no_such_task_xyz"], include_path=tasks)
    with pytest.raises(FileNotFoundError, match="include path"):
        decontaminate(data, out=tmp_path / "o.jsonl", against=["toy_qa"], include_path=tmp_path / "missing")
    with pytest.raises(ValueError, match="must be different files"):
        decontaminate(data, out=data, against=["toy_qa"], include_path=tasks)
    with pytest.raises(ValueError, match="n 0"):
        decontaminate(data, out=tmp_path / "o.jsonl", against=["toy_qa"], include_path=tasks, n=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        decontaminate(bad, out=tmp_path / "o.jsonl", against=["toy_qa"], include_path=tasks)
    assert not (tmp_path / "o.jsonl").exists()  # nothing half-written
    decontaminate(data, out=tmp_path / "o.jsonl", against=["toy_qa"], include_path=tasks)
    with pytest.raises(ValueError, match="o.jsonl exists"):
        decontaminate(data, out=tmp_path / "o.jsonl", against=["toy_qa"], include_path=tasks)


def test_cli(tmp_path, tasks, capsys):
    from loopeval.cli import main

    data = write_jsonl(tmp_path / "train.jsonl", planted_rows())
    assert main(["decontaminate", str(data), "--against", "gsm8k_boxed,toy_qa", "--include-path", str(tasks),
                 "--out", str(tmp_path / "clean.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "kept 5 of 9 rows" in out and "gsm8k_boxed: 3 rows" in out and (tmp_path / "clean.removed.jsonl").is_file()
    assert main(["decontaminate", str(data), "--against", "toy_qa", "--include-path", str(tasks),
                 "--out", str(tmp_path / "clean.jsonl")]) == 2
    assert "exists" in capsys.readouterr().err
