"""The ``loopeval`` command line: one module per subcommand. Each module's ``add`` registers
its parser and binds ``run``, which parses, calls one library function and prints the
result's own text form; heavy imports happen inside ``run``."""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

from loopeval.common.threads import set_wait_policy

set_wait_policy()  # before any subcommand imports torch (loopeval.common.threads)

SUBCOMMANDS = ("demo", "check_cache", "place", "decontaminate", "train", "protocol", "compare", "power", "report",
               "serve", "serve_cost", "score_audit", "tasks_path", "import_gguf", "local_tasks", "engine_env")
"""In the order ``loopeval --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    from loopeval import __version__

    parser = argparse.ArgumentParser(
        prog="loopeval",
        description="Does looping a trained language model pay for its inference compute?",
    )
    parser.add_argument("--version", action="version", version=f"loopeval {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        import_module(f"loopeval.cli.{name}").add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. Expected failures (a :class:`~loopeval.common.errors.UserError`,
    and bad values, files, options, templates) print one line on stderr and exit 2;
    ``LOOPEVAL_DEBUG=1`` shows the traceback instead."""
    import os

    from loopeval.common.errors import UserError

    parser = build_parser()
    args, passed = parser.parse_known_args(argv)
    if getattr(args, "passes_through", False):
        args.passed = passed  # options the subcommand hands on (loopeval serve: vLLM's)
    elif passed:
        parser.error(f"unrecognized arguments: {' '.join(passed)}")
    try:
        return int(args.func(args) or 0)
    except (UserError, ValueError, OSError) as exc:
        if os.environ.get("LOOPEVAL_DEBUG"):
            raise
        message = str(exc) if not isinstance(exc, OSError) or not exc.filename else f"{exc.filename}: {exc.strerror}"
        print(f"loopeval {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"loopeval {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
