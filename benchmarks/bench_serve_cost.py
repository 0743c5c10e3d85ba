"""Serving cost (the paper's Table 10) of the decode benchmark model on this machine.

The model of bench_loop_decode.py: a random Qwen3, 8 layers, hidden 1024, vocab 4096,
looped 2:6x2 (c = 1.5), against its own unlooped self, measured by
``loopeval.evaluation.serving.serve_cost`` once per cache implementation (each run interleaves the
two models). Targets with the dynamic cache: latency ratio <= 1.05 c, throughput ratio
>= 0.95 / c.

    python benchmarks/bench_serve_cost.py [--caches dynamic,static] [--compile] [--threads 2]

``--size 0.6b`` builds a random model of Qwen3-0.6B's shape instead (28 layers, hidden
1024, 16 heads, vocabulary 151,936), the GPU check of Table 10 (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse

import torch

from loopeval.evaluation.serving import serve_cost
from loopeval.tools.tiny import tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["decode", "0.6b"], default="decode")
    parser.add_argument("--spec", help="default: 2:6x2 (decode), 10:17x2 (0.6b, c = 1.25)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--caches", default="dynamic,static")
    parser.add_argument("--compile", action="store_true", help="also run the static cache compiled")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batch-sizes", default="1,8", help="sizes such as 1,8 or auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write OUT/<cache>/serve_cost.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.size == "decode":
        model, spec = tiny_model("qwen3", num_layers=8, hidden=1024, vocab_size=4096), args.spec or "2:6x2"
    else:
        model = tiny_model("qwen3", num_layers=28, hidden=1024, vocab_size=151936, intermediate_size=3072,
                           num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960)
        spec = args.spec or "10:17x2"
    model = model.to(getattr(torch, args.dtype))
    sizes = "auto" if args.batch_sizes == "auto" else [int(b) for b in args.batch_sizes.split(",")]
    runs = [(cache, False) for cache in args.caches.split(",")] + ([("static", True)] if args.compile else [])
    results = {}
    for cache, compiled in runs:
        label = cache + (" compiled" if compiled else "")
        results[label] = serve_cost(
            model, loop=spec, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
            batch_sizes=sizes, repeats=args.repeats, cache=cache,
            compile=compiled, out=f"{args.out}/{label.replace(' ', '_')}" if args.out else None,
        )
        print(f"\n== {label} cache, {args.threads} threads\n{results[label].to_text()}")
    if "dynamic" in results:
        r = results["dynamic"].ratios()
        c = r["multiplier"]
        print(f"\ndynamic: latency x{r['latency']:.3f} (target <= {1.05 * c:.3f} = 1.05 c), "
              f"throughput x{r['throughput']:.3f} (target >= {0.95 / c:.3f} = 0.95 / c)")
        for label, result in results.items():
            if label != "dynamic":
                rows = [f"{m.name} x{m.max_throughput / d.max_throughput:.3f}"
                        for m, d in zip(result.models, results["dynamic"].models)]
                print(f"{label} / dynamic throughput at batch {result.models[0].max_batch}: {', '.join(rows)}")


if __name__ == "__main__":
    main()
