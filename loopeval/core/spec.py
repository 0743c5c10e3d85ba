"""Loop specs and loop options, torch-free: ``LoopSpec``, ``LoopConfig`` and ``loop_config.json``.

A loop re-applies windows of consecutive decoder layers with shared weights; see
:mod:`loopeval.core.loop` for how it runs. This module holds what a loop *is*, so a study
file, a manifest or a trace can be validated without importing torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

OPERATORS = ("repeat", "damped")

DEFAULT_OPERATOR = "damped"
"""The loop operator wherever none is given (``place``, ``apply_loop``, ``--model looped``,
``serve-cost``, ``train``, studies). Paper A.1 defines two operators, repetition and the damped
update "F(x) = x + (g(x) - x)/K, g^(K)(x) = beta g(x) + (1 - beta) F^K(x)", and D.1 finds:
"Undamped repetition of the same seven layers cuts accuracy sharply (MATH-500 54.0% vs 76.3%),
so damping, not repetition, makes reuse of these layers safe." ``repeat`` is the named option."""

DEFAULT_BETA = 0.0
"""The damped operator's anchor beta when none is given: no anchor term, the output is
``F^K(x0)``. The paper states no single beta; its placement grid covers "every anchor"
(D.1), and ``place`` records the beta of each candidate, so a placed loop carries its own."""

MIX_SOURCES = ("window", "embedding")
"""What input mixing mixes into passes ``t >= 2``: the window's input, or the token embedding."""

KINDS = ("layer", "attn", "mlp")
"""What a call site executes: the whole decoder layer, only its attention block (the
token mixer: softmax attention or Gated DeltaNet), or only its MLP block."""

PASS_CHARGE = {"layer": 1, "attn": 0.5, "mlp": 0.5}
"""Layer passes charged per call site. A decoder layer is two residual blocks, so a
block pass is half a layer pass. With it the paper's searched Qwen3.5 span, "an
eight-layer window ... loops it twice, plus one MLP loop (K=3) at its first layer"
(``0:8x2+0:1x3/mlp``: 8 layer passes plus 2 MLP-block passes), charges the paper's
"32 -> 41 passes" (A.2). FLOPs and bytes are counted exactly in ``loopeval.core.cost``."""

MAX_PASSES = 64  # passes per layer that a spec may ask for
MAX_EXTRA_SITES = 4096  # extra call sites per token that a spec may add

_WINDOW = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*x\s*(\d+)\s*(?:/\s*([A-Za-z]+)\s*)?$")


def _count(x: float) -> int | float:
    """A pass count: an int when whole (every whole-layer spec), else a half-integer."""
    return int(x) if float(x).is_integer() else float(x)


@dataclass(frozen=True)
class Window:
    """Layers ``start..end-1`` (a Python slice) applied ``times`` times in total. Pass 1
    is the model's own pass; passes ``2..times`` re-apply the whole layers
    (``kind="layer"``), only their attention blocks (``"attn"``) or only their MLP
    blocks (``"mlp"``)."""

    start: int
    end: int
    times: int
    kind: str = "layer"

    @property
    def width(self) -> int:
        return self.end - self.start

    @property
    def extra_passes(self) -> int | float:
        """Layer passes this window adds per token (``PASS_CHARGE`` per call site)."""
        return _count(self.width * (self.times - 1) * PASS_CHARGE[self.kind])

    def __str__(self) -> str:
        suffix = "" if self.kind == "layer" else f"/{self.kind}"
        return f"{self.start}:{self.end}x{self.times}{suffix}"


@dataclass(frozen=True)
class CallSite:
    """One execution of a layer (``kind="layer"``) or of one of its blocks (``"attn"``,
    ``"mlp"``). ``slot`` is the cache slot it reads and writes; an MLP-only call site
    reads no cache and has ``slot=None``."""

    layer: int
    pass_index: int  # 1-based pass of the call site's window (1 outside windows)
    slot: int | None
    kind: str = "layer"


