"""FEMNIST (62 classes, one natural client per writer) from LEAF json files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from fedgmr.data.base import ArrayDataset, FederatedData, check_finite, check_labels
from fedgmr.data.registry import DATASETS
from fedgmr.errors import DatasetFormatError
from fedgmr.options import int_option

NUM_CLASSES = 62
_LAYOUT = (
    "expected the LEAF layout: a directory with train/*.json and test/*.json (or data/train and "
    "data/test below it), each json holding 'users' (list of ids), 'num_samples' and 'user_data' "
    "{user: {'x': [[784 floats], ...], 'y': [class ids 0..61]}}"
)

UserData = dict[str, tuple[np.ndarray, np.ndarray]]


def _split_dir(root: Path, split: str) -> Path:
    for candidate in (root / split, root / "data" / split):
        if candidate.is_dir():
            return candidate
    raise DatasetFormatError(f"femnist: {root} has no {split}/ folder; {_LAYOUT}")


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetFormatError(f"femnist: cannot read {path} as json ({exc}); {_LAYOUT}") from None
    if not isinstance(data, dict) or "users" not in data or "user_data" not in data:
        raise DatasetFormatError(f"femnist: {path} lacks the 'users' or 'user_data' key; {_LAYOUT}")
    return data


def _read_split(root: Path, split: str) -> UserData:
    """Read every json of one split into ``{user: (x (n, 784) float32, y (n,) int64)}``."""
    folder = _split_dir(root, split)
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DatasetFormatError(f"femnist: {folder} holds no *.json file; {_LAYOUT}")
    users: UserData = {}
    for path in files:
        data = _read_json(path)
        try:
            counts = data.get("num_samples")
            if counts is not None and (not isinstance(counts, list) or len(counts) != len(data["users"])):
                raise ValueError(f"'num_samples' must list one count per entry of 'users' ({len(data['users'])})")
            for i, user in enumerate(data["users"]):
                record = data["user_data"][str(user)]
                x = np.asarray(record["x"], dtype=np.float32)
                y = check_labels(record["y"], NUM_CLASSES, f"user {user!r}")
                if x.size == 0:
                    x = x.reshape(0, 784)
                if x.ndim != 2 or x.shape[1] != 784 or y.ndim != 1 or len(x) != len(y):
                    raise ValueError(f"user {user!r} has x of shape {x.shape} and y of shape {y.shape}")
                check_finite(x, f"user {user!r} pixels")
                if counts is not None and counts[i] != len(y):
                    raise ValueError(f"user {user!r}: num_samples says {counts[i]!r} but it has {len(y)} samples")
                uid = str(user)
                if uid in users:  # a writer split over several files
                    px, py = users[uid]
                    x, y = np.concatenate([px, x]), np.concatenate([py, y])
                users[uid] = (x, y)
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetFormatError(f"femnist: malformed {path}: {exc}; {_LAYOUT}") from None
    if not users:
        raise DatasetFormatError(f"femnist: no users in {folder}; {_LAYOUT}")
    return users


def _stack(users: UserData, keep: list[str]) -> tuple[ArrayDataset, list[np.ndarray]]:
    xs, ys, natural, start = [], [], [], 0
    for user in keep:
        x, y = users[user]
        xs.append(x)
        ys.append(y)
        natural.append(np.arange(start, start + len(y), dtype=np.int64))
        start += len(y)
    x_all = np.concatenate(xs) if xs else np.zeros((0, 784), dtype=np.float32)
    y_all = np.concatenate(ys) if ys else np.zeros(0, dtype=np.int64)
    data = ArrayDataset(torch.from_numpy(x_all).reshape(-1, 1, 28, 28), torch.from_numpy(y_all))
    return data, natural


@DATASETS.register("femnist")
def load_femnist(root: str | None = None, max_users: int | None = None) -> FederatedData:
    """FEMNIST from LEAF json files in ``root``.

    Parameters
    ----------
    root: directory holding ``train/*.json`` and ``test/*.json`` (LEAF's ``data/`` folder
        or its parent).
    max_users: keep only the first ``max_users`` writers (file order, then listing order).
        Writers with no training sample are dropped first (they could not train).
        The test split keeps the same writers when they appear there (LEAF's by-sample split),
        else its first ``max_users`` writers.

    Returns
    -------
    FederatedData with images of shape (1, 28, 28), 62 classes and one natural client per
    writer of the training split.
    """
    max_users = int_option("data.options.max_users", max_users, optional=True)
    if root is None:
        raise DatasetFormatError(f"femnist needs data.root pointing to a directory; {_LAYOUT}")
    path = Path(root)
    if not path.is_dir():
        raise DatasetFormatError(f"femnist: {path} is not a directory; {_LAYOUT}")
    train_users, test_users = _read_split(path, "train"), _read_split(path, "test")
    # a writer with no training sample cannot train: dropped, so no natural client is empty
    keep = [u for u, (_, y) in train_users.items() if len(y)]
    if not keep:
        raise DatasetFormatError(f"femnist: every writer under {_split_dir(path, 'train')} has 0 samples; {_LAYOUT}")
    if max_users is not None:
        keep = keep[:max_users]
    keep_test = [u for u in keep if u in test_users]
    if not keep_test:
        keep_test = list(test_users)[:max_users] if max_users is not None else list(test_users)
    train, natural = _stack(train_users, keep)
    test, _ = _stack(test_users, keep_test)
    if len(test) == 0:
        raise DatasetFormatError(f"femnist: the test writers under {_split_dir(path, 'test')} have 0 samples; "
                                 f"{_LAYOUT}")
    return FederatedData(name="femnist", train=train, test=test, num_classes=NUM_CLASSES,
                         natural_clients=natural, meta={"users": keep})
