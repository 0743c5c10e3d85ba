"""``serve-cost --server``: serving cost under load, measured as the field measures it.

Two servers (:func:`loopeval.engines.server.running_server`) serve one checkpoint, unlooped
and looped by ``loop``; vLLM's own serving benchmark client (``vllm bench serve``'s
:mod:`vllm.benchmarks.serve`, its random dataset: ``prompt_tokens`` random prompt tokens,
exactly ``new_tokens`` generated, greedy) runs against them in turn, at each client
concurrency, in every repeat (interleaved: repeat k times both servers at every level
before repeat k+1). Its figures go into the one serve-cost result
(:class:`loopeval.evaluation.serving.ServeCost`, with its checks against c):

* ``prefill_s``: the median time to first token (TTFT) at the lowest concurrency;
* ``latency_s``: the median time per output token after the first (TPOT) there;
* ``throughput``: generated tokens per second at each concurrency (the result's batch sizes).

Every level's medians of TTFT, TPOT and inter-token latency (ITL) and its throughput are kept
in ``settings["levels"]``. Memory is not measured here: ``peak_memory_bytes`` is the weights
plus loop_cost's KV bytes per token for one row (``settings["memory"]`` says so).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from loopeval.evaluation.serving import ModelServing, ServeCost, Spread
from loopeval.evaluation.serving.measure import _batch_sizes, _check_counts, _loop_with_options, _writable

NAME = "vllm-server"
"""The result's ``engine``: vLLM behind ``loopeval serve``, measured by vLLM's benchmark client."""
FIXED = ("--enforce-eager", "--no-enable-prefix-caching")
"""Both servers' settings, for the reasons of :data:`loopeval.engines.vllm_serving.FIXED`: eager,
since a looped model runs eager whatever the setting; no prefix cache, since the benchmark's
seeded random prompts repeat across runs and a cache would time no prefill."""
FIGURES = ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "output_throughput")
"""What ``settings["levels"]`` keeps of each benchmark run."""


def serve_cost(model, *, loop=None, prompt_tokens: int = 512, new_tokens: int = 256, concurrencies=(1, 4),
               prompts_per_level: int | None = None, repeats: int = 3, dtype: str | None = None, seed: int = 0,
               server_args: tuple[str, ...] = (), out: str | Path | None = None, timeout: float = 900.0,
               **loop_options) -> ServeCost:
    """The serving cost of ``model`` (a checkpoint folder without a loop of its own) looped by
    ``loop`` against its unlooped self, through two servers (module docstring).
    ``prompts_per_level``: requests per benchmark run (default: 4 per concurrent client);
    ``server_args``: further ``vllm serve`` options for both servers. Inputs are checked
    before any server starts; with ``out``, writes ``out/serve_cost.json``."""
    from loopeval.engines.server import running_server

    model, sizes = _check(model, loop, loop_options, prompt_tokens, new_tokens, concurrencies, repeats, out)
    config = _loop_with_options(loop, loop_options)
    per_level = prompts_per_level or 4 * sizes[-1]
    options = ("--dtype", dtype or "auto", "--max-model-len", str(prompt_tokens + new_tokens + 16),
               "--seed", str(seed), *FIXED, *server_args)
    looping = ["--loop", str(config.spec), *_loop_flags(config)]
    with running_server(model, *options, timeout=timeout) as base, \
            running_server(model, *options, *looping, timeout=timeout) as looped:
        servers = (base, looped)
        runs = [[{c: [] for c in sizes} for _ in servers] for _ in range(repeats)]
        for server in servers:  # warm-up: both shapes once
            _bench(server, prompt_tokens, new_tokens, 1, 2, seed)
        for k in range(repeats):
            for c in sizes:
                for i, server in enumerate(servers):
                    runs[k][i][c] = _bench(server, prompt_tokens, new_tokens, c, max(per_level, c), seed + k)
    return _result(model, config, runs, sizes, dtype, seed, prompt_tokens, new_tokens, per_level, out)


def _check(model, loop, loop_options, prompt_tokens, new_tokens, concurrencies, repeats, out):
    """Refuse, before any server starts, what the server benchmark cannot measure; the one
    checkpoint (from a list of one) and the concurrencies."""
    from loopeval.core.loop import check_source, resolve_loop

    _check_counts(prompt_tokens, new_tokens, repeats)
    sizes = _batch_sizes(concurrencies)
    if sizes == "auto":
        raise ValueError("--server needs explicit --batch-sizes (the client concurrencies, e.g. 1,4)")
    if isinstance(model, (list, tuple)):
        if len(model) != 1:
            raise ValueError("--server compares one --model with its own unlooped self (--loop)")
        model = model[0]
    check_source(str(model))
    if loop is None:
        raise ValueError("--server needs --loop SPEC: it serves the checkpoint unlooped and looped by it")
    if resolve_loop(str(model), None) is not None:
        raise ValueError(f"{model} carries its own loop (loop_config.json), so it cannot be served unlooped; "
                         "give its base checkpoint with --loop")
    resolve_loop(str(model), _loop_with_options(loop, loop_options))  # the spec against the model's layers
    if out is not None:
        _writable(out)
    return str(model), sizes


def _loop_flags(config) -> list[str]:
    """``loopeval serve``'s loop option flags for ``config``: those that differ from LoopConfig's defaults."""
    from loopeval.core.spec import LOOP_OPTIONS, LoopConfig

    default = LoopConfig(str(config.spec))
    return [a for name in LOOP_OPTIONS if getattr(config, name) != getattr(default, name)
            for a in (f"--{name.replace('_', '-')}", str(getattr(config, name)))]


def _bench(server, prompt_tokens: int, new_tokens: int, concurrency: int, prompts: int, seed: int) -> dict:
    """One run of vLLM's serving benchmark against ``server``: ``prompts`` random requests,
    at most ``concurrency`` in flight; its figures (:data:`FIGURES`)."""
    import asyncio

    from loopeval.engines.vllm_metadata import vllm_version_known

    with vllm_version_known():
        from vllm.benchmarks.serve import add_cli_args, main_async
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        args = parser.parse_args([
            "--backend", "vllm", "--base-url", server.url, "--model", server.model, "--dataset-name", "random",
            "--random-input-len", str(prompt_tokens), "--random-output-len", str(new_tokens),
            "--random-range-ratio", "0", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
            "--request-rate", "inf", "--temperature", "0", "--seed", str(seed), "--disable-tqdm",
            "--ignore-eos", "--num-warmups", "0"])
        with contextlib.redirect_stdout(io.StringIO()):  # its report: the result keeps the figures
            result = asyncio.run(main_async(args))
    if result["completed"] != prompts or result["total_output_tokens"] != prompts * new_tokens:
        raise RuntimeError(f"vllm bench serve on {server.url}: {result['completed']} of {prompts} requests "
                           f"completed, {result['total_output_tokens']} tokens, not {prompts * new_tokens}")
    return {name: float(result[name]) for name in FIGURES}


def _result(model, config, runs, sizes, dtype, seed, prompt_tokens, new_tokens, per_level, out) -> ServeCost:
    """The :class:`ServeCost` of the benchmark ``runs`` (``runs[repeat][server][concurrency]``)."""
    from transformers import AutoConfig

    from loopeval.core.cost import loop_cost
    from loopeval.engines.server import dtype_size
    from loopeval.engines.vllm_engine import engine_version
    from loopeval.engines.vllm_serving import device_type

    hf = AutoConfig.from_pretrained(str(model))
    size = dtype_size(dtype)
    models = []
    for i, spec in enumerate((None, config.spec)):
        cost = loop_cost(hf, spec, bytes_per_element=size)
        weights = _weight_bytes(hf, cost.bytes_per_element)
        series = lambda c, name: [r[i][c][name] for r in runs]  # noqa: E731
        models.append(ModelServing(
            name="unlooped" if spec is None else f"looped {spec}", loop=None if spec is None else str(spec),
            passes=cost.passes, generation_flops=cost.generation_flops(prompt_tokens, new_tokens),
            weight_bytes=weights, kv_bytes_per_token=cost.kv_bytes_per_token,
            state_bytes_per_sequence=cost.state_bytes_per_sequence,
            prefill_s=Spread.of(v / 1e3 for v in series(sizes[0], "median_ttft_ms")),
            latency_s=Spread.of(v / 1e3 for v in series(sizes[0], "median_tpot_ms")),
            throughput={c: Spread.of(series(c, "output_throughput")) for c in sizes}, max_batch=sizes[-1],
            peak_memory_bytes=weights + cost.kv_bytes(prompt_tokens + new_tokens), memory_growth_per_token=None))
    settings = {
        "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "batch_sizes": list(sizes),
        "batch_sizes_are": "client concurrencies (vllm bench serve --max-concurrency)",
        "prompts_per_level": per_level, "repeats": len(runs), "cache": "paged", "compile": False,
        "fixed_server_args": list(FIXED),
        "device": device_type(), "dtype": dtype or "auto", "seed": seed, "client": "vllm.benchmarks.serve, random dataset",
        "prefill": "median TTFT at the lowest concurrency", "latency": "median TPOT at the lowest concurrency",
        "memory": "weights + loop_cost's KV bytes per token x (prompt_tokens + new_tokens); not measured",
        "levels": [[{str(c): r[i][c] for c in sizes} for i in range(2)] for r in runs]}
    result = ServeCost(tuple(models), settings, engine=NAME, engine_version=engine_version())
    if out is not None:
        result.write(out)
    return result


def _weight_bytes(config, bytes_per_element: int) -> int:
    """The model's parameters and buffers at ``bytes_per_element`` (counted on the meta device)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return bytes_per_element * sum(t.numel() for t in [*model.parameters(), *model.buffers()])


def levels_text(result: ServeCost) -> str:
    """Every concurrency's medians over the repeats: TTFT, TPOT, ITL (ms) and tokens/s, per model,
    and the looped / unlooped ratio of each next to c."""
    import statistics

    from loopeval.common.text import table

    levels = result.settings["levels"]
    c = result.ratios()["multiplier"]
    rows = []
    for level in levels[0][0]:
        medians = [{name: statistics.median(r[i][level][name] for r in levels) for name in FIGURES} for i in (0, 1)]
        for i, m in enumerate(result.models):
            rows.append((level, m.name, *(f"{medians[i][name]:,.2f}" for name in FIGURES)))
        rows.append((level, f"ratio (c = {c:.3f})", *(f"x{medians[1][n] / medians[0][n]:.3f}" for n in FIGURES)))
    header = ("clients", "model", "TTFT ms", "TPOT ms", "ITL ms", "tokens/s")
    return f"per concurrency (medians over {len(levels)} repeats):\n" + table(header, rows, text_columns=2)
