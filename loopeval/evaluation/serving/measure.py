"""The serving-cost measurement protocol, the same for every serving backend.

:func:`serve_cost` measures, for any models, interleaved and side by side in one process,
through a serving backend (:class:`loopeval.evaluation.serving.hf.HFServing` by default),
each model generating exactly the same number of tokens on the same seeded random prompts:

* prefill: the time of a one-token generation (the prompt's forward and the first token);
* decode latency per token at batch 1, prefill excluded: ``(T(G) - T(1)) / (G - 1)`` of a
  ``G``-token and a one-token generation run back to back in each repeat;
* throughput: generated tokens per second of whole generations (prefill included) at
  each batch size;
* memory at batch 1 and its growth per token, as the backend weighs them
  (:meth:`HFServing.memory <loopeval.evaluation.serving.hf.HFServing.memory>`).

Timings synchronise CUDA before reading the clock. Times are medians over ``repeats``
with their min and max; ratios are per repeat (:mod:`loopeval.evaluation.serving.result`).

A serving backend is an object with ``name``, ``load_device`` (where the models loaded
here for their cost and weights go) and the methods :class:`HFServing
<loopeval.evaluation.serving.hf.HFServing>` defines: ``check`` (its refusals, before any
model loads), ``version``, ``load`` (the models it times), ``meter`` (a :class:`~loopeval.evaluation.serving.clock.Clock`),
``memory_runs``, ``memory``, ``auto_batch`` (needed only where ``check`` lets ``"auto"``
batch sizes through) and ``settings`` (what the JSON records of it).
"""

from __future__ import annotations

import copy
import platform
from pathlib import Path

from loopeval.evaluation.serving.clock import Clock
from loopeval.evaluation.serving.hf import HFServing
from loopeval.evaluation.serving.result import ModelServing, ServeCost, Spread

def _batch_sizes(value) -> tuple[int, ...] | str:
    if value == "auto":
        return "auto"
    if isinstance(value, int):
        value = (value,)
    sizes = tuple(value)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"batch sizes {value!r}: expected 'auto' or positive integers such as 1,8,64 "
                         "(a batch size of 0 generates nothing)")
    return tuple(sorted(set(sizes)))



