"""The server of local-only training (``local.algorithm: local_sgd``, e.g.
``method=fedavg --set local.algorithm=local_sgd``): clients upload nothing and the global
model never changes; each client's own model is kept on the client
(fedgmr.training.client_methods.LocalClient) and scored by personalised evaluation. The
reference point below which federation does not pay."""

from __future__ import annotations

import dataclasses

import torch

from fedgmr.algorithm.maskinfo import frozen, memo
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy, _Entry
from fedgmr.strategy.messages import Assignment


class LocalOnlyStrategy(MaskedBufferedStrategy):
    """:class:`MaskedBufferedStrategy` that aggregates nothing: replies carry no values
    (an empty upload mask) and every aggregation keeps the global model."""

    def _assignment(self, client_id: int, version: int, level: int, density: float, mask: torch.Tensor,
                    changed: bool) -> Assignment:
        """Nothing travels either way: the client trains the model it keeps, starting from
        the run's initial weights, which it builds from the seed (as FedMD's clients do),
        so neither the download nor the upload takes bytes or virtual time."""
        a = super()._assignment(client_id, version, level, density, mask, changed)
        return dataclasses.replace(a, wire=dataclasses.replace(a.wire, models=()))

    def upload_mask(self, mask: torch.Tensor) -> torch.Tensor | None:
        return memo(mask, ("upload", "nothing"), lambda: frozen(torch.zeros_like(mask)))

    def _fuse(self, params: torch.Tensor, buffers: dict[str, torch.Tensor],
              used: list[_Entry]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.params, self.buffers


__all__ = ["LocalOnlyStrategy"]
