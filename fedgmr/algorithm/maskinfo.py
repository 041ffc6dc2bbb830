"""Cached facts about mask tensors (kept count, flat indices, per-model plans).

Level masks are shared by every client on the level and live for many server steps,
so counting them or listing their indices once per mask object (not once per use)
removes full passes over the parameter vector from the hot path. Entries are keyed by
object identity and hold a weak reference, so a replaced mask is simply forgotten.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Hashable, TypeVar

import torch

T = TypeVar("T")
_CACHE: dict[int, tuple[weakref.ref, dict[Hashable, Any]]] = {}


def memo(mask: torch.Tensor, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` once per (mask object, key); later calls return the cached value."""
    hit = _CACHE.get(id(mask))
    if hit is None or hit[0]() is not mask:
        if len(_CACHE) > 512:
            for dead in [k for k, v in _CACHE.items() if v[0]() is None]:
                del _CACHE[dead]
        hit = (weakref.ref(mask), {})
        _CACHE[id(mask)] = hit
    facts = hit[1]
    if key not in facts:
        facts[key] = compute()
    return facts[key]


def mask_indices(mask: torch.Tensor) -> torch.Tensor:
    """Flat indices of the True entries, ascending (cached per mask object)."""
    return memo(mask, "indices", lambda: torch.nonzero(mask.reshape(-1), as_tuple=False).squeeze(1))


def mask_count(mask: torch.Tensor) -> int:
    """Number of True entries (cached per mask object)."""
    return memo(mask, "count", lambda: int(mask.sum()))


def gather(flat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``flat[mask]`` using the cached indices; when every coordinate is kept this is
    ``flat`` itself (no copy)."""
    if mask_count(mask) == mask.numel():
        return flat
    return flat.index_select(0, mask_indices(mask))
