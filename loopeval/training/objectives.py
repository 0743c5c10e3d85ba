"""Training objectives, as sums over a micro-batch's target tokens (the runner divides by
the global batch's target count, so neither processes nor micro-batches change them).

Targets are the positions whose label is not -100; position ``t`` predicts token ``t+1``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _targets(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits that predict a target token, ``[n, vocab]`` in float32, and those tokens."""
    keep = labels[:, 1:] != -100
    return logits[:, :-1][keep].float(), labels[:, 1:][keep]


def nll_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token negative log-likelihood of the target tokens."""
    predicted, tokens = _targets(logits, labels)
    return F.cross_entropy(predicted, tokens, reduction="sum")


def kl_and_nll_sums(teacher_logits: torch.Tensor, student_logits: torch.Tensor,
                    labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed ``KL(teacher || student)`` over the vocabulary per target position,
    ``sum_v p_teacher(v) * (log p_teacher(v) - log p_student(v))`` (exactly 0 where the
    two logits are equal), and the student's summed NLL, from one log-softmax of each."""
    teacher, _ = _targets(teacher_logits, labels)
    student, tokens = _targets(student_logits, labels)
    log_student = F.log_softmax(student, dim=-1)
    kl = F.kl_div(log_student, F.log_softmax(teacher, dim=-1), log_target=True, reduction="sum")
    return kl, -log_student.gather(1, tokens[:, None]).sum()
