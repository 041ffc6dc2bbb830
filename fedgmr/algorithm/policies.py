"""Sub-model policies: which coordinates a client at ladder level ``l`` trains.

A policy owns one mask per ladder level (clients on the same level share it). The
default :class:`MagnitudePolicy` builds nested magnitude masks from one global ranking
(SPEC 3.2); :class:`FullModelPolicy` gives everybody the whole model (FedAvg, FedAsync).
Structured policies for the baselines plug in through the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import torch

from fedgmr.algorithm.encoding import encoded_nbytes
from fedgmr.algorithm.masks import ims_increments, magnitude_ranking, nested_masks
from fedgmr.algorithm.params import ParamSpace
from fedgmr.registry import Registry


class SubmodelPolicy(ABC):
    """One mask per ladder level; masks of higher levels contain lower ones when
    ``nested`` is True (which is what IMS needs)."""

    name: str = "policy"
    nested: bool = True

    def __init__(self, space: ParamSpace, ladder: Sequence[float]) -> None:
        self.space = space
        self.ladder = tuple(float(r) for r in ladder)

    @abstractmethod
    def mask(self, level: int) -> torch.Tensor:
        """The bool mask (over the flat parameter vector) of a ladder level."""

    def refresh(self, step: int, params: torch.Tensor) -> bool:
        """Called after every server step; may recompute masks. Returns True if it did."""
        return False

    def payload_nbytes(self, kept: int) -> int:
        """Bytes on the wire for a sub-model of ``kept`` coordinates (values plus the
        smaller mask encoding). Structured policies override it: their slices need no mask."""
        return encoded_nbytes(self.space.numel, kept)

    def increments(self) -> list[torch.Tensor]:
        """IMS blocks: base mask plus the increment of every further level (cached
        until the level masks change)."""
        masks = [self.mask(l) for l in range(len(self.ladder))]
        key = tuple(id(m) for m in masks)
        cached = getattr(self, "_increments", None)
        if cached is None or cached[0] != key:
            self._increments = (key, masks, ims_increments(masks))  # masks kept alive: ids stay valid
        return self._increments[2]

    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(JSON-able state, tensors) for checkpoints."""
        return {}, {}

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        pass


class FullModelPolicy(SubmodelPolicy):
    """Every level is the full model."""

    name = "full"

    def __init__(self, space: ParamSpace, ladder: Sequence[float] = (1.0,)) -> None:
        super().__init__(space, ladder)
        self._full = torch.ones(space.numel, dtype=torch.bool)

    def mask(self, level: int) -> torch.Tensor:
        return self._full


class MagnitudePolicy(SubmodelPolicy):
    """Nested masks from one global |w| ranking with a per-layer floor.

    Parameters
    ----------
    space: the model's parameter layout.
    ladder: increasing densities, the last normally 1.0.
    params: the global model used for the initial ranking.
    floor: fraction of every prunable layer that is always kept.
    costs: optional per-layer cost dividing |w| (see :func:`layer_costs`).
    refresh_every: recompute the ranking every that many server steps (None: never).
    """

    name = "magnitude"

    def __init__(self, space: ParamSpace, ladder: Sequence[float], params: torch.Tensor,
                 floor: float = 0.02, costs: dict[str, float] | None = None,
                 refresh_every: int | None = None) -> None:
        super().__init__(space, ladder)
        self.floor = floor
        self.costs = costs
        self.refresh_every = refresh_every
        self._rebuild(params)

    def _rebuild(self, params: torch.Tensor) -> None:
        self.ranking = magnitude_ranking(params, self.space, self.floor, self.costs)
        self._masks = nested_masks(self.ranking, self.space, self.ladder, self.floor)

    def mask(self, level: int) -> torch.Tensor:
        return self._masks[level]

    def refresh(self, step: int, params: torch.Tensor) -> bool:
        if self.refresh_every and step > 0 and step % self.refresh_every == 0:
            self._rebuild(params)
            return True
        return False

    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        return {}, {"ranking": self.ranking}

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        self.ranking = tensors["ranking"].clone()
        self._masks = nested_masks(self.ranking, self.space, self.ladder, self.floor)


POLICIES: Registry = Registry("sub-model policy")
POLICIES.register("magnitude", MagnitudePolicy)
POLICIES.register("full", FullModelPolicy)
