"""The engine's replay of the decoding rules gives ``generate``'s tokens and outcomes, on many random streams.

``loopeval.engines.vllm_engine.generate`` runs the rules after vLLM has generated a segment and
continues from the prefix they force; ``generate`` applies them as a logits processor before
every token. Here a scripted model (the next token a fixed random function of the last two)
stands in for both vLLM and the HF model, so the two loops can be compared token for token on
hundreds of random cases with budget forcing (in and out of thinking, answered rows skipped or
not), the repetition stop, stop strings and end of sequence. Needs no vLLM.
"""

import random
import sys
import types

import pytest
import torch

from loopeval.engines import vllm_engine
from loopeval.evaluation.decoding import DecodingRules
from loopeval.evaluation.settings import THINK_CLOSE, THINK_OPEN


class Scripted:
    """A deterministic model: the next token is a random table's entry for the last two tokens;
    once it has written the first two tokens of a ``chain``, it writes the rest."""

    def __init__(self, rng: random.Random, alphabet: list[int], chains: list[list[int]] = ()):
        self.table = {(a, b): rng.choice(alphabet) for a in alphabet + [-1] for b in alphabet + [-1]}
        for chain in chains:
            self.table.update({(chain[i - 2], chain[i - 1]): chain[i] for i in range(2, len(chain))})
        self.alphabet = set(alphabet)

    def __call__(self, ids: list[int]) -> int:
        a, b = (ids[-2:] if len(ids) > 1 else [-1, *ids[-1:]])
        return self.table[(a if a in self.alphabet else -1, b if b in self.alphabet else -1)]


class ScriptedLLM:
    """vLLM's ``LLM.generate`` for the scripted model (greedy, ``max_tokens``, ``stop_token_ids``)."""

    def __init__(self, model: Scripted):
        self.model, self.calls = model, 0

    def generate(self, prompts, params, use_tqdm=False):
        self.calls += 1
        outs = []
        for prompt, p in zip(prompts, params, strict=True):
            ids, tokens = list(prompt["prompt_token_ids"]), []
            while len(tokens) < p.max_tokens:
                tokens.append(self.model(ids + tokens))
                if tokens[-1] in p.stop_token_ids:
                    break
            outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=tokens)]))
        return outs


def hf_generate(model: Scripted, prompt: list[int], budget: int, rules: DecodingRules, eos: int, vocab: int):
    """``generate``'s greedy loop for one row, the rules as its logits processor (before each token)."""
    generated = []
    while len(generated) < budget:
        scores = torch.zeros(1, vocab)
        scores[0, model(prompt + generated)] = 1.0
        generated.append(int(rules(torch.tensor([prompt + generated]), scores)[0].argmax()))
        if generated[-1] == eos:
            break
    return generated, rules.outcomes(torch.tensor([prompt + generated]))[0]


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    module.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", module)


def test_the_replay_gives_generates_tokens_and_outcomes_on_random_streams(tokenizer, fake_vllm):
    eos = tokenizer.eos_token_id
    pieces = tokenizer.encode(f"{THINK_OPEN} {THINK_CLOSE} so \\boxed{{7}} Question: 12 ab\n\n",
                              add_special_tokens=False)
    boxed = tokenizer.encode(" so \\boxed{7}", add_special_tokens=False)
    rng = random.Random(0)
    seen = {"forced": 0, "repetition": 0, "stop": 0, "eos": 0, "skipped": 0}
    for case in range(240):
        alphabet = sorted(set(pieces + rng.sample(range(len(tokenizer) - 10), 6)) | ({eos} if case % 3 else set()))
        model = Scripted(rng, alphabet, [boxed] if case % 2 else [])
        kinds = rng.choice([{"budget_forcing"}, {"repetition_stop"}, {"stops"}, {"budget_forcing", "repetition_stop"},
                            {"budget_forcing", "repetition_stop", "stops"}, set()])
        stops = [rng.choice(["Question:", "\n\n", "ab", "}"])] if "stops" in kinds else []
        reserve = 64 + rng.randrange(20)
        budgets = [reserve + rng.randrange(1, 60) for _ in range(rng.randrange(1, 5))]
        prompts = [[rng.choice(alphabet) for _ in range(rng.randrange(1, 12))] for _ in budgets]
        prompts = [p + boxed[:2] if case % 2 else p for p in prompts]  # the model boxes an answer first

        def rules(prompt, budget):
            return DecodingRules(tokenizer, torch.tensor([prompt]), budget, budget_forcing="budget_forcing" in kinds,
                                 reserve=reserve, when_answered=rng.choice(["skip", "force"]),
                                 repetition_stop="repetition_stop" in kinds, stops=stops, eos_token_ids=[eos])

        state = rng.getstate()
        expected = [hf_generate(model, p, b, rules(p, b), eos, len(tokenizer)) for p, b in zip(prompts, budgets)]
        rng.setstate(state)  # the same when_answered draws for the engine's rules
        got = vllm_engine.generate(ScriptedLLM(model), prompts, budgets, [rules(p, b) for p, b in zip(prompts, budgets)],
                                   eos_token_ids=[eos, None])
        assert got == expected, (case, kinds, stops)
        for generated, outcome in expected:
            seen["forced"] += outcome.forced_at is not None
            seen["repetition"] += outcome.repetition_stop_at is not None
            seen["skipped"] += outcome.forcing_skipped is not None
            seen["eos"] += outcome.finished
            seen["stop"] += bool(stops) and outcome.finished and any(s in tokenizer.decode(generated) for s in stops)
    assert min(seen.values()) >= 3, seen  # every rule fired, in several cases
