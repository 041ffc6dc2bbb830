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

from fedgmr.errors import DatasetFormatError

Task = Literal["classification", "next_token"]


def check_labels(labels: object, num_classes: int | None, where: str, layout: str = "") -> np.ndarray:
    """Class labels as int64, or :class:`DatasetFormatError` naming ``where`` (a file, a
    user) and the first offending label: labels must be whole numbers (``3`` or ``3.0``,
    never ``1.5``, NaN or ``true``) in ``0 .. num_classes - 1`` (``>= 0`` when None)."""
    tail = f"; {layout}" if layout else ""
    try:
        raw = np.asarray(labels)
    except (TypeError, ValueError) as exc:
        raise DatasetFormatError(f"{where}: labels are not a flat list of class ids ({exc}){tail}") from None
    if raw.size == 0:
        return raw.astype(np.int64).reshape(0)
    if raw.dtype.kind not in "iuf":
        first = raw.flat[0] if raw.dtype.kind == "b" else next(
            (v for v in raw.flat if isinstance(v, bool) or not isinstance(v, (int, float, np.number))), raw.flat[0])
        raise DatasetFormatError(f"{where}: labels must be integer class ids, found {first!r}{tail}")
    if raw.dtype.kind == "f":
        bad = ~np.isfinite(raw) | (raw != np.round(raw))
        if bad.any():
            value = raw.flat[int(np.flatnonzero(bad.ravel())[0])]
            raise DatasetFormatError(f"{where}: label {value!r} is not a whole class id{tail}")
    high = f"0..{num_classes - 1}" if num_classes is not None else ">= 0"
    out_of_range = (raw < 0) if num_classes is None else ((raw < 0) | (raw >= num_classes))
    if out_of_range.any():
        value = raw.flat[int(np.flatnonzero(out_of_range.ravel())[0])]
        raise DatasetFormatError(f"{where}: labels outside the class ids {high} (found {value!r}){tail}")
    return raw.astype(np.int64)


def check_finite(values: np.ndarray, where: str, layout: str = "") -> None:
    """:class:`DatasetFormatError` when float ``values`` hold NaN or infinity."""
    if values.dtype.kind == "f" and values.size and not np.isfinite(values).all():
        index = int(np.flatnonzero(~np.isfinite(values.ravel()))[0])
        tail = f"; {layout}" if layout else ""
        raise DatasetFormatError(f"{where}: value {values.ravel()[index]!r} at flat position {index} is not a finite "
                                 f"number (NaN or infinity){tail}")


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
