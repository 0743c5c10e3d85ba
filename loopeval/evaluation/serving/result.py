"""The serving-cost result: each model's figures, the candidate / baseline ratios and their checks.

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

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

FILE_NAME = "serve_cost.json"
FORMAT = 1

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
    peak_memory_bytes: int  # at batch 1: weights + peak tensor memory of the generation (a paged engine: + one row's KV)
    memory_growth_per_token: float | None  # measured, bytes per generated token at batch 1 (HF path only)
    engine_kv_bytes_per_token: int | None = None  # as an engine allocates its paged KV cache (engines only)

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
    engine: str = "hf"  # the serving backend's name
    engine_version: str | None = None  # the serving backend's: transformers' on the HF path, the engine's otherwise

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
        paged = any(m.engine_kv_bytes_per_token is not None for m in self.models)  # an engine's preallocated cache
        header = ("model", "loop", "passes", "prefill ms", "latency ms/tok", "[min, max]", "batch", "tokens/s",
                  "batch-1 MB" if paged else "peak MB", "KV B/tok",
                  f"{self.engine} KV B/tok" if paged else "measured B/tok")
        rows = [(m.name, m.loop or "-", f"{m.passes:g}", f"{1e3 * m.prefill_s.median:.2f}",
                 f"{1e3 * m.latency_s.median:.2f}", f"[{1e3 * m.latency_s.low:.2f}, {1e3 * m.latency_s.high:.2f}]",
                 str(m.max_batch), f"{m.max_throughput:,.1f}", f"{m.peak_memory_bytes / 2**20:,.1f}",
                 f"{m.kv_bytes_per_token:,}",
                 f"{m.engine_kv_bytes_per_token:,}" if paged else _bytes(m.memory_growth_per_token))
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


def _bytes(value: float | None) -> str:
    """A measured byte count, or ``-`` where the backend measures none."""
    return "-" if value is None else f"{value:,.0f}"


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

