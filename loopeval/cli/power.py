"""``loopeval power``."""

from __future__ import annotations


from loopeval.cli._common import add_stat_options, metric_value


def add(sub) -> None:
    p = sub.add_parser(
        "power",
        help="minimum detectable difference, or items needed, from a paired pilot of two runs",
        description=(
            "Treat two lm-eval runs (written with --log_samples) as a paired pilot: per task and for the macro, "
            "print the per-item SD of CANDIDATE - BASELINE, the minimum detectable difference at the pilot's items "
            "(or --n), and with --delta the items needed to detect it. Two-sided normal approximation. The "
            "macro counts the items of all tasks together, in the pilot's proportions."
        ),
    )
    p.add_argument("baseline", help="baseline pilot run (e.g. the twin)")
    p.add_argument("candidate", help="candidate pilot run (e.g. the looped model)")
    p.add_argument("--delta", action="append", type=metric_value, default=[], metavar="[METRIC=]VALUE",
                   help="difference to detect: a bare VALUE on accuracies, a fraction (0.02 = 2 points); METRIC=VALUE "
                   "on a metric in its own unit (e.g. nll_per_byte=0.005). Repeatable")
    p.add_argument("--n", type=int, help="items at which to give the minimum detectable difference")
    add_stat_options(p, "alpha")
    p.add_argument("--power", type=float, default=0.8, help="power (default: 0.8)")
    p.add_argument("--metric", help="metric instead of each task's main one, e.g. exact_match,flexible-extract")
    p.add_argument("--tasks", nargs="+", metavar="T", help="leaf tasks or groups (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object (fractions, not points)")
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from loopeval.analysis.compared import pilot_power

    bare = [v for name, v in args.delta if name is None]
    if len(bare) > 1:
        raise ValueError(f"--delta given {len(bare)} bare values; give the accuracy difference once")
    result = pilot_power(args.baseline, args.candidate, alpha=args.alpha, power_=args.power, n=args.n,
                         delta=bare[0] if bare else None, deltas={k: v for k, v in args.delta if k is not None},
                         metric=args.metric, tasks=args.tasks)
    print(json.dumps(result.as_dict(), indent=2) if args.json else result)
    return 0
