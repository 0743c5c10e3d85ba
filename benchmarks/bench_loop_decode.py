"""Cached decode time of a looped model against its unrolled copy and the unlooped model.

Setup (issue "Looped model core"): a compute-bound CPU model, 8 layers, hidden 1024,
batch 8, 48 new tokens, loop 2:6x2 (c = 1.5). The three models are timed side by side,
interleaved over several repeats; the median is reported.

    python benchmarks/bench_loop_decode.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from loopeval import apply_loop, loop_cost
from loopeval.tools.tiny import tiny_model
from loopeval.core.unroll import unrolled_copy


def decode_seconds(model, ids, new_tokens: int) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--spec", default="2:6x2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    kwargs = dict(num_layers=8, hidden=1024, vocab_size=4096)
    unlooped = tiny_model("qwen3", **kwargs)
    unrolled = unrolled_copy(unlooped, args.spec)
    looped = apply_loop(tiny_model("qwen3", **kwargs), args.spec)
    c = loop_cost(unlooped, args.spec).multiplier
    ids = torch.randint(3, 4096, (args.batch, args.prompt_tokens))
    models = {"unlooped": unlooped, "unrolled": unrolled, "looped": looped}
    for m in models.values():  # warm-up
        decode_seconds(m, ids, 4)
    times = {name: [] for name in models}
    for _ in range(args.repeats):
        for name, m in models.items():
            times[name].append(decode_seconds(m, ids, args.new_tokens))
    med = {name: statistics.median(t) for name, t in times.items()}
    tokens = args.batch * args.new_tokens
    print(f"loop {args.spec} (c = {c:.2f}), batch {args.batch}, {args.new_tokens} new tokens, {args.threads} threads")
    for name, t in med.items():
        print(f"  {name:9s} {t:7.3f} s  {tokens / t:8.1f} tok/s")
    print(f"  looped / unrolled = {med['looped'] / med['unrolled']:.3f}   (target <= 1.05)")
    print(f"  looped / unlooped = {med['looped'] / med['unlooped']:.3f}   (target <= {1.05 * c:.3f} = 1.05 c)")


if __name__ == "__main__":
    main()
