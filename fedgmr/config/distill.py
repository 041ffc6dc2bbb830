"""Federated distillation (``distill``) and its proxy data (``distill.proxy``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from fedgmr.config.base import Section


class ProxyConfig(Section):
    """Unlabelled proxy / public data for federated distillation: ``size`` samples of a
    registered data set's ``split`` from sample ``offset`` on (labels are never used).
    ``offset`` keeps an in-domain proxy apart from the samples the clients train on (the
    mnist preset trains on the first 20,000 MNIST training images: ``offset: 20000``)."""

    name: str | None = None
    root: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    split: Literal["train", "test"] = "train"
    size: int = Field(1000, ge=1)
    offset: int = Field(0, ge=0)


class DistillConfig(Section):
    """Federated distillation (docs/methods/feddf.md, docs/methods/fedmd.md).

    server: FedDF's server-side ensemble distillation after every ``every``-th aggregation.
    proxy: the unlabelled proxy (FedDF) / public (FedMD) data.
    temperature, steps, batch_size, lr: the distillation (Adam, a fresh optimiser each time):
        server steps per distillation (FedDF) or digest steps per client job (FedMD).
    loss: ``kl`` (T^2 KL to the soft targets) or ``mse`` (on the softened probabilities; FedMD only).
    val_every, patience: FedDF's early stopping on the server's validation split (null: off).
    seconds_per_step: virtual seconds one server distillation step adds to the aggregation
        (0: free, as FedDF's paper assumes).
    """

    server: bool = False
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    temperature: float = Field(1.0, gt=0)
    steps: int = Field(20, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0)
    loss: Literal["kl", "mse"] = "kl"
    every: int = Field(1, ge=1)
    val_every: int | None = Field(None, ge=1)
    patience: int = Field(2, ge=1)
    seconds_per_step: float = Field(0.0, ge=0)
