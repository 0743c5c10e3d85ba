"""``loopeval local-tasks``."""

from __future__ import annotations


def add(sub) -> None:
    p = sub.add_parser(
        "local-tasks",
        help="write task overrides that read loopeval's tasks from a local copy of their data",
        description="For every task in tasks/ whose files are under DATA (DATA/<repo>/[<config>/]<split>.jsonl, "
        ".json, .parquet or .csv, or the hub's <split>-00000-of-00002.<ext> shards; see docs/tasks.md), writes a task of the same name "
        "that reads them. Pass the folder to lm_eval --include_path.",
    )
    p.add_argument("--data", required=True, help="the local data folder")
    p.add_argument("--out", required=True, help="the task folder to write")
    p.add_argument("--tasks", help="comma-separated task names (default: every task whose data is present)")
    p.set_defaults(func=run)


def run(args) -> int:
    from loopeval.evaluation.local_data import write_local_tasks

    names = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    print(write_local_tasks(args.data, args.out, tasks=names))
    return 0
