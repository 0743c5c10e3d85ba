"""Boxed-answer scoring for the reasoning benchmarks (paper, appendix A.4).

The paper's rule: "The answer is the last boxed expression after any thinking block (for
GSM8K, the last number if there is no box), compared with the reference after normalising
LaTeX and numerically when possible."

The answer is the last complete, non-empty ``\\boxed{...}`` or ``\\fbox{...}`` after the last
``</think>``. A response whose thinking block never closes has no answer. With
``number_fallback`` (GSM8K) the last number stands in when there is no box. An answer equal
to the reference after whitespace and trivial LaTeX normalisation is correct at once;
otherwise option letters (``B``, ``(B)``, ``\\text{(B)}``, ``B) 4 eV``) are compared as
letters, and everything else by math-verify, which normalises LaTeX and compares
numerically where it can. Digit groups split by LaTeX thousands separators (``14{,}916``,
``1\\,234``, ``1 234``) are joined before math-verify reads them, which would otherwise read
``1\\,234`` as 235.

A math-verify timeout, error or unparsable expression makes the answer wrong and is
counted (:func:`failures`); it never stops a run. math-verify's timeouts use ``SIGALRM``, which
only the main thread can set, so elsewhere scoring runs without a time limit.

Every :class:`Grade` carries ``flags``: the rules in :data:`FLAGS` that a reader might
dispute and that decided or shaped this verdict (``loopeval score-audit`` lists them).
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass

from loopeval.evaluation.settings import THINK_CLOSE, THINK_OPEN

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TIMEOUT_SECONDS = 5
"""Limit for each math-verify parse and comparison, in whole seconds (main thread only)."""

FLAGS = {
    "number_fallback": "no box: the last number in the text was compared (GSM8K)",
    "hedged_letter": "the answer names two or more option letters, e.g. 'B or C'; scored wrong",
    "several_boxes": "different boxed answers after thinking; the last one was compared",
    "math_verify_failed": "math-verify could not parse, errored or timed out; scored wrong",
    "relation_vs_interval": "an inequality against an interval gold (wrong) or an interval against an inequality gold",
    "irregular_grouping": "the fallback number had irregular thousands grouping and was read whole (1080,000 as 1080000)",
    "ambiguous_number": "the fallback number may belong to a grouped or decimal-comma number (1 000, 3,5); "
                        "read as written, not guessed",
}
"""The disputable rules a :class:`Grade` can carry in ``flags``, with what each means."""

_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BARE_ARGUMENT = re.compile(r"[ \t]+([^\s$]+)")
# LaTeX thousands separators: {,} and the thin, medium, thick and control spaces, and ~.
_SEPARATOR = r"(?:\{,\}|\\[,:; ]|\\thinspace(?![A-Za-z]) ?|~)"
_GROUPED_OR_SPACED = re.compile(rf"(?<![\d.])\d{{1,3}}(?:(?:{_SEPARATOR}| )\d{{3}})+(?!\d)")
_SEPARATORS = re.compile(rf"{_SEPARATOR}| ")
# The number fallback's reading of free text; at each position the first alternative that
# matches wins. Unambiguous thousands groups are read whole: commas (1,080,000), two or more
# dots (1.080.000), thin, no-break, LaTeX spaces or apostrophes (1 080 000, 1'080'000), and
# two or more plain-space groups (1 080 000). A lead group of four or more digits before
# comma groups (1080,000) is read whole and flagged. A single plain-space group (1 000) or a
# decimal comma (3,5) stays separate numbers, flagged when it gives the answer.
_FALLBACK = re.compile(
    r"(?<![\w.])-?(?:"
    r"(?P<comma>\d{1,3}(?:,\d{3})+(?:\.\d+)?)(?!\d)(?!,\d)"
    r"|(?P<dots>\d{1,3}(?:\.\d{3}){2,})(?!\d)(?!\.\d)"
    rf"|(?P<marked>\d{{1,3}}(?:(?:{_SEPARATOR}|[\u2009\u202f\u00a0'])\d{{3}})+)(?!\d)"
    r"|(?P<spaced>\d{1,3}(?: \d{3}){2,})(?!\d)"
    r"|(?P<irregular>\d{4,}(?:,\d{3})+)(?!\d)(?!,\d)"
    r"|\d+(?:\.\d+)?(?!\d)|\.\d+(?!\d))"
)
_UNGROUP = re.compile(rf"{_SEPARATOR}|[,\s\u2009\u202f\u00a0']")
_DECIMAL_COMMA_BEFORE = re.compile(r"\d,$")
_SPACE_GROUP_BEFORE = re.compile(r"(?<![\d,.])\d{1,3} $")
_INTEGER = re.compile(r"-?\d+")

# Trivial LaTeX normalisation for the exact-match test: tokens, dropped, renamed, spacing.
_TOKEN = re.compile(r"\\(?:[A-Za-z]+|.)|\s+|.", re.DOTALL)
_DROPPED = frozenset({"\\left", "\\right", "\\displaystyle", "$"})
_RENAMED = {"\\dfrac": "\\frac", "\\tfrac": "\\frac", "\\cfrac": "\\frac", "\\varnothing": "\\emptyset"}
_SPACING = frozenset({"\\,", "\\:", "\\;", "\\!", "\\ ", "\\quad", "\\qquad", "\\thinspace", "~"})

_LETTER_WRAPPER = re.compile(
    r"\\(?:textbf|textit|textrm|textsf|texttt|text|mathrm|mathbf|mathit|mathsf|mathtt|mbox|emph|boldsymbol)\s*"
    r"|\\(?:[,:; !]|q?quad(?![A-Za-z]))|\*\*|[{}$]"
)
_GOLD_LETTER = re.compile(r"\(?([A-Z])\)?")
_ANSWER_LETTER = re.compile(
    r"(?:(?i:the\s+)?(?i:(?:correct|final)\s+)?(?i:answer|option|choice)(?i:\s+is)?\s*[:.]?\s*)?"
    r"(?P<open>[(\[])?(?P<letter>[A-Z])(?(open)[)\]]|(?P<label>[).:])?)(?P<rest>.*)",
    re.DOTALL,
)
# After a bare letter (no bracket or label punctuation) an operator means an expression such as B + C.
_OPERATOR = re.compile(
    r"[-+*/=<>^_|&;]|\\(?:cdot|times|div|cup|cap|pm|mp|le|ge|leq|geq|neq|ne|to|vee|wedge|lor|land|setminus)(?![A-Za-z])"
)
_LETTER_TOKEN = re.compile(r"(?<![A-Za-z0-9\\])([A-J])(?![A-Za-z0-9])")
# A connective, at most two lowercase words, then another option letter: "or C", "(or possibly C)", ", C", "/C".
_HEDGE = re.compile(
    r"(?:\b(?i:or|and|nor|vs|versus|either|possibly|maybe|perhaps|probably)\b|[,/&;])(?!\s+not\b)"
    r"(?:\s+[a-z]+){0,2}[\s(\[]*([A-J])(?![A-Za-z0-9])"
)

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
    as wrong). ``flags`` names the disputable rules (keys of :data:`FLAGS`, in that order)
    behind the verdict.
    """

    correct: bool
    answer: str | None
    boxed: bool
    failure: str | None = None
    flags: tuple[str, ...] = ()


