"""Core data containers shared by every loader.

A loader returns a :class:`FederatedData`: train and test tensors, the number of
classes, and - for data with natural users (LEAF writers, Shakespeare roles) - the
natural client split as index arrays into ``train``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

Task = Literal["classification", "next_token"]


@dataclass
class ArrayDataset:
    """Inputs ``x`` and targets ``y`` as tensors with a shared first dimension."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} rows but y has {len(self.y)}")

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, indices: np.ndarray | torch.Tensor) -> "ArrayDataset":
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        return ArrayDataset(self.x[idx], self.y[idx])


@dataclass
class FederatedData:
    """A data set ready for federated training.

    Attributes
    ----------
    name: data set name (for logs).
    train, test: the two splits. Validation data is carved from ``train`` by the
        partitioner; ``test`` is only ever used for reporting.
    num_classes: number of classes (vocabulary size for ``next_token`` tasks).
    task: ``classification`` (y is a class per sample) or ``next_token``
        (y is a sequence of token ids; ``pad_index`` tokens are ignored).
    natural_clients: optional natural split (writers, roles, users): one index
        array into ``train`` per client.
    pad_index: padding token id for ``next_token`` tasks.
    """

    name: str
    train: ArrayDataset
    test: ArrayDataset
    num_classes: int
    task: Task = "classification"
    natural_clients: list[np.ndarray] | None = None
    pad_index: int | None = None
    meta: dict = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train.x.shape[1:])
