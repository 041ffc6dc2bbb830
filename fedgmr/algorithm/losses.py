"""Loss functions for the supported tasks."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def task_loss(logits: torch.Tensor, y: torch.Tensor, task: str, loss: str = "ce",
              pad_index: int | None = None, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy (default) or BCE-with-logits on one-hot labels (the authors' choice
    for image tasks). For ``next_token`` tasks padding targets are ignored."""
    if task == "next_token":
        ignore = -100 if pad_index is None else pad_index
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                               ignore_index=ignore, reduction=reduction)
    if loss == "bce":
        target = F.one_hot(y, logits.shape[-1]).to(logits.dtype)
        out = F.binary_cross_entropy_with_logits(logits, target, reduction="none").sum(-1)
        return out.mean() if reduction == "mean" else out.sum()
    return F.cross_entropy(logits, y, reduction=reduction)
