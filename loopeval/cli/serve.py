"""``loopeval serve``."""

from __future__ import annotations

import argparse

from loopeval.cli._common import add_loop_options, loop_options


class _VllmHelp(argparse.Action):
    """``--vllm-help[=KEYWORD]``: print vLLM's serve options and exit, as ``--help`` does."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            _require_vllm()
        except ValueError as exc:
            parser.error(f"--vllm-help: {exc}")
        from loopeval.engines.server import vllm_options_help

        print(vllm_options_help(values))
        parser.exit()


def add(sub) -> None:
    p = sub.add_parser(
        "serve", allow_abbrev=False,
        usage="loopeval serve CKPT [--loop SPEC] [loop options] [--exit-after K] [any vllm serve option]",
        help="vLLM's OpenAI-compatible server (completions, chat completions) for a looped or unlooped checkpoint",
        description="Serves CKPT (a float checkpoint folder) looped by --loop, or by its own loop_config.json, on "
        "the vLLM engine, with the defaults and refusals of lm_eval --model looped engine=vllm; prints its cost "
        "(c, KV bytes per token), listens on 127.0.0.1:8000 unless --host/--port say otherwise, answers GET "
        "/health, and stops on Ctrl-C or SIGTERM. Every other option is vllm serve's (e.g. --dtype float32 "
        "--max-model-len 2048 --port 8001; --vllm-help=all lists them). Clients get plain decoding: budget "
        "forcing and the repetition stop are harness rules (docs/serving.md, \"A server any client can call\"). Run it where vLLM is installed.",
    )
    p.add_argument("checkpoint", help="checkpoint folder (loopeval import-gguf converts a GGUF file)")
    p.add_argument("--loop", help="loop spec, e.g. 14:16x2 (default: the checkpoint's own loop, if any)")
    add_loop_options(p)
    p.add_argument("--exit-after", type=int, help="run the loop's first K steps (lm-eval's exit_after=)")
    p.add_argument("--vllm-help", nargs="?", const=None, metavar="KEYWORD", action=_VllmHelp,
                   help="list vllm serve's options and exit, as vllm serve --help[=KEYWORD] would (all, a group, "
                        "or part of an option's name)")
    p.set_defaults(func=run, passes_through=True)


def _require_vllm() -> None:
    """``ValueError`` with the install line where vLLM is not installed."""
    from loopeval.engines.vllm_engine import INSTALL, engine_version

    try:
        engine_version()
    except ImportError:
        raise ValueError(f"vLLM is not installed in this environment: {INSTALL}") from None


def run(args) -> int:
    _require_vllm()
    from loopeval.engines.server import prepare, serve

    serve(prepare(args.checkpoint, args.passed, loop=args.loop, exit_after=args.exit_after, **loop_options(args)))
    return 0
