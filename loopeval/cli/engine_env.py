"""``loopeval engine-env``."""

from __future__ import annotations


def add(sub) -> None:
    p = sub.add_parser(
        "engine-env", help="print the environment to start the vLLM engine's process with, as export lines",
        description="Prints, as shell export lines, the vLLM settings the engine sets and the libraries of vLLM's "
                    "CPU guide (tcmalloc, Intel's OpenMP runtime) that this environment has installed and "
                    "LD_PRELOAD lacks; a preload only works from a process's start, so run "
                    "eval \"$(loopeval engine-env)\" in the shell that then starts lm_eval ... engine=vllm. "
                    "Not needed for exact results; see docs/engine.md, \"Performance\".")
    p.set_defaults(func=run)


def run(args) -> int:
    from loopeval.engines.runtime import engine_environment, export_lines

    print(export_lines(engine_environment()), end="")
    return 0
