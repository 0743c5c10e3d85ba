"""Serving cost: latency, throughput and memory of looped against unlooped decoding.

The paper checks its layer-pass charge against the clock (B.3, Table 10): "Latency is
the decode time per token at batch 1. We measure throughput at the largest batch that
fits in 80 GB, and memory as the peak at batch 1." :func:`serve_cost` measures the same
figures for any models, interleaved and side by side in one process, through HF
``generate`` (the path lm-eval's ``looped`` model decodes by), with a fixed-length
decode (``min_new_tokens = max_new_tokens``, so EOS never ends a row early and both
sides generate the same tokens):

* prefill: the time of a one-token generation (the prompt's forward and the first token);
* decode latency per token at batch 1, prefill excluded: ``(T(G) - T(1)) / (G - 1)`` of a
  ``G``-token and a one-token generation run back to back in each repeat;
* throughput: generated tokens per second of whole generations (prefill included) at
  each batch size; ``"auto"`` finds each model's own largest batch (below);
* peak memory at batch 1: the model's weights plus the peak of tensor memory allocated
  during a ``G``-token generation (``torch.cuda.max_memory_allocated`` on CUDA; on CPU
  the same count from the CPU allocator's events under ``torch.profiler``, since the
  process's peak RSS cannot be reset between measurements and would hold every model
  in the process);
* measured memory growth per token: the tensor memory a ``G``-token generation keeps
  (its cache) less a one-token generation's, over ``G - 1``, next to ``loop_cost``'s
  KV bytes per token. A static cache is preallocated to its full length, so it grows 0.

Timings synchronise CUDA before reading the clock. Times are medians over ``repeats``
with their min and max.

The same figures run on vLLM (:func:`loopeval.engines.vllm_serving.serve_cost`):
both models' ``LLM`` alive in one process and measured alternately, prefix caching off, eager.
vLLM preallocates its paged KV cache, so the peak above has no meaning there; memory is
the KV cache bytes per token as vLLM allocates them (its KV cache spec: over the attention
layers, the loop's call sites included, page bytes over block size), shown next to
``loop_cost``'s, and the memory at batch 1 is the weights plus that KV for one row of
``prompt_tokens + new_tokens``.

Each ratio comes with its spread: the repeats are interleaved (every repeat times each
model in turn), so repeat k gives one candidate / baseline ratio; the ratio shown
everywhere (headline, notes, JSON, report) is the median of those per-repeat ratios, and
their range shows how much the machine moved during the measurement.
:meth:`ServeCost.checks` marks latency, prefill and throughput ratios unreliable, with the
reason, when the median lies outside what c allows (a loop that adds layer passes cannot
decode or prefill faster than its unlooped base, nor slower than c times;
:data:`PLAUSIBLE_SLACK`) or when the per-repeat range is wider than :data:`NOISY_SPREAD`
of the median: most likely load by other processes on the machine; more repeats on an
idle machine are suggested.
"""

from __future__ import annotations

import copy
import json
import math
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

ENGINES = ("hf", "vllm")
"""What decodes: transformers' ``generate`` (the HF path) or vLLM (:mod:`loopeval.engines.vllm_serving`,
a floor above this one, which passes its engine object to :func:`serve_cost`)."""
CACHES = ("dynamic", "static")
"""Cache implementations: HF's default dynamic cache, or its preallocated ``StaticCache``."""

FILE_NAME = "serve_cost.json"
FORMAT = 1

AUTO_MAX_BATCH = 65536  # the doubling search's ceiling
PLAUSIBLE_SLACK = 0.05
"""A latency or prefill ratio is plausible between 1 and c, widened by the slack (``[1 − slack,
c (1 + slack)]`` for c >= 1), and a throughput ratio between their reciprocals: the layers'
work scales by c, the work outside them (sampling, the LM head, Python) stays, so a real
ratio lies between the two; the slack absorbs rounding."""
NOISY_SPREAD = 0.25
"""Per-repeat ratios whose range exceeds this share of their median are unreliable (noisy)."""
CHECKED = ("latency", "prefill", "throughput")
"""The timed ratios :meth:`ServeCost.checks` checks."""
STATISTIC = "median of the per-repeat candidate / baseline ratios (repeats interleaved)"


