"""Data set registry: ``name -> loader(root=None, **options) -> FederatedData``."""

from __future__ import annotations

from typing import Callable

from fedgmr.data.base import FederatedData
from fedgmr.registry import Registry

DatasetLoader = Callable[..., FederatedData]
DATASETS: Registry[DatasetLoader] = Registry("dataset")


def load_dataset(name: str, root: str | None = None, **options) -> FederatedData:
    """Load a registered data set by name."""
    return DATASETS.get(name)(root=root, **options)
