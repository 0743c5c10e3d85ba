"""The engine's generation with and without ``loopeval engine-env``'s preload, processes alternating.

Each process starts one vLLM engine (loopeval's settings, eager, float32), generates 8 prompts of
60 tokens x 32 greedy tokens once to warm up, then times two generations and prints the time,
the load average and a hash of the tokens. A preload works from a process's start only, so the
variants are separate processes, alternated ``--rounds`` times:

    python benchmarks/bench_engine_env.py --model smollm2 --rounds 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time


def child(model: str, threads: int) -> None:
    from loopeval.engines.runtime import configure_environment

    configure_environment()
    import torch

    torch.set_num_threads(threads)
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model, dtype="float32", enforce_eager=True, distributed_executor_backend="uni", max_model_len=512,
              enable_prefix_caching=False)
    batch = [TokensPrompt(prompt_token_ids=list(range(100 + 7 * i, 160 + 7 * i))) for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    llm.generate(batch, params, use_tqdm=False)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        out = llm.generate(batch, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    tokens = hashlib.sha256(json.dumps([list(o.outputs[0].token_ids) for o in out]).encode()).hexdigest()[:12]
    print(json.dumps({"threads": torch.get_num_threads(), "times": times, "tokens": tokens,
                      "load": os.getloadavg()[0]}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        child(a.model, a.threads)
        return
    from loopeval.engines.runtime import preload

    plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    print("| process | LD_PRELOAD | generation 1 | generation 2 | load | tokens |\n|---|---|---|---|---|---|")
    for n, env in enumerate([plain, {**plain, "LD_PRELOAD": preload(plain)}] * a.rounds, 1):
        out = subprocess.run([sys.executable, __file__, "--child", "--model", a.model, "--threads", str(a.threads)],
                             env=env, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        print(f"| {n} | {env.get('LD_PRELOAD') or 'none'} | {r['times'][0]:.1f} s | {r['times'][1]:.1f} s | "
              f"{r['load']:.1f} | {r['tokens']} |", flush=True)


if __name__ == "__main__":
    main()