def plausible_range(name: str, c: float, *, same_batch: bool = True) -> tuple[float, float]:
    """What c allows for the timed ratio ``name`` (:data:`PLAUSIBLE_SLACK`). Throughput read
    at two different batches (``auto`` fitting fewer looped rows) has no lower bound."""
    low, high = min(1.0, c) * (1 - PLAUSIBLE_SLACK), max(1.0, c) * (1 + PLAUSIBLE_SLACK)
    if name == "throughput":
        return (1 / high if same_batch else 0.0), 1 / low
    return low, high
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


@dataclass(frozen=True)
class Spread:
    """A repeated measurement: the median, the smallest and largest value, and every sample."""

    median: float
    low: float
    high: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, values) -> Spread:
        values = tuple(float(v) for v in values)
        return cls(statistics.median(values), min(values), max(values), values)


@dataclass(frozen=True)
class ModelServing:
    """One model's serving figures. ``throughput`` maps a batch size to generated tokens/s;
    ``max_batch`` is the batch the headline throughput is read at (``auto``'s find, else
    the largest given). Bytes are bytes; times are seconds."""

    name: str
    loop: str | None
    passes: float  # layer passes per token (core.spec.charged_passes, the paper's charge)
    generation_flops: float  # forward FLOPs of one prompt_tokens + new_tokens generation, per row
    weight_bytes: int
    kv_bytes_per_token: int  # loop_cost, at the model's dtype
    state_bytes_per_sequence: int  # recurrent + convolution state (Gated DeltaNet call sites)
    prefill_s: Spread
    latency_s: Spread  # decode seconds per token at batch 1, prefill excluded
    throughput: dict[int, Spread]
    max_batch: int
    peak_memory_bytes: int  # at batch 1: weights + peak tensor memory of the generation (vLLM: + one row's KV)
    memory_growth_per_token: float | None  # measured, bytes per generated token at batch 1 (HF path only)
    engine_kv_bytes_per_token: int | None = None  # as vLLM allocates its paged KV cache (vLLM only)

    @property
    def max_throughput(self) -> float:
        return self.throughput[self.max_batch].median


@dataclass(frozen=True)
class RatioCheck:
    """One candidate / baseline ratio with its spread over repeats, the range c allows,
    and whether the measurement is reliable (``note`` says why not)."""

    name: str
    ratio: Spread  # per-repeat ratios
    allowed: tuple[float, float]
    reliable: bool
    note: str


