"""Looping a trained Hugging Face decoder: the loop a checkpoint gets (``resolve_loop``) and ``apply_loop``.

A loop re-applies windows of consecutive decoder layers with shared weights. The model
is looped in place with forward hooks, so its module tree, ``parameters()``,
``state_dict()`` and ``config`` stay those of the base model, and HF ``forward`` and
``generate()`` work unchanged.

A window re-applies whole layers, or only their attention blocks (``/attn``) or only
their MLP blocks (``/mlp``): sub-layer call sites.

The loop's call sites, their cache slots and hooks are :mod:`loopeval.core.loop_runtime`;
its operators :mod:`loopeval.core.operators`; sub-layer blocks :mod:`loopeval.core.blocks`;
the depth of a forward during training :mod:`loopeval.core.loop_controls`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torch import nn

from loopeval.core.blocks import check_sub_layer_support
from loopeval.core.loop_runtime import LoopRuntime
from loopeval.core.spec import LOOP_CONFIG_NAME, LOOP_OPTIONS, LoopConfig, LoopSpec, read_loop_config


def check_source(path: str | Path, *, revision: str | None = None, trust_remote_code: bool = False,
                 gguf_file: str | None = None) -> None:
    """Refuse, before any weights load, a checkpoint that is neither a local folder nor a hub
    model whose config can be read. A path that looks local is named as a missing folder,
    not as a malformed hub id. With ``gguf_file`` (a GGUF file inside the folder, as
    transformers' ``from_pretrained(path, gguf_file=...)`` takes it) a local folder must
    hold that file, it must be GGUF, and a ``config.json`` beside it must describe its model
    (:func:`loopeval.core.gguf.check_gguf_folder`)."""
    text = str(path)
    if Path(text).is_dir():
        if gguf_file is not None:
            from loopeval.core.gguf import check_gguf_folder

            check_gguf_folder(text, gguf_file)
        return
    if text.startswith((".", "/", "~")) or text.count("/") != 1 or "\\" in text:
        raise ValueError(f"{text}: no such local folder (a hub id has the form org/name)")
    from transformers import AutoConfig

    kwargs = {k: v for k, v in (("revision", revision), ("gguf_file", gguf_file)) if v is not None}
    try:
        AutoConfig.from_pretrained(text, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{text}: neither a local folder nor a hub model whose config can be read ({first})") from None


def resolve_loop(source, loop: str | LoopSpec | LoopConfig | None = None, *, arg_prefix: str = "", revision: str | None = None,
                 trust_remote_code: bool = False, gguf_file: str | None = None,
                 **options) -> LoopConfig | None:
    """The loop to apply to ``source``: a checkpoint path or hub id, a model, or a model config.

    The one rule for every entry point (``load_model``, lm-eval's ``looped``, training,
    ``check-cache``, ``place``): a path or hub id must exist (:func:`check_source`); a
    source that already has a loop (``loop_config.json``, or an applied loop) keeps it,
    and giving ``loop`` as well is an error; otherwise ``loop`` with its options is the
    loop, checked against the source's layer count. Nothing but the config is read, so
    a bad spec fails before any weights load. Option names in errors carry
    ``arg_prefix`` (lm-eval's args are ``loop_operator`` ...). ``options`` are the loop
    options (:data:`loopeval.core.spec.LOOP_OPTIONS`; ``None`` means not given). ``gguf_file``:
    the source is that GGUF file in the folder ``source`` (its config is read from the file).
    """
    if isinstance(source, (str, Path)):
        check_source(source, revision=revision, trust_remote_code=trust_remote_code, gguf_file=gguf_file)
    unknown = sorted(set(options) - set(LOOP_OPTIONS))
    if unknown:
        raise ValueError(f"unknown loop option(s) {', '.join(arg_prefix + k for k in unknown)}")
    if loop is None:
        given = [f"{arg_prefix}{k}" for k, v in options.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} given without loop=")
    if isinstance(source, nn.Module):
        stored = loop_config(source)
    elif isinstance(source, (str, Path)) and Path(source).is_dir():
        stored = read_loop_config(source)
    else:
        stored = None
    if loop is None:
        if stored is not None and isinstance(source, (str, Path)):
            try:  # a stored loop_config.json is checked against the config before any weights load too
                layers = count_layers(source, revision=revision, trust_remote_code=trust_remote_code)
            except (OSError, ValueError):
                layers = None  # no readable config: the loaded model is checked when the loop is applied
            if layers is not None:
                try:
                    stored.validate(layers)
                except ValueError as exc:
                    raise ValueError(f"{Path(source) / LOOP_CONFIG_NAME}: {exc}") from None
        return stored
    if stored is not None:
        raise ValueError(
            f"{source if not isinstance(source, nn.Module) else 'the model'} already has the loop {stored.spec} "
            f"({LOOP_CONFIG_NAME}); drop loop={loop!s} or load the base checkpoint"
        )
    if isinstance(loop, LoopConfig):
        given = [f"{arg_prefix}{k}" for k, v in options.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} given beside a whole LoopConfig; put them inside it")
        wanted = loop
    else:
        wanted = LoopConfig.from_options(loop, **options)
    return wanted.validate(count_layers(source, revision=revision, trust_remote_code=trust_remote_code,
                                        gguf_file=gguf_file))


def count_layers(source, **config_kwargs) -> int:
    """The decoder layer count of a model, a model config, or a checkpoint path or hub id
    (whose config alone is read)."""
    if isinstance(source, nn.Module):
        return len(decoder_layers(source))
    if isinstance(source, (str, Path)):
        from transformers import AutoConfig

        kwargs = {k: v for k, v in config_kwargs.items() if v is not None}
        source = AutoConfig.from_pretrained(source, **kwargs)
    text = source.get_text_config(decoder=True) if hasattr(source, "get_text_config") else source
    return int(text.num_hidden_layers)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder's layer list (``model.model.layers`` or the text decoder's layers)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(
            f"unsupported architecture {type(model).__name__}: loopeval loops decoders whose layers "
            "are an nn.ModuleList at model.model.layers (Llama, Qwen2/3, Mistral, Qwen3.5, Qwen3-Next, Gemma 3)"
        )
    return layers


def apply_loop(model: nn.Module, loop: str | LoopSpec | LoopConfig, **options):
    """Loop ``model`` in place and return it. No parameters are added or copied.

    ``loop`` is a spec with the loop ``options`` (``operator``, ``beta``, ``mix``,
    ``mix_source``: :class:`LoopConfig`'s fields, defaults there) or a whole
    :class:`LoopConfig`. Raises ``ValueError`` for a malformed spec, bad options, an
    unsupported architecture or an already looped model, before anything is changed.
    """
    if isinstance(loop, LoopConfig):
        if any(v is not None for v in options.values()):
            raise ValueError("apply_loop: give the operator options inside the LoopConfig, not beside it")
        config = loop
    else:
        config = LoopConfig.from_options(loop, **options)
    layers = decoder_layers(model)
    config.validate(len(layers))
    check_sub_layer_support(layers, config.spec)
    if getattr(model, "_loopeval", None) is not None:
        raise ValueError(
            f"model is already looped with {model._loopeval.config.spec}; call loopeval.remove_loop(model) first"
        )
    model._loopeval = LoopRuntime(model, layers, config)
    return model


def remove_loop(model: nn.Module) -> nn.Module:
    """Undo ``apply_loop``; the model is the unlooped base model again."""
    runtime = getattr(model, "_loopeval", None)
    if runtime is not None:
        runtime.remove()
        model._loopeval = None
    return model


def loop_config(model: nn.Module) -> LoopConfig | None:
    """The loop applied to ``model``, or ``None``; a mix logit being learned
    (:func:`set_learned_mix`) appears with its current value."""
    runtime = getattr(model, "_loopeval", None)
    if runtime is None:
        return None
    if runtime.learned_mix is not None:
        return dataclasses.replace(runtime.config, mix=float(runtime.learned_mix.detach()))
    return runtime.config
