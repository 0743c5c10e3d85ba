"""Verdicts that rest on the GSM8K number fallback from a response that did not finish.

The paper's rule (A.4) reads "for GSM8K, the last number if there is no box", and that
stays the default. But a response cut at its token budget ends mid-sentence, and its last
number is whatever it was writing (a list index, a step count): a "right" verdict from it
rests on chance. The trace knows which responses finished (ended by end-of-sequence or a
stop string within the budget). :mod:`loopeval.analysis.score_audit` counts those verdicts per task,
and :func:`loopeval.analysis.score_audit.unfinished_fallback_wrong` reads a run with them counted
wrong: the analysis-side option ``--unfinished-fallback wrong`` of ``compare``, ``report``
and ``score-audit``. It lives on the analysis side, not in the lm-eval task, because only
the looped model's trace knows whether a response finished, and so that one run can be
read both ways without being generated again; the recorded scores are left as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

UNFINISHED_FALLBACK = ("credit", "wrong")
"""How a right verdict from the number fallback on an unfinished response counts: ``credit``
(the paper's rule, default) or ``wrong``."""


def check_option(unfinished_fallback: str) -> str:
    """``unfinished_fallback`` if it is one of :data:`UNFINISHED_FALLBACK`, else ``ValueError``."""
    if unfinished_fallback not in UNFINISHED_FALLBACK:
        raise ValueError(f"unfinished_fallback {unfinished_fallback!r}: choose one of {', '.join(UNFINISHED_FALLBACK)}")
    return unfinished_fallback

# loopeval's process_results hooks call _results(doc, results, number_fallback=..., thinking=...).
_OPTION = re.compile(r"\b(number_fallback|thinking)\s*=\s*(True|False)\b")


def scoring_options(config: Mapping) -> dict[str, bool] | None:
    """The ``number_fallback`` and ``thinking`` options of a task scored by
    :mod:`loopeval.evaluation.scoring`, read from the ``process_results`` source lm-eval records in the
    run's configuration; ``None`` for a task scored otherwise."""
    options = dict(_OPTION.findall(str(config.get("process_results", ""))))
    if config.get("output_type") != "generate_until" or set(options) != {"number_fallback", "thinking"}:
        return None
    return {key: value == "True" for key, value in options.items()}


def response_finished(records: Sequence, n: int) -> list[bool | None]:
    """Per response of an item, whether it finished: paired with the item's trace records by
    order when they are as many, else the item's (all finished); ``None`` without records."""
    if not records:
        return [None] * n
    if len(records) == n:
        return [bool(r.finished) for r in records]
    return [all(r.finished for r in records)] * n
