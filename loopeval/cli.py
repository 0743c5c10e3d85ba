"""The ``loopeval`` command line. Each subcommand is an ``_add_<name>`` function that
registers its parser and binds ``func``; heavy imports happen inside the handlers."""

from __future__ import annotations

import argparse
import sys


def _add_check_cache(sub) -> None:
    p = sub.add_parser(
        "check-cache",
        help="compare cached greedy decoding of a (looped) model with full recomputation",
        description="Exit status 0 when cached decoding equals full recomputation, 1 on a mismatch.",
    )
    p.add_argument("--model", help="checkpoint path or hub id (default: a tiny random Qwen3 built on the fly)")
    p.add_argument("--loop", help="loop spec such as 8:16x2 (default: the checkpoint's own loop, if any)")
    p.add_argument("--operator", default=None, choices=["repeat", "damped"])
    p.add_argument("--beta", type=float, default=None)
    p.add_argument("--mix", type=float, default=None)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompt", action="append", help="a prompt (repeatable); default: three built-in prompts")
    p.set_defaults(func=_check_cache)


def _check_cache(args) -> int:
    from loopeval.cache_check import run_check_cache_cli

    return run_check_cache_cli(args)


def _add_tasks_path(sub) -> None:
    p = sub.add_parser("tasks-path", help="print the folder to pass to lm_eval --include_path")
    p.set_defaults(func=_tasks_path)


def _tasks_path(args) -> int:
    from loopeval.paths import tasks_path

    print(tasks_path())
    return 0


# Subcommands are listed here in the order `loopeval --help` shows them.
_SUBCOMMANDS = [_add_check_cache, _add_tasks_path]


def build_parser() -> argparse.ArgumentParser:
    from loopeval import __version__

    parser = argparse.ArgumentParser(
        prog="loopeval",
        description="Does looping a trained language model pay for its inference compute?",
    )
    parser.add_argument("--version", action="version", version=f"loopeval {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        # Bad input: one clear line on stderr, no traceback.
        print(f"loopeval {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