def grade(response: str, gold: str, *, number_fallback: bool = False, thinking: bool = False) -> Grade:
    """Extract the answer from ``response`` and compare it with the reference ``gold``.

    ``thinking`` says the prompt itself opened the thinking block (thinking mode), so an
    answer counts only after a ``</think>`` in the response.
    """
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"gold answer must be a non-empty string, got {gold!r}")
    answer, boxed, distinct_boxes, grouping = _extract(response, number_fallback=number_fallback, thinking=thinking)
    flags = set()
    if answer is not None and not boxed:
        flags.add("number_fallback")
        flags.update(grouping)
    if distinct_boxes > 1:
        flags.add("several_boxes")
    correct, failure = False, None
    if answer is not None:
        same = _same(answer, gold)
        gold_letter = _GOLD_LETTER.fullmatch(_unwrap_letter(gold))
        if same is not None:
            correct = same
        elif gold_letter:
            letter, hedged = _read_letter(answer)
            correct = letter == gold_letter.group(1) and not hedged
            if hedged:
                flags.add("hedged_letter")
        else:
            correct, failure, relation = _math_verify(gold, answer)
            if failure:
                flags.add("math_verify_failed")
                with _failures_lock:
                    _failures[failure] += 1
            if relation:
                flags.add("relation_vs_interval")
    return Grade(correct=correct, answer=answer, boxed=boxed, failure=failure,
                 flags=tuple(f for f in FLAGS if f in flags))


