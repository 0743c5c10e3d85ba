"""Boxed-answer scoring for the reasoning benchmarks (paper, appendix A.4).

The answer is the last complete, non-empty ``\\boxed{...}`` after the last ``</think>``. A
response whose thinking block never closes has no answer. With ``number_fallback``
(GSM8K) the last number stands in when there is no box. Answers are compared with the
reference by math-verify, which normalises LaTeX and compares numerically where it can;
option letters (``B``, ``(B)``, ``\\text{(B)}``, ``B) 4 eV``) are compared as letters.

A math-verify timeout, error or unparsable expression makes the answer wrong and is
counted (:func:`failures`); it never stops a run. math-verify's timeouts use ``SIGALRM``, which
only the main thread can set, so elsewhere scoring runs without a time limit.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TIMEOUT_SECONDS = 5
"""Limit for each math-verify parse and comparison, in whole seconds (main thread only)."""

_BOXED = re.compile(r"\\boxed(?![A-Za-z])")
_BARE_ARGUMENT = re.compile(r"[ \t]+([^\s$]+)")
# A number with optional sign, thousands separators and decimals; the look-behind keeps
# the "2" of "x2", the "5" of "1.5" and the "-3" of "10-3" from counting as numbers.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d)")
_LETTER_WRAPPER = re.compile(r"\\(?:textbf|text|mathrm|mathbf|mbox)\s*|[{}$]")
_GOLD_LETTER = re.compile(r"\(?([A-Z])\)?")
_ANSWER_LETTER = re.compile(r"\(?([A-Z])(?:[).:]?(?:\s.*)?)?", re.DOTALL)

_failures: Counter[str] = Counter()
_failures_lock = threading.Lock()


def user_prompt(question: str) -> str:
    """The single user turn of a generative task: the stripped question, a newline, ``INSTRUCTION``."""
    if not question.strip():
        raise ValueError("question is empty")
    return f"{question.strip()}\n{INSTRUCTION}"


@dataclass(frozen=True)
class Grade:
    """The verdict on one response.

    ``answer`` is the extracted answer (``None`` when there is none), ``boxed`` whether it
    came from a box rather than the number fallback, and ``failure`` is ``"parse"``,
    ``"timeout"`` or ``"error"`` when math-verify could not decide (the answer then counts
    as wrong).
    """

    correct: bool
    answer: str | None
    boxed: bool
    failure: str | None = None


def grade(response: str, gold: str, *, number_fallback: bool = False, thinking: bool = False) -> Grade:
    """Extract the answer from ``response`` and compare it with the reference ``gold``.

    ``thinking`` says the prompt itself opened the thinking block (thinking mode), so an
    answer counts only after a ``</think>`` in the response.
    """
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"gold answer must be a non-empty string, got {gold!r}")
    answer, boxed = _extract(response, number_fallback=number_fallback, thinking=thinking)
    if answer is None:
        return Grade(correct=False, answer=None, boxed=False)
    gold_letter = _GOLD_LETTER.fullmatch(_unwrap_letter(gold))
    if gold_letter:
        answer_letter = _ANSWER_LETTER.fullmatch(_unwrap_letter(answer))
        correct = answer_letter is not None and answer_letter.group(1) == gold_letter.group(1)
        return Grade(correct=correct, answer=answer, boxed=boxed)
    correct, failure = _math_verify(gold, answer)
    if failure:
        with _failures_lock:
            _failures[failure] += 1
    return Grade(correct=correct, answer=answer, boxed=boxed, failure=failure)


def score(response: str, gold: str, *, number_fallback: bool = False, thinking: bool = False) -> bool:
    """Whether ``response`` answers ``gold`` correctly (see :func:`grade`)."""
    return grade(response, gold, number_fallback=number_fallback, thinking=thinking).correct


def extract_answer(response: str, *, number_fallback: bool = False, thinking: bool = False) -> str | None:
    """The answer :func:`score` would compare, or ``None`` when the response has none."""
    return _extract(response, number_fallback=number_fallback, thinking=thinking)[0]


def gsm8k_gold(solution: str) -> str:
    """The reference number of a GSM8K solution: the text after ``####``, without commas."""
    _, sep, tail = solution.rpartition("####")
    number = tail.strip().replace(",", "")
    if not sep or not number:
        raise ValueError(f"GSM8K solution has no '#### <number>' line: {solution[-80:]!r}")
    return number


def failures() -> dict[str, int]:
    """How many comparisons math-verify could not decide in this process, by kind."""
    with _failures_lock:
        return dict(_failures)


def reset_failures() -> None:
    """Set the :func:`failures` counts back to zero."""
    with _failures_lock:
        _failures.clear()


def _extract(response: str, *, number_fallback: bool, thinking: bool) -> tuple[str | None, bool]:
    if not isinstance(response, str):
        raise ValueError(f"response must be a string, got {type(response).__name__}")
    _, closed, final = response.rpartition(THINK_CLOSE)
    if not closed:
        if thinking:
            return None, False
        final = response
    if THINK_OPEN in final:
        return None, False
    boxes = [content for content in _boxed_contents(final) if content]
    if boxes:
        return boxes[-1], True
    if number_fallback:
        numbers = _NUMBER.findall(final)
        if numbers:
            return numbers[-1].replace(",", ""), False
    return None, False


def _boxed_contents(text: str) -> list[str]:
    """The stripped argument of every complete ``\\boxed`` in ``text``, in order."""
    contents = []
    for match in _BOXED.finditer(text):
        start = match.end()
        brace = start + len(text[start:]) - len(text[start:].lstrip())
        if brace < len(text) and text[brace] == "{":
            end = _closing_brace(text, brace)
            if end is not None:
                contents.append(text[brace + 1 : end].strip())
        elif bare := _BARE_ARGUMENT.match(text, start):
            # `\boxed 42`: read the whole word, as the MATH and Qwen-Math graders do.
            contents.append(bare.group(1).rstrip(".,;"))
    return contents


def _closing_brace(text: str, open_at: int) -> int | None:
    depth = 0
    i = open_at
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # an escaped character, such as \{ or \}, never opens or closes
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _unwrap_letter(expr: str) -> str:
    return _LETTER_WRAPPER.sub("", expr).strip()


def _math_verify(gold: str, answer: str) -> tuple[bool, str | None]:
    from math_verify import verify
    from math_verify.errors import TimeoutException

    limit = TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = _parse(gold, limit)
        answer_parsed = _parse(answer, limit)
        if not gold_parsed or not answer_parsed:
            return False, "parse"
        for g in gold_parsed:
            for a in answer_parsed:
                if verify(g, a, timeout_seconds=limit, raise_on_error=True):
                    return True, None
        return False, None
    except TimeoutException:
        return False, "timeout"
    except Exception:  # sympy and latex2sympy raise many types on odd input
        return False, "error"


def _parse(expr: str, limit: int | None) -> list:
    from math_verify import LatexExtractionConfig, parse

    parsed = parse(
        f"\\boxed{{{expr}}}",
        extraction_config=[LatexExtractionConfig()],
        parsing_timeout=limit,
        raise_on_error=True,
    )
    # math-verify appends the raw string as a fallback; only a parsed expression counts.
    return [item for item in parsed if not isinstance(item, str)]
