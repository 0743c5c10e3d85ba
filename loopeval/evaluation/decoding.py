"""Free decoding rules, applied per row inside one cached ``generate`` call.

* **Budget forcing** (paper §3): "Budget forcing ends the reasoning once a token limit
  is reached. We set this limit 512 tokens before the budget, so the model always
  writes an answer". When a row reaches ``max_new_tokens - reserve`` generated tokens
  and has neither finished nor closed its thinking block, the rule inserts a string;
  the row then continues with the reserved tokens. Outside a thinking block, a row that
  has already written a complete ``\boxed{...}`` answer is skipped by default
  (``when_answered="skip"``): forcing it would append a new box, and the last box is
  the one scored.
* **Repetition stop** (paper B.2): the same insertion, fired when the generated tokens
  end in a period of 4-256 tokens repeated three times.
* **Thinking-aware stop strings**: a stop string ends a row only outside an open
  thinking block, and ``cut_at_stop`` cuts the text the same way.

Insertion forces the next tokens' logits, so it costs no second prefill and no extra
forward pass. Each row gets at most one insertion. The rules are model-agnostic and
independent of lm-eval.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessor

from loopeval.evaluation.settings import DEFAULT_RESERVE, RESERVE_RULES, THINK_CLOSE, THINK_OPEN, WHEN_ANSWERED

# Qwen's recommended thinking-budget string: it closes the thinking block.
DEFAULT_THINK_STRING = (
    "\n\nConsidering the limited time by the user, I have to give the solution based on the thinking directly now.\n</think>\n\n"
)
# For rows without an open thinking block: an answer cue in the tasks' boxed format.
DEFAULT_ANSWER_STRING = "\n\nConsidering the limited time, I have to give the final answer now.\nThe final answer is \\boxed{"

REPETITION_PERIODS = (4, 256)  # shortest and longest period, in tokens
REPETITION_TIMES = 3

SKIPPED_ANSWERED = "answered"  # the trace's reason when forcing skips an answered row


def effective_reserve(reserve: int, *, budget: int, scale: float, rule: str = "scaled", minimum: int = 1) -> int:
    """The budget-forcing reserve, in tokens, of a budget scaled by ``scale``.

    The paper states the reserve at the default budget ("512 tokens before the
    budget"); that is ``reserve``, used as is at ``scale == 1`` by both rules.

    * ``"scaled"`` (default): the reserve is the forcing string (``minimum`` tokens) plus
      the room left to write the answer, and that room keeps its share of the budget:
      ``minimum + max(1, round((reserve - minimum) * scale))``. The string is never cut
      and the answer always has room (scaling the whole reserve left a 6-token string
      no token to answer in, at 0.5x of the demo). A 0.5-2x sweep then runs at every
      budget; at 0.5x GSM8K (384 tokens, a 20-token string) it is 266.
    * ``"fixed"``: the same ``reserve`` tokens at every budget.

    Raises ``ValueError`` when the reserve leaves no token to reason with.
    """
    if rule not in RESERVE_RULES:
        raise ValueError(f"bf_reserve_rule {rule!r}: choose one of {', '.join(RESERVE_RULES)}")
    if rule == "scaled" and reserve > minimum:
        tokens = minimum + max(1, round((reserve - minimum) * scale))
    else:
        tokens = reserve if rule == "fixed" else max(minimum, reserve)
    if tokens >= budget:
        raise ValueError(f"bf_reserve={reserve} ({tokens} tokens under the {rule!r} rule at budget_scale={scale:g}) "
                         f"must be smaller than the token budget max_gen_toks={budget}")
    return tokens


def scaled_budget(max_gen_toks: int, scale: float) -> int:
    """``max_gen_toks`` times ``scale``, rounded to the nearest token (at least 1)."""
    if scale <= 0:
        raise ValueError(f"budget_scale must be > 0, got {scale}")
    return max(1, int(round(max_gen_toks * scale)))


def cut_at_stop(text: str, stops: list[str]) -> str:
    """Cut ``text`` at the first stop string outside any thinking block.

    Only text after the last ``</think>`` is searched; if a ``<think>`` is still open
    at the end (no later ``</think>``), nothing is cut.
    """
    stops = [s for s in stops if s]
    if not stops:
        return text
    close = text.rfind(THINK_CLOSE)
    start = close + len(THINK_CLOSE) if close >= 0 else 0
    if text.rfind(THINK_OPEN) > close:
        return text
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return text[: min(hits)] if hits else text


@dataclass(frozen=True)
class RowOutcome:
    """What happened to one row of a batch."""

    generated_tokens: int  # up to and including the end-of-sequence token, if any
    finished: bool  # ended by end-of-sequence or a stop string within the budget
    forced_at: int | None  # generated-token index where budget forcing inserted its string
    repetition_stop_at: int | None  # generated-token index where the repetition stop did
    forcing_skipped: str | None = None  # why budget forcing left the row alone at its threshold


def forcing_tokens(tokenizer, force_string: str | None) -> list[list[int]]:
    """Token ids of the strings budget forcing inserts: ``[in thinking, otherwise]``."""
    return [tokenizer.encode(s, add_special_tokens=False) for s in forcing_strings(force_string)]


def forcing_strings(force_string: str | None) -> tuple[str, str]:
    """The strings budget forcing inserts: ``(in thinking, otherwise)``."""
    return (force_string, force_string) if force_string is not None else (DEFAULT_THINK_STRING, DEFAULT_ANSWER_STRING)


def check_forcing_against_stops(strings, stops) -> None:
    """Refuse stop strings that could match text of an inserted forcing string.

    A stop string is searched outside thinking only, so the part of a forcing string after
    its last ``</think>`` is what a stop can see. A stop inside that part, or straddling its
    start or end, would end the row and cut the forced answer away while the trace still
    charges it; such a task is refused (a forcing string without it is the fix), rather than
    having the stop undo the forcing.
    """
    for string in strings:
        visible = string[string.rfind(THINK_CLOSE) + len(THINK_CLOSE):] if THINK_CLOSE in string else string
        for stop in (s for s in stops if s):
            overlap = stop in visible or any(
                stop[k:] == visible[: len(stop) - k] or stop[: len(stop) - k] == visible[-(len(stop) - k):]
                for k in range(1, len(stop)) if len(stop) - k <= len(visible))
            if overlap:
                raise ValueError(
                    f"the stop string {stop!r} can match inside budget forcing's string {string!r} and would cut "
                    "the forced answer away; give bf_string= a forcing string without it")


def check_forcing_against_eos(tokenizer, strings, eos_token_ids) -> None:
    """Refuse a forcing string holding an end-of-sequence token: every forced row would end at it."""
    eos = {e for e in eos_token_ids if e is not None}
    for string in strings:
        ids = tokenizer.encode(string, add_special_tokens=False)
        texts = [tokenizer.decode([e]) for e in eos]
        if eos & set(ids) or any(t and t in string for t in texts):
            raise ValueError(f"bf_string={string!r} holds the end-of-sequence token; every forced row would end "
                             "there, marked finished; give a forcing string without it")


def _single_token_id(tokenizer, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


class DecodingRules(LogitsProcessor):
    """A logits processor for one ``generate`` call over a left-padded batch.

    ``prompt_ids`` is the batch's input; ``max_new_tokens`` its budget. ``stops`` are
    stop strings (applied only outside thinking). After generation, ``outcomes(seqs)``
    reports each row.
    """

    def __init__(
        self,
        tokenizer,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        budget_forcing: bool = False,
        reserve: int = DEFAULT_RESERVE,
        force_string: str | None = None,
        when_answered: str = "skip",
        repetition_stop: bool = False,
        stops: list[str] = (),
        eos_token_ids: list[int] = (),
    ):
        self.tokenizer = tokenizer
        self.prompt_len = prompt_ids.shape[1]
        self.max_new_tokens = max_new_tokens
        if when_answered not in WHEN_ANSWERED:
            raise ValueError(f"bf_when_answered {when_answered!r}: choose one of {', '.join(WHEN_ANSWERED)}")
        self.budget_forcing = budget_forcing
        self.skip_answered = when_answered == "skip"
        self.repetition_stop = repetition_stop
        self.threshold = max_new_tokens - reserve
        self.stops = [s for s in stops if s]
        self.eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=prompt_ids.device)
        self.force_ids = forcing_tokens(tokenizer, force_string)  # [thinking, answer]
        if budget_forcing and reserve < max(len(ids) for ids in self.force_ids):
            raise ValueError(
                f"bf_reserve={reserve} is shorter than the forcing string ({max(len(i) for i in self.force_ids)} tokens)"
            )
        if budget_forcing and self.threshold < 1:
            raise ValueError(f"bf_reserve={reserve} must be smaller than the token budget max_gen_toks={max_new_tokens}")
        self.open_id = _single_token_id(tokenizer, THINK_OPEN)
        self.close_id = _single_token_id(tokenizer, THINK_CLOSE)
        rows = prompt_ids.shape[0]
        device = prompt_ids.device
        self.thinking = torch.zeros(rows, dtype=torch.bool, device=device)  # an open thinking block
        self.closed = torch.zeros(rows, dtype=torch.bool, device=device)  # a thinking block was closed
        if self.open_id is not None and self.close_id is not None:
            positions = torch.arange(self.prompt_len, device=device)
            last_open = torch.where(prompt_ids == self.open_id, positions, -1).amax(1)
            last_close = torch.where(prompt_ids == self.close_id, positions, -1).amax(1)
            self.thinking = last_open > last_close
        self.done = torch.zeros(rows, dtype=torch.bool, device=device)
        self.inserted = torch.zeros(rows, dtype=torch.bool, device=device)
        self.queue: dict[int, list[int]] = {}  # row -> forced tokens still to emit
        self.forced_at: dict[int, int] = {}
        self.skipped: dict[int, str] = {}
        self.repetition_at: dict[int, int] = {}
        lo, hi = REPETITION_PERIODS
        self.periods = torch.arange(lo, hi + 1, device=device)
        self.runs = torch.zeros(rows, len(self.periods), dtype=torch.long, device=device)
        self.stop_lookback = max((len(tokenizer.encode(s, add_special_tokens=False)) for s in self.stops), default=0) + 2

    @property
    def active(self) -> bool:
        return self.budget_forcing or self.repetition_stop or bool(self.stops)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for row, token in self.forced(input_ids).items():
            scores[row] = float("-inf")
            scores[row, token] = 0.0
        return scores

    def forced(self, input_ids: torch.LongTensor) -> dict[int, int]:
        """One step of the rules: the token each row must emit next (row -> token id), given
        the sequences so far (``input_ids``, prompt included). The rules read only the last
        tokens (and, at budget forcing's threshold, the row's text once), so a caller may pass a
        view of a preallocated buffer; ``__call__`` is this step applied to the logits."""
        step = input_ids.shape[1] - self.prompt_len  # tokens generated so far
        if step > 0:
            self._observe(input_ids[:, self.prompt_len :], step)
        live = ~self.done
        if self.repetition_stop and step > 0:
            fire = live & ~self.inserted & (self.runs >= (REPETITION_TIMES - 1) * self.periods).any(1)
            for row in torch.nonzero(fire).flatten().tolist():
                self._insert(row, step, self.repetition_at)
        if self.budget_forcing and step == self.threshold:
            fire = live & ~self.inserted & ~(self.closed & ~self.thinking)
            for row in torch.nonzero(fire).flatten().tolist():
                if self.skip_answered and not self.thinking[row] and self._answered(input_ids[row]):
                    self.skipped[row] = SKIPPED_ANSWERED
                else:
                    self._insert(row, step, self.forced_at)
        if self.stops and step > 0:
            self._stop_on_strings(input_ids, live)
        out = {}
        for row, tokens in list(self.queue.items()):
            out[row] = tokens.pop(0)
            if not tokens:
                del self.queue[row]
        return out

    def _observe(self, generated: torch.Tensor, step: int) -> None:
        last = generated[:, -1]
        if self.eos.numel():
            self.done |= torch.isin(last, self.eos)
        if self.open_id is not None and self.close_id is not None:
            closing = last == self.close_id
            self.closed |= closing
            self.thinking &= ~closing
            self.thinking |= last == self.open_id
        if self.repetition_stop:
            back = step - 1 - self.periods  # index of the token one period earlier
            valid = back >= 0
            earlier = generated[:, back.clamp(min=0)]
            same = (earlier == last[:, None]) & valid
            self.runs = (self.runs + 1) * same

    def _answered(self, ids: torch.Tensor) -> bool:
        """Whether the row's text so far holds a complete boxed answer after any thinking."""
        from loopeval.evaluation.scoring import extract_answer

        return extract_answer(self.tokenizer.decode(ids[self.prompt_len :])) is not None

    def _insert(self, row: int, step: int, record: dict[int, int]) -> None:
        self.inserted[row] = True
        record[row] = step
        self.queue[row] = list(self.force_ids[0] if self.thinking[row] else self.force_ids[1])

    def _stop_on_strings(self, input_ids: torch.Tensor, live: torch.Tensor) -> None:
        """End a row, by forcing end-of-sequence, once a stop string appears outside thinking."""
        if not self.eos.numel():
            return
        rows = torch.nonzero(live & ~self.thinking).flatten().tolist()
        tails = input_ids[rows, max(self.prompt_len, input_ids.shape[1] - self.stop_lookback) :]
        for row, text in zip(rows, self.tokenizer.batch_decode(tails)):
            if row not in self.queue and any(s in text for s in self.stops):
                self.queue[row] = [int(self.eos[0])]

    def outcomes(self, sequences: torch.Tensor) -> list[RowOutcome]:
        """Per-row outcomes of the finished ``generate`` output ``sequences``."""
        generated = sequences[:, self.prompt_len :]
        out = []
        for row in range(generated.shape[0]):
            hits = torch.nonzero(torch.isin(generated[row], self.eos)).flatten() if self.eos.numel() else []
            finished = len(hits) > 0
            count = int(hits[0]) + 1 if finished else generated.shape[1]
            out.append(RowOutcome(count, finished, self.forced_at.get(row), self.repetition_at.get(row),
                                  self.skipped.get(row)))
        return out
