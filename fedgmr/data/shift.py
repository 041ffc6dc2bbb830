"""Feature-shifted clients (FedBN's setting): every client sees its images under one fixed
transform (``data.feature_shift``), its training, validation and test samples alike.

A transform is ``shift(x, lo, hi, gen) -> x'`` on a batch of images ``(N, C, H, W)``
(``lo``/``hi``: the data set's value range, so a transform stays in it; ``gen``: a seeded
generator for random ones). Register your own in :data:`FEATURE_SHIFTS`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedgmr.errors import ConfigError
from fedgmr.registry import Registry

Shift = Callable[[torch.Tensor, float, float, torch.Generator], torch.Tensor]

#: feature transforms by name
FEATURE_SHIFTS: Registry[Shift] = Registry("feature shift")


def _none(x: torch.Tensor, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return x


def _invert(x: torch.Tensor, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return (lo + hi) - x


def _rotate(x: torch.Tensor, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    if x.shape[-1] != x.shape[-2]:
        return torch.flip(x, dims=(-1, -2))  # 180 degrees where 90 would change the shape
    return torch.rot90(x, 1, dims=(-2, -1))


def _noise(x: torch.Tensor, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    noise = torch.randn(x.shape, generator=gen, dtype=x.dtype) * (0.25 * (hi - lo))
    return (x + noise).clamp(lo, hi)


def _blur(x: torch.Tensor, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    c = x.shape[1]
    kernel = torch.ones(c, 1, 3, 3, dtype=x.dtype) / 9.0
    return F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), kernel, groups=c)


def _low_contrast(x: torch.Tensor, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    mid = 0.5 * (lo + hi)
    return mid + 0.3 * (x - mid)


for _name, _fn in (("none", _none), ("invert", _invert), ("rotate", _rotate), ("noise", _noise), ("blur", _blur),
                   ("low_contrast", _low_contrast)):
    FEATURE_SHIFTS.register(_name, _fn)


def _exact_rotation(quarter_turns: int) -> Shift:
    """Counter-clockwise rotation by ``quarter_turns`` x 90 degrees, exact (``torch.rot90``;
    square images only: the clustered-FL rotated-MNIST setting, docs/methods/ifca.md)."""

    def rotate(x: torch.Tensor, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
        if x.shape[-1] != x.shape[-2]:
            raise ConfigError(f"feature shift 'rot{90 * quarter_turns}' needs square images, got "
                              f"{tuple(x.shape[-2:])}")
        return torch.rot90(x, quarter_turns, dims=(-2, -1))

    return rotate


for _k in range(4):  # rot0 (the identity), rot90, rot180, rot270
    FEATURE_SHIFTS.register(f"rot{90 * _k}", _exact_rotation(_k))


def _generator(seed: int, stream: int, index: int) -> torch.Generator:
    state = np.random.SeedSequence([int(seed), 0x5F1F7, stream, index]).generate_state(1, dtype=np.uint32)[0]
    return torch.Generator().manual_seed(int(state))


def apply_shift(name: str, x: torch.Tensor, lo: float, hi: float, seed: int, stream: int, index: int) -> torch.Tensor:
    """``x`` (images ``(N, C, H, W)``) under the shift ``name``, random draws seeded by
    (seed, stream, index): the same images for every run of a seed."""
    if x.ndim != 4 or not x.is_floating_point():
        raise ConfigError(f"data.feature_shift needs image data (N, C, H, W floats); this data set's samples have "
                          f"shape {tuple(x.shape[1:])} and dtype {x.dtype}")
    if len(x) == 0:
        return x
    return FEATURE_SHIFTS.get(name)(x, lo, hi, _generator(seed, stream, index)).to(x.dtype)


def shift_by_client(shifts: Sequence[str], parts: list[torch.Tensor], lo: float, hi: float, seed: int,
                    stream: int) -> list[torch.Tensor]:
    """Client ``i``'s tensor under ``shifts[i mod len]`` (``stream`` tells splits apart)."""
    return [apply_shift(shifts[i % len(shifts)], x, lo, hi, seed, stream, i) for i, x in enumerate(parts)]


def shift_cycling(shifts: Sequence[str], x: torch.Tensor, lo: float, hi: float, seed: int,
                  stream: int) -> torch.Tensor:
    """A shared split (global test, server validation): sample ``j`` under ``shifts[j mod len]``."""
    out = x.clone()
    for k, name in enumerate(shifts):
        idx = torch.arange(k, len(x), len(shifts))
        out[idx] = apply_shift(name, x[idx], lo, hi, seed, stream, k)
    return out


__all__ = ["FEATURE_SHIFTS", "apply_shift", "shift_by_client", "shift_cycling"]
