"""Generation throughput of ``--model looped`` (no loop) against ``--model hf`` on one model.

Both adapters run ``generate_until`` on the same requests (greedy, ``min_new_tokens``
so every row generates the full budget); runs are interleaved and the median is kept.

    python benchmarks/bench_lm_eval_throughput.py [--repeats 3] [--trace]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from loopeval import save_model
from loopeval.tools.tiny import tiny_model, tiny_tokenizer
from loopeval.model_adapters.looped import LoopedLM


def requests(n: int, new_tokens: int) -> list[Instance]:
    kwargs = {"until": [], "max_gen_toks": new_tokens, "do_sample": False, "min_new_tokens": new_tokens}
    return [
        Instance("generate_until", {}, (f"Question {i}: what is {i} + {2 * i}? Answer:", kwargs), 0, ("bench", i, 1))
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--trace", action="store_true", help="also write the per-item trace")
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        tok = tiny_tokenizer()
        save_model(tiny_model("qwen3", vocab_size=len(tok), num_layers=8, hidden=512), tok, tmp)
        common = dict(pretrained=tmp, device="cpu", batch_size=args.batch_size)
        models = {
            "hf": HFLM(**common),
            "looped": LoopedLM(**common, trace=f"{tmp}/trace" if args.trace else None),
        }
        reqs = requests(args.requests, args.new_tokens)
        for lm in models.values():
            lm.generate_until(reqs[: args.batch_size], disable_tqdm=True)
        times = {name: [] for name in models}
        for _ in range(args.repeats):
            for name, lm in models.items():
                start = time.perf_counter()
                lm.generate_until(reqs, disable_tqdm=True)
                times[name].append(time.perf_counter() - start)
    tokens = args.requests * args.new_tokens
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, t in med.items():
        print(f"{name:7s} {t:7.3f} s  {tokens / t:8.1f} tok/s")
    print(f"looped / hf throughput = {med['hf'] / med['looped']:.3f}  (target >= 0.97)")


if __name__ == "__main__":
    main()
