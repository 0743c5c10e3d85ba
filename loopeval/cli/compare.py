"""``loopeval compare``."""

from __future__ import annotations

import sys

from loopeval.cli._common import MARGIN_HELP, add_metric_option, add_reading_options, add_stat_options, metric_option


def add(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="paired statistics of two lm-eval runs: bootstrap, McNemar, TOST",
        description=(
            "Compare CANDIDATE with BASELINE item by item, per task and on the macro (unweighted mean over "
            "leaf tasks of one kind of metric): scores and differences in each metric's unit (points for a 0/1 "
            "accuracy, nats per byte for gsm8k_nll ...), paired-bootstrap 95%% interval and two-sided p, "
            "exact McNemar p on 0/1 tasks, and TOST equivalence (the paper's 90%% interval inside +-2 points for "
            "accuracies; a continuous metric's margin only with --margin METRIC=VALUE). Runs that decode differently "
            "(chat template, settings, prompts) have their outcomes withheld unless --intended names the difference. "
            "A run is an lm-eval --output_path folder, its model folder or a results_*.json file written with "
            "--log_samples. Exit status 2, with the reason on stderr, when the runs cannot be paired."
        ),
    )
    p.add_argument("baseline", help="baseline run (e.g. the twin)")
    p.add_argument("candidate", help="candidate run (e.g. the looped model)")
    p.add_argument("--json", action="store_true", help="print one JSON object (fractions, not points)")
    p.add_argument("--metric", help="metric instead of each task's main one, e.g. exact_match,flexible-extract")
    p.add_argument("--tasks", nargs="+", metavar="T", help="leaf tasks or groups to compare (default: all)")
    p.add_argument("--test", choices=["bootstrap", "mcnemar"], default="bootstrap",
                   help="the test that decides each row (default: the paired bootstrap)")
    p.add_argument("--family", type=int, metavar="K", help="Bonferroni-adjust every interval for a family of K")
    p.add_argument("--cluster-field", metavar="FIELD", help="resample clusters of items sharing this doc field")
    add_stat_options(p, "cost", "n_resamples", "seed")
    add_metric_option(p, "--margin", MARGIN_HELP)
    p.add_argument("--intended", nargs="+", default=[], metavar="NAME",
                   help="differences between the runs that are intended (a setting such as chat_template_sha, or "
                   "prompts, generation_kwargs, task_version): the outcomes are shown despite them")
    add_reading_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from loopeval.analysis.compared import compare_runs

    margin, margins = metric_option(args, "--margin")
    result = compare_runs(args.baseline, args.candidate, metric=args.metric, tasks=args.tasks,
                          cluster_field=args.cluster_field, cost=args.cost, test=args.test, family=args.family,
                          n_resamples=args.n_resamples, seed=args.seed, allow_subset=args.allow_subset,
                          unfinished_fallback=args.unfinished_fallback, margin=margin, margins=margins,
                          intended=args.intended)
    for note in result.notes:
        print(f"warning: {note}", file=sys.stderr)
    print(json.dumps(result.as_dict(), indent=2) if args.json else result)
    return 0
