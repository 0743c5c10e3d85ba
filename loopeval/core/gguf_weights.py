"""A GGUF file's tensors against the weights transformers would fill from them, before any load.

transformers loads a GGUF by building its architecture's model from the file's config and
copying each tensor into the parameter its GGUF name maps to
(``transformers.modeling_gguf_pytorch_utils.get_gguf_hf_weights_map``); a parameter no
tensor maps to keeps its random initial value, silently. :func:`check_weights_set` builds
that model on the meta device (no memory, no weights), takes transformers' own name map
and the file's tensor table (:func:`loopeval.core.gguf_header.read_header`), and refuses a
file that leaves any parameter unset, naming the file and the weights. Tied weights (the
output layer of a file without ``output.weight``) count as set with the tensor they share.
"""

from __future__ import annotations

import functools
from pathlib import Path
from unittest import mock

from loopeval.core.gguf_header import GGUFHeader


def check_weights_set(file: str | Path, header: GGUFHeader) -> None:
    """``ValueError`` naming ``file`` and the weights its tensors (``header``'s table) leave unset
    in the model transformers builds for it, or naming why transformers cannot build one."""
    path = Path(file).resolve()
    stat = path.stat()
    try:
        unset, model_type = _unset(str(path), stat.st_size, stat.st_mtime_ns, tuple(header.tensors), header.architecture)
    except ValueError as exc:
        raise ValueError(f"{file}: {exc}") from None
    if unset:
        shown = ", ".join(f"{gguf} ({hf})" if gguf else hf for gguf, hf in unset[:4])
        more = f" and {len(unset) - 4} more" if len(unset) > 4 else ""
        raise ValueError(f"{file}: its tensors leave {len(unset)} weight(s) of transformers' {model_type} model unset "
                         f"(they would keep their random initial values): no tensor {shown}{more}; "
                         "is general.architecture right, or was a tensor dropped?")


@functools.lru_cache(maxsize=8)
def _unset(path: str, size: int, mtime_ns: int, tensors: tuple[str, ...], arch: str | None
           ) -> tuple[list[tuple[str | None, str]], str]:
    """The (GGUF name or ``None``, parameter name) pairs left unset, and the model type; once per file version."""
    import gguf
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    folder, name = Path(path).parent, Path(path).name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001 -- metadata transformers cannot build from fails in many types (e.g.
        # ValueError for bert, TypeError for lfm2, torch's AssertionError for a phi3 padding id past the vocabulary)
        first = (str(exc).strip().splitlines() or [""])[0] or type(exc).__name__
        raise ValueError(f"transformers builds no model from it ({type(exc).__name__}: {first})") from None
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    # The map function rebuilds gguf's name table for every submodule (seconds on a small
    # model); the table depends on the architecture and block count alone.
    with mock.patch.object(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)):
        to_hf = get_gguf_hf_weights_map(model, processor)
    filled = {to_hf[t] for t in tensors if t in to_hf}
    filled |= {to_hf[t.rsplit(".", 1)[0]] for t in tensors if t.rsplit(".", 1)[0] in to_hf}  # tensors a processor places itself
    to_gguf = {}
    for g, hf in to_hf.items():
        to_gguf.setdefault(hf, g)
    shared: dict[int, list[str]] = {}
    for hf, parameter in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(parameter), []).append(hf)
    unset = [(to_gguf.get(names[0]), names[0]) for names in shared.values() if not filled.intersection(names)]
    return unset, config.model_type
