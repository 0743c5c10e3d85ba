"""Decontamination speed: ``loopeval decontaminate`` on many training rows against the
paper's five test sets, read through loopeval's own task YAMLs.

The test sets are synthetic documents with the real datasets' fields and sizes (GSM8K
test 1,319, MATH-500 500, AIME 2024 30, AIME 2025 30, GPQA-Diamond 198), served from
local JSON files, so nothing is downloaded. Training rows are prompt/completion pairs of
Zipf-distributed pseudo-words (the test documents draw from the same distribution, so
most training words are in the test vocabulary and nearly every 13-word window is
hashed and looked up: the slow case). ``--planted`` rows carry a 13-gram of a test
document, and the run checks that exactly those are removed.

    python benchmarks/bench_decontaminate.py --rows 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from loopeval.common.paths import tasks_path
from loopeval.training.decontamination import PAPER_TEST_SETS, decontaminate

SIZES = {"gsm8k_boxed": 1319, "math500_boxed": 500, "aime24_boxed": 30, "aime25_boxed": 30, "gpqa_diamond_boxed": 198}


class Words:
    def __init__(self, seed: int, vocab: int = 30_000):
        rng = np.random.default_rng(seed)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        self.vocab = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(vocab)]
        p = 1.0 / np.arange(1, vocab + 1) ** 1.1
        self.p = p / p.sum()
        self.rng = rng

    def text(self, n: int) -> str:
        return " ".join(self.vocab[i] for i in self.rng.choice(len(self.vocab), size=n, p=self.p))

    def texts(self, count: int, lo: int, hi: int) -> list[str]:
        lengths = self.rng.integers(lo, hi, size=count)
        ids = self.rng.choice(len(self.vocab), size=int(lengths.sum()), p=self.p)
        out, at = [], 0
        for n in lengths:
            out.append(" ".join(self.vocab[i] for i in ids[at:at + n]))
            at += n
        return out


def test_docs(words: Words, task: str, n: int) -> list[dict]:
    q, a = words.texts(n, 40, 160), words.texts(n, 60, 200)
    if task == "gsm8k_boxed":
        return [{"question": x, "answer": f"{y}\n#### {i}"} for i, (x, y) in enumerate(zip(q, a))]
    if task == "math500_boxed":
        return [{"problem": x, "solution": y, "answer": str(i)} for i, (x, y) in enumerate(zip(q, a))]
    if task == "aime24_boxed":
        return [{"ID": str(i), "Problem": x, "Solution": y, "Answer": i} for i, (x, y) in enumerate(zip(q, a))]
    if task == "aime25_boxed":
        return [{"problem": x, "answer": str(i), "id": str(i)} for i, x in enumerate(q)]
    options = words.texts(4 * n, 3, 12)
    return [{"Question": x, "Correct Answer": options[4 * i], "Incorrect Answer 1": options[4 * i + 1],
             "Incorrect Answer 2": options[4 * i + 2], "Incorrect Answer 3": options[4 * i + 3], "Explanation": y,
             "Record ID": f"rec{i}"} for i, (x, y) in enumerate(zip(q, a))]


def write_tasks(folder: Path, words: Words) -> dict[str, list[dict]]:
    docs = {}
    for task, n in SIZES.items():
        docs[task] = test_docs(words, task, n)
        data = folder / f"{task}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs[task]))
        split = yaml.load((tasks_path() / f"{task}.yaml").read_text().replace("!function", ""), Loader=yaml.SafeLoader)["test_split"]
        (folder / f"{task}.yaml").write_text(yaml.safe_dump({
            "include": str(tasks_path() / f"{task}.yaml"), "task": task, "dataset_path": "json", "dataset_name": None,
            "dataset_kwargs": {"data_files": {split: str(data)}, "cache_dir": str(folder / "hf_cache")}}))
    return docs


def write_training(path: Path, words: Words, rows: int, planted: int, docs: dict[str, list[dict]], seed: int) -> set[int]:
    rng = random.Random(seed)
    sources = [text.split() for task in docs for d in docs[task] for text in [next(iter(d.values()))] if len(text.split()) >= 13]
    plant = set(rng.sample(range(rows), planted))
    with path.open("w") as f:
        for start in range(0, rows, 50_000):
            n = min(50_000, rows - start)
            prompts, completions = words.texts(n, 20, 60), words.texts(n, 60, 140)
            for i, (p, c) in enumerate(zip(prompts, completions)):
                if start + i in plant:
                    w = rng.choice(sources)
                    at = rng.randrange(len(w) - 12)
                    c = f"{c} {' '.join(w[at:at + 13])}"
                f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
    return {r + 1 for r in plant}  # line numbers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--planted", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", help="keep the generated files here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.workdir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        words = Words(args.seed)
        t0 = time.perf_counter()
        docs = write_tasks(root, words)
        planted = write_training(root / "train.jsonl", words, args.rows, args.planted, docs, args.seed)
        size = (root / "train.jsonl").stat().st_size
        print(f"generated {args.rows:,} rows ({size / 2**20:,.0f} MiB) and {sum(SIZES.values()):,} test documents "
              f"in {time.perf_counter() - t0:.0f} s")
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        result = decontaminate(root / "train.jsonl", out=root / "clean.jsonl", against=PAPER_TEST_SETS, include_path=root,
                               overwrite=True)
        seconds = time.perf_counter() - t0
        removed = {json.loads(line)["row"] for line in result.removed_path.read_text().splitlines()}
        words_total = sum(len(line.split()) for line in (root / "train.jsonl").open())
        print(f"decontaminate: {seconds:.1f} s wall for {result.rows:,} rows ({result.rows / seconds:,.0f} rows/s, "
              f"{words_total / seconds / 1e6:.1f} M words/s); load average before: {load:.1f}")
        print(f"removed {result.removed} rows ({result.removed_by_task}); planted {len(planted)}; "
              f"exactly the planted rows: {removed == planted}")


if __name__ == "__main__":
    main()
