"""FEMNIST loader on small LEAF json files written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedgmr.data import load_dataset
from fedgmr.errors import DatasetFormatError


def _user(value: float, labels: list[int]) -> dict:
    return {"x": [[value] * 784 for _ in labels], "y": labels}


def _write(path: Path, users: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"users": list(users), "num_samples": [len(u["y"]) for u in users.values()],
                                "user_data": users}))


@pytest.fixture()
def leaf(tmp_path: Path) -> Path:
    _write(tmp_path / "train" / "all_data_0_train.json", {"w0": _user(0.1, [0, 1, 61]), "w1": _user(0.2, [5, 5])})
    _write(tmp_path / "train" / "all_data_1_train.json", {"w2": _user(0.3, [7])})
    _write(tmp_path / "test" / "all_data_0_test.json", {"w0": _user(0.1, [2]), "w1": _user(0.2, [3])})
    _write(tmp_path / "test" / "all_data_1_test.json", {"w2": _user(0.3, [9, 10])})
    return tmp_path


def test_shapes_labels_and_writers(leaf: Path) -> None:
    data = load_dataset("femnist", root=str(leaf))
    assert data.num_classes == 62 and data.task == "classification"
    assert data.train.x.shape == (6, 1, 28, 28) and data.train.x.dtype == torch.float32
    assert data.test.x.shape == (4, 1, 28, 28)
    assert data.train.y.tolist() == [0, 1, 61, 5, 5, 7]
    assert data.input_shape == (1, 28, 28)
    assert [c.tolist() for c in data.natural_clients] == [[0, 1, 2], [3, 4], [5]]
    for client, value in zip(data.natural_clients, (0.1, 0.2, 0.3)):
        assert torch.allclose(data.train.x[torch.as_tensor(client)], torch.tensor(value))


def test_max_users_and_leaf_data_subfolder(leaf: Path, tmp_path: Path) -> None:
    data = load_dataset("femnist", root=str(leaf), max_users=2)
    assert len(data.natural_clients) == 2 and len(data.train) == 5
    assert data.test.y.tolist() == [2, 3]  # the same writers' test samples
    nested = tmp_path / "femnist"
    (nested / "data").mkdir(parents=True)
    (leaf / "train").rename(nested / "data" / "train")
    (leaf / "test").rename(nested / "data" / "test")
    assert len(load_dataset("femnist", root=str(nested)).train) == 6


@pytest.mark.parametrize("breakage, fragment", [
    ("no_test", "test/"),
    ("bad_json", "cannot read"),
    ("no_users_key", "'users'"),
    ("short_image", "784"),
    ("bad_label", "labels outside"),
    ("empty_folder", "no *.json"),
])
def test_malformed_files_raise_format_error(leaf: Path, breakage: str, fragment: str) -> None:
    target = leaf / "train" / "all_data_1_train.json"
    if breakage == "no_test":
        for f in (leaf / "test").iterdir():
            f.unlink()
        (leaf / "test").rmdir()
    elif breakage == "bad_json":
        target.write_text("{not json")
    elif breakage == "no_users_key":
        target.write_text(json.dumps({"user_data": {}}))
    elif breakage == "short_image":
        _write(target, {"w9": {"x": [[0.0] * 100], "y": [1]}})
    elif breakage == "bad_label":
        _write(target, {"w9": _user(0.0, [62])})
    elif breakage == "empty_folder":
        for f in (leaf / "train").iterdir():
            f.unlink()
    with pytest.raises(DatasetFormatError) as err:
        load_dataset("femnist", root=str(leaf))
    assert fragment in str(err.value)
    assert "LEAF layout" in str(err.value)


def test_missing_root(tmp_path: Path) -> None:
    with pytest.raises(DatasetFormatError, match="train/\\*.json"):
        load_dataset("femnist", root=None)
    with pytest.raises(DatasetFormatError, match="not a directory"):
        load_dataset("femnist", root=str(tmp_path / "nowhere"))
    with pytest.raises(DatasetFormatError, match="no train/ folder"):
        load_dataset("femnist", root=str(tmp_path))
