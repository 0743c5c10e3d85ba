"""Budget forcing, the repetition stop and thinking-aware stops, inside one cached generate call."""

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from loopeval.evaluation.decoding import (
    DEFAULT_ANSWER_STRING,
    DEFAULT_THINK_STRING,
    DecodingRules,
    cut_at_stop,
    scaled_budget,
)
from loopeval.tools.tiny import tiny_model

EOS = 2


class ForceEOS(LogitsProcessor):
    """Make one row end at a chosen step, as a model that finishes early would."""

    def __init__(self, prompt_len, row, step):
        self.prompt_len, self.row, self.step = prompt_len, row, step

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] - self.prompt_len == self.step:
            scores[self.row] = float("-inf")
            scores[self.row, EOS] = 0.0
        return scores


def _generate(model, tokenizer, prompts, max_new, *, extra=(), **rules):
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    proc = DecodingRules(tokenizer, enc.input_ids, max_new, eos_token_ids=[EOS], **rules)
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=max_new,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                logits_processor=LogitsProcessorList([*extra, proc]),
            )
    finally:
        handle.remove()
    return enc, out, proc, len(calls)


@pytest.fixture
def model(tokenizer):
    return tiny_model("qwen3", vocab_size=len(tokenizer)).eval()


def test_budget_forcing_fires_at_the_exact_position_without_extra_forwards(model, tokenizer):
    prompts = ["Tom has 3 apples.", "A train travels 60 miles in 1.5 hours; its speed is"]
    max_new, reserve = 48, 30
    prompt_len = tokenizer(prompts, return_tensors="pt", padding=True).input_ids.shape[1]
    _, plain, _, plain_calls = _generate(model, tokenizer, prompts, max_new, extra=[ForceEOS(prompt_len, 1, 40)])
    enc, out, proc, calls = _generate(
        model, tokenizer, prompts, max_new, budget_forcing=True, reserve=reserve, extra=[ForceEOS(prompt_len, 1, 5)]
    )
    assert calls == plain_calls == max_new  # one prefill, then one forward per new token: no re-prefill
    cue = tokenizer.encode(DEFAULT_ANSWER_STRING, add_special_tokens=False)
    gen = out[:, enc.input_ids.shape[1] :]
    threshold = max_new - reserve
    # row 0 never finished: the answer cue starts exactly at max_new - reserve
    assert gen[0, threshold : threshold + len(cue)].tolist() == cue
    torch.testing.assert_close(gen[0, :threshold], plain[0, prompt_len : prompt_len + threshold])
    # row 1 ended at step 5, before the threshold: no forcing
    outcomes = proc.outcomes(out)
    assert outcomes[0].forced_at == threshold and not outcomes[0].finished
    assert outcomes[1].forced_at is None and outcomes[1].finished and outcomes[1].generated_tokens == 6


def test_budget_forcing_closes_an_open_thinking_block(model, tokenizer):
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
    enc, out, proc, _ = _generate(model, tokenizer, [prompt], 40, budget_forcing=True, reserve=36)
    gen = out[0, enc.input_ids.shape[1] :].tolist()
    think = tokenizer.encode(DEFAULT_THINK_STRING, add_special_tokens=False)
    assert gen[4 : 4 + len(think)] == think
    assert "</think>" in tokenizer.decode(gen)
    assert proc.outcomes(out)[0].forced_at == 4


def test_thinking_closed_during_generation_is_not_forced(model, tokenizer):
    close = tokenizer.convert_tokens_to_ids("</think>")

    class CloseAt2(LogitsProcessor):
        def __call__(self, input_ids, scores):
            if input_ids.shape[1] - prompt_len == 2:
                scores[0] = float("-inf")
                scores[0, close] = 0.0
            return scores

    thinking = "<|im_start|>assistant\n<think>\n"
    answered = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # a non-thinking template
    prompt_len = tokenizer([thinking, answered], return_tensors="pt", padding=True).input_ids.shape[1]
    _, out, proc, _ = _generate(model, tokenizer, [thinking, answered], 40, budget_forcing=True, reserve=30, extra=[CloseAt2()])
    # row 0 closed its own thinking block before the threshold; row 1 never thought, so it gets the answer cue
    assert [o.forced_at for o in proc.outcomes(out)] == [None, 10]


def test_user_string_and_bad_reserves(model, tokenizer):
    enc = tokenizer(["x"], return_tensors="pt")
    with pytest.raises(ValueError, match="smaller than the token budget"):
        DecodingRules(tokenizer, enc.input_ids, 512, budget_forcing=True, reserve=512)
    with pytest.raises(ValueError, match="shorter than the forcing string"):
        DecodingRules(tokenizer, enc.input_ids, 512, budget_forcing=True, reserve=2)
    enc, out, _, _ = _generate(model, tokenizer, ["x"], 12, budget_forcing=True, reserve=6, force_string=" Answer:")
    assert tokenizer.decode(out[0, enc.input_ids.shape[1] + 6 :]).startswith(" Answer:")


def _first_repetition(tokens, lo=4, hi=256, times=3):
    """Brute force: the first length n at which tokens[:n] ends in `times` copies of a period."""
    for n in range(1, len(tokens) + 1):
        for p in range(lo, hi + 1):
            if n >= times * p and all(tokens[n - 1 - i] == tokens[n - 1 - i - p] for i in range((times - 1) * p)):
                return n
    return None


