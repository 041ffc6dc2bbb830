"""Sub-model policies: which coordinates a client at ladder level ``l`` trains.

A policy owns one mask per ladder level (clients on the same level share it). The
default :class:`MagnitudePolicy` builds nested magnitude masks from one global ranking
(docs/reference.md §3.2); :class:`FullModelPolicy` gives everybody the whole model (FedAvg, FedAsync).
Structured policies for the baselines plug in through the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import logging

import torch

from fedgmr.algorithm.encoding import mask_code_nbytes
from fedgmr.algorithm.maskinfo import frozen, mask_count
from fedgmr.algorithm.masks import (floor_sets_size, ims_increments, magnitude_ranking, nested_masks,
                                    nested_ranked_masks)
from fedgmr.algorithm.params import ParamSpace
from fedgmr.registry import Registry

log = logging.getLogger(__name__)


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

    def client_mask(self, client_id: int, level: int, params: torch.Tensor) -> torch.Tensor:
        """The mask client ``client_id`` on ladder level ``level`` is dispatched with now,
        ``params`` being the global model it receives. Default: the level's shared mask; a
        per-client policy (``submodel.per_client``) draws each client its own."""
        return self.mask(level)

    def refresh(self, step: int, params: torch.Tensor) -> bool:
        """Called after every server step; may recompute masks. Returns True if it did."""
        return False

    def observe(self, masks: Sequence[torch.Tensor]) -> None:
        """Called at every aggregation, before :meth:`refresh`, with the masks of the
        updates it used (a coverage-driven policy keeps their history)."""

    def code_nbytes(self, mask: torch.Tensor) -> int:
        """Bytes that tell a client which coordinates ``mask`` holds (sent with a download
        only when the client's mask changed). Default: the entropy-near mask code of
        :func:`~fedgmr.algorithm.encoding.encode_mask`; structured policies override it
        with their shape description."""
        return mask_code_nbytes(mask)

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
    """Every level is the full model (its mask on ``device``, the global model's)."""

    name = "full"

    def __init__(self, space: ParamSpace, ladder: Sequence[float] = (1.0,),
                 device: torch.device | str = "cpu") -> None:
        super().__init__(space, ladder)
        self._full = frozen(torch.ones(space.numel, dtype=torch.bool, device=device))

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
    basis: what a density counts, ``model`` or ``prunable`` (see :func:`prefix_length`).
    """

    name = "magnitude"

    def __init__(self, space: ParamSpace, ladder: Sequence[float], params: torch.Tensor,
                 floor: float = 0.02, costs: dict[str, float] | None = None,
                 refresh_every: int | None = None, basis: str = "model") -> None:
        super().__init__(space, ladder)
        self.floor = floor
        self.costs = costs
        self.refresh_every = refresh_every
        self.basis = basis
        self._rebuild(params)
        sizes = [mask_count(m) for m in self._masks]
        same = [(a, b) for (a, b), (x, y) in zip(zip(self.ladder, self.ladder[1:]), zip(sizes, sizes[1:])) if x == y]
        floored = [(d, m) for d, m in zip(self.ladder, self._masks) if floor_sets_size(space, d, floor, basis)]
        if floored:
            kept = space.numel - space.num_prunable
            held = [mask_count(m) / space.numel if basis == "model" else (mask_count(m) - kept) / space.num_prunable
                    for _, m in floored]
            log.warning("density level(s) %s hold more than asked for (%s of the %s): the per-layer floor "
                        "(submodel.layer_floor %g) keeps %g of every prunable layer%s, and that is the smallest "
                        "mask there is; every prunable layer holds just its floor (fedgmr masks shows each layer)",
                        ", ".join(f"{d:g}" for d, _ in floored), ", ".join(f"{h:.4f}" for h in held),
                        "model" if basis == "model" else "prunable weights", floor, floor,
                        " and the always-kept coordinates come on top" if basis == "model" else "")
        if same:
            kept = space.numel - space.num_prunable
            log.warning("density levels %s give identical masks: the always-kept coordinates (output layer, "
                        "biases, norms) are %.1f%% of the model and the per-layer floor sets the rest; "
                        "submodel.density_basis 'prunable' counts densities over the prunable weights only",
                        ", ".join(f"{a:g}={b:g}" for a, b in same), 100.0 * kept / space.numel)

    def _masks_of(self, ranking: torch.Tensor) -> list[torch.Tensor]:
        return [frozen(m) for m in nested_masks(ranking, self.space, self.ladder, self.floor, self.basis)]

    def _rebuild(self, params: torch.Tensor) -> None:
        # the level masks by one selection per level (the masks of the full ranking, bit for
        # bit); the ranking itself is built only when asked for, from a copy of the weights
        self._ranked = params.detach().clone()
        self._ranking: torch.Tensor | None = None
        self._masks = [frozen(m) for m in nested_ranked_masks(self._ranked, self.space, self.ladder, self.floor,
                                                              self.basis, self.costs)]

    @property
    def ranking(self) -> torch.Tensor:
        """The global ranking of the prunable coordinates the level masks are prefixes of
        (:func:`~fedgmr.algorithm.masks.magnitude_ranking`), built on first use."""
        if self._ranking is None:
            self._ranking = magnitude_ranking(self._ranked, self.space, self.floor, self.costs)
        return self._ranking

    def mask(self, level: int) -> torch.Tensor:
        return self._masks[level]

    def refresh(self, step: int, params: torch.Tensor) -> bool:
        if self.refresh_every and step > 0 and step % self.refresh_every == 0:
            self._rebuild(params)
            return True
        return False

    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        if self._ranked is None:  # loaded from an older checkpoint: the ranking is the state
            return {}, {"ranking": self.ranking}
        return {}, {"ranking_weights": self._ranked}  # the masks are rebuilt from them

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        device = self._masks[0].device  # a checkpoint's tensors are on the CPU
        if "ranking_weights" in tensors:
            self._rebuild(tensors["ranking_weights"].to(device))
            return
        # an older checkpoint holds the ranking itself
        self._ranked = None
        self._ranking = tensors["ranking"].to(device, copy=True)
        self._masks = self._masks_of(self._ranking)


POLICIES: Registry = Registry("sub-model policy")
POLICIES.register("magnitude", MagnitudePolicy)
POLICIES.register("full", FullModelPolicy)

# the online extraction policies (random, rolling, coverage_max) register themselves in
# POLICIES from fedgmr.algorithm.extraction, which the experiment builder imports
