"""Time loopeval.evaluation.scoring on realistic responses against the scorer before issue 10 (d9ab394).

    python benchmarks/bench_scoring.py [--responses 10000] [--repeats 3] [--seed 0]

Work: ``--responses`` generated responses in the proportions of a ``loop_full`` run:
GSM8K (boxed integers, some with units or separators, some unboxed for the last-number
fallback), MATH-500 (fractions, surds, intervals, tuples, matrices, text; written as the
reference, in an equivalent form or wrong), AIME (8 sampled answers per problem) and
GPQA (option letters in several wrappings, a few hedges), each after a few sentences of
reasoning. The old scorer is ``git show d9ab394:loopeval/evaluation/scoring.py`` loaded from a temp
file; both score every response in the main thread (math-verify's time-outs on), passes
interleaved, median of ``--repeats``. Prints a Markdown table, the verdicts that differ,
and the machine.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from loopeval.evaluation import scoring

OLD_COMMIT = "d9ab394"
REPO = Path(__file__).resolve().parents[1]

# (gold, equivalent forms, wrong answers) for MATH-style problems.
MATH = [
    (r"\frac{3}{4}", [r"\frac{3}{4}", r"\dfrac{3}{4}", "3/4", "0.75"], [r"\frac{4}{3}", "0.7"]),
    (r"2\sqrt{2}", [r"2\sqrt{2}", r"\sqrt{8}", r"2 \sqrt 2"], [r"\sqrt{2}", "2.8"]),
    (r"\frac{\pi}{3}", [r"\frac{\pi}{3}", r"\dfrac{\pi}{3}", r"\pi/3"], [r"\frac{\pi}{6}", "60"]),
    (r"(-\infty, 3]", [r"(-\infty, 3]", r"(-\infty,3]", r"x \in (-\infty, 3]"], [r"(-\infty, 3)", r"x \le 3"]),
    (r"\left( 3, \frac{\pi}{2} \right)", [r"\left( 3, \frac{\pi}{2} \right)", r"(3, \frac{\pi}{2})", r"(3,\pi/2)"],
     [r"(\frac{\pi}{2}, 3)", r"(3, \pi)"]),
    (r"\begin{pmatrix} 1 \\ -2 \end{pmatrix}",
     [r"\begin{pmatrix} 1 \\ -2 \end{pmatrix}", r"\begin{pmatrix}1\\-2\end{pmatrix}"],
     [r"\begin{pmatrix} -2 \\ 1 \end{pmatrix}"]),
    (r"\text{Evelyn}", [r"\text{Evelyn}", "Evelyn"], [r"\text{Carla}"]),
    ("-2, 5", ["-2, 5", "5, -2", "x = -2, 5"], ["5", "-5, 2"]),
    (r"y = 2x + 3", [r"y = 2x + 3", r"y=2x+3", "2x + 3"], [r"y = 3x + 2"]),
    (r"10{,}000", [r"10{,}000", "10000", r"10\,000"], ["1000"]),
    (r"\frac{1}{\sqrt{3}}", [r"\frac{1}{\sqrt{3}}", r"\frac{\sqrt{3}}{3}"], [r"\sqrt{3}"]),
    ("12:00", ["12:00"], ["11:00"]),
    (r"30^\circ", [r"30^\circ", "30", r"30 \text{ degrees}"], [r"60^\circ"]),
    (r"25\%", [r"25\%", "25", "0.25"], [r"20\%"]),
]
LETTER_FORMS = ["{L}", "({L})", r"\text{{({L})}}", r"\textbf{{{L}}}", "{L}) 4 eV", r"\text{{{L}. }} 10^{{-4}}",
                r"\mathrm{{{L}}}"]
FILLER = [
    "Let me work through this step by step.", "First, {a} + {b} = {c}.", "So we have {a} groups of {b}, which is {d}.",
    "Checking: {c} - {b} = {a}, which matches.", "We substitute into the equation and simplify.",
    "Therefore the quantity we want follows from the previous line.", "Note that {a} \\times {b} = {d}.",
]


def reasoning(rng: random.Random) -> str:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return " ".join(rng.choice(FILLER).format(a=a, b=b, c=a + b, d=a * b) for _ in range(rng.randint(3, 12)))


def gsm8k(rng: random.Random) -> tuple[str, str, dict]:
    gold = rng.randint(1, 99_999)
    answer = gold if rng.random() < 0.6 else gold + rng.choice([-10, -1, 1, 2, 100])
    written = rng.choice([str(answer)] * 3 + [f"\\${answer}", f"{answer} \\text{{ apples}}", f"{answer:,}",
                          f"{answer:,}".replace(",", "{,}")])
    if rng.random() < 0.1:  # no box: the last-number fallback
        return f"{reasoning(rng)} So the answer is {answer}.", str(gold), {"number_fallback": True}
    return f"{reasoning(rng)} The answer is $\\boxed{{{written}}}$.", str(gold), {"number_fallback": True}


def math500(rng: random.Random) -> tuple[str, str, dict]:
    gold, same, wrong = rng.choice(MATH)
    roll = rng.random()
    answer = same[0] if roll < 0.5 else rng.choice(same) if roll < 0.7 else rng.choice(wrong)
    return f"{reasoning(rng)} Hence the answer is $\\boxed{{{answer}}}$.", gold, {}


def aime(rng: random.Random) -> list[tuple[str, str, dict]]:
    gold = rng.randint(0, 999)
    return [(f"{reasoning(rng)} $\\boxed{{{gold if rng.random() < 0.3 else rng.randint(0, 999)}}}$", str(gold), {})
            for _ in range(8)]


def gpqa(rng: random.Random) -> tuple[str, str, dict]:
    gold = rng.choice("ABCD")
    letter = gold if rng.random() < 0.4 else rng.choice("ABCD")
    answer = rng.choice(LETTER_FORMS).format(L=letter)
    if rng.random() < 0.05:
        answer = f"{letter} \\text{{ or }} {rng.choice('ABCD')}"
    return f"{reasoning(rng)} The correct option is $\\boxed{{{answer}}}$.", gold, {}


def responses(n: int, seed: int) -> list[tuple[str, str, dict]]:
    rng = random.Random(seed)
    out: list[tuple[str, str, dict]] = []
    while len(out) < n:
        roll = rng.random()
        if roll < 0.45:
            out.append(gsm8k(rng))
        elif roll < 0.80:
            out.append(math500(rng))
        elif roll < 0.85:
            out += aime(rng)
        else:
            out.append(gpqa(rng))
    return out[:n]


def old_scorer():
    source = subprocess.run(["git", "show", f"{OLD_COMMIT}:loopeval/evaluation/scoring.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"scoring_{OLD_COMMIT}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"scoring_{OLD_COMMIT}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def timed(scorer, work) -> tuple[float, list[bool]]:
    start = time.perf_counter()
    verdicts = [scorer.score(r, g, **kw) for r, g, kw in work]
    return time.perf_counter() - start, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--responses", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    work = responses(args.responses, args.seed)
    scorers = {"before (d9ab394)": old_scorer(), "after": scoring}
    for scorer in scorers.values():  # warm-up: imports and math-verify's grammar
        timed(scorer, work[:50])
    times: dict[str, list[float]] = {name: [] for name in scorers}
    verdicts = {}
    for _ in range(args.repeats):
        for name, scorer in scorers.items():
            seconds, verdicts[name] = timed(scorer, work)
            times[name].append(seconds)

    print(f"{len(work)} responses ({Counter(len(kw) for _, _, kw in work)[1]} GSM8K-style), "
          f"median of {args.repeats} interleaved passes\n")
    print("| scorer | time | responses/s | accuracy |\n| --- | --- | --- | --- |")
    for name in scorers:
        median = statistics.median(times[name])
        accuracy = sum(verdicts[name]) / len(work)
        print(f"| {name} | {median:.2f} s | {len(work) / median:,.0f} | {100 * accuracy:.2f}% |")
    before, after = verdicts.values()
    changed = Counter((b, a) for b, a in zip(before, after) if b != a)
    print(f"\nverdicts changed: {changed[(False, True)]} wrong -> right, {changed[(True, False)]} right -> wrong")
    boxed = [scoring.extract_answer(r, **kw) for r, _, kw in work]
    groups = Counter((w[1], answer, b, a) for w, answer, b, a in zip(work, boxed, before, after) if b != a)
    for (gold, answer, b, a), count in groups.most_common(10):
        print(f"  {count:4d} x  answer {answer!r} for reference {gold!r}: {'right' if b else 'wrong'} -> "
              f"{'right' if a else 'wrong'}")
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}; Python {sys.version.split()[0]}, "
          f"math-verify {importlib.metadata.version('math-verify')}")


if __name__ == "__main__":
    main()