@dataclass(frozen=True)
class ServeCost:
    """Serving figures of several models, the baseline first (the unlooped model), and the
    settings they were measured with. :meth:`ratios` divides each candidate by the baseline."""

    models: tuple[ModelServing, ...]
    settings: dict = field(default_factory=dict)
    engine: str = "hf"  # ENGINES
    engine_version: str | None = None  # transformers' version on the HF path, vLLM's on the engine

    @property
    def baseline(self) -> ModelServing:
        return self.models[0]

    def ratios(self, candidate: int = 1) -> dict[str, float]:
        """Candidate / baseline: latency, prefill, throughput (each at its own ``max_batch``;
        these three the :data:`STATISTIC`), peak memory, KV bytes per token, and the cost
        multipliers c (layer passes) and FLOPs."""
        a, b = self.baseline, self.models[candidate]
        timed = self.ratio_spreads(candidate)
        return {
            "multiplier": b.passes / a.passes,
            "flop_multiplier": b.generation_flops / a.generation_flops,
            **{name: timed[name].median for name in CHECKED},
            "memory": b.peak_memory_bytes / a.peak_memory_bytes,
            "kv_bytes_per_token": b.kv_bytes_per_token / a.kv_bytes_per_token if a.kv_bytes_per_token else math.nan,
        }

    def ratio_spreads(self, candidate: int = 1) -> dict[str, Spread]:
        """Candidate / baseline per repeat (the repeats are interleaved), for latency, prefill
        and throughput (each model at its own ``max_batch``)."""
        a, b = self.baseline, self.models[candidate]
        pairs = {"latency": (a.latency_s, b.latency_s), "prefill": (a.prefill_s, b.prefill_s),
                 "throughput": (a.throughput[a.max_batch], b.throughput[b.max_batch])}
        return {name: Spread.of([y / x for x, y in zip(sa.samples, sb.samples)]) for name, (sa, sb) in pairs.items()}

    def checks(self, candidate: int = 1) -> list[RatioCheck]:
        """Latency, prefill and throughput ratios: unreliable when the median of the
        per-repeat ratios lies outside what c allows (:func:`plausible_range`), or when
        their range exceeds :data:`NOISY_SPREAD` of that median; ``note`` says which."""
        c = self.ratios(candidate)["multiplier"]
        spreads = self.ratio_spreads(candidate)
        repeats = len(spreads["latency"].samples)
        more = f"rerun with more repeats (--repeats {max(2 * repeats, 10)}) on an idle machine"
        out = []
        for name in CHECKED:
            same = self.baseline.max_batch == self.models[candidate].max_batch
            r, (low, high) = spreads[name], plausible_range(name, c, same_batch=same)
            slower = r.median < low if name == "throughput" else r.median > high
            if not low <= r.median <= high:
                why = "slower than c allows" if slower else "faster than the unlooped model"
                note = (f"unreliable: {name} x{r.median:.3f} (per repeat {r.low:.3f} to {r.high:.3f}) says the looped "
                        f"model is {why} (c = {c:.3f} allows {low:.3f} to {high:.3f}); likely cause: load from other "
                        f"processes on the machine during the measurement; {more}")
            elif r.high - r.low > NOISY_SPREAD * r.median:
                note = (f"unreliable: {name} x{r.median:.3f} from per-repeat ratios {r.low:.3f} to {r.high:.3f}, a range "
                        f"over {NOISY_SPREAD:.0%} of the median: the machine's speed moved during the measurement; {more}")
            else:
                note = ""
            out.append(RatioCheck(name, r, (low, high), not note, note))
        return out

    def to_dict(self) -> dict:
        models = []
        for m in self.models:
            d = asdict(m)
            d["throughput"] = {str(k): asdict(v) for k, v in m.throughput.items()}
            models.append(d)
        return {"format": FORMAT, "engine": self.engine, "engine_version": self.engine_version,
                "settings": self.settings, "models": models,
                "ratios": [self.ratios(i) for i in range(1, len(self.models))],
                "ratio_spreads": [{k: asdict(v) for k, v in self.ratio_spreads(i).items()}
                                  for i in range(1, len(self.models))],
                "ratio_statistic": STATISTIC,
                "checks": [[{"name": c.name, "ratio": c.ratio.median, "allowed": list(c.allowed), "reliable": c.reliable,
                             "note": c.note} for c in self.checks(i)] for i in range(1, len(self.models))]}

    def write(self, out: str | Path) -> Path:
        """Write ``out/serve_cost.json`` and return its path."""
        path = Path(out) / FILE_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def from_dict(cls, d: dict) -> ServeCost:
        if d.get("format") != FORMAT:
            raise ValueError(f"unknown serve_cost format {d.get('format')!r} (this loopeval reads {FORMAT})")
        models = []
        for m in d["models"]:
            m = dict(m)
            for key in ("prefill_s", "latency_s"):
                m[key] = _spread(m[key])
            m["throughput"] = {int(k): _spread(v) for k, v in m["throughput"].items()}
            models.append(ModelServing(**m))
        settings = dict(d.get("settings") or {})
        # files written before the engine was recorded were measured on the HF path
        return cls(tuple(models), settings, engine=d.get("engine", "hf"),
                   engine_version=d.get("engine_version", (settings.get("versions") or {}).get("transformers")))

    def to_text(self) -> str:
        """The terminal table: one row per model, then each candidate's ratios next to c."""
        from loopeval.common.text import table

        s = self.settings
        vllm = self.engine == "vllm"
        header = ("model", "loop", "passes", "prefill ms", "latency ms/tok", "[min, max]", "batch", "tokens/s",
                  "batch-1 MB" if vllm else "peak MB", "KV B/tok", "vLLM KV B/tok" if vllm else "measured B/tok")
        rows = [(m.name, m.loop or "-", f"{m.passes:g}", f"{1e3 * m.prefill_s.median:.2f}",
                 f"{1e3 * m.latency_s.median:.2f}", f"[{1e3 * m.latency_s.low:.2f}, {1e3 * m.latency_s.high:.2f}]",
                 str(m.max_batch), f"{m.max_throughput:,.1f}", f"{m.peak_memory_bytes / 2**20:,.1f}",
                 f"{m.kv_bytes_per_token:,}",
                 f"{m.engine_kv_bytes_per_token:,}" if vllm else f"{m.memory_growth_per_token:,.0f}")
                for m in self.models]
        compiled = ", compiled" if s.get("compile") else ""
        lines = [f"{self.engine} {self.engine_version}, {s.get('device')}, {s.get('dtype')}, {s.get('prompt_tokens')} "
                 f"prompt + {s.get('new_tokens')} new tokens, {s.get('cache')} cache{compiled}, {s.get('repeats')} "
                 f"repeats (medians); batch sizes {s.get('batch_sizes')}", "", table(header, rows, text_columns=2),
                 "", f"ratios: the {STATISTIC}"]
        for i, m in enumerate(self.models[1:], 1):
            r = self.ratios(i)
            unreliable = {c.name for c in self.checks(i) if not c.reliable}
            shown = {name: f"{name} x{r[name]:.3f}{' UNRELIABLE' if name in unreliable else ''} "
                           f"[per repeat {x.low:.3f}, {x.high:.3f}]" for name, x in self.ratio_spreads(i).items()}
            lines += ["", f"{m.name} / {self.baseline.name}:  c = {r['multiplier']:.3f}  FLOPs x{r['flop_multiplier']:.3f}",
                      f"  {shown['latency']}   {shown['throughput']}   {shown['prefill']}",
                      f"  memory x{r['memory']:.3f}   KV/token x{r['kv_bytes_per_token']:.3f}"]
            lines += [f"  {c.note}" for c in self.checks(i) if c.note]
        return "\n".join(lines)


