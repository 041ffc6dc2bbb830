"""Cached facts about mask tensors (kept count, flat indices, per-model plans).

Level masks are shared by every client on the level and live for many server steps,
so counting them or listing their indices once per mask object (not once per use)
removes full passes over the parameter vector from the hot path. Entries are keyed by
object identity and hold a weak reference, so a replaced mask is simply forgotten.

A mask is immutable once its facts are cached: every entry remembers the tensor's
in-place version counter (``Tensor._version``, which PyTorch bumps on every in-place
write), and a mask written in place afterwards raises :class:`MaskMutatedError` at its
next use instead of silently serving the old coordinates. Build a new mask instead.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Hashable, TypeVar

import numpy as np
import torch

from fedgmr.errors import FedGMRError

T = TypeVar("T")
_CACHE: dict[int, tuple[weakref.ref, int, dict[Hashable, Any]]] = {}


class MaskMutatedError(FedGMRError, ValueError):
    """A mask was written in place after facts about it were cached."""


def _entry(mask: torch.Tensor) -> tuple[weakref.ref, int, dict[Hashable, Any]]:
    hit = _CACHE.get(id(mask))
    if hit is None or hit[0]() is not mask:
        if len(_CACHE) > 512:
            for dead in [k for k, v in _CACHE.items() if v[0]() is None]:
                del _CACHE[dead]
        hit = (weakref.ref(mask), mask._version, {})
        _CACHE[id(mask)] = hit
    elif hit[1] != mask._version:
        raise MaskMutatedError(
            f"a mask of {mask.numel()} coordinates was modified in place after it was first used; masks are "
            f"immutable (they are shared and their indices cached): build a new mask tensor instead")
    return hit


def frozen(mask: torch.Tensor) -> torch.Tensor:
    """Register ``mask`` as immutable from now on and return it: any later in-place
    write makes its next use raise :class:`MaskMutatedError`."""
    _entry(mask)
    return mask


def memo(mask: torch.Tensor, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` once per (mask object, key); later calls return the cached value.
    Raises :class:`MaskMutatedError` if the mask was written in place since first use."""
    facts = _entry(mask)[2]
    if key not in facts:
        facts[key] = compute()
    return facts[key]


def _indices(mask: torch.Tensor) -> torch.Tensor:
    flat = mask.reshape(-1)
    if flat.device.type == "cpu" and flat.dtype == torch.bool:
        # numpy's flatnonzero: the same ascending int64 indices, ~8x faster than torch.nonzero
        # on a CPU bool vector (23 ms against 3 ms on 6.5 M coordinates)
        return torch.from_numpy(np.flatnonzero(flat.numpy())).to(torch.int64)
    return torch.nonzero(flat, as_tuple=False).squeeze(1)


def mask_indices(mask: torch.Tensor) -> torch.Tensor:
    """Flat indices of the True entries, ascending (cached per mask object)."""
    return memo(mask, "indices", lambda: _indices(mask))


def _count(mask: torch.Tensor) -> int:
    # a bool sum accumulates in int64 through a cast: count_nonzero is ~20x faster (same count)
    return int(torch.count_nonzero(mask)) if mask.dtype == torch.bool else int(mask.sum())


def mask_count(mask: torch.Tensor) -> int:
    """Number of True entries (cached per mask object)."""
    return memo(mask, "count", lambda: _count(mask))


def gather(flat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``flat[mask]`` using the cached indices; when every coordinate is kept this is
    ``flat`` itself (no copy)."""
    if mask_count(mask) == mask.numel():
        return flat
    return flat.index_select(0, mask_indices(mask))
