"""``loopeval power``."""

from __future__ import annotations


from loopeval.cli._common import DELTA_HELP, add_metric_option, add_stat_options, metric_option


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
    add_metric_option(p, "--delta", DELTA_HELP)
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

    delta, deltas = metric_option(args, "--delta")
    result = pilot_power(args.baseline, args.candidate, alpha=args.alpha, power_=args.power, n=args.n,
                         delta=delta, deltas=deltas,
                         metric=args.metric, tasks=args.tasks)
    print(json.dumps(result.as_dict(), indent=2) if args.json else result)
    return 0
