"""Serving cost on transformers' ``generate``: the HF serving backend of
:func:`loopeval.evaluation.serving.measure.serve_cost`.

A fixed-length decode (``min_new_tokens = max_new_tokens``, so EOS never ends a row early
and both sides generate the same tokens) on the models loaded in this process. Peak memory
at batch 1 is the model's weights plus the peak of tensor memory allocated during a
``G``-token generation (``torch.cuda.max_memory_allocated`` on CUDA; on CPU the same count
from the CPU allocator's events under ``torch.profiler``, since the process's peak RSS
cannot be reset between measurements and would hold every model in the process); the
measured memory growth per token is the tensor memory a ``G``-token generation keeps (its
cache) less a one-token generation's, over ``G - 1``, next to ``loop_cost``'s KV bytes per
token (a static cache is preallocated to its full length, so it grows 0). ``"auto"``
batch sizes find each model's own largest batch (:func:`auto_batch`).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

from loopeval.evaluation.serving.clock import Clock

CACHES = ("dynamic", "static")
"""Cache implementations: HF's default dynamic cache, or its preallocated ``StaticCache``."""

AUTO_MAX_BATCH = 65536  # the doubling search's ceiling
CPU_AUTO_GAIN = 1.05  # on CPU, auto doubles while throughput rises by at least 5%
CPU_AUTO_MEMORY_SHARE = 0.5  # ... and the estimated cache fits in half the available memory


def generation_options(cache: str = "dynamic", compile: bool = False, *, device="cpu") -> dict:
    """The ``generate()`` keywords for a cache implementation and a compiled decode step.

    transformers compiles the decode step only with a static cache, and on CUDA it does
    so by default; ``compile=False`` therefore sets ``disable_compile`` so that the
    option means what it says, and ``compile=True`` requires ``cache="static"``. Compiled
    decoding uses inductor (``reduce-overhead``, CUDA graphs, on CUDA; ``default`` elsewhere).
    """
    if cache not in CACHES:
        raise ValueError(f"cache {cache!r}: choose one of {', '.join(CACHES)}")
    if compile and cache != "static":
        raise ValueError("compile needs the static cache (--cache static, cache_implementation=static): "
                         "transformers compiles the decode step only with it; add it, or drop compile")
    options = {"disable_compile": not compile}
    if cache == "static":
        options["cache_implementation"] = "static"
    if compile:
        from transformers import CompileConfig

        config = CompileConfig(mode="reduce-overhead" if str(device).startswith("cuda") else "default")
        config._compile_all_devices = True  # transformers compiles only on accelerators unless told
        options["compile_config"] = config
    return options


def check_compile_backend(device="cpu") -> None:
    """Raise ``ValueError`` unless ``torch.compile`` (inductor) builds and runs a kernel on ``device``."""
    import torch

    try:
        torch.compile(lambda x: x * 2 + 1, backend="inductor")(torch.ones(4, device=device))
    except Exception as exc:  # a missing compiler, triton or a broken install: all say the same to the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"--compile: torch.compile (inductor) cannot build a kernel on {device} ({first[:300]}); "
                         "drop --compile, or install a C++ compiler (CPU) or triton (CUDA)") from None



class HFServing:
    """transformers' ``generate`` as a serving backend (:func:`loopeval.evaluation.serving.measure.serve_cost`'s
    default): the models measured where they were loaded, on ``device`` (CUDA when present),
    with a dynamic or static cache, optionally compiled."""

    name = "hf"

    def check(self, sources, sizes, *, cache: str, compile: bool, device: str | None) -> None:
        """Refuse, before any model loads, a cache or compile setting ``generate`` cannot take."""
        import torch

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.cache, self.compile = cache, compile
        self.options = generation_options(cache, compile, device=self.device)
        if compile:
            check_compile_backend(self.device)

    @property
    def load_device(self) -> str:
        return self.device

    def version(self) -> str:
        import transformers

        return transformers.__version__

    def load(self, sources, loaded, loops, *, dtype: str, max_model_len: int, seed: int) -> list:
        """The models to time: those loaded, as they are."""
        return [model for _, model, _ in loaded]

    def meter(self, loaded, vocab_size: int, prompt_tokens: int, seed: int) -> HFMeter:
        tokenizer, config = loaded[0][2], loaded[0][1].config
        pad = next((v for v in (getattr(tokenizer, "pad_token_id", None), config.pad_token_id,
                                getattr(tokenizer, "eos_token_id", None)) if v is not None), 0)
        return HFMeter(self.device, pad, vocab_size, prompt_tokens, self.options, seed)

    def memory_runs(self, new_tokens: int) -> int:
        """Generated tokens :meth:`memory` costs per model (for the progress bar)."""
        return 1 + new_tokens

    def memory(self, meter: HFMeter, model, *, prompt_tokens: int, new_tokens: int) -> tuple[int, float, None]:
        """(peak tensor bytes of a batch-1 generation, measured growth per token, no engine KV)."""
        peak, kept = meter.memory(model, new_tokens)
        _, kept_one = meter.memory(model, 1)
        return peak, (kept - kept_one) / (new_tokens - 1), None

    def auto_batch(self, meter: HFMeter, model, new_tokens: int, *, cache_bytes_per_row: int) -> int:
        return auto_batch(meter, model, new_tokens, cache_bytes_per_row=cache_bytes_per_row)

    def settings(self, timed, meter: HFMeter) -> dict:
        """What the JSON's settings record of the backend."""
        return {"cache": self.cache, "compile": self.compile, "device": str(self.device),
                "memory": "torch.cuda.max_memory_allocated" if meter.cuda else "torch.profiler CPU allocations"}


