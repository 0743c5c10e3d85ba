"""Hashes of weights, for the manifest's proof that twins start from the same place."""

from __future__ import annotations

import hashlib

import torch


def weights_sha256(model_or_tensors: torch.nn.Module | dict[str, torch.Tensor]) -> str:
    """sha256 of a state dict (or of named tensors): every tensor's name, dtype, shape
    and bytes, by name."""
    tensors = model_or_tensors.state_dict() if isinstance(model_or_tensors, torch.nn.Module) else model_or_tensors
    h = hashlib.sha256()
    for name, t in sorted(tensors.items()):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
