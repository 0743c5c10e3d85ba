"""The decoding options of an evaluation, torch-free and defined once.

:class:`DecodingOptions` holds the free decoding rules (budget forcing, the repetition
stop) and the budget scale. lm-eval's ``looped`` model args, a study's ``decoding:``
conditions and the trace header (:class:`loopeval.evaluation.trace.DecodingSettings`,
which adds what the evaluation recorded about itself) are derived from its fields, so a
new option reaches all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from loopeval.common.args import as_field, as_float, as_int

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

DEFAULT_RESERVE = 512
"""Paper §3: "We set this limit 512 tokens before the budget, so the model always writes an answer"."""
RESERVE_RULES = ("scaled", "fixed")
WHEN_ANSWERED = ("skip", "force")


@dataclass(frozen=True)
class DecodingOptions:
    """The decoding rules both sides of a comparison must share; all off by default, so
    ``looped`` without options decodes as ``--model hf``. Fields marked ``forcing`` apply
    only with budget forcing and are recorded as ``None`` without it (hence their
    ``| None`` types)."""

    budget_forcing: bool = field(default=False, metadata={
        "help": "budget forcing (paper §3): end the reasoning bf_reserve tokens before the budget"})
    bf_reserve: int | None = field(default=DEFAULT_RESERVE, metadata={
        "forcing": True, "parse": lambda n, v: as_int(n, v, minimum=1),
        "help": "tokens reserved for the answer at budget_scale 1 (the paper's 512)"})
    bf_reserve_rule: str | None = field(default="scaled", metadata={
        "forcing": True, "choices": RESERVE_RULES,
        "help": "how the reserve follows budget_scale (loopeval.evaluation.decoding.effective_reserve)"})
    bf_string: str | None = field(default=None, metadata={
        "forcing": True, "help": "the forcing string (default: the thinking or answer string, automatically)"})
    bf_when_answered: str | None = field(default="skip", metadata={
        "forcing": True, "choices": WHEN_ANSWERED,
        "help": "skip rows that already boxed an answer, or force them too"})
    repetition_stop: bool = field(default=False, metadata={
        "help": "insert the forcing string when the output repeats a period of 4-256 tokens three times (B.2)"})
    budget_scale: float = field(default=1.0, metadata={
        "parse": lambda n, v: as_float(n, v, positive=True), "help": "multiplies every task's max_gen_toks"})

    @classmethod
    def parse(cls, raw: dict, *, prefix: str = "") -> DecodingOptions:
        """The options named in ``raw`` (strings or typed values), each checked; other keys
        are left in ``raw`` (they are popped). Errors name ``prefix + name``."""
        values = {f.name: as_field(f, prefix + f.name, raw.pop(f.name)) for f in fields(cls)
                  if f.name in raw and raw[f.name] is not None}
        return cls(**values)


DECODING_OPTIONS: tuple[str, ...] = tuple(f.name for f in fields(DecodingOptions))
"""The names of the decoding options (model args and study keys alike)."""
