"""vLLM's OpenAI-compatible server for a looped or unlooped checkpoint (``loopeval serve``).

The server is the vLLM backend behind vLLM's own HTTP front (completions, chat completions,
``/health``, ``/v1/models``): :func:`prepare` opens the evaluation session over
:class:`loopeval.engines.vllm_backend.VLLMBackend` (the loop from the options or the
checkpoint's ``loop_config.json``, the same defaults and refusals as ``engine=vllm``, the
process's thread decision), then vLLM's ``serve`` arguments are parsed and checked and the
listening address tried, all before vLLM starts; :func:`serve` runs vLLM's API server with
the loop's ``hf_overrides`` (:func:`loopeval.engines.vllm_models.engine_overrides`), bound to
127.0.0.1 unless ``--host`` says otherwise. Clients get plain decoding: budget forcing and the
repetition stop are harness rules (``lm_eval --model looped --model_args ...,engine=vllm``).

:func:`running_server` starts one as a subprocess on a free local port and stops it with its
whole process group (tests, ``serve-cost --server``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from loopeval.common.errors import UserError
from loopeval.engines.vllm_engine import configure_environment

DEFAULT_HOST = "127.0.0.1"
HARNESS_RULES = ("budget forcing and the repetition stop are harness rules: a client of this server gets plain "
                 "decoding; lm_eval --model looped --model_args ...,engine=vllm applies them on the same engine")
ONE_SERVER = ("headless", "grpc")
"""vLLM ``serve`` modes that run no single in-process API server: refused."""


@dataclass
class Prepared:
    """A checked server: the session (loop, thread decision), vLLM's ``serve`` arguments with the
    loop's ``hf_overrides`` in, and the loop's cost."""

    session: object  # loopeval.evaluation.session.Session
    args: object  # vLLM's argparse.Namespace
    cost: object  # loopeval.core.cost.LoopCost

    @property
    def url(self) -> str:
        host = self.args.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.args.port}"

    def banner(self) -> str:
        """What ``loopeval serve`` prints before vLLM starts: the model, its cost, threads and address."""
        s, c = self.session, self.cost
        loop = s.loop.to_dict() if s.loop is not None else None
        what = "unlooped" if loop is None else "looped " + ", ".join(f"{k}={v}" for k, v in loop.items() if v is not None)
        threads = s.threads
        return "\n".join([
            f"loopeval serve: {s.pretrained}, {what}",
            f"loopeval serve: c = {c.multiplier:.4g} ({c.passes:g} of {c.base_passes} layer passes per token), "
            f"KV cache {c.kv_bytes_per_token:,} bytes per token ({c.base_kv_bytes_per_token:,} unlooped) at "
            f"{c.bytes_per_element} bytes per element",
            f"loopeval serve: {threads.threads} torch thread(s): {threads.reason}",
            f"loopeval serve: {HARNESS_RULES}",
            f"loopeval serve: serving model {self.args.served_model_name or self.args.model!r} at {self.url}/v1 once "
            f"loaded (GET {self.url}/health answers 200 then); Ctrl-C or SIGTERM stops it"])


def prepare(checkpoint, vllm_argv: list[str], *, loop: str | None = None, exit_after: int | None = None,
            **loop_options) -> Prepared:
    """Every check before vLLM starts (module docstring); ``loop_options`` are the loop's
    (``operator``, ``beta``, ``mix``, ``mix_source``), ``vllm_argv`` any ``vllm serve`` options."""
    from loopeval.core.spec import LOOP_OPTIONS
    from loopeval.engines.vllm_backend import VLLMBackend
    from loopeval.evaluation.session import Session

    unknown = sorted(set(loop_options) - set(LOOP_OPTIONS))
    if unknown:
        raise UserError(f"serve: unknown loop option(s) {', '.join(unknown)}; valid: {', '.join(LOOP_OPTIONS)}")
    configure_environment()
    args = _vllm_args(checkpoint, vllm_argv)
    model_args = {"loop": loop, "exit_after": exit_after, **{f"loop_{k}": v for k, v in loop_options.items()},
                  "revision": args.revision, "trust_remote_code": args.trust_remote_code}
    session = Session(str(checkpoint), {k: v for k, v in model_args.items() if v is not None}, VLLMBackend(),
                      argv=[])
    if session.loop is not None:
        if args.hf_overrides:
            raise UserError("serve: --hf-overrides given for a looped model; loopeval writes the loop's "
                            "hf_overrides itself (drop the flag, or serve the checkpoint unlooped)")
        from transformers import AutoConfig

        from loopeval.engines.vllm_models import engine_overrides

        config = AutoConfig.from_pretrained(str(checkpoint), revision=args.revision,
                                            trust_remote_code=args.trust_remote_code)
        args.hf_overrides = engine_overrides((config.architectures or ["?"])[0], session.loop)
    _check_address(args.host, args.port)
    return Prepared(session, args, _cost(checkpoint, session, args))


def _vllm_parser():
    """vLLM's own ``serve`` parser."""
    from loopeval.engines.vllm_metadata import vllm_version_known

    with vllm_version_known():
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        return make_arg_parser(FlexibleArgumentParser(
            prog="loopeval serve CKPT [--loop SPEC ...]", description="vLLM's serve options"))


def vllm_options_help(keyword: str | None = None) -> str:
    """vLLM's ``serve`` options as ``vllm serve --help[=KEYWORD]`` lists them (``all``, a group's
    title or part of an option's name; none: the groups), which the CPU build's own ``vllm``
    command cannot print (:mod:`loopeval.engines.vllm_metadata`)."""
    parser = _vllm_parser()
    parser._search_keyword = keyword  # how vLLM's parser receives --help=KEYWORD
    return parser.format_help().replace("'--help", "'--vllm-help")  # its hints name its own flag


