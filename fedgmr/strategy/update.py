"""An accepted update as the server strategy keeps it (:class:`Update`).

A module of its own so that the strategy, its plug-ins (:mod:`fedgmr.strategy.plugins`)
and every method's server half can name the type without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Update:
    """One client's accepted reply, validated and bounded, waiting in the buffer (or the
    arrivals of a step) for the next aggregation."""

    client_id: int
    version: int  # the model version the client was dispatched on
    mask: torch.Tensor  # the coordinates ``values`` hold
    values: torch.Tensor
    num_samples: int
    buffers: dict[str, torch.Tensor]
    num_processed: int
    density: float  # the client's ladder density when it was dispatched
    #: the reply's declared extras, as checked (not in checkpoints: a part that needs
    #: them after the step they arrived in keeps its own copy)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


__all__ = ["Update"]
