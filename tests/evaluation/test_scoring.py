"""loopeval.evaluation.scoring: answer extraction and comparison on responses small models really write."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from loopeval.evaluation import scoring

FALLBACK = {"number_fallback": True}
POLAR = r"\left( 3, \frac{\pi}{2} \right)"
VECTOR = r"\begin{pmatrix} 1 \\ -2 \end{pmatrix}"
THINKING = {"thinking": True}

# (case, response, gold, keyword arguments, correct, extracted answer)
CASES = [
    # Which box counts.
    ("last of several boxes", r"First guess \boxed{12}. Rechecking: \boxed{14}.", "14", {}, True, "14"),
    ("last box wins even when wrong", r"\boxed{14}. Hmm, actually \boxed{12}.", "14", {}, False, "12"),
    ("box only inside thinking", r"<think>so \boxed{7}</think>The answer is seven.", "7", {}, False, None),
    ("box inside and after thinking", r"<think>\boxed{5}</think> So \boxed{7}.", "7", {}, True, "7"),
    ("right in thinking, wrong after", r"<think>\boxed{7}</think>\boxed{5}", "7", {}, False, "5"),
    ("thinking never closed", r"<think>Let me compute 3+4 = \boxed{7}", "7", {}, False, None),
    ("second thinking block never closed", r"<think>a</think>\boxed{7}<think>wait", "7", {}, False, None),
    ("thinking mode, no </think>", r"3+4 is \boxed{7}", "7", THINKING, False, None),
    ("thinking mode, closed", "3+4 is 7.</think>\n\n\\boxed{7}", "7", THINKING, True, "7"),
    ("truncated box only", r"so the answer is \boxed{\frac{3}{4", r"\frac34", {}, False, None),
    ("truncated box after a complete one", r"\boxed{3/4}, or is it \boxed{0.7", r"\frac34", {}, True, "3/4"),
    ("echoed empty boxes ignored", r"Put it within \boxed{}: \boxed{42}. Within \boxed{}.", "42", {}, True, "42"),
    ("bare \\boxed argument", r"The answer is $\boxed 5$.", "5", {}, True, "5"),
    ("space before the brace", r"\boxed {9}", "9", {}, True, "9"),
    ("nested braces", r"$\boxed{\frac{\sqrt{3}}{2}}$", r"\frac{\sqrt3}{2}", {}, True, r"\frac{\sqrt{3}}{2}"),
    ("escaped braces", r"\boxed{\{1, 2\}}", r"\{1,2\}", {}, True, r"\{1, 2\}"),
    ("empty response", "", "5", {}, False, None),
    # LaTeX variants.
    ("dfrac vs frac", r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}", {}, True, r"\dfrac{3}{4}"),
    ("frac12 shorthand", r"\boxed{\frac12}", "0.5", {}, True, r"\frac12"),
    ("0.50 vs 1/2", r"\boxed{0.50}", r"\frac{1}{2}", {}, True, "0.50"),
    ("0.33 is not 1/3", r"\boxed{0.33}", r"\frac{1}{3}", {}, False, "0.33"),
    ("decimal vs fraction", r"\boxed{3.5}", r"\frac{7}{2}", {}, True, "3.5"),
    ("left/right parentheses", r"\boxed{(3, \frac{\pi}{2})}", POLAR, {}, True, r"(3, \frac{\pi}{2})"),
    ("ordered pair swapped", r"\boxed{\left(\frac{\pi}{2}, 3\right)}", POLAR, {}, False, r"\left(\frac{\pi}{2}, 3\right)"),
    ("percent sign", r"\boxed{25\%}", "25", {}, True, r"25\%"),
    ("dollar sign and cents", r"\boxed{\$18.00}", "18", {}, True, r"\$18.00"),
    ("degree symbol", r"\boxed{30^\circ}", "30", {}, True, r"30^\circ"),
    ("degrees in words", r"\boxed{30 \text{ degrees}}", r"30^\circ", {}, True, r"30 \text{ degrees}"),
    ("units in text", r"\boxed{5\text{ cm}^2}", "5", {}, True, r"5\text{ cm}^2"),
    ("thousands separator", r"\boxed{1,000}", "1000", {}, True, "1,000"),
    ("braced thousands separator", r"\boxed{14{,}000}", "14000", {}, True, "14{,}000"),
    ("power of ten", r"\boxed{10^{10}}", "10000000000", {}, True, "10^{10}"),
    ("negative number", r"\boxed{-3}", "-3", {}, True, "-3"),
    ("sign error", r"\boxed{3}", "-3", {}, False, "3"),
    ("half-open interval", r"\boxed{[1, 2)}", "[1,2)", {}, True, "[1, 2)"),
    ("closed is not half-open", r"\boxed{[1,2]}", "[1,2)", {}, False, "[1,2]"),
    ("interval with membership", r"\boxed{x \in (-\infty, 3]}", r"(-\infty, 3]", {}, True, r"x \in (-\infty, 3]"),
    ("unordered solutions", r"\boxed{2, 1}", "1, 2", {}, True, "2, 1"),
    ("equation for a value", r"\boxed{x = 5}", "5", {}, True, "x = 5"),
    ("equivalent surds", r"\boxed{\sqrt{8}}", r"2\sqrt{2}", {}, True, r"\sqrt{8}"),
    ("rationalised denominator", r"\boxed{\frac{\sqrt{3}}{3}}", r"\frac{1}{\sqrt{3}}", {}, True, r"\frac{\sqrt{3}}{3}"),
    ("text answer", r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", {}, True, r"\text{Evelyn}"),
    ("column vector", f"\\boxed{{{VECTOR}}}", VECTOR, {}, True, VECTOR),
    # Option letters.
    ("text-wrapped letter", r"\boxed{\text{(B)}}", "B", {}, True, r"\text{(B)}"),
    ("bold letter", r"\boxed{\textbf{B}}", "B", {}, True, r"\textbf{B}"),
    ("letter with option text", r"\boxed{B) 10^{-4} eV}", "B", {}, True, "B) 10^{-4} eV"),
    ("wrong letter", r"\boxed{(C)}", "B", {}, False, "(C)"),
    ("option text instead of letter", r"\boxed{10^{-4} eV}", "B", {}, False, "10^{-4} eV"),
    ("MATH letter gold", r"\boxed{C}", r"\text{(C)}", {}, True, "C"),
    # GSM8K: the last number when there is no box.
    ("fallback with separators and cents", "She pays $1,234.50 in total.", "1234.5", FALLBACK, True, "1234.50"),
    ("fallback negative", "The temperature falls to -5 degrees.", "-5", FALLBACK, True, "-5"),
    ("fallback ignores an expression's minus", "10-3 = 7, so 7 apples.", "7", FALLBACK, True, "7"),
    ("fallback takes the last number", "3 bags of 4 is 12 apples; he eats 2.", "12", FALLBACK, False, "2"),
    ("no fallback without the flag", "He has 18 apples.", "18", {}, False, None),
    ("a box beats the fallback", r"\boxed{17} apples, not 18", "18", FALLBACK, False, "17"),
    ("boxed number with units", r"\boxed{18 \text{ apples}}", "18", FALLBACK, True, r"18 \text{ apples}"),
    ("fallback after thinking only", "<think>maybe 12</think> It is 18.", "18", FALLBACK, True, "18"),
    ("fallback not inside open thinking", "<think>maybe 18", "18", FALLBACK, False, None),
    ("comma-separated list is not a thousand", "We get 3,4", "4", FALLBACK, True, "4"),
]


@pytest.mark.parametrize(
    ("response", "gold", "kwargs", "correct", "answer"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_score_and_extract(response, gold, kwargs, correct, answer):
    assert scoring.extract_answer(response, **kwargs) == answer
    assert scoring.score(response, gold, **kwargs) is correct


def test_finished_means_a_box_not_the_fallback():
    assert scoring.grade(r"so \boxed{18}", "18", number_fallback=True).boxed
    fallback = scoring.grade("so 18", "18", number_fallback=True)
    assert fallback.correct and not fallback.boxed


def test_parse_failure_is_wrong_and_counted():
    scoring.reset_failures()
    result = scoring.grade(r"\boxed{11\sqrt2 +}", r"11\sqrt2")
    assert (result.correct, result.answer, result.failure) == (False, r"11\sqrt2 +", "parse")
    assert scoring.failures() == {"parse": 1}
    scoring.reset_failures()
    assert scoring.failures() == {}


def test_timeout_is_wrong_and_counted(monkeypatch):
    # Comparing 9^(9^9) with 5 makes sympy evaluate a number with 370 million digits.
    monkeypatch.setattr(scoring, "TIMEOUT_SECONDS", 1)
    scoring.reset_failures()
    result = scoring.grade(r"\boxed{9^{9^{9}}}", "5")  # without the timeout: minutes of sympy
    assert (result.correct, result.failure) == (False, "timeout")
    assert scoring.failures() == {"timeout": 1}
    scoring.reset_failures()


def test_scoring_works_outside_the_main_thread():
    # math-verify's signal-based timeout raises ValueError off the main thread unless disabled.
    with ThreadPoolExecutor(max_workers=4) as pool:
        verdicts = list(pool.map(lambda c: scoring.score(c[1], c[2], **c[3]), CASES))
    assert verdicts == [c[4] for c in CASES]


def test_user_prompt():
    assert scoring.user_prompt("  What is 2+2?\n") == (
        "What is 2+2?\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    with pytest.raises(ValueError, match="question is empty"):
        scoring.user_prompt(" \n")


def test_gsm8k_gold():
    assert scoring.gsm8k_gold("48/2 = <<48/2=24>>24\n#### 72") == "72"
    assert scoring.gsm8k_gold("so 1,200 loaves\n#### 1,200") == "1200"
    assert scoring.gsm8k_gold("#### -3") == "-3"
    with pytest.raises(ValueError, match="no '#### <number>' line"):
        scoring.gsm8k_gold("The answer is 72.")


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="gold answer must be a non-empty string"):
        scoring.score(r"\boxed{1}", " ")
    with pytest.raises(ValueError, match="response must be a string, got NoneType"):
        scoring.score(None, "1")