class HFMeter(Clock):
    """Times and weighs ``generate`` calls of the models on one device."""

    def __init__(self, device, pad_token_id: int, vocab_size: int, prompt_tokens: int, options: dict, seed: int):
        super().__init__(device, vocab_size, prompt_tokens, seed)
        self.pad = pad_token_id
        self.options = options

    def generate(self, model, batch: int, new_tokens: int, **extra):
        ids = self.prompt(batch)
        with self.torch.no_grad():
            out = model.generate(ids, attention_mask=self.torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=self.pad,
                                 **self.options, **extra)
        if self.bar is not None:
            self.bar.update(batch * new_tokens)
        return out

    def generated(self, out) -> int:
        return out.shape[1] - self.prompt_tokens

    def fits(self, model, batch: int, new_tokens: int) -> bool:
        self.planned(batch * new_tokens)  # the search's length is not known in advance
        try:
            self.seconds(model, batch, new_tokens)
            return True
        except self.torch.cuda.OutOfMemoryError:
            self.torch.cuda.empty_cache()
            return False

    def memory(self, model, new_tokens: int) -> tuple[int, int]:
        """(peak, kept) tensor bytes allocated by a batch-1 generation above what was
        allocated before it; ``kept`` is what its returned cache still holds."""
        torch = self.torch
        if self.cuda:
            self._sync()
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            out = self.generate(model, 1, new_tokens, return_dict_in_generate=True)
            self._sync()
            peak = torch.cuda.max_memory_allocated(self.device) - before
            kept = torch.cuda.memory_allocated(self.device) - before
            del out
            return peak, kept
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _quiet_stderr():  # Kineto prints "profiler_start" to the C-level stderr, uncontrollably
            prof.start()
        try:
            out = self.generate(model, 1, new_tokens, return_dict_in_generate=True)
        finally:
            with _quiet_stderr():
                prof.stop()
        del out
        level = peak = 0
        for event in sorted(prof.events(), key=lambda e: e.time_range.start):
            level += event.self_cpu_memory_usage  # allocations inside ops, frees as [memory] events
            peak = max(peak, level)
        return peak, level


@contextmanager
def _quiet_stderr():
    """Send file descriptor 2 to /dev/null inside the block (C++ logging that Python cannot
    silence); Python's ``sys.stderr`` is flushed first and restored after."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _available_memory() -> int | None:
    """The memory the kernel reports available (Linux), or ``None`` where it does not: then
    the CPU ``auto`` search stops on throughput alone."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def auto_batch(meter: HFMeter, model, new_tokens: int, *, cache_bytes_per_row: int) -> int:
    """The batch ``auto`` measures at. On CUDA: the largest that fits, by doubling from 1 until
    out-of-memory and then bisecting. On CPU, where running out of memory kills the process
    instead of raising, doubling goes on while one generation's throughput rises by at least
    ``CPU_AUTO_GAIN`` and the estimated cache stays within ``CPU_AUTO_MEMORY_SHARE`` of the
    available memory; the batch of the best throughput seen is returned."""
    if meter.cuda:
        ok, bad = 0, 1
        while meter.fits(model, bad, new_tokens):
            ok, bad = bad, bad * 2
            if bad > AUTO_MAX_BATCH:
                return ok
        if ok == 0:
            raise ValueError(f"batch 1 does not fit on {meter.device} ({new_tokens} new tokens)")
        while bad - ok > 1:
            mid = (ok + bad) // 2
            ok, bad = (mid, bad) if meter.fits(model, mid, new_tokens) else (ok, mid)
        return ok
    available = _available_memory()
    best, best_rate, batch = 1, 0.0, 1
    while batch <= AUTO_MAX_BATCH:
        if available is not None and batch * cache_bytes_per_row > CPU_AUTO_MEMORY_SHARE * available:
            break
        meter.planned(batch * new_tokens)  # as in fits()
        rate = batch * new_tokens / meter.seconds(model, batch, new_tokens)
        if best_rate and rate < CPU_AUTO_GAIN * best_rate:
            break
        best, best_rate, batch = batch, rate, batch * 2
    return best


