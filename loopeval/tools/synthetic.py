"""A synthetic reasoning task made locally: multi-step arithmetic word problems.

Each problem has a worked solution that ends in ``\\boxed{answer}``, in the format the
tasks score. Problems combine two or three operations on small numbers, so a tiny
model can learn them on a CPU in minutes and still has something to reason about.

The test split is decontaminated against train: no test question, compared after
lower-casing and collapsing whitespace, appears in train. (The paper's 13-gram rule
is meant for natural text; template problems share their wording by design.)
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from loopeval.evaluation.scoring import user_prompt

_NAMES = ["Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kim", "Leo", "Mia", "Noor", "Omar", "Pia"]
_ITEMS = ["apples", "pens", "coins", "cards", "shells", "books", "eggs", "stamps", "marbles", "cookies"]
_BOXES = ["bags", "boxes", "jars", "packs", "baskets", "trays"]


@dataclass(frozen=True)
class Problem:
    question: str
    solution: str  # worked steps ending in \boxed{answer}
    answer: str


def _p(question: str, steps: list[str], answer: int) -> Problem:
    return Problem(question, " ".join(steps) + f" The answer is \\boxed{{{answer}}}.", str(answer))


def _make(rng: random.Random) -> Problem:
    name, item, box = rng.choice(_NAMES), rng.choice(_ITEMS), rng.choice(_BOXES)
    kind = rng.randrange(5)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    if kind == 0:
        c = rng.randint(1, a * b)
        q = f"{name} has {a} {box} with {b} {item} in each. {name} gives away {c} {item}. How many {item} are left?"
        return _p(q, [f"{a} * {b} = {a * b}.", f"{a * b} - {c} = {a * b - c}."], a * b - c)
    if kind == 1:
        c = rng.randint(1, 12)
        q = f"{name} buys {a} {box} of {b} {item} and {c} more {item}. How many {item} does {name} have?"
        return _p(q, [f"{a} * {b} = {a * b}.", f"{a * b} + {c} = {a * b + c}."], a * b + c)
    if kind == 2:
        a, b = rng.randint(5, 20), rng.randint(1, 12)
        c = rng.randint(1, a + b)
        q = f"{name} has {a} {item}, finds {b} more and then loses {c}. How many {item} does {name} have now?"
        return _p(q, [f"{a} + {b} = {a + b}.", f"{a + b} - {c} = {a + b - c}."], a + b - c)
    if kind == 3:
        c = rng.randint(1, a * b)
        d = rng.randint(1, 12)
        q = (
            f"There are {a} {box} of {b} {item}. {name} takes {c} {item} out and puts {d} {item} back. "
            f"How many {item} are there?"
        )
        steps = [f"{a} * {b} = {a * b}.", f"{a * b} - {c} = {a * b - c}.", f"{a * b - c} + {d} = {a * b - c + d}."]
        return _p(q, steps, a * b - c + d)
    c = rng.randint(b * a, b * a + 12)
    q = f"{name} had {c} {item} and gave {b} {item} to each of {a} friends. How many {item} are left?"
    return _p(q, [f"{b} * {a} = {a * b}.", f"{c} - {a * b} = {c - a * b}."], c - a * b)


def _key(question: str) -> str:
    return " ".join(question.lower().split())


def make_splits(n_train: int, n_test: int, *, seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """Distinct test problems, and train problems that never repeat a test question."""
    rng = random.Random(seed)
    test, seen = [], set()
    while len(test) < n_test:
        p = _make(rng)
        if _key(p.question) not in seen:
            seen.add(_key(p.question))
            test.append(p)
    train = []
    while len(train) < n_train:
        p = _make(rng)
        if _key(p.question) not in seen:
            train.append(p)
    return train, test


def write_splits(folder: str | Path, train: list[Problem], test: list[Problem]) -> tuple[Path, Path]:
    """``train.jsonl`` as chat SFT rows (prompt, completion) and ``test.jsonl`` with
    GSM8K-style fields (question, answer ending in ``#### N``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    train_file, test_file = folder / "train.jsonl", folder / "test.jsonl"
    with train_file.open("w") as f:
        for p in train:
            f.write(json.dumps({"prompt": user_prompt(p.question), "completion": p.solution}) + "\n")
    with test_file.open("w") as f:
        for p in test:
            f.write(json.dumps({**asdict(p), "answer": f"{p.solution}\n#### {p.answer}"}) + "\n")
    return train_file, test_file