def score(response: str, gold: str, *, number_fallback: bool = False, thinking: bool = False) -> bool:
    """Whether ``response`` answers ``gold`` correctly (see :func:`grade`)."""
    return grade(response, gold, number_fallback=number_fallback, thinking=thinking).correct


def extract_answer(response: str, *, number_fallback: bool = False, thinking: bool = False) -> str | None:
    """The answer :func:`score` would compare, or ``None`` when the response has none."""
    return _extract(response, number_fallback=number_fallback, thinking=thinking)[0]


GSM8K_ANSWER_LINE = "The final answer is \\boxed{{{answer}}}."
"""How :func:`gsm8k_solution` writes a GSM8K reference's ``#### N`` line: the boxed form
the task's instruction asks for."""

_CALCULATOR = re.compile(r"<<[^<>]*>>")


_GOLD_NUMBER = re.compile(r"[-+]?[0-9]+(?:\.[0-9]+)?")
"""A GSM8K gold answer: a whole or decimal number in ASCII digits (commas removed)."""


def gsm8k_solution(solution: str) -> str:
    """A GSM8K reference solution as the boxed task asks a model to write it: the
    calculator annotations (``<<48/2=24>>``, the dataset's tool calls, never part of a
    model's text) removed, and the final ``#### N`` line replaced by
    ``The final answer is \\boxed{N}.`` (``N`` as :func:`gsm8k_gold` reads it)."""
    answer = gsm8k_gold(solution)
    steps = _CALCULATOR.sub("", solution.rpartition("####")[0]).rstrip()
    return f"{steps}\n{GSM8K_ANSWER_LINE.format(answer=answer)}"


def gsm8k_gold(solution: str) -> str:
    """The reference number of a GSM8K solution: the text after ``####``, without commas;
    anything but a number in ASCII digits there (``#### eighteen``) is refused."""
    _, sep, tail = solution.rpartition("####")
    number = tail.strip().replace(",", "")
    if not sep or not number:
        raise ValueError(f"GSM8K solution has no '#### <number>' line: {solution[-80:]!r}")
    if not _GOLD_NUMBER.fullmatch(number):
        raise ValueError(f"GSM8K solution's '#### <number>' line holds {tail.strip()!r}, not a number in digits")
    return number


def failures() -> dict[str, int]:
    """How many comparisons math-verify could not decide in this process, by kind."""
    with _failures_lock:
        return dict(_failures)


def reset_failures() -> None:
    """Set the :func:`failures` counts back to zero."""
    with _failures_lock:
        _failures.clear()


def _extract(response: str, *, number_fallback: bool,
             thinking: bool) -> tuple[str | None, bool, int, tuple[str, ...]]:
    """The answer, whether it is boxed, how many different boxed answers the final text
    holds, and the fallback number's grouping flags."""
    if not isinstance(response, str):
        raise ValueError(f"response must be a string, got {type(response).__name__}")
    _, closed, final = response.rpartition(THINK_CLOSE)
    if not closed:
        if thinking:
            return None, False, 0, ()
        final = response
    if THINK_OPEN in final:
        return None, False, 0, ()
    boxes = [content for content in _boxed_contents(final) if content]
    if boxes:
        return boxes[-1], True, len({_canonical(b) for b in boxes}), ()
    if number_fallback:
        number, grouping = _last_number(final)
        if number is not None:
            return number, False, 0, grouping
    return None, False, 0, ()


def _last_number(text: str) -> tuple[str | None, tuple[str, ...]]:
    """The number fallback's answer in ``text`` (separators removed) and its grouping flags."""
    matches = list(_FALLBACK.finditer(text))
    last = matches[-1] if matches else None
    if last is None:
        return None, ()
    kind = last.lastgroup
    number = last.group().replace(".", "") if kind == "dots" else _UNGROUP.sub("", last.group())
    flags = ()
    if kind == "irregular":
        flags = ("irregular_grouping",)
    elif kind is None:
        before, digits = text[: last.start()], last.group().lstrip("-")
        if (_DECIMAL_COMMA_BEFORE.search(before) and digits.isdigit() and len(digits) != 3) or \
                (len(digits) == 3 and digits.isdigit() and _SPACE_GROUP_BEFORE.search(before)):
            flags = ("ambiguous_number",)
    return number, flags


