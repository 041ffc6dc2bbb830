"""What flows between a strategy and its clients, whatever the runtime."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch


@dataclass(frozen=True)
class Assignment:
    """What the server sends a client: a model version and the mask to train."""

    client_id: int
    version: int
    level: int
    density: float
    mask: torch.Tensor  # bool over the flat parameter vector (shared per level)
    consumes: Literal["model", "delta"] = "model"
    #: the mask differs from the one the client last held (first contact, restoration,
    #: refresh): the download must carry it; otherwise only values travel
    mask_changed: bool = True
    #: the coordinates the reply must carry (None: ``mask``); FedBN keeps BatchNorm local
    upload_mask: torch.Tensor | None = None
    #: full-length vectors sent beside the model, each counted on the wire at the mask
    #: (SCAFFOLD's server control variate ``c``)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    #: names of the vectors the reply must carry beside its values, at the same coordinates
    reply_extras: tuple[str, ...] = ()
    #: the model the job starts from, (params, buffers) (None: the global model); a
    #: clustered method sends each client a cluster model
    start: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None
    #: more models sent beside ``start``, each a whole model on the wire at the mask (IFCA:
    #: the other cluster models); the client trains the one with the lowest loss on its
    #: data and reports every loss (``Reply.extras["model_losses"]``, ``start`` first)
    alternatives: tuple[tuple[torch.Tensor, dict[str, torch.Tensor]], ...] = ()
    #: float32 scalars the reply carries beside its values, in the same payload, never scaled
    #: by network.model_size_mb (IFCA: one loss per model offered)
    reply_scalars: int = 0
    #: (values down, values up) when what travels is not the model on the mask but plain
    #: vectors (FedMD's logits): counted as they are, never scaled by network.model_size_mb
    wire_values: tuple[int, int] | None = None

    @property
    def reply_mask(self) -> torch.Tensor:
        """The coordinates of the reply's values."""
        return self.mask if self.upload_mask is None else self.upload_mask


@dataclass
class Reply:
    """What a client sends back.

    ``values`` are the trained weights (``kind="model"``) or the change from the
    downloaded model (``kind="delta"``) at the coordinates of ``mask`` - the assigned
    mask unless the client reports a smaller one.

    ``num_samples`` is the size of the client's training set (FedAvg's ``n_k``, the
    default aggregation weight); ``num_processed`` the samples its local steps went
    through (local steps x batch; ``aggregation.weighting: processed``). A client that
    does not report it is taken to have processed ``num_samples``.
    """

    client_id: int
    version: int
    values: torch.Tensor
    num_samples: int
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    kind: Literal["model", "delta"] = "model"
    mask: torch.Tensor | None = None
    loss: float = float("nan")
    val_score: float | None = None
    num_processed: int | None = None
    #: vectors beside ``values``, at the same coordinates (SCAFFOLD's ``delta_c``)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class StepReport:
    """Summary of one server step (aggregation)."""

    step: int
    used: list[int]
    staleness: list[int]
    weights: list[float]
    rejected_total: int
    #: server work beyond the aggregation, in virtual seconds (FedDF's distillation steps)
    server_seconds: float = 0.0
