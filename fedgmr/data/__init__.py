"""Data sets, loaders and client partitions."""

from fedgmr.data.base import ArrayDataset, FederatedData
from fedgmr.data.partition import Partition, dirichlet_partition, iid_partition, make_partition
from fedgmr.data.registry import DATASETS, load_dataset
from fedgmr.data import digits as _digits, idx as _idx, synthetic as _synthetic  # noqa: F401
from fedgmr.data import cifar as _cifar  # noqa: F401
from fedgmr.data import femnist as _femnist  # noqa: F401
from fedgmr.data import imagenet as _imagenet  # noqa: F401
from fedgmr.data import shakespeare as _shakespeare  # noqa: F401
from fedgmr.data import stackoverflow as _stackoverflow  # noqa: F401

__all__ = [
    "ArrayDataset", "FederatedData", "Partition", "DATASETS", "load_dataset",
    "make_partition", "iid_partition", "dirichlet_partition",
]
