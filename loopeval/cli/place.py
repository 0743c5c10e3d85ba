"""``loopeval place``."""

from __future__ import annotations

import argparse

from loopeval.cli._common import float_list, int_list


def add(sub) -> None:
    p = sub.add_parser(
        "place",
        help="score where to put a loop: every window of a grid by calibrated perplexity PPL_T, PPL and KL",
        description=(
            "Score every window of a grid on held-out text (JSONL of {\"text\"} documents, split by hash into a "
            "validation part for temperature fitting and a test part for scoring): PPL_T, plain PPL and the mean KL "
            "to the unlooped model, which is the first row. Writes OUT/placements.jsonl (a re-run skips candidates "
            "already there) and OUT/placement.html, and prints the ranked table."
        ),
    )
    p.add_argument("--model", required=True, help="unlooped checkpoint folder or hub id")
    p.add_argument("--data", required=True, metavar="TEXT.jsonl")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--widths", type=int_list, default=argparse.SUPPRESS, help="window widths (default 2-8)")
    p.add_argument("--times", type=int_list, default=argparse.SUPPRESS, help="K, passes of the window (default 2,3,4)")
    p.add_argument("--betas", type=float_list, default=argparse.SUPPRESS, help="anchors beta (default 0,0.25,0.5)")
    p.add_argument("--starts", type=int_list, default=argparse.SUPPRESS, help="window starts (default: every layer)")
    p.add_argument("--operator", default=argparse.SUPPRESS, help="repeat or damped (default: damped)")
    p.add_argument("--mlp-loop", nargs="?", type=int, const=10, default=argparse.SUPPRESS, metavar="TOP",
                   help="also try the TOP windows (default 10) with one MLP-only loop (K=3) at their first layer")
    p.add_argument("--max-tokens", type=int, default=argparse.SUPPRESS, help="text tokens to use, in all")
    p.add_argument("--seq-len", type=int, default=argparse.SUPPRESS, help="tokens per row (default 1024)")
    p.add_argument("--val-fraction", type=float, default=argparse.SUPPRESS, help="share of documents for validation (0.5)")
    p.add_argument("--batch-tokens", type=int, default=argparse.SUPPRESS, help="tokens per layer call (default 8192)")
    p.add_argument("--rank-by", default=argparse.SUPPRESS, help="ppl_t (default), ppl or kl")
    p.add_argument("--correlate", metavar="RESULTS.jsonl", default=argparse.SUPPRESS,
                   help='benchmark accuracies, {"loop", "operator", "beta", "accuracy"} rows: Spearman rho per score')
    p.add_argument("--dtype", default=argparse.SUPPRESS, help="weight dtype, e.g. bfloat16 (default: the checkpoint's)")
    p.add_argument("--device", default=argparse.SUPPRESS, help="default: cuda if available, else cpu")
    p.add_argument("--top", type=int, default=20, help="rows of the printed table (default 20)")
    p.add_argument("--no-rerun", dest="rerun", action="store_false", default=argparse.SUPPRESS,
                   help="refuse, instead of searching again, an --out folder searched with other weights or text")
    p.set_defaults(func=run)


def run(args) -> int:
    from loopeval.common.outputs import check_outputs, folder_lock
    from loopeval.tools.placement import place
    from loopeval.tools.placement.report import format_correlations, format_table, handoff

    options = {k: v for k, v in vars(args).items() if k not in ("command", "func", "model", "data", "out", "top")}
    if "correlate" in options:
        options["results"] = options.pop("correlate")
    check_outputs({"--out": args.out}, [args.model, args.data])
    with folder_lock(args.out, "place"):
        result = place(args.model, args.data, out=args.out, **options)
    print(format_table(result, top=args.top))
    if result.correlations:
        print(format_correlations(list(result.correlations)))
    print(f"{result.scored} candidates scored in {result.wall_s:.1f} s ({result.layer_passes:.1f} layer passes per "
          f"text position); wrote {result.out / 'placements.jsonl'} and {result.out / 'placement.html'}")
    print(handoff(result, args.model))
    return 0
