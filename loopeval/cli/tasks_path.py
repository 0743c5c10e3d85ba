"""``loopeval tasks-path``."""

from __future__ import annotations


def add(sub) -> None:
    p = sub.add_parser("tasks-path", help="print the folder to pass to lm_eval --include_path")
    p.set_defaults(func=run)


def run(args) -> int:
    from loopeval.common.paths import tasks_path

    print(tasks_path())
    return 0