def _spread(d: dict) -> Spread:
    return Spread(d["median"], d["low"], d["high"], tuple(d["samples"]))


def read_serve_cost(path: str | Path) -> ServeCost:
    """Read ``DIR/serve_cost.json`` (or the file itself); a bad file raises ``ValueError``."""
    path = Path(path)
    file = path / FILE_NAME if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"{path}: no {FILE_NAME} (write one with loopeval serve-cost --out {path})")
    try:
        return ServeCost.from_dict(json.loads(file.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{file}: not a serve-cost result ({exc})") from None


# -- measuring -----------------------------------------------------------------------


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


def _check_engine(engine, sources, sizes, *, cache, compile, device) -> None:
    """Refuse, before any model loads, an ``engine`` that is neither ``None`` (the HF path) nor
    an engine object, and what the engine cannot measure (its :meth:`check`)."""
    if engine is None:
        return
    if isinstance(engine, str):
        if engine == "hf":
            return
        raise ValueError(f"engine {engine!r}: serve_cost takes engine=None for the HF path and an engine object "
                         "otherwise; for vLLM use loopeval.engines.vllm_serving.serve_cost (loopeval serve-cost "
                         "--engine vllm)")
    engine.check(sources, sizes, cache=cache, compile=compile, device=device)


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


class Clock:
    """Times generations of the models on the same seeded random prompt rows; a subclass
    says how to generate (:meth:`generate`) and count the tokens generated (:meth:`generated`)."""

    def __init__(self, device, vocab_size: int, prompt_tokens: int, seed: int):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.prompt_tokens = prompt_tokens
        self.generator = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.prompts: dict[int, object] = {}
        self.bar = None  # a tqdm bar counting generated tokens, set by serve_cost

    def planned(self, tokens: int) -> None:
        """Add generations of ``tokens`` generated tokens in all to the bar's total."""
        if self.bar is not None:
            self.bar.total += tokens
            self.bar.refresh()

    def prompt(self, batch: int):
        """The same random prompt rows for every model (special ids below 16 avoided)."""
        if batch not in self.prompts:
            ids = self.torch.randint(16, self.vocab_size, (batch, self.prompt_tokens), generator=self.generator)
            self.prompts[batch] = ids.to(self.device)
        return self.prompts[batch]

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def seconds(self, model, batch: int, new_tokens: int) -> float:
        self._sync()
        start = time.perf_counter()
        out = self.generate(model, batch, new_tokens)
        self._sync()
        elapsed = time.perf_counter() - start
        if (generated := self.generated(out)) != new_tokens:
            raise RuntimeError(f"generate returned {generated} tokens, not {new_tokens}")
        return elapsed


class _Meter(Clock):
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
    return None


def _auto_batch(meter: _Meter, model, new_tokens: int, *, cache_bytes_per_row: int) -> int:
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


def serve_cost(models, *, loop=None, prompt_tokens: int = 512, new_tokens: int = 256, batch_sizes="auto",
               repeats: int = 5, engine=None, compile: bool = False, cache: str = "dynamic",
               device: str | None = None, dtype: str | None = None, seed: int = 0,
               out: str | Path | None = None, progress: bool = True, **loop_options) -> ServeCost:
    """Measure the serving cost of ``models`` side by side (module docstring).

    ``models`` is one checkpoint (path, hub id or model), compared with ``loop`` or its
    own loop against its unlooped self (sharing its weights), or several, the baseline
    first, each with its own loop. The loop options (``operator``, ``beta``, ``mix``, ``mix_source``:
    :class:`loopeval.core.spec.LoopConfig`'s fields and defaults, the damped operator
    ``place`` searches with) go with ``loop``. The torch
    thread count comes from ``loopeval.common.threads.configure_threads`` and is recorded. ``batch_sizes`` is ``"auto"`` or a list of sizes; the
    headline throughput is read at ``auto``'s batch or the largest size given. ``dtype``
    (e.g. ``"bfloat16"``) is the load dtype of checkpoints (default: their own); a model
    object is measured as it is. ``device`` defaults to CUDA when present. Every
    input is checked before any model loads or runs. With ``out``, writes
    ``out/serve_cost.json``.

    ``engine`` is ``None`` for the HF path, or an engine object from a floor above this one
    (``name``, and ``check``, ``version``, ``load``, ``meter``, ``kv_bytes_per_token`` and
    ``settings`` as :class:`loopeval.engines.vllm_serving.VLLMServing` defines them); that one (through
    :func:`loopeval.engines.vllm_serving.serve_cost`) measures the same figures on vLLM:
    every model's ``LLM`` alive in this process, timed in turn as above, with **prefix
    caching off** (the repeats send the same prompt ids, so a prefix cache would skip their
    prefill), eager. vLLM preallocates its paged KV cache, so there is no per-generation peak:
    ``engine_kv_bytes_per_token`` is the KV cache bytes per token vLLM allocates (over its KV
    cache spec's attention layers, the loop's call sites included: page bytes over block
    size), next to ``loop_cost``'s ``kv_bytes_per_token``, and the memory at batch 1
    (``peak_memory_bytes``) is the weights plus that KV for one row of
    ``prompt_tokens + new_tokens``. It needs checkpoint folders and explicit ``batch_sizes``;
    ``cache``, ``compile`` and ``device`` set transformers' ``generate`` and are refused.
    """
    import torch
    import transformers

    from loopeval.core.cost import loop_cost
    from loopeval.core.loop import loop_config

    _check_counts(prompt_tokens, new_tokens, repeats)
    sizes = _batch_sizes(batch_sizes)
    sources = list(models) if isinstance(models, (list, tuple)) else [models]
    _check_engine(engine, sources, sizes, cache=cache, compile=compile, device=device)
    engine = None if engine == "hf" else engine
    if engine is None:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        options = generation_options(cache, compile, device=device)
        if compile:
            check_compile_backend(device)
    if out is not None:
        _writable(out)
    loop = _loop_with_options(loop, loop_options)
    _check_sources(sources, loop, prompt_tokens + new_tokens)
    from loopeval.common.threads import configure_threads

    threads = configure_threads()
    loaded = _load(sources, loop, dtype, device if engine is None else "cpu")
    names = [name for name, _, _ in loaded]
    loops = [loop_config(model) for _, model, _ in loaded]
    costs = [loop_cost(model, config.spec if config else None) for (_, model, _), config in zip(loaded, loops)]
    model_dtype = str(next(loaded[0][1].parameters()).dtype).replace("torch.", "")
    vocab = min(m.config.get_text_config(decoder=True).vocab_size for _, m, _ in loaded)
    # the weights at the dtype measured (vLLM loads the same; its CPU backend repacks linear layers outside
    # the module's parameters, so they are counted here)
    weights = [sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()]) for _, m, _ in loaded]
    if engine is not None:
        del loaded  # the engines hold their own weights
        paths = sources if len(sources) > 1 else sources * 2
        timed = [engine.load(path, loop=config, dtype=model_dtype, max_model_len=prompt_tokens + new_tokens, seed=seed)
                 for path, config in zip(paths, loops)]
        meter = engine.meter(vocab, prompt_tokens, seed)
    else:
        tokenizer = loaded[0][2]
        pad = next((v for v in (getattr(tokenizer, "pad_token_id", None), loaded[0][1].config.pad_token_id,
                                getattr(tokenizer, "eos_token_id", None)) if v is not None), 0)
        timed = [model for _, model, _ in loaded]
        meter = _Meter(device, pad, vocab, prompt_tokens, options, seed)

    from tqdm.auto import tqdm

    # the bar counts generated tokens: a generation's time grows with them, so the ETA holds
    per_model = None if sizes == "auto" else [list(sizes)] * len(timed)
    memory_runs = 1 + new_tokens if engine is None else 0  # the HF path weighs a batch-1 generation
    meter.bar = tqdm(desc="serve-cost", unit="token", disable=not progress,
                     total=len(timed) * ((repeats + 1) * (1 + new_tokens) + memory_runs  # warm-up, repeats
                                         + sum((1 + repeats) * b * new_tokens for b in (per_model or [[]])[0])))
    for model in timed:  # warm-up (and, compiled, compilation) of every shape timed below
        meter.seconds(model, 1, 1)
        meter.seconds(model, 1, new_tokens)
    prefill = [[] for _ in timed]
    latency = [[] for _ in timed]
    for _ in range(repeats):
        for i, model in enumerate(timed):
            one = meter.seconds(model, 1, 1)
            full = meter.seconds(model, 1, new_tokens)
            prefill[i].append(one)
            latency[i].append((full - one) / (new_tokens - 1))
    if engine is not None:
        engine_kv = [engine.kv_bytes_per_token(llm) for llm in timed]
        memory = [(kv * (prompt_tokens + new_tokens), None) for kv in engine_kv]
    else:
        engine_kv = [None] * len(timed)
        memory = []
        for model in timed:
            peak, kept = meter.memory(model, new_tokens)
            _, kept_one = meter.memory(model, 1)
            memory.append((peak, (kept - kept_one) / (new_tokens - 1)))
    if sizes == "auto":
        chosen = []
        for model, cost in zip(timed, costs):
            row = cost.kv_bytes(prompt_tokens + new_tokens) + cost.state_bytes_per_sequence
            chosen.append(_auto_batch(meter, model, new_tokens, cache_bytes_per_row=row))
        per_model = [sorted({1, b}) for b in chosen]
        meter.planned(sum((1 + repeats) * b * new_tokens for batches in per_model for b in batches))
    else:
        chosen = [sizes[-1]] * len(timed)
    rates = [{b: [] for b in batches} for batches in per_model]
    for batch in sorted({b for batches in per_model for b in batches}):
        for i, model in enumerate(timed):
            if batch in rates[i]:
                meter.seconds(model, batch, new_tokens)  # warm-up of this shape
        for _ in range(repeats):
            for i, model in enumerate(timed):
                if batch in rates[i]:
                    rates[i][batch].append(batch * new_tokens / meter.seconds(model, batch, new_tokens))
    meter.bar.close()
    meter.bar = None
    results = []
    for i, (name, config, cost) in enumerate(zip(names, loops, costs)):
        results.append(ModelServing(
            name=name, loop=str(config.spec) if config else None, passes=cost.passes,
            generation_flops=cost.generation_flops(prompt_tokens, new_tokens), weight_bytes=weights[i],
            kv_bytes_per_token=cost.kv_bytes_per_token, state_bytes_per_sequence=cost.state_bytes_per_sequence,
            prefill_s=Spread.of(prefill[i]), latency_s=Spread.of(latency[i]),
            throughput={b: Spread.of(v) for b, v in rates[i].items()}, max_batch=chosen[i],
            peak_memory_bytes=weights[i] + memory[i][0], memory_growth_per_token=memory[i][1],
            engine_kv_bytes_per_token=engine_kv[i],
        ))
    if engine is not None:
        version, where = engine.version(), engine.settings(timed[0])
    else:
        version = transformers.__version__
        where = {"cache": cache, "compile": compile, "device": str(device),
                 "memory": "torch.cuda.max_memory_allocated" if meter.cuda else "torch.profiler CPU allocations"}
    settings = {
        "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
        "batch_sizes": sizes if sizes == "auto" else list(sizes), "repeats": repeats, **where,
        "dtype": model_dtype, "seed": seed,
        "threads": torch.get_num_threads(), "threads_source": threads.source, "threads_reason": threads.reason,
        "gpu": torch.cuda.get_device_name(where["device"]) if where["device"].startswith("cuda") else None,
        "cpu": platform.processor() or platform.machine(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    result = ServeCost(tuple(results), settings, engine=engine.name if engine is not None else "hf",
                       engine_version=version)
    if out is not None:
        result.write(out)
    return result