def _check_counts(prompt_tokens, new_tokens, repeats) -> None:
    for name, value, least in (("prompt_tokens", prompt_tokens, 1), ("new_tokens", new_tokens, 2),
                               ("repeats", repeats, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            why = " (latency excludes prefill, so it needs a second token)" if name == "new_tokens" else ""
            raise ValueError(f"{name} {value!r}: must be an integer >= {least}{why}")


def _writable(out) -> None:
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot create the folder ({exc.strerror or exc})") from None


def _check_sources(sources, loop, positions: int) -> None:
    """Refuse, before any weights load, a loop with several models, a generation longer
    than a model's maximum position and models with different tokenizers."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from loopeval.core.loop import check_source, resolve_loop

    if not sources:
        raise ValueError("serve_cost: no model given")
    if loop is not None and len(sources) != 1:
        raise ValueError("--loop compares one model with its own unlooped self; with several --model, "
                         "each model brings its own loop (loop_config.json)")
    vocabs = []
    for s in sources:
        if isinstance(s, torch.nn.Module):
            config, name, vocab = s.config, type(s).__name__, None
        else:
            check_source(str(s))
            config, name = AutoConfig.from_pretrained(s), str(s)
            try:
                vocab = AutoTokenizer.from_pretrained(s).get_vocab()
            except (OSError, ValueError):
                vocab = None
        if len(sources) == 1 and resolve_loop(s if isinstance(s, torch.nn.Module) else str(s), loop) is None:
            raise ValueError(f"{name} has no loop: give --loop SPEC to compare it with its unlooped self, or a "
                             "second --model")
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        limit = getattr(text, "max_position_embeddings", None)
        if limit is not None and positions > limit:
            raise ValueError(f"--prompt-tokens + --new-tokens = {positions} positions: more than {name}'s maximum "
                             f"position {limit} (max_position_embeddings); lower --new-tokens or --prompt-tokens")
        vocabs.append((name, vocab))
    for name, vocab in vocabs[1:]:
        if vocab != vocabs[0][1]:
            raise ValueError(f"{name} and {vocabs[0][0]} have different tokenizers; serving costs are compared "
                             "on the same token stream, so give models that share one tokenizer")


def _loop_with_options(loop, options: dict):
    """``loop`` as a ``LoopConfig`` with its loop options; the options need a loop."""
    from loopeval.core.spec import LoopConfig

    given = [k for k, v in options.items() if v is not None]
    if loop is None:
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} given without --loop (a checkpoint's own loop keeps "
                             "its operator)")
        return None
    if isinstance(loop, LoopConfig):
        if given:
            raise ValueError(f"{', '.join(given)} given beside a whole LoopConfig; put them inside it")
        return loop
    return LoopConfig.from_options(loop, **options)


def _load(sources, loop, dtype, device):
    """``[(name, model, tokenizer)]``, the baseline first; one source gives its unlooped
    self and its looped self, the two sharing the weights."""
    import torch

    from loopeval.core.checkpoint import load_model
    from loopeval.core.loop import apply_loop, loop_config, remove_loop, resolve_loop

    loaded = []
    for s in sources:
        if isinstance(s, torch.nn.Module):
            model, tok, name = s, None, type(s).__name__
        else:
            model, tok = load_model(s, dtype=getattr(torch, dtype) if dtype else "auto")
            name = str(s)
        loaded.append((name, model.to(device).eval(), tok))
    if len(sources) > 1:
        return loaded
    _, model, tok = loaded[0]
    wanted = resolve_loop(model, loop)
    own = loop_config(model) is not None
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    if own:  # copy it unlooped: hooks do not survive a copy
        remove_loop(model)
    try:
        twin = copy.deepcopy(model, memo=shared)  # the same weights
    finally:
        if own:
            apply_loop(model, wanted)
    base, looped = (twin, model) if own else (model, apply_loop(twin, wanted))
    return [("unlooped", base, tok), (f"looped {wanted.spec}", looped, tok)]




def _check_backend(engine, sources, sizes, *, cache, compile, device):
    """The serving backend: ``engine``, or transformers' ``generate`` for ``None``; its refusals made
    before any model loads (:meth:`check`)."""
    if engine is None or engine == "hf":
        engine = HFServing()
    elif isinstance(engine, str):
        raise ValueError(f"engine {engine!r}: serve_cost takes a serving backend object (None: transformers' "
                         "generate); loopeval serve-cost --engine NAME picks an engine's")
    engine.check(sources, sizes, cache=cache, compile=compile, device=device)
    return engine


def serve_cost(models, *, loop=None, prompt_tokens: int = 512, new_tokens: int = 256, batch_sizes="auto",
               repeats: int = 5, engine=None, compile: bool = False, cache: str = "dynamic",
               device: str | None = None, dtype: str | None = None, seed: int = 0,
               out: str | Path | None = None, progress: bool = True, **loop_options) -> ServeCost:
    """Measure the serving cost of ``models`` side by side (module docstring).

    ``models`` is one checkpoint (path, hub id or model), compared with ``loop`` or its
    own loop against its unlooped self (sharing its weights), or several, the baseline
    first, each with its own loop. The loop options (``operator``, ``beta``, ``mix``,
    ``mix_source``: :class:`loopeval.core.spec.LoopConfig`'s fields and defaults, the damped
    operator ``place`` searches with) go with ``loop``. The torch thread count comes from
    ``loopeval.common.threads.configure_threads`` and is recorded. ``batch_sizes`` is
    ``"auto"`` or a list of sizes; the headline throughput is read at ``auto``'s batch or
    the largest size given. ``dtype`` (e.g. ``"bfloat16"``) is the load dtype of
    checkpoints (default: their own); a model object is measured as it is. ``engine`` is
    the serving backend (module docstring; ``None``: transformers' ``generate``, which
    takes ``cache``, ``compile`` and ``device``, CUDA by default when present). Every input
    is checked before any model loads or runs. With ``out``, writes ``out/serve_cost.json``.
    """
    from loopeval.common.threads import configure_threads
    from loopeval.core.cost import loop_cost
    from loopeval.core.loop import loop_config

    _check_counts(prompt_tokens, new_tokens, repeats)
    sizes = _batch_sizes(batch_sizes)
    sources = list(models) if isinstance(models, (list, tuple)) else [models]
    engine = _check_backend(engine, sources, sizes, cache=cache, compile=compile, device=device)
    if out is not None:
        _writable(out)
    loop = _loop_with_options(loop, loop_options)
    _check_sources(sources, loop, prompt_tokens + new_tokens)
    threads = configure_threads()
    loaded = _load(sources, loop, dtype, engine.load_device)
    names = [name for name, _, _ in loaded]
    loops = [loop_config(model) for _, model, _ in loaded]
    costs = [loop_cost(model, config.spec if config else None) for (_, model, _), config in zip(loaded, loops)]
    model_dtype = str(next(loaded[0][1].parameters()).dtype).replace("torch.", "")
    vocab = min(m.config.get_text_config(decoder=True).vocab_size for _, m, _ in loaded)
    # the weights at the dtype measured (an engine loads the same; vLLM's CPU backend repacks linear
    # layers outside the module's parameters, so they are counted here)
    weights = [sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()]) for _, m, _ in loaded]
    meter = engine.meter(loaded, vocab, prompt_tokens, seed)
    timed = engine.load(sources, loaded, loops, dtype=model_dtype, max_model_len=prompt_tokens + new_tokens, seed=seed)
    del loaded  # what an engine loaded itself holds its own weights

    from tqdm.auto import tqdm

    # the bar counts generated tokens: a generation's time grows with them, so the ETA holds
    per_model = None if sizes == "auto" else [list(sizes)] * len(timed)
    meter.bar = tqdm(desc="serve-cost", unit="token", disable=not progress,
                     total=len(timed) * ((repeats + 1) * (1 + new_tokens) + engine.memory_runs(new_tokens)
                                         + sum((1 + repeats) * b * new_tokens for b in (per_model or [[]])[0])))
    prefill, latency = _batch_one(meter, timed, new_tokens, repeats)
    memory = [engine.memory(meter, model, prompt_tokens=prompt_tokens, new_tokens=new_tokens) for model in timed]
    if sizes == "auto":
        chosen = []
        for model, cost in zip(timed, costs):
            row = cost.kv_bytes(prompt_tokens + new_tokens) + cost.state_bytes_per_sequence
            chosen.append(engine.auto_batch(meter, model, new_tokens, cache_bytes_per_row=row))
        per_model = [sorted({1, b}) for b in chosen]
        meter.planned(sum((1 + repeats) * b * new_tokens for batches in per_model for b in batches))
    else:
        chosen = [sizes[-1]] * len(timed)
    rates = _throughput(meter, timed, per_model, new_tokens, repeats)
    meter.bar.close()
    meter.bar = None
    results = [_model_row(*row, prompt_tokens=prompt_tokens, new_tokens=new_tokens)
               for row in zip(names, loops, costs, weights, memory, prefill, latency, rates, chosen)]
    where = engine.settings(timed, meter)
    settings = {
        "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
        "batch_sizes": sizes if sizes == "auto" else list(sizes), "repeats": repeats, **where,
        "dtype": model_dtype, "seed": seed, **_machine(threads, where["device"]),
    }
    result = ServeCost(tuple(results), settings, engine=engine.name, engine_version=engine.version())
    if out is not None:
        result.write(out)
    return result


def _model_row(name, config, cost, weight_bytes, memory, prefill, latency, rates, chosen, *, prompt_tokens: int,
               new_tokens: int) -> ModelServing:
    """One model's :class:`ModelServing` from its measurements (``memory``: the engine's peak,
    growth per token and KV bytes per token)."""
    peak, growth, engine_kv = memory
    return ModelServing(
        name=name, loop=str(config.spec) if config else None, passes=cost.passes,
        generation_flops=cost.generation_flops(prompt_tokens, new_tokens), weight_bytes=weight_bytes,
        kv_bytes_per_token=cost.kv_bytes_per_token, state_bytes_per_sequence=cost.state_bytes_per_sequence,
        prefill_s=Spread.of(prefill), latency_s=Spread.of(latency),
        throughput={b: Spread.of(v) for b, v in rates.items()}, max_batch=chosen,
        peak_memory_bytes=weight_bytes + peak, memory_growth_per_token=growth, engine_kv_bytes_per_token=engine_kv,
    )

def _batch_one(meter: Clock, timed: list, new_tokens: int, repeats: int) -> tuple[list, list]:
    """Per model, each repeat's prefill seconds and decode seconds per token at batch 1 (a one-token
    and a ``new_tokens`` generation back to back), the models interleaved, after a warm-up (and,
    compiled, the compilation) of both shapes."""
    for model in timed:
        meter.seconds(model, 1, 1)
        meter.seconds(model, 1, new_tokens)
    prefill, latency = [[] for _ in timed], [[] for _ in timed]
    for _ in range(repeats):
        for i, model in enumerate(timed):
            one = meter.seconds(model, 1, 1)
            full = meter.seconds(model, 1, new_tokens)
            prefill[i].append(one)
            latency[i].append((full - one) / (new_tokens - 1))
    return prefill, latency


def _machine(threads, device: str) -> dict:
    """What the JSON's settings record of the machine and the libraries."""
    import torch
    import transformers

    return {"threads": torch.get_num_threads(), "threads_source": threads.source, "threads_reason": threads.reason,
            "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda") else None,
            "cpu": platform.processor() or platform.machine(),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}


def _throughput(meter: Clock, timed: list, per_model: list[list[int]], new_tokens: int, repeats: int) -> list[dict]:
    """Per model, generated tokens per second of each repeat at each of its batch sizes, the
    models interleaved within each repeat (after one warm-up per shape)."""
    rates = [{b: [] for b in batches} for batches in per_model]
    for batch in sorted({b for batches in per_model for b in batches}):
        for i, model in enumerate(timed):
            if batch in rates[i]:
                meter.seconds(model, batch, new_tokens)  # warm-up of this shape
        for _ in range(repeats):
            for i, model in enumerate(timed):
                if batch in rates[i]:
                    rates[i][batch].append(batch * new_tokens / meter.seconds(model, batch, new_tokens))
    return rates
