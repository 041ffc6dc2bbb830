"""Standard image augmentation for the clients' local training (``training.augment``).

Each job augments its client's images afresh (random crops of the zero-padded image and
horizontal flips), drawn from the job's own seeded generator, so a run stays a function
of its config and seed on every executor. Pure function of (images, generator, options).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def augment_images(x: torch.Tensor, gen: torch.Generator, flip: bool = False, crop_padding: int = 0) -> torch.Tensor:
    """``x`` (N, C, H, W) with each image randomly cropped back to H x W from its copy
    zero-padded by ``crop_padding`` on every side, then flipped left-right with
    probability 1/2 when ``flip``; a new tensor (``x`` untouched)."""
    if x.dim() != 4:
        raise ValueError(f"image augmentation needs images (N, C, H, W), got shape {tuple(x.shape)}")
    if crop_padding < 0:
        raise ValueError(f"crop_padding must be >= 0, got {crop_padding}")
    n, c, h, w = x.shape
    out = x
    if crop_padding > 0:
        p = crop_padding
        padded = F.pad(x, (p, p, p, p))
        dy = torch.randint(0, 2 * p + 1, (n,), generator=gen)
        dx = torch.randint(0, 2 * p + 1, (n,), generator=gen)
        rows = (dy[:, None] + torch.arange(h)[None, :]).to(x.device)
        cols = (dx[:, None] + torch.arange(w)[None, :]).to(x.device)
        out = padded[torch.arange(n, device=x.device)[:, None, None, None],
                     torch.arange(c, device=x.device)[None, :, None, None],
                     rows[:, None, :, None], cols[:, None, None, :]]
    if flip:
        mirror = (torch.rand(n, generator=gen) < 0.5).to(x.device)
        out = torch.where(mirror[:, None, None, None], out.flip(-1), out)
    return out.clone() if out is x else out