def _boxed_contents(text: str) -> list[str]:
    """The stripped argument of every complete ``\\boxed`` or ``\\fbox`` in ``text``, in order."""
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


def _join_thousands(expr: str) -> str:
    """``expr`` with every digit group split by thousands separators (LaTeX or spaces) joined."""
    return _GROUPED_OR_SPACED.sub(lambda m: _SEPARATORS.sub("", m.group()), expr)


def _canonical(expr: str) -> str:
    """``expr`` after trivial normalisation: thousands joined, ``$``, ``\\left``, ``\\right`` and
    ``\\displaystyle`` dropped, ``\\dfrac`` read as ``\\frac`` and ``\\varnothing`` as ``\\emptyset``,
    and spacing removed except
    between two letters or digits (``\\pi r`` keeps its space)."""
    out: list[str] = []
    space = False
    for token in _TOKEN.findall(_join_thousands(expr)):
        if token.isspace() or token in _SPACING:
            space = True
            continue
        if token in _DROPPED:
            continue
        token = _RENAMED.get(token, token)
        if space and out and out[-1][-1].isalnum() and token[0].isalnum():
            out.append(" ")
        out.append(token)
        space = False
    return "".join(out)


def _same(answer: str, gold: str) -> bool | None:
    """``True`` when the answer is the reference after trivial normalisation; for two integers
    the verdict either way (as math-verify gives it); otherwise ``None``: undecided."""
    a, g = _canonical(answer), _canonical(gold)
    if a == g:
        return True
    if _INTEGER.fullmatch(a) and _INTEGER.fullmatch(g):
        return int(a) == int(g)
    return None


def _unwrap_letter(expr: str) -> str:
    return _LETTER_WRAPPER.sub(" ", expr).strip()


def _read_letter(answer: str) -> tuple[str | None, bool]:
    """The option letter an answer gives (``None``: not a letter answer) and whether it hedges
    between two letters.

    After a letter in brackets or with label punctuation (``(B)``, ``B)``, ``B.``, ``B:``)
    any option text may follow; after a bare letter, a space or comma and text, but not an
    operator (``B + C``).
    An answer hedges when a connective (or, and, ``,``, ``/``, possibly, ...) introduces
    another letter after a first one: ``B or C``, ``B (or possibly C)``, ``Either B or C``.
    """
    text = _unwrap_letter(answer)
    hedged = any(
        m.group(1) != hedge.group(1)
        for hedge in _HEDGE.finditer(text)
        for m in _LETTER_TOKEN.finditer(text, 0, hedge.start())
    )
    match = _ANSWER_LETTER.fullmatch(text)
    if match is None:
        return None, hedged
    rest = match.group("rest")
    if rest and not (match.group("open") or match.group("label")):
        if rest[0] not in " \t\n," or _OPERATOR.match(rest.lstrip()):
            return None, hedged
    return match.group("letter"), hedged


def _math_verify(gold: str, answer: str) -> tuple[bool, str | None, bool]:
    """math-verify's verdict, the failure kind (or ``None``), and whether it compared a
    relation with an interval or set."""
    from math_verify import verify
    from math_verify.errors import TimeoutException

    limit = TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = _parse(_join_thousands(gold), limit)
        answer_parsed = _parse(_join_thousands(answer), limit)
        if not gold_parsed or not answer_parsed:
            return False, "parse", False
        relation = any(_relation_vs_set(g, a) for g in gold_parsed for a in answer_parsed)
        for g in gold_parsed:
            for a in answer_parsed:
                if verify(g, a, timeout_seconds=limit, raise_on_error=True):
                    return True, None, relation
        return False, None, relation
    except TimeoutException:
        return False, "timeout", False
    except Exception:  # sympy and latex2sympy raise many types on odd input
        return False, "error", False


def _relation_vs_set(gold, answer) -> bool:
    from math_verify.grader import is_equation, is_relation
    from sympy import FiniteSet, Set

    def inequality(x):
        return is_relation(x) and not is_equation(x)

    def region(x):
        return isinstance(x, Set) and not isinstance(x, FiniteSet)

    return (inequality(answer) and region(gold)) or (inequality(gold) and region(answer))


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