@dataclass(frozen=True)
class LoopSpec:
    """A set of windows, written ``"S:ExK"`` (whole layers), ``"S:ExK/mlp"`` (MLP blocks
    only) or ``"S:ExK/attn"`` (attention blocks only), joined by ``+``.

    ``LoopSpec.parse("8:16x2")`` runs layers 8..15 twice in total (m = 8 extra layer
    passes); ``"2:4x2+10:12x3"`` has two windows; ``"10:19x2/mlp"`` runs layers 10..18
    once and then their MLP blocks once more. Whole-layer windows must not overlap, nor
    may sub-layer windows; a sub-layer window may sit inside a whole-layer window, and
    then runs within its first pass: ``"0:8x2+0:1x3/mlp"`` runs layer 0, its MLP block
    twice more, layers 1..7, then layers 0..7 again. A ``LoopSpec`` is accepted wherever
    a spec string is; ``str(spec)`` is its canonical text, which parses back to it.
    """

    windows: tuple[Window, ...]

    @classmethod
    def parse(cls, spec: str | LoopSpec, *, max_passes: int = MAX_PASSES, max_extra_sites: int = MAX_EXTRA_SITES) -> LoopSpec:
        """Parse ``spec``; refuse, before building anything, a window run more than
        ``max_passes`` times or a loop adding more than ``max_extra_sites`` call sites
        (limits on work, not on the model: raise them for a deliberate huge loop)."""
        if isinstance(spec, LoopSpec):
            return spec
        if not isinstance(spec, str):
            raise ValueError(f"loop spec {spec!r}: expected a string such as '8:16x2', got {type(spec).__name__}")
        if not spec.strip():
            raise ValueError("loop spec '': empty; expected windows such as '8:16x2' or '2:4x2+10:12x3'")
        windows = []
        for part in spec.split("+"):
            match = _WINDOW.match(part)
            if match is None:
                raise ValueError(f"loop spec {spec!r}: cannot parse {part.strip()!r}; expected START:ENDxTIMES, "
                                 "e.g. 8:16x2, optionally with /attn or /mlp")
            start, end, times = (int(g) for g in match.groups()[:3])
            kind = (match.group(4) or "layer").lower()
            if kind not in KINDS[1:] and match.group(4) is not None:
                raise ValueError(f"loop spec {spec!r}: window {part.strip()!r} has kind {match.group(4)!r}; "
                                 "expected /attn or /mlp (no suffix: whole layers)")
            if end <= start:
                raise ValueError(f"loop spec {spec!r}: window {part.strip()!r} has end {end} <= start {start}")
            if times < 1:
                raise ValueError(f"loop spec {spec!r}: window {part.strip()!r} has {times} passes; K must be >= 1")
            if times > max_passes:
                raise ValueError(f"loop spec {spec!r}: window {part.strip()!r} runs {times} times; more than "
                                 f"{max_passes} passes per layer is refused (LoopSpec.parse(..., max_passes=...) to allow it)")
            windows.append(Window(start, end, times, kind))
        extra = sum((w.end - w.start) * (w.times - 1) for w in windows)
        if extra > max_extra_sites:
            raise ValueError(f"loop spec {spec!r}: adds {extra} call sites per token; more than {max_extra_sites} is "
                             "refused (LoopSpec.parse(..., max_extra_sites=...) to allow it)")
        windows.sort(key=lambda w: (w.start, KINDS.index(w.kind), w.end))
        for i, a in enumerate(windows):
            for b in windows[i + 1:]:
                if b.start >= a.end:
                    continue
                nested = (a.kind == "layer") != (b.kind == "layer") and a.kind == "layer" and b.end <= a.end
                if not nested:
                    what = "overlap" if (a.kind == "layer") == (b.kind == "layer") else "overlap without nesting"
                    raise ValueError(f"loop spec {spec!r}: windows {a} and {b} {what}; a sub-layer window may "
                                     "only lie inside a whole-layer window")
        return cls(tuple(windows))

    def __str__(self) -> str:
        return "+".join(str(w) for w in self.windows)

    @property
    def extra_passes(self) -> int | float:
        """m: layer passes added per token (``PASS_CHARGE`` per call site)."""
        return _count(sum(w.extra_passes for w in self.windows))

    @property
    def has_sub_layer(self) -> bool:
        return any(w.kind != "layer" for w in self.windows)

    def validate(self, num_layers: int) -> LoopSpec:
        """Raise ``ValueError`` if a window reaches past the model's last layer."""
        for w in self.windows:
            if w.end > num_layers:
                raise ValueError(
                    f"loop spec {str(self)!r}: window {w} reaches past the last layer "
                    f"(the model has {num_layers} layers, 0..{num_layers - 1})"
                )
        return self

    def call_sites(self, num_layers: int) -> list[CallSite]:
        """Every call site in execution order, with its cache slot: a window's passes
        ``2..K`` follow the first-pass call of its last layer (a nested sub-layer
        window's before its enclosing window's)."""
        self.validate(num_layers)
        sites, next_slot = [], num_layers
        for j in range(num_layers):
            sites.append(CallSite(j, 1, j))
            for w in self.windows_ending_at(j):
                for t in range(2, w.times + 1):
                    for i in range(w.start, w.end):
                        slot = None if w.kind == "mlp" else next_slot
                        next_slot += slot is not None
                        sites.append(CallSite(i, t, slot, w.kind))
        return sites

    def windows_ending_at(self, layer: int) -> list[Window]:
        """The windows whose last layer is ``layer``, in the order they run (nested first)."""
        return sorted((w for w in self.windows if w.end - 1 == layer), key=lambda w: w.kind == "layer")

    def schedule(self, num_layers: int) -> list[int]:
        """The layer index of every call site in execution order."""
        return [s.layer for s in self.call_sites(num_layers)]

    def at_depth(self, passes: int) -> LoopSpec:
        """This spec with every window run ``passes`` times."""
        return LoopSpec(tuple(dataclasses.replace(w, times=passes) for w in self.windows))