def _vllm_args(checkpoint, vllm_argv: list[str]):
    """vLLM's ``serve`` arguments for ``checkpoint``, parsed and validated by vLLM's own parser
    (argparse's exit on a bad option), with the host defaulting to :data:`DEFAULT_HOST`."""
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    args = _vllm_parser().parse_args([str(checkpoint), *vllm_argv])
    given = [f"--{name}" for name in ONE_SERVER if getattr(args, name, False)]
    if given or (args.api_server_count or 1) > 1 or args.data_parallel_size > 1:
        raise UserError(f"serve: {', '.join(given) or 'several API servers or data parallel ranks'}: loopeval serve "
                        "runs one API server in its own process (scale it with --tensor-parallel-size, or start one "
                        "server per GPU)")
    args.model = str(checkpoint)
    args.host = args.host or DEFAULT_HOST
    validate_parsed_serve_args(args)
    return args


def _check_address(host: str, port: int) -> None:
    """Refuse an address the server could not listen on (as vLLM binds it: ``SO_REUSEADDR``)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        raise UserError(f"serve: cannot listen on {host}:{port} ({exc.strerror or exc}); another server may hold the "
                        "port: pick another with --port") from None


def dtype_size(dtype) -> int | None:
    """Bytes per element of a ``--dtype`` value (``float32``, ``half``...); ``None`` for ``auto``."""
    import torch

    found = getattr(torch, str(dtype), None)
    return found.itemsize if isinstance(found, torch.dtype) else None


def _cost(checkpoint, session, args):
    """The loop's cost (:func:`loopeval.core.cost.loop_cost`) at the dtype served (``--dtype``,
    else the checkpoint's)."""
    from transformers import AutoConfig

    from loopeval.core.cost import loop_cost

    config = AutoConfig.from_pretrained(str(checkpoint), revision=args.revision,
                                        trust_remote_code=args.trust_remote_code)
    return loop_cost(config, session.loop.spec if session.loop else None, bytes_per_element=dtype_size(args.dtype))


def serve(prepared: Prepared) -> None:
    """Run vLLM's API server for ``prepared`` until Ctrl-C or SIGTERM (vLLM's own handlers stop it
    and its engine process)."""
    import uvloop

    from loopeval.engines.vllm_metadata import vllm_version_known
    from loopeval.engines.vllm_models import register

    # vLLM's engine runs in a child process, which takes its torch threads from the environment
    os.environ["OMP_NUM_THREADS"] = str(prepared.session.threads.threads)
    print(prepared.banner(), flush=True)
    register()
    with vllm_version_known():
        from vllm.entrypoints.launchers.api_server.entry import run_server
        from vllm.logger import configure_logging_from_args

        configure_logging_from_args(prepared.args)
        uvloop.run(run_server(prepared.args))


# -- the Python API: a server in a subprocess ---------------------------------------------------


def server_environment() -> dict[str, str]:
    """The environment :func:`running_server`'s server process gets: this process's, its output
    unbuffered (so the log's tail is current when it dies)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port nothing listens on at ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running server: its base URL (``http://127.0.0.1:PORT``), the model name it serves,
    its process (the leader of its own process group) and its log file."""

    url: str
    model: str
    process: subprocess.Popen
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.is_file() else ""


def _get(url: str, timeout: float = 5.0) -> bytes | None:
    """The body of a 200 answer to GET ``url``; ``None`` when nothing (or an error) answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read() if r.status == 200 else None
    except OSError:
        return None


@contextlib.contextmanager
def running_server(checkpoint, *options: str, timeout: float = 600.0, log: str | Path | None = None,
                   python: str | None = None):
    """``loopeval serve checkpoint *options`` in a subprocess (``python``: this interpreter) on a
    free 127.0.0.1 port, yielded as a :class:`Server` once ``/health`` answers; ``RuntimeError``
    with the log's tail if it exits first, ``TimeoutError`` after ``timeout`` seconds. On exit
    the server gets SIGTERM (as from ``kill``), then its process group SIGKILL after a grace."""
    import json

    port = free_port()
    path = Path(log) if log is not None else Path(tempfile.mkstemp(prefix="loopeval-serve-", suffix=".log")[1])
    command = [python or sys.executable, "-m", "loopeval", "serve", str(checkpoint), *options, "--port", str(port)]
    with open(path, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=server_environment(),
                                   start_new_session=True)
    server = Server(f"http://{DEFAULT_HOST}:{port}", "", process, path)
    clean = False
    try:
        deadline = time.monotonic() + timeout
        while _get(f"{server.url}/health", timeout=2.0) is None:
            if process.poll() is not None:
                raise RuntimeError(f"loopeval serve {checkpoint} exited ({process.returncode}) before answering "
                                   f"/health; the tail of its log {path}:\n{server.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"loopeval serve {checkpoint}: no answer on {server.url}/health within "
                                   f"{timeout:g} s; the tail of its log {path}:\n{server.log_tail()}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.5)  # returns at once if the server dies
        server.model = json.loads(_get(f"{server.url}/v1/models"))["data"][0]["id"]
        yield server
        clean = True
    finally:
        stop(process)
        if clean and log is None:
            path.unlink(missing_ok=True)


def stop(process: subprocess.Popen, grace: float = 60.0) -> None:
    """SIGTERM to ``process``; after ``grace`` seconds, or once it has exited, SIGKILL to whatever
    is left of its process group (it leads one: ``start_new_session``)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
