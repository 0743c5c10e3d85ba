"""GGUF files as ordinary float checkpoints: ``loopeval import-gguf``.

transformers reads a GGUF file with ``from_pretrained(folder, gguf_file=name)`` and
dequantises its weights to float, but the model it returns is marked as quantised
("quantized with gguf and is not serializable"), so ``save_pretrained`` refuses it.
:func:`import_gguf` rebuilds the model from its config without the GGUF marks, loads the
dequantised state dict into it and saves a plain checkpoint folder (config, safetensors
weights, tokenizer, chat template if the file has one, generation config, and
``gguf_import.json``: the source file and whether it carried a chat template), which
``load_model``, ``lm_eval --model looped``, ``place``, ``train`` and ``serve-cost`` take
like any other. The weights are exactly the dequantised ones at ``dtype="float32"``
(transformers' own GGUF load), rounded once at ``bfloat16``/``float16``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from loopeval.common.errors import UserError
from loopeval.common.outputs import check_not_installed
from loopeval.core.gguf_header import GGUFHeader, check_header
from loopeval.core.gguf_weights import check_weights_set

GGUF_MAGIC = b"GGUF"
DTYPES = ("float32", "bfloat16", "float16")
IMPORT_RECORD = "gguf_import.json"
TOKENIZER_FILE = "tokenizer.json"
"""The file transformers takes a tokenizer from in a folder before a ``gguf_file``'s own
(``TokenizersBackend.__init__``: ``tokenizer_file``, then ``gguf_file``)."""
_TOKEN_SAMPLE = 256
"""Token ids compared between a folder's tokenizer and the GGUF's token list."""


def chat_template_fix(folder: str | Path) -> str:
    """How to give a checkpoint folder without a chat template one."""
    return (f"put the model family's chat template (Jinja text) in {Path(folder) / 'chat_template.jinja'}, "
            "or evaluate without --apply_chat_template")


def check_chat_template(source: str, **tokenizer_kwargs) -> None:
    """``ValueError`` naming the fix when the tokenizer of ``source`` has no chat template
    (reads the tokenizer only, not the weights)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, **tokenizer_kwargs)
    if not getattr(tokenizer, "chat_template", None):
        fix = chat_template_fix(source) if Path(source).is_dir() else "evaluate without --apply_chat_template"
        raise ValueError(f"looped: --apply_chat_template, but the tokenizer of {source} has no chat template "
                         f"(a GGUF without one, such as Gemma 3 270M's, imports none); {fix}")


def check_gguf(file: str | Path) -> Path:
    """``file`` as a path, or ``ValueError`` if it is missing, not a GGUF file (its first
    four bytes are not ``GGUF``), a damaged one (its header, metadata and tensor table
    checked against the file size and its architecture:
    :func:`loopeval.core.gguf_header.check_header`), or one whose tensors leave weights of
    transformers' model for it unset (:func:`loopeval.core.gguf_weights.check_weights_set`)."""
    path = Path(file)
    if not path.is_file():
        raise ValueError(f"{file}: no such GGUF file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(f"{file}: not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    check_weights_set(path, check_header(path))
    return path


def _embedding_rows(header: GGUFHeader) -> int:
    shape = header.tensors["token_embd.weight"].shape  # GGUF order: (width, vocabulary)
    return shape[1] if len(shape) > 1 else shape[0]


def check_gguf_folder(folder: str | Path, gguf_file: str) -> GGUFHeader:
    """The GGUF ``folder/gguf_file`` (:func:`check_gguf`), and the checkpoint files beside
    it are its own: transformers reads the model from the file, but loopeval reads the
    folder's ``loop_config.json`` and exit gate, so a ``config.json`` there that describes
    another model (its layers, width or vocabulary differ from the file's) is refused,
    naming both, before any weights load."""
    path = check_gguf(Path(folder) / gguf_file)
    header = check_header(path)
    config_file = Path(folder) / "config.json"
    if not config_file.is_file():
        return header
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{config_file}: not a JSON config ({exc})",
                        fix=f"remove it, or give {gguf_file} in a folder of its own") from None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    arch, meta = header.architecture, header.metadata
    theirs = {"layers": text.get("num_hidden_layers"), "width": text.get("hidden_size"),
              "vocabulary": text.get("vocab_size")}
    ours = {"layers": meta.get(f"{arch}.block_count"), "width": meta.get(f"{arch}.embedding_length"),
            "vocabulary": _embedding_rows(header)}
    differ = [k for k in ours if theirs[k] is not None and theirs[k] != ours[k]]
    if differ:
        shown = ", ".join(f"{k} {theirs[k]} vs {ours[k]}" for k in differ)
        raise UserError(f"gguf_file={gguf_file}: {config_file} describes another model than {path} ({shown}); "
                        "loopeval would read that folder's loop and exit gate for the GGUF's weights",
                        fix=f"give {gguf_file} in a folder of its own, or its own checkpoint folder")
    return header


