"""What flows between a strategy and its clients, whatever the runtime."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch


#: a model as it travels: its flat parameter vector and its buffers
Model = tuple[torch.Tensor, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class Wire:
    """What one assignment puts on the wire, each way, in terms no method owns.

    The simulator's byte count (:mod:`fedgmr.strategy.wire`) and the Flower payload read
    this and nothing else: a method says what it sends by filling these fields, never by
    adding one. Down: the model(s) at the assignment's mask, the vectors beside them at the
    same coordinates, and vectors sent whole. Up: the values at the reply's coordinates,
    the named vectors beside them, and a count of float32 values sent whole.
    """

    #: the models sent, each whole at the mask; the job starts from the first and, given
    #: several, trains the one with the lowest loss on its data (IFCA's cluster models).
    #: None: the global model; ``()``: none travels (the client trains a model it keeps)
    models: tuple[Model, ...] | None = None
    #: full-length vectors sent beside the model, each at the mask (SCAFFOLD's ``c``)
    beside: dict[str, torch.Tensor] = field(default_factory=dict)
    #: vectors sent whole, not at the mask (FedMD's consensus logits)
    plain: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the coordinates of the reply's values (None: the mask); FedBN keeps BatchNorm local
    reply_coords: torch.Tensor | None = None
    #: names of the vectors the reply carries beside its values, at the same coordinates
    #: (SCAFFOLD's ``delta_c``)
    reply_beside: tuple[str, ...] = ()
    #: float32 values the reply carries whole, beside its values, in all: never scaled by
    #: network.model_size_mb (IFCA: one loss per model offered; FedNova: tau; FedMD: logits)
    reply_plain: int = 0

    @property
    def vectors(self) -> dict[str, torch.Tensor]:
        """Every vector sent down, by name (what the client's job reads in ``extras``)."""
        return {**self.beside, **self.plain}


@dataclass(frozen=True)
class Assignment:
    """What the server sends a client: a model version and the mask to train, and what
    travels with them (:class:`Wire`)."""

    client_id: int
    version: int
    level: int
    density: float
    mask: torch.Tensor  # bool over the flat parameter vector (shared per level)
    consumes: Literal["model", "delta"] = "model"
    #: the mask differs from the one the client last held (first contact, restoration,
    #: refresh): the download must carry it; otherwise only values travel
    mask_changed: bool = True
    #: what travels each way beside the version and the mask
    wire: Wire = field(default_factory=Wire)

    @property
    def reply_mask(self) -> torch.Tensor:
        """The coordinates of the reply's values."""
        return self.mask if self.wire.reply_coords is None else self.wire.reply_coords


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
