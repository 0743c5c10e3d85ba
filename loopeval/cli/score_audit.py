"""``loopeval score-audit``."""

from __future__ import annotations

from loopeval.cli._common import add_reading_options


def add(sub) -> None:
    p = sub.add_parser(
        "score-audit",
        help="list the items of an lm-eval run whose verdict rests on a disputable scoring rule",
        description="Grade every response of RUN's boxed-answer tasks again and list those that used the GSM8K "
        "number fallback, hedged between option letters, held several different boxes, failed in math-verify, "
        "or compared an inequality with an interval; with counts per task. RUN is an lm-eval --output_path "
        "folder, its model folder or a results_*.json file written with --log_samples.",
    )
    p.add_argument("run", help="the lm-eval run")
    p.add_argument("--tasks", nargs="+", metavar="T", help="leaf tasks or groups to audit (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object (fractions, not points)")
    add_reading_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from loopeval.analysis.runs import load_run
    from loopeval.analysis.score_audit import score_audit

    run = load_run(args.run, tasks=args.tasks, allow_subset=args.allow_subset)
    audit = score_audit(run, unfinished_fallback=args.unfinished_fallback)
    print(json.dumps(audit.as_dict(), indent=2) if args.json else audit.to_text())
    return 0
