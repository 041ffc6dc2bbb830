"""Local training on each client: SGD and its schedule and augmentation (``training``), the
client half of a method (``local``) and FedMRL's models (``fedmrl``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fedgmr.config.base import Section


class LRScheduleConfig(Section):
    """The clients' learning rate over the server's model versions (fedgmr.training.schedules):
    ``constant``; ``step``: x ``gamma`` every ``step_every`` versions; ``cosine``: from
    ``training.lr`` down to ``min_lr`` over ``total_steps`` versions."""

    kind: Literal["constant", "step", "cosine"] = "constant"
    step_every: int = Field(100, ge=1)
    gamma: float = Field(0.5, gt=0, le=1)
    total_steps: int | None = Field(None, ge=1)
    min_lr: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _cosine_needs_a_length(self) -> "LRScheduleConfig":
        if self.kind == "cosine" and self.total_steps is None:
            raise ValueError("a cosine schedule needs training.lr_schedule.total_steps (server steps)")
        return self


class AugmentConfig(Section):
    """Image augmentation in local training (fedgmr.training.augment): each job crops every
    image from its copy zero-padded by ``crop_padding`` pixels and flips it left-right with
    probability 1/2 (``flip``), drawn from the job's own seed."""

    flip: bool = False
    crop_padding: int = Field(0, ge=0, le=64)


class TrainingConfig(Section):
    """Local SGD on each client.

    clip_grad_norm: clip each local step's gradient (on the client's mask, after any
        FedProx/SCAFFOLD term) to this L2 norm, as ``torch.nn.utils.clip_grad_norm_``
        does; null: the method's default (no clipping, except HeteroFL and FedRolex,
        whose published code clips at 1); 0: no clipping.
    """

    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(20, ge=1)
    local_steps: int = Field(5, ge=1)
    loss: Literal["ce", "bce"] = "ce"
    clip_grad_norm: float | None = Field(None, ge=0)
    lr_schedule: LRScheduleConfig = Field(default_factory=LRScheduleConfig)
    augment: AugmentConfig = Field(default_factory=AugmentConfig)


class LocalConfig(Section):
    """The client half of a method (fedgmr.training.client_methods; docs/methods/).

    algorithm: ``sgd`` (masked local SGD), ``fedprox``, ``scaffold``, ``ditto`` or
        ``fedbn`` (the registry ``CLIENT_METHODS``).
    prox_mu: FedProx's mu (docs/methods/fedprox.md).
    ditto_lambda: Ditto's lambda; personal_steps: its steps on the personal model per job
        (null: ``training.local_steps``).
    server_lr: SCAFFOLD's global step size eta_g.
    stragglers: FedProx's straggler model, for every method: this fraction of jobs runs a
        random number of local steps in [1, E) and is still aggregated.
    options: keyword options of the registered client method (FedDyn's ``alpha``); names
        are checked against its factory's signature, values by the factory
        (:func:`fedgmr.training.client_methods.client_method`).
    """

    algorithm: str = "sgd"
    prox_mu: float = Field(0.01, ge=0)
    ditto_lambda: float = Field(1.0, ge=0)
    personal_steps: int | None = Field(None, ge=1)
    server_lr: float = Field(1.0, gt=0)
    stragglers: float = Field(0.0, ge=0, le=1)
    options: dict[str, Any] = Field(default_factory=dict)


class FedMRLConfig(Section):
    """FedMRL (``local.algorithm: fedmrl``; docs/methods/fedmrl.md). The model
    (``model.name``, a representation model such as ``rep_cnn``) gives the architecture
    family of both the shared small model G and each client's local model F_i.

    d1: G's representation size: the Matryoshka prefix of the fused representation that
        G's head reads.
    d2: the large representation: each F_i's representation size, the projector's output
        and what F_i's head reads (d1 <= d2).
    g_width: G's width rate (its hidden sizes; the same G on every client).
    widths: F_i's width rate; client i takes ``widths[i mod len]`` (also ``standalone``'s
        model per client).
    """

    d1: int = Field(20, ge=1)
    d2: int = Field(100, ge=1)
    g_width: float = Field(0.25, gt=0, le=1)
    widths: list[float] = Field(default_factory=lambda: [1.0, 0.75, 0.5, 0.375, 0.25])

    @field_validator("widths")
    @classmethod
    def _widths(cls, v: list[float]) -> list[float]:
        if not v or any(not 0 < w <= 1 for w in v):
            raise ValueError("must list one or more width rates in (0, 1]")
        return v

    @model_validator(mode="after")
    def _prefix(self) -> "FedMRLConfig":
        if self.d1 > self.d2:
            raise ValueError(f"fedmrl.d1 ({self.d1}) must be at most fedmrl.d2 ({self.d2}): G's head reads a prefix "
                             f"of the d2-dimensional fused representation")
        return self
