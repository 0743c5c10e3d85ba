"""``loopeval demo``."""

from __future__ import annotations


def add(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="the protocol end to end on tiny local models: data, twin training, 16 lm-eval runs, report",
        description="Makes a synthetic arithmetic task, trains a tiny twin and looped model on CPU, evaluates both "
        "through lm-eval's looped model at 0.5-2x budgets with and without budget forcing, and writes the report.",
    )
    p.add_argument("--out", default="loopeval-demo", help="output folder (default: ./loopeval-demo)")
    p.add_argument("--size", default="default", choices=["default", "tiny"], help="tiny: a one-minute smoke test")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recipe", default="full", choices=["full", "convert"],
                   help="convert: fine-tune the base, then convert it with LoRA through the loop (and its twin)")
    p.set_defaults(func=run)


def run(args) -> int:
    from loopeval.tools.demo import run_demo

    run_demo(args.out, size=args.size, seed=args.seed, recipe=args.recipe)
    return 0
