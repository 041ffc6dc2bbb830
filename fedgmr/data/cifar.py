"""CIFAR-10 from the python pickle batches (``cifar-10-batches-py``)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from fedgmr.data.base import ArrayDataset, FederatedData, check_labels
from fedgmr.data.registry import DATASETS
from fedgmr.errors import DatasetFormatError
from fedgmr.options import bool_option, int_option

FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
_LAYOUT = (
    f"expected the CIFAR-10 python version: a folder ({FOLDER}/ or its parent) holding the pickle "
    f"files {', '.join(TRAIN_BATCHES)} and {TEST_BATCH}, each a dict with b'data' (N x 3072 uint8, "
    "channel-major 32x32 images) and b'labels' (N ints in 0..9)"
)


def _batch_dir(root: Path) -> Path | None:
    """The folder that holds the batches: ``root`` itself or ``root/cifar-10-batches-py``."""
    for candidate in (root, root / FOLDER):
        if (candidate / TEST_BATCH).is_file():
            return candidate
    return None


def _download(root: Path) -> None:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        raise DatasetFormatError(
            f"cifar10: no CIFAR-10 batches under {root} and download=True needs torchvision, "
            f"which is not installed; install torchvision or place the files yourself; {_LAYOUT}"
        ) from None
    from torchvision.datasets import CIFAR10

    target = root.parent if root.name == FOLDER else root
    try:
        CIFAR10(str(target), train=True, download=True)
    except Exception as exc:  # network or archive errors surface as one typed error
        raise DatasetFormatError(f"cifar10: download into {target} failed ({exc}); {_LAYOUT}") from None


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one pickle batch into ``(images (N, 3, 32, 32) uint8, labels (N,) int64)``."""
    try:
        with open(path, "rb") as fh:
            batch = pickle.load(fh, encoding="bytes")
    except FileNotFoundError:
        raise DatasetFormatError(f"cifar10: missing {path}; {_LAYOUT}") from None
    except Exception as exc:  # pickle raises many types on corrupt input; report one
        raise DatasetFormatError(f"cifar10: cannot unpickle {path} ({exc}); {_LAYOUT}") from None
    if not isinstance(batch, dict):
        raise DatasetFormatError(f"cifar10: {path} does not hold a dict; {_LAYOUT}")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise DatasetFormatError(f"cifar10: {path} lacks b'data' or b'labels'; {_LAYOUT}")
    try:
        raw = np.asarray(data)
    except (TypeError, ValueError) as exc:
        raise DatasetFormatError(f"cifar10: {path} has non-numeric data ({exc}); {_LAYOUT}") from None
    if raw.dtype.kind not in "iu" or (raw.size and (raw.min() < 0 or raw.max() > 255)):
        # a float array (NaN included) or values past a byte would be cast silently
        raise DatasetFormatError(f"cifar10: {path} has b'data' of type {raw.dtype}, expected uint8 pixel values "
                                 f"0..255; {_LAYOUT}")
    images = raw.astype(np.uint8)
    y = check_labels(labels, 10, f"cifar10: {path}", _LAYOUT)
    if images.ndim != 2 or images.shape[1] != 3072 or y.ndim != 1 or len(images) != len(y):
        raise DatasetFormatError(
            f"cifar10: {path} has data of shape {images.shape} and {y.shape} labels; {_LAYOUT}"
        )
    if len(y) == 0:
        raise DatasetFormatError(f"cifar10: {path} holds 0 images; {_LAYOUT}")
    return images.reshape(-1, 3, 32, 32), y


def _to_dataset(images: np.ndarray, labels: np.ndarray, normalize: bool) -> ArrayDataset:
    x = torch.from_numpy(images).float().div_(255.0)
    if normalize:
        x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    return ArrayDataset(x, torch.from_numpy(labels))


def _label_names(folder: Path) -> list[str] | None:
    try:
        with open(folder / "batches.meta", "rb") as fh:
            meta = pickle.load(fh, encoding="bytes")
        return [n.decode() if isinstance(n, bytes) else str(n) for n in meta[b"label_names"]]
    except Exception:  # the meta file is optional and only used for display
        return None


@DATASETS.register("cifar10")
def load_cifar10(root: str | None = None, normalize: bool = True, download: bool = False,
                 limit_train: int | None = None, limit_test: int | None = None) -> FederatedData:
    """CIFAR-10 (50,000 / 10,000 RGB 32x32 images, 10 classes).

    Parameters
    ----------
    root: ``cifar-10-batches-py/`` or the folder that contains it.
    normalize: standardise each channel with the usual CIFAR-10 mean and std; otherwise
        pixels are floats in [0, 1].
    download: when the files are missing, fetch them with ``torchvision`` (only if it is
        installed).
    limit_train, limit_test: keep only the first samples of each split.
    """
    normalize = bool_option("data.options.normalize", normalize)
    download = bool_option("data.options.download", download)
    limit_train = int_option("data.options.limit_train", limit_train, optional=True)
    limit_test = int_option("data.options.limit_test", limit_test, optional=True)
    if root is None:
        raise DatasetFormatError(f"cifar10 needs data.root pointing to a directory; {_LAYOUT}")
    path = Path(root)
    folder = _batch_dir(path)
    if folder is None and download:
        _download(path)
        folder = _batch_dir(path) or _batch_dir(path.parent)
    if folder is None:
        raise DatasetFormatError(f"cifar10: no {TEST_BATCH} in {path} or {path / FOLDER}; {_LAYOUT}")
    parts = [read_batch(folder / name) for name in TRAIN_BATCHES]
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    test_x, test_y = read_batch(folder / TEST_BATCH)
    if limit_train:
        train_x, train_y = train_x[:limit_train], train_y[:limit_train]
    if limit_test:
        test_x, test_y = test_x[:limit_test], test_y[:limit_test]
    meta: dict = {"normalized": normalize}
    names = _label_names(folder)
    if names:
        meta["classes"] = names
    return FederatedData(name="cifar10", train=_to_dataset(train_x, train_y, normalize),
                         test=_to_dataset(test_x, test_y, normalize), num_classes=10, meta=meta)
