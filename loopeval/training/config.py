"""``TrainConfig``: how a model is trained, recipe included. Twins share all of it.

A recipe is data: its name (``recipe``) and its fields, recorded in the manifest. The
fields of one recipe may not be set under another (a ``ValueError`` names them), and
``lr`` and ``min_lr_ratio`` default per recipe (:data:`RECIPE_DEFAULTS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from loopeval.training.exit_monitor import COLLAPSE_PATIENCE, COLLAPSE_THRESHOLD
from loopeval.training.manifest import RECIPES

DTYPES = ("float32", "bfloat16", "float16")

RECIPE_DEFAULTS = {
    "full": {"lr": 1e-5, "min_lr_ratio": 0.1},
    "convert": {"lr": 1e-4, "min_lr_ratio": 0.1},
    # Paper A.3: "The learning rate is constant after warm-up, so checkpoints lie on one trajectory."
    "cpt": {"lr": 1e-5, "min_lr_ratio": 1.0},
    "joint": {"lr": 1e-5, "min_lr_ratio": 0.1},
    "loop-convert": {"lr": 1e-5, "min_lr_ratio": 0.1},
}

RECIPE_FIELDS = {
    "convert": ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "kl_weight", "nll_weight", "curriculum"),
    "cpt": ("passes",),
    "joint": ("single_weight", "loop_weight", "teacher", "receiver", "kd_weight", "stages", "matched_from"),
    "loop-convert": ("exit_beta", "exit_smoothing", "mix_init", "collapse_threshold", "collapse_patience"),
}

FIELD_HELP = {
    "steps": "optimizer steps",
    "batch_size": "global batch, in rows",
    "micro_batch_size": "rows per forward on each process",
    "lr": "peak learning rate (default per recipe)",
    "min_lr_ratio": "final learning rate / peak (default per recipe; cpt: 1, constant)",
    "warmup": "linear warm-up steps",
    "weight_decay": "AdamW weight decay of matrices and embeddings",
    "grad_clip": "gradient-norm clip; 0: off",
    "max_length": "tokens per row; longer rows are cut (cpt: the packed row length)",
    "seed": "training seed (dropout, LoRA initialisation, loop draws)",
    "data_seed": "batch-order seed",
    "dtype": "weight dtype: float32, bfloat16 or float16",
    "log_every": "steps per loss-curve point",
    "save_every": "steps between intermediate checkpoints and held-out measurements (full, cpt)",
    "lora_rank": "convert: LoRA rank",
    "lora_alpha": "convert: LoRA alpha (scale alpha/rank)",
    "lora_dropout": "convert: LoRA dropout",
    "lora_targets": "convert: all-linear, module names a,b,c, or a regular expression",
    "kl_weight": "convert: weight of KL(teacher || student)",
    "nll_weight": "convert: weight of the NLL",
    "curriculum": "convert: fraction of steps over which p(loop) rises 0 -> 1",
    "passes": "cpt: random depth, every window's passes drawn per batch from a range, e.g. 1-3",
    "single_weight": "joint: label weight of the single pass",
    "loop_weight": "joint: label weight of the looped output",
    "teacher": "joint: KD teacher frozen-original, online or frozen-looped (needs --receiver)",
    "receiver": "joint: the output(s) the teacher guides: single, loop or both",
    "kd_weight": "joint: KL weight, split evenly over the receivers",
    "stages": "joint: staged objectives NAME:STEPS,... (loop, single, joint) adding up to --steps",
    "max_blocks": "stop before a step would pass this many forward blocks (teacher included)",
    "max_seconds": "stop once the training steps have taken this many seconds",
    "exit_beta": "loop-convert: entropy coefficient beta of the exit loss",
    "exit_smoothing": "loop-convert: epsilon mixing the exit distribution with uniform in the LM loss",
    "mix_init": "loop-convert: initial mix logit a, w = sigmoid(a)",
    "collapse_threshold": "loop-convert: p0 above which the exit gate counts as collapsed",
    "collapse_patience": "loop-convert: consecutive collapsed steps before a warning",
    "recipe": "the recipe: full, convert, cpt, joint or loop-convert",
    "activation_checkpointing": "recompute layer activations in the backward pass to save memory",
}
"""What each field means, in a line: ``loopeval train``'s flags and help are derived from the
fields of :class:`TrainConfig` and this table (a field without a line has no flag)."""


ALL_LINEAR = "all-linear"
"""``lora_targets`` default: every ``nn.Linear`` inside the decoder layers (not the LM head)."""


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained; twins share all of it.

    Every recipe: ``batch_size`` is the global batch in rows; ``micro_batch_size`` (rows
    per forward on each process; ``None``: all of its share) and
    ``activation_checkpointing`` only trade memory for time, up to float rounding. The
    learning rate warms up linearly for ``warmup`` steps, then follows a cosine to
    ``min_lr_ratio * lr`` (``None``: the recipe's default). Weight decay applies to
    matrices and embeddings, not to norms and biases. ``seed`` seeds dropout, the LoRA
    initialisation and the loop draws, ``data_seed`` the batch order. ``dtype`` is the
    dtype the weights load and train in; mixed precision is ``accelerate launch
    --mixed_precision bf16``. ``save_every`` writes an intermediate checkpoint and
    measures held-out loss every that many steps (``full`` and ``cpt``).

    ``convert`` (paper A.3, "Conversion of Qwen3-8B"): LoRA of rank ``lora_rank``,
    scale ``lora_alpha / lora_rank`` and ``lora_dropout`` on ``lora_targets`` (PEFT's
    ``target_modules``: module-name suffixes, or one regular expression; default every
    linear layer of the decoder, "We train LoRA adapters on every linear layer through
    the looped computation."). The loss is ``kl_weight * KL(teacher || student) +
    nll_weight * NLL``: "The loss on reasoning traces is a KL divergence to the
    unmodified model as teacher (weight 0.9) plus the next-token negative
    log-likelihood (weight 0.1)". ``curriculum`` is the fraction of steps over which the
    probability of applying the loop rises linearly from 0 to 1: "the probability of
    applying it rises from 0 to 1 over the first third of training."

    ``cpt`` (paper A.3, "Continued pretraining"): plain text packed to ``max_length``.
    ``passes=(lo, hi)`` draws every window's number of passes per batch uniformly from
    ``lo..hi`` ("The looped model applies the loop a random 1–3 times per batch.");
    ``None`` trains at the loop's own depth.

    ``loop-convert`` (paper 004, "Closing the Loop", section 4 and F.2): every weight
    trains, through a whole-decoder loop ``0:NxT``, with a learned mixing logit
    initialised at ``mix_init`` ("We initialize a = 4.6, corresponding to w = 0.99005")
    and an exit gate. The loss is ``(1 - eps) sum_t p_t L_t + eps/T sum_t L_t - beta
    H(p)`` with ``beta = exit_beta`` ("entropy coefficient beta = 0.15") and ``eps =
    exit_smoothing`` ("we additionally smooth the exit-weighted LM loss with eps =
    0.05"). The gate-collapse monitor warns when ``p_0 > collapse_threshold`` for more
    than ``collapse_patience`` consecutive steps (:mod:`loopeval.training.exit_monitor`).

    ``joint`` (companion paper 002, "One Model, Two Paths"): the single pass and the
    looped output of one model, ``single_weight * CE_single + loop_weight * CE_loop``
    plus, with a ``teacher``, ``kd_weight`` split evenly over the ``receiver`` paths;
    ``stages`` and ``matched_from``: see :mod:`loopeval.training.joint`.

    Every recipe: ``max_blocks`` caps the forward blocks (layer passes of every forward
    of a step, teacher included, a shared prefix once) and ``max_seconds`` the training
    time; training stops at the first cap reached, before ``steps`` (the learning-rate
    schedule still spans ``steps``).
    """

    recipe: str = "full"
    steps: int = 1000
    batch_size: int = 32
    micro_batch_size: int | None = None
    lr: float | None = None
    min_lr_ratio: float | None = None
    warmup: int = 0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    max_length: int = 2048
    seed: int = 0
    data_seed: int = 0
    dtype: str = "float32"
    activation_checkpointing: bool = False
    log_every: int = 10
    save_every: int | None = None
    # convert
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_targets: str | tuple[str, ...] = ALL_LINEAR
    kl_weight: float = 0.9
    nll_weight: float = 0.1
    curriculum: float = 1 / 3
    # cpt
    passes: tuple[int, int] | None = None
    # joint (loopeval.training.joint; 002 Table 34: "Matched CE (L_s, L_c) ... (0.2, 0.9)" with KL weight 0.1 on the single pass)
    single_weight: float = 0.1
    loop_weight: float = 0.9
    teacher: str | None = None
    receiver: str | None = None
    kd_weight: float = 0.1
    stages: tuple[tuple[str, int], ...] | None = None
    matched_from: str | None = None
    # every recipe: budget caps
    max_blocks: float | None = None
    max_seconds: float | None = None
    # loop-convert
    exit_beta: float = 0.15
    exit_smoothing: float = 0.05
    mix_init: float = 4.6
    collapse_threshold: float = COLLAPSE_THRESHOLD
    collapse_patience: int = COLLAPSE_PATIENCE

    def __post_init__(self):
        def need(ok: bool, what: str):
            if not ok:
                raise ValueError(f"TrainConfig: {what}")

        need(self.recipe in RECIPES, f"recipe {self.recipe!r}: choose one of {', '.join(RECIPES)}")
        defaults = {f.name: f.default for f in fields(self)}
        for recipe, names in RECIPE_FIELDS.items():
            if recipe != self.recipe:
                for name in names:
                    need(getattr(self, name) == defaults[name],
                         f"{name} belongs to recipe {recipe!r}, not {self.recipe!r}")
        for name, value in RECIPE_DEFAULTS[self.recipe].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if isinstance(self.lora_targets, list):
            object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        if isinstance(self.passes, list):
            object.__setattr__(self, "passes", tuple(self.passes))
        if self.stages is not None and not isinstance(self.stages, str):
            object.__setattr__(self, "stages", tuple(tuple(s) for s in self.stages))

        need(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        need(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        need(self.micro_batch_size is None or self.micro_batch_size >= 1,
             f"micro_batch_size must be >= 1 or None, got {self.micro_batch_size}")
        need(self.lr > 0 and math.isfinite(self.lr), f"lr must be > 0, got {self.lr}")
        need(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
        need(0 <= self.warmup <= self.steps, f"warmup must lie in [0, steps={self.steps}], got {self.warmup}")
        need(math.isfinite(self.weight_decay) and self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        need(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas), f"betas must be two values in [0, 1), got {self.betas}")
        need(math.isfinite(self.grad_clip) and self.grad_clip >= 0, f"grad_clip must be >= 0 (0: no clipping), got {self.grad_clip}")
        need(self.max_length >= 2, f"max_length must be >= 2, got {self.max_length}")
        need(self.dtype in DTYPES, f"dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        need(self.log_every >= 1, f"log_every must be >= 1, got {self.log_every}")
        need(self.save_every is None or self.save_every >= 1, f"save_every must be >= 1 or None, got {self.save_every}")
        need(self.save_every is None or self.recipe != "convert",
             "save_every: convert merges its adapters once, at the end; it writes no intermediate checkpoints")
        need(self.lora_rank >= 1, f"lora_rank must be >= 1, got {self.lora_rank}")
        need(self.lora_alpha > 0 and math.isfinite(self.lora_alpha), f"lora_alpha must be a finite number > 0, got {self.lora_alpha}")
        need(0.0 <= self.lora_dropout < 1.0, f"lora_dropout must lie in [0, 1), got {self.lora_dropout}")
        need(bool(self.lora_targets) and (isinstance(self.lora_targets, str) or all(
            isinstance(t, str) and t for t in self.lora_targets)),
             f"lora_targets must be {ALL_LINEAR!r}, a regular expression or module names, got {self.lora_targets!r}")
        for name in ("kl_weight", "nll_weight"):
            value = getattr(self, name)
            need(math.isfinite(value) and value >= 0, f"{name} must be >= 0, got {value}")
        need(self.kl_weight + self.nll_weight > 0,
             f"kl_weight + nll_weight must be > 0, got {self.kl_weight} + {self.nll_weight}: nothing to optimise")
        need(0.0 <= self.curriculum <= 1.0, f"curriculum must be a fraction of the steps in [0, 1], got {self.curriculum}")
        need(math.isfinite(self.exit_beta) and self.exit_beta >= 0, f"exit_beta must be >= 0, got {self.exit_beta}")
        need(0.0 <= self.exit_smoothing <= 1.0, f"exit_smoothing must lie in [0, 1], got {self.exit_smoothing}")
        need(math.isfinite(self.mix_init), f"mix_init must be a finite logit (w = sigmoid(mix_init)), got {self.mix_init}")
        need(0.0 < self.collapse_threshold < 1.0, f"collapse_threshold must lie in (0, 1), got {self.collapse_threshold}")
        need(isinstance(self.collapse_patience, int) and self.collapse_patience >= 0,
             f"collapse_patience must be an integer >= 0, got {self.collapse_patience!r}")
        if self.passes is not None:
            need(len(self.passes) == 2 and all(isinstance(k, int) and not isinstance(k, bool) for k in self.passes),
                 f"passes must be a range (lo, hi) of integers, got {self.passes!r}")
            need(self.passes[0] >= 1, f"passes range {format_passes(self.passes)} starts below 1: a window runs at least once")
            need(self.passes[0] <= self.passes[1], f"passes range {format_passes(self.passes)} is empty (lo > hi)")
        for name in ("max_blocks", "max_seconds"):
            value = getattr(self, name)
            need(value is None or (not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0),
                 f"{name} must be > 0 or None (no cap), got {value!r}")
        if self.recipe == "joint":
            check_joint(self)

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def parse_passes(text: str) -> tuple[int, int]:
    """``"1-3"`` -> ``(1, 3)``; ``"2"`` -> ``(2, 2)`` (the ``--passes`` option)."""
    lo, sep, hi = str(text).strip().partition("-")
    try:
        passes = (int(lo), int(hi if sep else lo))
    except ValueError:
        raise ValueError(f"passes {text!r}: expected a range such as 1-3, or one number") from None
    if passes[0] < 1:
        raise ValueError(f"passes range {text!r} starts below 1: a window runs at least once")
    return passes


def format_passes(passes: tuple[int, int]) -> str:
    return f"{passes[0]}-{passes[1]}"


def parse_targets(text: str) -> str | tuple[str, ...]:
    """``--lora-targets``: ``all-linear``, a comma-separated list of module names, or a
    regular expression (any text with a character other than ``[A-Za-z0-9_.,]``)."""
    text = text.strip()
    if text == ALL_LINEAR or any(not (c.isalnum() or c in "_.,") for c in text):
        return text
    return tuple(t.strip() for t in text.split(",") if t.strip())


# -- the joint recipe's options (paper 002), checked with the config --------------------------

TEACHERS = ("frozen-original", "online", "frozen-looped")
RECEIVERS = {"single": ("single",), "loop": ("loop",), "both": ("single", "loop")}
STAGES = ("loop", "single", "joint")
"""Stage objectives: CE on the looped output alone, on the single pass alone, the joint objective."""


def parse_stages(text: str) -> tuple[tuple[str, int], ...]:
    """``"loop:100,joint:200"`` -> ``(("loop", 100), ("joint", 200))`` (the ``--stages`` option)."""
    stages = []
    for part in str(text).split(","):
        name, sep, steps = part.strip().partition(":")
        try:
            stages.append((name.strip(), int(steps)))
        except ValueError:
            raise ValueError(f"stages {text!r}: cannot read {part.strip()!r}; expected NAME:STEPS pairs such as "
                             f"loop:100,joint:200 (names: {', '.join(STAGES)})") from None
    return tuple(stages)


def format_stages(stages) -> str:
    return ",".join(f"{name}:{steps}" for name, steps in stages)


def check_joint(config) -> None:
    """Refuse a ``joint`` config that cannot train as asked (from ``TrainConfig``)."""

    def need(ok: bool, what: str):
        if not ok:
            raise ValueError(f"TrainConfig: {what}")

    for name in ("single_weight", "loop_weight", "kd_weight"):
        value = getattr(config, name)
        need(isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, f"{name} must be >= 0, got {value}")
    need(config.teacher is None or config.teacher in TEACHERS,
         f"teacher {config.teacher!r}: choose one of {', '.join(TEACHERS)} (or none)")
    need(config.receiver is None or config.receiver in RECEIVERS,
         f"receiver {config.receiver!r}: choose one of {', '.join(RECEIVERS)}")
    need(config.teacher is None or config.receiver is not None,
         f"teacher {config.teacher!r} guides no output; give receiver single, loop or both (--receiver)")
    need(config.receiver is None or config.teacher is not None,
         f"receiver {config.receiver!r} without a teacher; give teacher {', '.join(TEACHERS)} (--teacher)")
    need(not (config.teacher == "online" and config.receiver in ("loop", "both")),
         f"teacher 'online' is the current looped output itself; it can only guide the single pass (receiver "
         f"single), not {config.receiver!r}")
    need(config.matched_from is None or config.teacher is None,
         f"matched_from {config.matched_from!r}: a matched-CE control has no teacher, got {config.teacher!r}")
    need(config.teacher is None or config.kd_weight > 0, "kd_weight must be > 0 with a teacher")
    total = config.single_weight + config.loop_weight + (config.kd_weight if config.teacher else 0.0)
    need(total > 0, f"single_weight + loop_weight{' + kd_weight' if config.teacher else ''} is 0: nothing to optimise")
    if config.stages is not None:
        stages = parse_stages(config.stages) if isinstance(config.stages, str) else config.stages
        object.__setattr__(config, "stages", tuple(stages))
        need(len(stages) > 0, "stages is empty")
        for name, steps in stages:
            need(name in STAGES, f"stages {format_stages(stages)}: unknown stage {name!r}; choose from {', '.join(STAGES)}")
            need(isinstance(steps, int) and steps >= 1, f"stages {format_stages(stages)}: stage {name!r} has {steps} steps; "
                 "each needs >= 1")
        need(sum(s for _, s in stages) == config.steps,
             f"stages {format_stages(stages)} add up to {sum(s for _, s in stages)} steps, not steps={config.steps}")
        need(any(name == "joint" for name, _ in stages) or config.teacher is None,
             f"teacher {config.teacher!r}: no joint stage in {format_stages(stages)} uses it")
