"""The exit gate of "Closing the Loop" (paper 004): halt probabilities after every loop
step, the survival construction and the (smoothed) exit-weighted loss.

The gate is a small module kept *beside* the looped model, not inside it, so
``apply_loop``'s promise holds: the base model's ``parameters()``, ``state_dict()`` and
``save_pretrained`` output are unchanged. ``attach_gate`` hangs it on the loop's
runtime; ``save_model`` writes it to ``exit_gate.safetensors`` beside the base weights
and ``load_model`` restores it. Fixed-exit evaluation does not use it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

EXIT_GATE_NAME = "exit_gate.safetensors"
"""The file beside a checkpoint's weights that stores its exit gate."""

GATE_INIT_STD = 0.02
"""004, Table 15: "Initialization std. 0.02 for newly added standard linear modules"."""


class ExitGate(nn.Module):
    """004, Eq. 4: "After each recurrent step, a shared linear gate produces a halt
    probability lambda_t = sigma(w_g^T h_t)", read from the final-normed hidden state
    ("A learnable RMSNorm is then applied to the hidden state after each recurrent
    step, before both the exit gate and the LM head"; a converted HF decoder has its
    own final norm). ``forward`` returns the halt *logits* ``w_g^T h + b``: a
    ``nn.Linear(hidden, 1)`` as Ouro's implementation, with a bias (zero at
    initialisation, so the start is Eq. 4 exactly)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.linear.weight, std=GATE_INIT_STD)
        nn.init.zeros_(self.linear.bias)

    def forward(self, normed: torch.Tensor) -> torch.Tensor:
        return self.linear(normed).squeeze(-1)


def exit_log_distribution(halt_logits: torch.Tensor) -> torch.Tensor:
    """``log p_t`` from halt logits ``[..., T]`` by the survival construction, 004 Eq. 5:
    "p_t = lambda_t prod_{s<t} (1 - lambda_s) (t < T), p_T = prod_{s<T} (1 - lambda_s)"
    (the last step takes the remaining mass; its own lambda is unused). Computed with
    log-sigmoids, so it sums to one and stays finite for any logits."""
    log_halt = F.logsigmoid(halt_logits)
    log_go = F.logsigmoid(-halt_logits)
    survive = torch.cumsum(log_go, dim=-1) - log_go  # sum_{s<t} log(1 - lambda_s)
    return torch.cat([log_halt[..., :-1] + survive[..., :-1], survive[..., -1:]], dim=-1)


def exit_loss_sums(step_nll: torch.Tensor, halt_logits: torch.Tensor, *, beta: float,
                   smoothing: float) -> dict[str, torch.Tensor]:
    """The exit objective summed over target tokens, from per-token step losses
    ``step_nll`` and halt logits, both ``[n, T]``.

    004 Eq. 6: "L = sum_t p_t L_t - beta H(p)", with Eq. 2's smoothing "(1 - eps)
    sum_t p_t L_t + eps/T sum_t L_t" of the LM part only ("Gate regularization and
    inference still use the original exit probabilities"). Returns ``loss``, ``lm``
    (the smoothed LM part), ``entropy`` (H(p) summed) and ``p`` (``[T]``: p_t summed
    over tokens, for the collapse monitor).
    """
    log_p = exit_log_distribution(halt_logits.float())
    p = log_p.exp()
    steps = p.shape[-1]
    weights = (1.0 - smoothing) * p + smoothing / steps
    lm = (weights * step_nll).sum()
    entropy = -(p * log_p).sum()
    return {"loss": lm - beta * entropy, "lm": lm, "entropy": entropy, "p": p.detach().sum(0)}


def attach_gate(model: nn.Module, gate: ExitGate | None) -> None:
    """Keep ``gate`` with ``model``'s loop (``None`` removes it); it is not a submodule."""
    runtime = getattr(model, "_loopeval", None)
    if runtime is None:
        raise ValueError("attach_gate: the model has no loop; an exit gate reads the loop's steps")
    runtime.exit_gate = gate


def exit_gate(model: nn.Module) -> ExitGate | None:
    """The exit gate kept with ``model``'s loop, or ``None``."""
    runtime = getattr(model, "_loopeval", None)
    return getattr(runtime, "exit_gate", None) if runtime is not None else None


def save_gate(gate: ExitGate, folder: str | Path) -> Path:
    from safetensors.torch import save_file

    file = Path(folder) / EXIT_GATE_NAME
    save_file({k: v.detach().contiguous().cpu() for k, v in gate.state_dict().items()}, str(file))
    return file


def load_gate(folder: str | Path, *, hidden_size: int) -> ExitGate | None:
    """The exit gate stored in ``folder``, or ``None``; a file that does not fit the
    model's hidden size is a ``ValueError`` naming it."""
    file = Path(folder) / EXIT_GATE_NAME
    if not file.is_file():
        return None
    from safetensors.torch import load_file

    state = load_file(str(file))
    gate = ExitGate(hidden_size)
    try:
        gate.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(f"{file}: not an exit gate for hidden size {hidden_size} ({str(exc).splitlines()[0]})") from None
    return gate


def gate_parameters(hidden_size: int) -> int:
    """Parameters of an exit gate: ``hidden_size`` weights and a bias."""
    return hidden_size + 1
