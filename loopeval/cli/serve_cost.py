"""``loopeval serve-cost``."""

from __future__ import annotations


from loopeval.cli._common import add_loop_options, int_list, loop_options
from loopeval.evaluation.serving import CACHES


ENGINES = {"hf": "loopeval.evaluation.serving:serve_cost", "vllm": "loopeval.engines.vllm_serving:serve_cost"}
"""The ``serve_cost`` of each ``--engine``: transformers' ``generate``, or vLLM's serving backend."""


def add(sub) -> None:
    p = sub.add_parser(
        "serve-cost",
        help="latency, throughput and memory of looped against unlooped decoding (the paper's Table 10)",
        description="Measures, interleaved in one process: prefill time, decode latency per token at batch 1 "
        "(prefill excluded), throughput at each batch size, peak memory at batch 1 and the memory growth per "
        "token next to loop_cost's KV bytes (with --engine vllm: the KV bytes per token vLLM allocates); prints each ratio next to c and writes OUT/serve_cost.json. One "
        "--model with --loop (or its own loop) is compared with its unlooped self; several --model are compared "
        "with the first.",
    )
    p.add_argument("--model", action="append", required=True, help="checkpoint folder or hub id (repeatable; the "
                   "first is the baseline)")
    p.add_argument("--loop", help="loop spec for a single --model, e.g. 8:16x2")
    add_loop_options(p)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--batch-sizes", type=_batch_sizes, default="auto",
                   help="auto (default: the largest batch that fits on CUDA; see docs/serving.md for CPU) or 1,8,64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--engine", choices=list(ENGINES), default="hf",
                   help="hf (transformers' generate, default) or vllm (the vLLM engine, compiled, prefix caching off; "
                   "docs/serving.md)")
    p.add_argument("--server", action="store_true",
                   help="measure under load instead: vLLM's serving benchmark client (vllm bench serve, random "
                   "dataset) against two loopeval serve servers, unlooped and --loop; --batch-sizes are then its "
                   "client concurrencies; TTFT, TPOT, ITL and tokens/s per concurrency (docs/serving.md)")
    p.add_argument("--prompts-per-level", type=int, help="with --server: requests per benchmark run "
                   "(default: 4 per concurrent client)")
    p.add_argument("--cache", choices=list(CACHES), default="dynamic")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step (needs --cache static)")
    p.add_argument("--device", help="default: cuda if available, else cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: the checkpoint's")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=run)


def _batch_sizes(text: str):
    return "auto" if text.strip() == "auto" else int_list(text)


def run(args) -> int:
    import importlib

    from loopeval.common.outputs import check_outputs

    check_outputs({"--out": args.out}, args.model)
    if args.server:
        return _server(args)
    module, name = ENGINES[args.engine].split(":")
    serve_cost = getattr(importlib.import_module(module), name)
    result = serve_cost(args.model, loop=args.loop, **loop_options(args), prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                        batch_sizes=args.batch_sizes, repeats=args.repeats, compile=args.compile,
                        cache=args.cache, device=args.device, dtype=args.dtype, out=args.out)
    print(result.to_text())
    print(f"wrote {args.out}/serve_cost.json")
    return 0


def _server(args) -> int:
    """``serve-cost --server`` (:func:`loopeval.engines.server_cost.serve_cost`)."""
    given = [flag for flag, on in (("--engine", args.engine != "hf"), ("--cache", args.cache != "dynamic"),
                                   ("--compile", args.compile), ("--device", args.device is not None)) if on]
    if given:
        raise ValueError(f"--server: {', '.join(given)} set the in-process measurement; the servers run vLLM "
                         "(loopeval serve) and take vLLM's own settings: drop them")
    if args.batch_sizes == "auto":
        raise ValueError("--server needs explicit --batch-sizes: the client concurrencies, e.g. 1,4")
    from loopeval.engines.server_cost import levels_text, serve_cost

    result = serve_cost(args.model, loop=args.loop, **loop_options(args), prompt_tokens=args.prompt_tokens,
                        new_tokens=args.new_tokens, concurrencies=args.batch_sizes, repeats=args.repeats,
                        prompts_per_level=args.prompts_per_level, dtype=args.dtype, out=args.out)
    print(result.to_text())
    print()
    print(levels_text(result))
    print(f"wrote {args.out}/serve_cost.json")
    return 0
