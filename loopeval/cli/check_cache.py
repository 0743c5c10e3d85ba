"""``loopeval check-cache``."""

from __future__ import annotations


from loopeval.cli._common import add_loop_options, loop_options


def add(sub) -> None:
    p = sub.add_parser(
        "check-cache",
        help="compare cached greedy decoding of a (looped) model with full recomputation",
        description="Exit status 0 when cached decoding equals full recomputation, 1 on a mismatch.",
    )
    p.add_argument("--model", help="checkpoint path or hub id (default: a tiny random Qwen3 built on the fly)")
    p.add_argument("--loop", help="loop spec such as 8:16x2 (default: the checkpoint's own loop, if any)")
    add_loop_options(p)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    p.add_argument("--prompt", action="append", help="a prompt (repeatable); default: three built-in prompts")
    p.set_defaults(func=run)


def run(args) -> int:
    """``loopeval check-cache``: print the result; exit 1 on a mismatch."""
    import torch

    from loopeval.core.cache_check import DEFAULT_PROMPTS, check_cache, checked_prompts
    from loopeval.core.checkpoint import load_model
    from loopeval.core.loop import apply_loop, loop_config, resolve_loop

    options = loop_options(args)
    prompts = checked_prompts(args.prompt or DEFAULT_PROMPTS)  # before any weights load
    if args.model is None:
        from loopeval.tools.tiny import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        model = tiny_model("qwen3", vocab_size=len(tokenizer), num_layers=6)
        apply_loop(model, resolve_loop(model, args.loop or "2:4x2", **options))
        print(f"model: tiny random Qwen3 (6 layers), loop {loop_config(model).spec}")
    else:
        model, tokenizer = load_model(args.model, args.loop, dtype=getattr(torch, args.dtype), **options)
        config = loop_config(model)
        print(f"model: {args.model}, loop {config.spec if config else 'none'}")
    result = check_cache(model, tokenizer, prompts, args.max_new_tokens)
    print(result)
    if result.error is not None:
        raise ValueError(f"the cache check could not compare: cached decoding raised {result.error}")
    return 0 if result.ok else 1
