"""CIFAR-10 loader on small pickle batches written here."""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedgmr.data import load_dataset
from fedgmr.data.cifar import MEAN, STD
from fedgmr.errors import DatasetFormatError


def _batch(path: Path, labels: list[int], red: bool = False) -> None:
    data = np.random.default_rng(len(labels)).integers(0, 256, size=(len(labels), 3072), dtype=np.uint8)
    if red:  # channel-major rows: the first 1024 values are the red plane
        data[:, :1024], data[:, 1024:] = 255, 0
    with open(path, "wb") as fh:
        pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, fh)


@pytest.fixture()
def batches(tmp_path: Path) -> Path:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i in range(1, 6):
        _batch(folder / f"data_batch_{i}", [i - 1, i], red=(i == 1))
    _batch(folder / "test_batch", [9, 8, 7])
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, fh)
    return folder


def test_shapes_range_and_channel_order(batches: Path) -> None:
    data = load_dataset("cifar10", root=str(batches), normalize=False)
    assert data.train.x.shape == (10, 3, 32, 32) and data.test.x.shape == (3, 3, 32, 32)
    assert data.train.x.dtype == torch.float32 and data.num_classes == 10
    assert data.train.y.tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
    assert data.test.y.tolist() == [9, 8, 7]
    assert 0.0 <= float(data.train.x.min()) and float(data.train.x.max()) <= 1.0
    assert torch.all(data.train.x[0, 0] == 1.0) and torch.all(data.train.x[0, 1:] == 0.0)
    assert data.natural_clients is None and data.meta["classes"][3] == "c3"


def test_parent_folder_normalisation_and_limits(batches: Path) -> None:
    raw = load_dataset("cifar10", root=str(batches), normalize=False)
    norm = load_dataset("cifar10", root=str(batches.parent), limit_train=4, limit_test=2)
    assert len(norm.train) == 4 and len(norm.test) == 2
    expected = (raw.train.x[:4] - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    assert torch.allclose(norm.train.x, expected)


@pytest.mark.parametrize("breakage, fragment", [
    ("missing_batch", "missing"),
    ("garbage", "cannot unpickle"),
    ("not_dict", "does not hold a dict"),
    ("no_labels", "b'labels'"),
    ("bad_shape", "shape"),
])
def test_malformed_batches(batches: Path, breakage: str, fragment: str) -> None:
    target = batches / "data_batch_3"
    if breakage == "missing_batch":
        target.unlink()
    elif breakage == "garbage":
        target.write_bytes(b"\x80\x04 this is not a pickle")
    else:
        payload = {
            "not_dict": [1, 2, 3],
            "no_labels": {b"data": np.zeros((2, 3072), np.uint8)},
            "bad_shape": {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]},
        }[breakage]
        target.write_bytes(pickle.dumps(payload))
    with pytest.raises(DatasetFormatError) as err:
        load_dataset("cifar10", root=str(batches))
    assert fragment in str(err.value) and "data_batch_1" in str(err.value)


def test_missing_files_and_download_without_torchvision(tmp_path: Path) -> None:
    with pytest.raises(DatasetFormatError, match="cifar-10-batches-py"):
        load_dataset("cifar10", root=str(tmp_path))
    with pytest.raises(DatasetFormatError, match="data.root"):
        load_dataset("cifar10", root=None)
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed; the no-torchvision message cannot be checked offline")
    with pytest.raises(DatasetFormatError, match="torchvision"):
        load_dataset("cifar10", root=str(tmp_path), download=True)
