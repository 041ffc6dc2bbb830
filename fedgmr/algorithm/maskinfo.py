"""Cached facts about mask tensors (kept count, flat indices).

Level masks are shared by every client on the level and live for many server steps,
so counting them or listing their indices once per mask object (not once per use)
removes full passes over the parameter vector from the hot path. Entries are keyed by
object identity and hold a weak reference, so a replaced mask is simply forgotten.
"""

from __future__ import annotations

import weakref

import torch

_CACHE: dict[int, tuple[weakref.ref, int, torch.Tensor | None]] = {}


def _lookup(mask: torch.Tensor) -> tuple[int, torch.Tensor | None] | None:
    hit = _CACHE.get(id(mask))
    if hit is not None and hit[0]() is mask:
        return hit[1], hit[2]
    return None


def _store(mask: torch.Tensor, count: int, indices: torch.Tensor | None) -> None:
    if len(_CACHE) > 512:
        for key in [k for k, v in _CACHE.items() if v[0]() is None]:
            del _CACHE[key]
    _CACHE[id(mask)] = (weakref.ref(mask), count, indices)


def mask_count(mask: torch.Tensor) -> int:
    """Number of True entries (cached per mask object)."""
    hit = _lookup(mask)
    if hit is not None:
        return hit[0]
    count = int(mask.sum())
    _store(mask, count, None)
    return count


def mask_indices(mask: torch.Tensor) -> torch.Tensor:
    """Flat indices of the True entries, ascending (cached per mask object)."""
    hit = _lookup(mask)
    if hit is not None and hit[1] is not None:
        return hit[1]
    idx = torch.nonzero(mask.reshape(-1), as_tuple=False).squeeze(1)
    _store(mask, int(idx.numel()), idx)
    return idx


def gather(flat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``flat[mask]`` using the cached indices; when every coordinate is kept this is
    ``flat`` itself (no copy)."""
    if mask_count(mask) == mask.numel():
        return flat
    return flat.index_select(0, mask_indices(mask))
