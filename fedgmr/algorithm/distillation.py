"""The math of federated distillation, as pure functions (docs/methods/feddf.md, fedmd.md).

* FedDF's teacher: the temperature-softened *mean* of the teachers' logits,
  ``p = softmax(mean_k z_k / T)``;
* the distillation loss: ``T^2 KL(p || softmax(z_s / T))`` averaged over the batch
  (Hinton et al.'s ``T^2`` keeps the gradient's scale independent of ``T``), or the
  mean squared error between the softened probabilities (FedMD's ``mse``);
* FedMD's consensus: the mean of the clients' logits on the public set.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
import torch.nn.functional as F

DistillLoss = Literal["kl", "mse"]


def ensemble_targets(teacher_logits: Sequence[torch.Tensor], temperature: float) -> torch.Tensor:
    """``softmax(mean_k z_k / T)`` over the last dimension: FedDF's averaged teacher."""
    if not teacher_logits:
        raise ValueError("distillation needs at least one teacher")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    mean = torch.stack([z.float() for z in teacher_logits]).mean(dim=0)
    return torch.softmax(mean / temperature, dim=-1)


def consensus(logits: Sequence[torch.Tensor]) -> torch.Tensor:
    """FedMD's consensus: the plain mean of the clients' logits (one tensor each, same shape)."""
    if not logits:
        raise ValueError("a consensus needs at least one client's logits")
    return torch.stack([z.float() for z in logits]).mean(dim=0)


def distill_loss(student_logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                 kind: DistillLoss = "kl") -> torch.Tensor:
    """Loss of ``student_logits`` (batch, classes) against soft ``targets`` (probabilities).

    ``kl``: ``T^2 * mean_batch KL(targets || softmax(z_s / T))``;
    ``mse``: ``mean over batch and classes of (softmax(z_s / T) - targets)^2``.
    """
    if kind == "kl":
        log_q = F.log_softmax(student_logits / temperature, dim=-1)
        kl = F.kl_div(log_q, targets, reduction="batchmean")
        return kl * temperature ** 2
    if kind == "mse":
        return F.mse_loss(torch.softmax(student_logits / temperature, dim=-1), targets)
    raise ValueError(f"unknown distillation loss {kind!r} (known: kl, mse)")


def batch_indices(n: int, batch_size: int, steps: int, gen: torch.Generator) -> list[torch.Tensor]:
    """``steps`` batches of ``min(batch_size, n)`` indices into ``n`` samples, without
    replacement within a pass over them (reshuffled after each pass), from ``gen``."""
    bs = min(batch_size, n)
    out: list[torch.Tensor] = []
    perm, pos = torch.randperm(n, generator=gen), 0
    for _ in range(steps):
        if pos + bs > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        out.append(perm[pos:pos + bs])
        pos += bs
    return out


__all__ = ["DistillLoss", "ensemble_targets", "consensus", "distill_loss", "batch_indices"]