@pytest.mark.parametrize(
    "sequence",
    [
        [7, 8, 9, 10] * 3 + [1],  # period 4, fires as soon as the third copy completes
        [1, 3] + [5, 6, 7, 8, 9] * 4,  # period 5
        [3] * 20,  # constant run: period 4 (and its multiples)
        [1, 2, 3, 4, 5, 6] * 2 + [1, 2, 3],  # only twice: never
        list(range(10, 40)) * 2 + list(range(10, 35)),  # period 30, not yet three copies: never
        list(range(10, 40)) * 3,  # period 30
    ],
)
def test_repetition_stop_matches_brute_force(tokenizer, sequence):
    prompt = torch.tensor([[11, 12, 13]])
    proc = DecodingRules(tokenizer, prompt, 1000, repetition_stop=True, eos_token_ids=[EOS])
    fired = None
    for n in range(len(sequence) + 1):
        ids = torch.cat([prompt, torch.tensor([sequence[:n]], dtype=torch.long)], dim=1)
        proc(ids, torch.zeros(1, 500))
        if 0 in proc.repetition_at:
            fired = proc.repetition_at[0]
            break
    assert fired == _first_repetition(sequence)


def test_repetition_stop_in_generation(model, tokenizer):
    class Loop(LogitsProcessor):  # a model stuck in a 5-token loop
        def __call__(self, input_ids, scores):
            scores[:] = float("-inf")
            scores[:, 100 + input_ids.shape[1] % 5] = 0.0
            return scores

    enc, out, proc, _ = _generate(model, tokenizer, ["x y"], 40, extra=[Loop()], repetition_stop=True)
    # The scripted loop overrides the insertion, but the rule records where it fired.
    assert proc.outcomes(out)[0].repetition_stop_at == 15


def test_stop_strings_are_ignored_inside_thinking():
    stops = ["\n\n", "Question:"]
    assert cut_at_stop("a\n\nb", stops) == "a"
    assert cut_at_stop("<think>a\n\nb", stops) == "<think>a\n\nb"  # never closed
    assert cut_at_stop("<think>a\n\nb</think>ans\n\nmore", stops) == "<think>a\n\nb</think>ans"
    assert cut_at_stop("<think>x</think>y<think>z\n\n", stops) == "<think>x</think>y<think>z\n\n"
    assert cut_at_stop("reasoning Question: next", stops) == "reasoning "
    assert cut_at_stop("abc", []) == "abc"


def test_scaled_budget():
    assert [scaled_budget(768, f) for f in (0.5, 1, 1.5, 2)] == [384, 768, 1152, 1536]
    with pytest.raises(ValueError, match="budget_scale"):
        scaled_budget(768, 0)


class Script(LogitsProcessor):
    """Make row ``row`` emit ``tokens`` from step 0 on, as a model that answers at once would."""

    def __init__(self, prompt_len, row, tokens):
        self.prompt_len, self.row, self.tokens = prompt_len, row, tokens

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_len
        if step < len(self.tokens):
            scores[self.row] = float("-inf")
            scores[self.row, self.tokens[step]] = 0.0
        return scores


@pytest.mark.parametrize("when", ["skip", "force"])
def test_forcing_skips_a_row_that_already_boxed_its_answer(model, tokenizer, when):
    prompts = ["Tom has 3 apples and 4 more. How many?", "A train travels 60 miles in 1.5 hours; its speed is"]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    answer = tokenizer.encode(" 3 + 4 = 7, so \\boxed{7}.", add_special_tokens=False)
    script = Script(enc.input_ids.shape[1], 0, answer)
    enc, out, proc, _ = _generate(model, tokenizer, prompts, 48, budget_forcing=True, reserve=30,
                                  when_answered=when, extra=[script])
    outcomes = proc.outcomes(out)
    text = tokenizer.decode(out[0, enc.input_ids.shape[1]:])
    if when == "skip":  # row 0 answered before its threshold: left alone, and its box stays the last one
        assert (outcomes[0].forced_at, outcomes[0].forcing_skipped) == (None, "answered")
        assert "The final answer is" not in text
    else:
        assert (outcomes[0].forced_at, outcomes[0].forcing_skipped) == (18, None)
        assert "The final answer is \\boxed{" in text
    assert (outcomes[1].forced_at, outcomes[1].forcing_skipped) == (18, None)  # never answered: forced


def test_effective_reserve_rules():
    from loopeval.evaluation.decoding import effective_reserve

    # the paper's 512 tokens at the default budget, under both rules
    assert effective_reserve(512, budget=768, scale=1.0) == effective_reserve(512, budget=768, scale=1.0, rule="fixed") == 512
    # GSM8K at 0.5x with a 20-token string: the string, then half of the 492 tokens of answer room
    assert effective_reserve(512, budget=384, scale=0.5, minimum=20) == 20 + 246
    assert effective_reserve(512, budget=1536, scale=2.0, minimum=20) == 20 + 984
    # the demo at 0.5x: a 6-token string keeps its 6 tokens, the 6 tokens of answer room become 3
    assert effective_reserve(12, budget=24, scale=0.5, minimum=6) == 9
    # scaling the whole reserve (12 -> 6) would have left the string no token to answer in; the
    # answer room never drops below one token, nor the string below its length
    for scale in (0.1, 0.25, 0.5, 0.75, 1.5, 2.0):
        for minimum in (1, 6, 11):
            tokens = effective_reserve(12, budget=10_000, scale=scale, minimum=minimum)
            assert tokens - minimum >= 1 and tokens - minimum == max(1, round((12 - minimum) * scale))
    with pytest.raises(ValueError, match=r"bf_reserve=512 \(512 tokens under the 'fixed' rule at budget_scale=0.5\)"):
        effective_reserve(512, budget=384, scale=0.5, rule="fixed")
    with pytest.raises(ValueError, match="bf_reserve_rule 'half'"):
        effective_reserve(512, budget=768, scale=1.0, rule="half")