def check_gguf_tokenizer(folder: str | Path, gguf_file: str, tokenizer: str | Path | None = None) -> None:
    """The tokenizer a GGUF model will be given is the file's, checked before any weights load:
    ``tokenizer`` (a path or hub id), else the folder's :data:`TOKENIZER_FILE` (transformers
    prefers it to the file's), else the file's own ``tokenizer.ggml.*`` metadata, which must
    then be there. A tokenizer with more tokens than the file's embedding has rows, or whose
    tokens differ from the file's token list (most of a fixed sample of ids), belongs to
    another model and is refused, naming both."""
    header = check_gguf_folder(folder, gguf_file)
    path = Path(folder) / gguf_file
    meta = header.metadata
    tokens = meta.get("tokenizer.ggml.tokens")
    source = tokenizer if tokenizer is not None else (Path(folder) if (Path(folder) / TOKENIZER_FILE).is_file() else None)
    if source is None and (not isinstance(meta.get("tokenizer.ggml.model"), str) or not isinstance(tokens, list)
                           or not tokens):
        raise UserError(f"gguf_file={gguf_file}: {path} carries no tokenizer (no tokenizer.ggml.model and "
                        f"tokenizer.ggml.tokens metadata) and {folder} holds no {TOKENIZER_FILE}",
                        fix=f"put the model's tokenizer files (tokenizer.json, tokenizer_config.json) in {folder}, "
                        "or give a GGUF exported with its tokenizer")
    from transformers import AutoTokenizer

    which = (f"the tokenizer of {path}" if source is None else f"the tokenizer {source}" if tokenizer is not None
             else f"the tokenizer in {source}, which transformers takes before the file's own,")
    try:  # the tokenizer alone, as the loaders will build it: cheap, and before any weights
        given = (AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file) if source is None
                 else AutoTokenizer.from_pretrained(str(source)))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0] or type(exc).__name__
        raise UserError(f"gguf_file={gguf_file}: {which} does not load ({type(exc).__name__}: {first})",
                        fix=f"give {gguf_file} with its own model's tokenizer files, or in a folder of its own") from None
    if source is None:
        return
    rows, size = _embedding_rows(header), len(given)
    mismatch = size > rows
    if not mismatch and isinstance(tokens, list) and tokens:
        n = min(size, len(tokens))
        ids = sorted({i * n // _TOKEN_SAMPLE for i in range(_TOKEN_SAMPLE)})
        theirs = given.convert_ids_to_tokens(ids)
        mismatch = sum(t != tokens[i] for t, i in zip(theirs, ids)) * 2 > len(ids)
    if mismatch:
        raise UserError(f"gguf_file={gguf_file}: the tokenizer in {source} ({size} tokens) is not the tokenizer of "
                        f"{path} (an embedding of {rows} rows"
                        + (f", {len(tokens)} listed tokens)" if isinstance(tokens, list) and tokens else ")"),
                        fix=f"give {gguf_file} with its own model's tokenizer files, or in a folder of its own")


def import_gguf(file: str | Path, out: str | Path, *, dtype: str = "float32") -> Path:
    """Write the model in the GGUF ``file`` as a float Hugging Face checkpoint folder ``out``.

    Refused before any loading: an unknown ``dtype``, an ``out`` that exists and is not
    empty or lies in loopeval's installed folders, a file that is missing, not GGUF,
    damaged or whose tensors leave weights of its architecture's model unset
    (:func:`check_gguf`). The folder is written
    beside ``out`` and renamed into place, so a failed import leaves no partial checkpoint.
    A GGUF without a chat template (Gemma 3 270M's) is imported with a warning that names the fix.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty folder; choose another --out")
    check_not_installed(out, "--out")
    path = check_gguf(file).resolve()
    folder, name = path.parent, path.name
    check_gguf_tokenizer(folder, name)
    loaded = from_pretrained_checked(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if not has_template:
        warnings.warn(f"{file}: the GGUF carries no chat template, so {out} has none and lm_eval "
                      f"--apply_chat_template will refuse it; {chat_template_fix(out)}", stacklevel=2)
    config = loaded.config
    for attr in ("quantization_config", "gguf_file"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = dtype
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    if unexpected or set(missing) - tied:
        raise ValueError(f"{file}: the rebuilt model does not take the GGUF weights "
                         f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model = model.to(getattr(torch, dtype)).eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp's folder is private; a checkpoint is an ordinary folder
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        record = {"gguf": name, "bytes": path.stat().st_size, "dtype": dtype, "chat_template": has_template}
        (staging / IMPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def from_pretrained_checked(path, *args, gguf_file: str | None = None, **kwargs):
    """``AutoModelForCausalLM.from_pretrained``; with ``gguf_file``, a GGUF whose tensors leave
    weights of its architecture's model unset (transformers would initialise them at random,
    e.g. a Llama file labelled ``qwen2`` lacks Qwen2's attention biases) is refused, naming the
    file. Every loader of a GGUF goes through it: ``import-gguf``, ``load_model`` and lm-eval's
    ``looped`` model. The backstop of :func:`check_gguf`'s check before loading, which predicts
    the same from transformers' name map; this one reads what the load did."""
    from transformers import AutoModelForCausalLM

    if gguf_file is None:
        return AutoModelForCausalLM.from_pretrained(path, *args, **kwargs)
    model, info = AutoModelForCausalLM.from_pretrained(path, *args, gguf_file=gguf_file, output_loading_info=True,
                                                       **kwargs)
    _check_loaded(Path(path) / gguf_file if Path(path).is_dir() else gguf_file, model, info)
    return model


class GGUFCheckedAutoModel:
    """``AutoModelForCausalLM`` for lm-eval's ``AUTO_MODEL_CLASS``, loading by :func:`from_pretrained_checked`."""

    from_pretrained = staticmethod(from_pretrained_checked)


def _check_loaded(file, model, info: dict) -> None:
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    missing = sorted(set(info.get("missing_keys") or ()) - tied)
    if missing:
        raise ValueError(f"{file}: its tensors do not make a {model.config.model_type} model: {len(missing)} weights "
                         f"are missing (e.g. {missing[0]}); is general.architecture right?")
