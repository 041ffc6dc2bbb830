"""The server of local-only training (``local.algorithm: local_sgd``, e.g.
``method=fedavg --set local.algorithm=local_sgd``): clients upload nothing and the global
model never changes; each client's own model is kept on the client
(fedgmr.training.client_methods.LocalClient) and scored by personalised evaluation. The
reference point below which federation does not pay."""

from __future__ import annotations

import dataclasses

import torch

from fedgmr.algorithm.maskinfo import frozen, memo
from fedgmr.strategy.update import Update
from fedgmr.strategy.messages import Assignment
from fedgmr.strategy.plugins import ServerPlugin


class LocalOnly(ServerPlugin):
    """A plug-in that makes the strategy aggregate nothing: replies carry no values (an
    empty upload mask) and every aggregation keeps the global model."""

    name = "local-only training"

    def wire(self, a: Assignment) -> Assignment:
        """Nothing travels either way: the client trains the model it keeps, starting from
        the run's initial weights, which it builds from the seed (as FedMD's clients do),
        so neither the download nor the upload takes bytes or virtual time."""
        mask = a.mask
        nothing = memo(mask, ("upload", "nothing"), lambda: frozen(torch.zeros_like(mask)))
        return dataclasses.replace(a, wire=dataclasses.replace(a.wire, models=(), reply_coords=nothing))

    def fuse(self, params: torch.Tensor, buffers: dict[str, torch.Tensor],
             used: list[Update]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.strategy.params, self.strategy.buffers


__all__ = ["LocalOnly"]
