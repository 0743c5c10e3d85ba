"""Loading and saving plain and looped checkpoints, in Hugging Face conventions.

A looped checkpoint is an ordinary ``save_pretrained`` folder (the base weights, once)
plus ``loop_config.json`` with the spec, operator, beta, mix and mix source, like PEFT's
``adapter_config.json``, and, when the loop was trained with an exit gate
(``loop-convert``), ``exit_gate.safetensors`` beside the base weights.
``load_model(path)`` re-applies that loop, so a looped checkpoint needs nothing but its
path; ``--model hf`` on the same folder loads the unlooped base model.
"""

from __future__ import annotations

import json
from pathlib import Path

from loopeval.core.exit_gate import EXIT_GATE_NAME, attach_gate, exit_gate, load_gate, save_gate
from loopeval.core.loop import apply_loop, loop_config, resolve_loop
from loopeval.core.spec import LOOP_CONFIG_NAME, LoopSpec


def load_model(
    path: str | Path,
    loop: str | LoopSpec | None = None,
    *,
    operator: str | None = None,
    beta: float | None = None,
    mix: float | None = None,
    mix_source: str | None = None,
    **from_pretrained_kwargs,
):
    """Load ``(model, tokenizer)`` from a checkpoint folder or hub id, looped.

    The loop is the checkpoint's own (``loop_config.json``) or ``loop`` with its options,
    by :func:`loopeval.core.loop.resolve_loop`: giving ``loop`` for a checkpoint that already
    has one is a ``ValueError``, and the spec is checked against the config before any
    weights load. ``gguf_file=NAME`` loads the GGUF file ``NAME`` in the folder ``path``
    (transformers dequantises it at every load; :func:`loopeval.core.gguf.import_gguf` saves
    it once as a float checkpoint); a GGUF whose tensors leave weights unset, or with no
    tokenizer of its own (:func:`loopeval.core.gguf.check_gguf_tokenizer`), is refused.
    """
    from transformers import AutoTokenizer

    from loopeval.core.gguf import from_pretrained_checked

    config_kwargs = {k: from_pretrained_kwargs[k] for k in ("revision", "trust_remote_code", "gguf_file")
                     if k in from_pretrained_kwargs}
    wanted = resolve_loop(path, loop, operator=operator, beta=beta, mix=mix, mix_source=mix_source, **config_kwargs)
    if config_kwargs.get("gguf_file") and Path(path).is_dir():
        from loopeval.core.gguf import check_gguf_tokenizer

        check_gguf_tokenizer(path, config_kwargs["gguf_file"])
    model = from_pretrained_checked(path, **from_pretrained_kwargs)
    tokenizer = AutoTokenizer.from_pretrained(path, **config_kwargs)
    if wanted is not None:
        apply_loop(model, wanted)
        if Path(path).is_dir():
            gate = load_gate(path, hidden_size=model.config.get_text_config(decoder=True).hidden_size)
            if gate is not None:
                attach_gate(model, gate.to(model.device))
    return model.eval(), tokenizer


def save_model(model, tokenizer, path: str | Path) -> Path:
    """Write ``model``'s base weights, its tokenizer and, if looped, ``loop_config.json``
    (a mix logit being learned is written with its current value) and its exit gate."""
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
    gate = exit_gate(model)
    if gate is not None:
        save_gate(gate, path)
    elif (path / EXIT_GATE_NAME).exists():
        (path / EXIT_GATE_NAME).unlink()
    return path


def weights_fingerprint(model, *, samples: int = 1024) -> str:
    """A cheap identity of a model's weights: sha256 over every parameter's name, shape,
    dtype and a fixed strided sample of up to ``samples`` of its values. Two models with
    the same fingerprint have the same weights unless a change missed every sampled value
    of every tensor; traces record it, so a loop on unchanged weights (training-free) is
    recognised."""
    import hashlib

    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in sorted(model.state_dict().items()):
            flat = t.detach().reshape(-1)
            step = max(1, flat.numel() // samples)
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
            h.update(flat[::step][:samples].float().cpu().numpy().tobytes())
    return h.hexdigest()
