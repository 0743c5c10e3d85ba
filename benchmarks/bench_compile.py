"""The vLLM engine compiled against eager, and looped against unlooped with both compiled, on SmolLM2-135M.

Runs in the engine's environment (README, "The vLLM engine"), one process. Four engines stay
alive (unlooped and looped, each eager and compiled); every round runs the same batch of
real GSM8K questions (chat template applied, greedy, ``--new-tokens`` each, end of sequence
ignored so every engine generates the same count) through all four, so a change in the
machine's load hits all of them. Per round it reports compiled / eager and looped / unlooped
wall time (the per-token time ratio: same token counts), beside c (``loopeval.core.cost``)
and the target 1.05 c; start-up per engine (the compiled ones include compilation); and
whether each compiled engine's tokens equal its eager twin's.

    python benchmarks/bench_compile.py --model smollm2 --data ../shared/data/gsm8k --rounds 5

``smollm2``: ``loopeval import-gguf``'s folder of SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def questions(data: str, count: int) -> list[str]:
    """The first ``count`` GSM8K test questions under ``data`` (a JSONL or Parquet test split)."""
    files = sorted(p for p in Path(data).rglob("*test*") if p.suffix in (".jsonl", ".parquet"))
    if not files:
        raise SystemExit(f"--data {data}: no GSM8K test split (*test*.jsonl or *test*.parquet) under it")
    if files[0].suffix == ".jsonl":
        rows = [json.loads(line) for line in files[0].read_text().splitlines()[:count]]
    else:
        import pyarrow.parquet as pq

        rows = pq.read_table(files[0]).slice(0, count).to_pylist()
    return [r["question"] for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="GSM8K folder (its test split)")
    parser.add_argument("--loop", default="14:16x2")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    a = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # four engines alive at once
    from transformers import AutoConfig, AutoTokenizer

    from loopeval.common.threads import configure_threads
    from loopeval.core.cost import loop_cost
    from loopeval.core.spec import LoopConfig
    from loopeval.engines.vllm_engine import configure_environment
    from loopeval.engines.vllm_models import engine_overrides, register

    configure_environment()
    threads = configure_threads()  # the engine's rule (docs/engine.md, "Settings"): idle threads sleep
    register()
    from vllm import LLM, SamplingParams, TokensPrompt

    config = AutoConfig.from_pretrained(a.model)
    loop = LoopConfig(a.loop)
    c = loop_cost(config, loop.spec).multiplier
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    batch = [TokensPrompt(prompt_token_ids=tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                                        add_generation_prompt=True, tokenize=True,
                                                                        return_dict=False))
             for q in questions(a.data, a.prompts)]
    params = SamplingParams(temperature=0, max_tokens=a.new_tokens, ignore_eos=True)
    overrides = {"unlooped": None, "looped": engine_overrides(config.architectures[0], loop)}
    engines, start = {}, {}
    for side in overrides:
        for eager in (True, False):
            t = time.perf_counter()
            engines[(side, eager)] = LLM(a.model, dtype="float32", enforce_eager=eager,
                                         distributed_executor_backend="uni", max_model_len=1024,
                                         hf_overrides=overrides[side])
            start[(side, eager)] = time.perf_counter() - t
    times = {k: [] for k in engines}
    tokens = {}
    for _ in range(a.rounds):
        for key, llm in engines.items():
            t = time.perf_counter()
            out = llm.generate(batch, params, use_tqdm=False)
            times[key].append(time.perf_counter() - t)
            tokens[key] = [list(o.outputs[0].token_ids) for o in out]
        print("round: " + ", ".join(f"{side} {'eager' if eager else 'compiled'} {times[(side, eager)][-1]:.2f} s"
                                    for side, eager in engines), flush=True)

    def ratios(num, den):
        return [x / y for x, y in zip(times[num], times[den], strict=True)]

    def show(name, rs):
        print(f"{name}: {', '.join(f'{r:.3f}' for r in rs)} (median {statistics.median(rs):.3f})")

    print(f"{config.architectures[0]} {a.model}, loop {a.loop}: c = {c:.4f}, 1.05 c = {1.05 * c:.4f}; "
          f"{len(batch)} prompts x {a.new_tokens} new tokens, {a.rounds} rounds, {threads.threads} threads; "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    for key, seconds in start.items():
        print(f"start-up {key[0]} {'eager' if key[1] else 'compiled'}: {seconds:.1f} s; "
              f"median round {statistics.median(times[key]):.2f} s "
              f"({1000 * statistics.median(times[key]) / (len(batch) * a.new_tokens):.1f} ms/token)")
    for side in overrides:
        show(f"{side} compiled / eager", ratios((side, False), (side, True)))
        same = sum(x == y for x, y in zip(tokens[(side, False)], tokens[(side, True)]))
        print(f"{side}: compiled tokens = eager tokens in {same}/{len(batch)} rows")
    show("looped / unlooped, both compiled", ratios(("looped", False), ("unlooped", False)))
    show("looped / unlooped, both eager", ratios(("looped", True), ("unlooped", True)))


if __name__ == "__main__":
    main()
