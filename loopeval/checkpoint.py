"""Loading and saving plain and looped checkpoints, in Hugging Face conventions.

A looped checkpoint is an ordinary ``save_pretrained`` folder (the base weights, once)
plus ``loop_config.json`` with the spec, operator, beta and mix, like PEFT's
``adapter_config.json``. ``load_model(path)`` re-applies that loop, so a looped
checkpoint needs nothing but its path; ``--model hf`` on the same folder loads the
unlooped base model.
"""

from __future__ import annotations

import json
from pathlib import Path

from loopeval.loop import LoopConfig, LoopSpec, _check_options, apply_loop, loop_config

LOOP_CONFIG_NAME = "loop_config.json"


def read_loop_config(path: str | Path) -> LoopConfig | None:
    """The loop stored with a local checkpoint, or ``None``."""
    file = Path(path) / LOOP_CONFIG_NAME
    if not file.is_file():
        return None
    try:
        return LoopConfig.from_dict(json.loads(file.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{file}: not a valid loop configuration ({exc})") from None


def load_model(
    path: str | Path,
    loop: str | LoopSpec | None = None,
    *,
    operator: str = "repeat",
    beta: float = 0.0,
    mix: float | None = None,
    **from_pretrained_kwargs,
):
    """Load ``(model, tokenizer)`` from a checkpoint folder or hub id, looped.

    The loop is the checkpoint's own (``loop_config.json``) or ``loop``; giving ``loop``
    for a checkpoint that already has one is a ``ValueError``, since a second loop on a
    model trained with a first is rarely what was meant. Spec and options are checked
    against the config before any weights load.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    stored = read_loop_config(path)
    if loop is not None:
        if stored is not None:
            raise ValueError(
                f"{path} already has the loop {stored.spec} ({LOOP_CONFIG_NAME}); "
                f"drop loop={loop!s} or load the base checkpoint"
            )
        spec = LoopSpec.parse(loop)
        _check_options(operator, beta, mix)
        wanted = LoopConfig(spec, operator, float(beta), mix)
    else:
        wanted = stored
    config_kwargs = {k: from_pretrained_kwargs[k] for k in ("revision", "trust_remote_code") if k in from_pretrained_kwargs}
    config = AutoConfig.from_pretrained(path, **config_kwargs)
    if wanted is not None:
        text = config.get_text_config(decoder=True)
        wanted.spec.validate(text.num_hidden_layers)
    model = AutoModelForCausalLM.from_pretrained(path, **from_pretrained_kwargs)
    tokenizer = AutoTokenizer.from_pretrained(path, **config_kwargs)
    if wanted is not None:
        apply_loop(model, wanted.spec, operator=wanted.operator, beta=wanted.beta, mix=wanted.mix)
    return model.eval(), tokenizer


def save_model(model, tokenizer, path: str | Path) -> Path:
    """Write ``model``'s base weights, its tokenizer and, if looped, ``loop_config.json``."""
    path = Path(path)
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    config = loop_config(model)
    file = path / LOOP_CONFIG_NAME
    if config is not None:
        file.write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    elif file.exists():
        file.unlink()
    return path
