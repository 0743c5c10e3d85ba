"""``loopeval protocol``."""

from __future__ import annotations

import sys


def add(sub) -> None:
    p = sub.add_parser(
        "protocol",
        help="run every evaluation of a two-test study (resumably, in parallel) and write its report",
        description="STUDY.yaml names the models, tasks, budgets, decoding rules and lm-eval settings "
        "(docs/protocol.md). The study is validated and checked for fairness before anything runs; finished "
        "evaluations are skipped, a killed one resumes, and the report is written to OUTPUT/report.html.",
    )
    p.add_argument("study", help="the study file (YAML)")
    p.add_argument("--dry-run", action="store_true", help="print every evaluation, whether it is done, and its budgeted cost")
    p.add_argument("--only", metavar="PATTERN", help="run only the evaluations whose names match this glob")
    p.add_argument("--report-only", action="store_true", help="run nothing; rebuild the report from finished evaluations")
    p.add_argument("--no-rerun", action="store_true",
                   help="refuse, instead of re-running, a finished evaluation made with other settings or weights")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, help="parallel worker processes on the CPU (default 1)")
    where.add_argument("--devices", help="one worker per device, e.g. cuda:0,cuda:1")
    where.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                       help="each evaluation a Ray task: on the cluster at ADDRESS ('auto': the one this node "
                            "joined), else RAY_ADDRESS's, else a new local Ray; the study's ray: key sets "
                            "resources and retries "
                            "(needs pip install 'loopeval[ray]')")
    p.set_defaults(func=run)


def run(args) -> int:
    from loopeval.tools.study import run_study

    devices = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else None
    workers = 1 if args.workers is None else args.workers
    explicit = args.workers is not None or devices is not None  # run without the study's ray: key
    try:
        result = run_study(args.study, dry_run=args.dry_run, only=args.only, report_only=args.report_only,
                           workers=workers, devices=devices, rerun=not args.no_rerun,
                           ray=args.ray if args.ray is not None else (False if explicit else None))
    except ImportError as exc:  # Ray, an optional extra, is not installed
        if exc.name != "ray":
            raise
        print(f"loopeval protocol: error: {exc}", file=sys.stderr)
        return 2
    for name in result.failed:
        print(f"FAILED {name}: {result.outcomes[name]}", file=sys.stderr)
    if result.report is not None:
        print(f"wrote {result.report}")
    return 1 if result.failed else 0
