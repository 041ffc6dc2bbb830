"""FedMRL's forward and loss, pure functions (docs/methods/fedmrl.md).

With the shared small model's representation ``r_G`` (``d1`` values) and the client's
heterogeneous model's ``r_F`` (``d2`` values), the personal projector ``P`` (a linear map
``R^(d1+d2) -> R^d2``) fuses them, and the two heads read nested prefixes of the result
(Matryoshka representations):

    r~ = P([r_G ; r_F])
    z_G = head_G(r~[:d1])        (the shared model's head: the coarse prefix)
    z_F = head_F(r~)             (the local model's head: all of it)
    loss = CE(z_G, y) + CE(z_F, y)
"""

from __future__ import annotations

from typing import Callable

import torch

from fedgmr.algorithm.losses import task_loss

Layer = Callable[[torch.Tensor], torch.Tensor]


def fuse(rep_g: torch.Tensor, rep_f: torch.Tensor, projector: Layer) -> torch.Tensor:
    """``P([r_G ; r_F])``: the projector over the concatenated representations (G's first)."""
    return projector(torch.cat([rep_g, rep_f], dim=1))


def matryoshka_logits(fused: torch.Tensor, head_g: Layer, head_f: Layer, d1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(``head_G(r~[:, :d1])``, ``head_F(r~)``) for the fused representation ``r~``."""
    if not 0 < d1 <= fused.shape[1]:
        raise ValueError(f"d1 must be in [1, {fused.shape[1]}] (the fused representation's size), got {d1}")
    return head_g(fused[:, :d1]), head_f(fused)


def mrl_loss(logits_g: torch.Tensor, logits_f: torch.Tensor, y: torch.Tensor, task: str = "classification",
             loss: str = "ce", pad_index: int | None = None) -> torch.Tensor:
    """The summed loss of both heads (each a batch mean)."""
    return task_loss(logits_g, y, task, loss, pad_index) + task_loss(logits_f, y, task, loss, pad_index)


__all__ = ["fuse", "matryoshka_logits", "mrl_loss"]