def charged_passes(num_layers: int, spec: LoopSpec | None) -> float:
    """The layer passes per token the paper charges a model of ``num_layers`` layers looped
    by ``spec`` (``None``: unlooped), N + m. A.2: "We charge the loop its layer passes,
    (N+m)/N, which matches the measured slowdown of memory-bound decoding." A sub-layer
    block pass is half a layer pass (:data:`PASS_CHARGE`), so the charge is a float. Every
    cost in loopeval (``loop_cost``, traces, studies, serving) is computed here."""
    return float(num_layers + (0 if spec is None else spec.extra_passes))


LOOP_CONFIG_NAME = "loop_config.json"
"""The file beside a checkpoint's weights that stores its loop (like PEFT's ``adapter_config.json``)."""


@dataclass(frozen=True)
class LoopConfig:
    """A loop: its spec and operator options. It validates itself on construction, so a
    ``LoopConfig`` that exists is well-formed; only the layer count is checked later
    (:meth:`validate`, :func:`loopeval.core.loop.resolve_loop`). ``spec`` may be given as
    a string. A trained mixing logit (recipe ``loop-convert``) is stored as a float.

    The fields after ``spec`` are the loop options (:data:`LOOP_OPTIONS`), defined here
    only: lm-eval's model args (``loop_<name>``), study keys (``<name>``), CLI flags
    (``--<name>``), ``loop_config.json`` and trace headers are derived from them.
    """

    spec: LoopSpec
    operator: str = field(default=DEFAULT_OPERATOR, metadata={
        "help": f"loop operator: {' or '.join(OPERATORS)} (default {DEFAULT_OPERATOR}, paper A.1 and D.1)",
        "choices": OPERATORS})
    beta: float = field(default=DEFAULT_BETA, metadata={
        "help": "anchor beta of the damped operator, in [0, 1] (default 0)", "type": float})
    mix: float | None = field(default=None, metadata={
        "help": "input-mixing logit a, w = sigmoid(a) (default: no mixing)", "type": float})
    mix_source: str = field(default="window", metadata={
        "help": "what input mixing mixes in: the window's input or the token embedding (default window)",
        "choices": MIX_SOURCES})

    def __post_init__(self):
        object.__setattr__(self, "spec", LoopSpec.parse(self.spec))
        if self.operator not in OPERATORS:
            raise ValueError(f"loop operator {self.operator!r}: unknown; choose one of {', '.join(OPERATORS)}")
        beta = _finite(self.beta, "loop beta", "a number in [0, 1]")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"loop beta {self.beta!r}: must lie in [0, 1]")
        if self.operator == "repeat" and beta != 0.0:
            raise ValueError(f"loop beta {self.beta!r}: only the 'damped' operator uses beta")
        object.__setattr__(self, "beta", beta)
        if self.mix is not None:
            object.__setattr__(self, "mix", _finite(self.mix, "loop mix", "a finite logit (w = sigmoid(mix))"))
        if self.mix_source not in MIX_SOURCES:
            raise ValueError(f"loop mix_source {self.mix_source!r}: unknown; choose one of {', '.join(MIX_SOURCES)}")
        if self.mix_source != "window" and self.mix is None:
            raise ValueError(f"loop mix_source {self.mix_source!r} given without mix (the mixing logit)")

    @classmethod
    def from_options(cls, loop: str | LoopSpec, **options) -> LoopConfig:
        """The loop ``loop`` with ``options`` (names from :data:`LOOP_OPTIONS`; ``None``
        means the default)."""
        unknown = sorted(set(options) - set(LOOP_OPTIONS))
        if unknown:
            raise ValueError(f"unknown loop option(s) {', '.join(unknown)}; the options are {', '.join(LOOP_OPTIONS)}")
        return cls(loop, **{k: v for k, v in options.items() if v is not None})

    def options(self) -> dict:
        """The options that differ from their defaults (``{}`` for a plain loop)."""
        return {f.name: getattr(self, f.name) for f in option_fields() if getattr(self, f.name) != f.default}

    def validate(self, num_layers: int) -> LoopConfig:
        """Raise ``ValueError`` if the spec reaches past the model's last layer."""
        self.spec.validate(num_layers)
        return self

    def exit_after(self, steps: int) -> LoopConfig:
        """The loop run for ``steps`` passes and read there (004's "fixed exit after k
        steps"): every window at ``K = steps``, options kept. ``steps`` must lie in
        ``1..K`` of every window."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"exit_after={steps!r}: must be an integer >= 1 (the number of loop steps to run)")
        short = [w for w in self.spec.windows if w.times < steps]
        if short:
            raise ValueError(f"exit_after={steps}: larger than the loop's step count; window {short[0]} of loop "
                             f"{self.spec} runs {short[0].times} times")
        return dataclasses.replace(self, spec=self.spec.at_depth(steps))

    def to_dict(self) -> dict:
        """The stored form: ``{"loop": spec, <every option>}``. ``mix_source`` is written
        only when it is not ``"window"``, so loops from before it existed are stored (and
        compared) as they were."""
        d = {"loop": str(self.spec), **{f.name: getattr(self, f.name) for f in option_fields()}}
        if self.mix_source == "window":
            del d["mix_source"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LoopConfig:
        """A stored loop. Every stored form names its operator; a missing option takes its default."""
        if not isinstance(d, dict) or "loop" not in d:
            raise ValueError(f"expected an object with a 'loop' spec, got {d!r}")
        options = {k: v for k, v in d.items() if k != "loop"}
        unknown = sorted(set(options) - set(LOOP_OPTIONS))
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}; a loop has loop and {', '.join(LOOP_OPTIONS)}")
        return cls(d["loop"], **options)

    def __str__(self) -> str:
        """The spec with its non-default options, e.g. ``6:8x2`` or ``6:8x2 (operator=repeat)``."""
        options = self.options()
        return str(self.spec) + (f" ({', '.join(f'{k}={v}' for k, v in options.items())})" if options else "")


def option_fields() -> tuple:
    """The dataclass fields of the loop options (every field of :class:`LoopConfig` but ``spec``)."""
    return tuple(f for f in fields(LoopConfig) if f.name != "spec")


LOOP_OPTIONS: tuple[str, ...] = tuple(f.name for f in option_fields())
"""The names of the loop options, in order: ``operator``, ``beta``, ``mix``, ``mix_source``."""


def _finite(value, what: str, expected: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} {value!r}: must be {expected}")
    return float(value)


def read_loop_config(path: str | Path) -> LoopConfig | None:
    """The loop stored with a local checkpoint folder, or ``None``."""
    file = Path(path) / LOOP_CONFIG_NAME
    if not file.is_file():
        return None
    try:
        return LoopConfig.from_dict(json.loads(file.read_text()))
    except (json.JSONDecodeError, ValueError) as exc:
        raise ValueError(f"{file}: not a valid loop configuration ({exc})") from None


