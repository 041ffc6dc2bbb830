"""MNIST and Fashion-MNIST from IDX files in a local directory."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch

from fedgmr.data.base import ArrayDataset, FederatedData, check_finite, check_labels
from fedgmr.data.registry import DATASETS
from fedgmr.errors import DatasetFormatError
from fedgmr.options import int_option

_LAYOUT = (
    "expected a directory holding train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
    "t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz]"
)
_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) into a numpy array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError, zlib.error) as exc:  # a corrupt or truncated gzip stream included
        raise DatasetFormatError(f"cannot read IDX file {path}: {exc}; {_LAYOUT}") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
        raise DatasetFormatError(f"{path} is not an IDX file (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetFormatError(f"{path}: truncated IDX header")
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    dtype = np.dtype(_DTYPES[data[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(data) - header != expected:
        raise DatasetFormatError(
            f"{path}: header announces shape {dims} ({expected} bytes) but the file holds "
            f"{len(data) - header} bytes of data"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)


def _find(root: Path, stem: str) -> Path:
    for candidate in (root / stem, root / f"{stem}.gz"):
        if candidate.exists():
            return candidate
    raise DatasetFormatError(f"{root}: missing {stem}[.gz]; {_LAYOUT}")


def _load_split(root: Path, prefix: str, num_classes: int | None) -> ArrayDataset:
    image_path = _find(root, f"{prefix}-images-idx3-ubyte")
    label_path = _find(root, f"{prefix}-labels-idx1-ubyte")
    images, labels = read_idx(image_path), read_idx(label_path)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DatasetFormatError(
            f"{root}: {prefix} images have shape {images.shape} and labels {labels.shape}; "
            "expected (n, rows, cols) images and n labels"
        )
    if len(labels) == 0:
        raise DatasetFormatError(f"{image_path} and {label_path} hold 0 samples; expected a non-empty {prefix} "
                                 f"split; {_LAYOUT}")
    check_finite(images, f"{image_path}", "expected finite pixel values (uint8 in MNIST's IDX files)")
    y = check_labels(labels, num_classes, f"{label_path}",
                     f"expected class ids 0..{num_classes - 1}" if num_classes else "expected class ids >= 0")
    x = torch.tensor(images.astype(np.float32) / 255.0).unsqueeze(1)
    return ArrayDataset(x, torch.from_numpy(y))


def load_idx_dataset(root: str | Path | None, name: str, limit_train: int | None = None,
                     limit_test: int | None = None, num_classes: int | None = None) -> FederatedData:
    """Load an MNIST-format data set from ``root``; optionally keep only the first samples.

    Labels must lie in ``0 .. num_classes - 1``; with ``num_classes=None`` the class count is
    the largest label + 1."""
    limit_train = int_option("data.options.limit_train", limit_train, optional=True)
    limit_test = int_option("data.options.limit_test", limit_test, optional=True)
    if root is None:
        raise DatasetFormatError(f"{name} needs data.root pointing to a directory; {_LAYOUT}")
    path = Path(root)
    if not path.is_dir():
        raise DatasetFormatError(f"{name}: {path} is not a directory; {_LAYOUT}")
    train, test = _load_split(path, "train", num_classes), _load_split(path, "t10k", num_classes)
    if limit_train:
        train = ArrayDataset(train.x[:limit_train], train.y[:limit_train])
    if limit_test:
        test = ArrayDataset(test.x[:limit_test], test.y[:limit_test])
    if num_classes is None:
        num_classes = int(max(train.y.max(), test.y.max())) + 1
    return FederatedData(name=name, train=train, test=test, num_classes=num_classes)


@DATASETS.register("mnist")
def load_mnist(root: str | None = None, limit_train: int | None = None,
               limit_test: int | None = None) -> FederatedData:
    """MNIST from IDX files in ``root`` (labels 0..9)."""
    return load_idx_dataset(root, "mnist", limit_train, limit_test, num_classes=10)


@DATASETS.register("fashion_mnist")
def load_fashion_mnist(root: str | None = None, limit_train: int | None = None,
                       limit_test: int | None = None) -> FederatedData:
    """Fashion-MNIST from IDX files in ``root`` (labels 0..9)."""
    return load_idx_dataset(root, "fashion_mnist", limit_train, limit_test, num_classes=10)
