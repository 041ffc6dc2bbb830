"""Malformed data files written here: every loader refuses them with one
``DatasetFormatError`` naming the file and what it expected, never a zlib, numpy or torch
error, and never a silently truncated label. Natural clients are never empty."""

from __future__ import annotations

import gzip
import json
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from fedgmr.data import load_dataset, make_partition
from fedgmr.data.idx import read_idx
from fedgmr.errors import DatasetFormatError

_IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(">f4"): 0x0D}


def write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file (gzip-compressed when ``path`` ends in .gz)."""
    header = bytes([0, 0, _IDX_CODES[array.dtype], array.ndim]) + b"".join(struct.pack(">I", s) for s in array.shape)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as fh:
        fh.write(header + array.tobytes())


def fake_mnist(root: Path, n: int = 20, labels: np.ndarray | None = None, images: np.ndarray | None = None) -> Path:
    """Four IDX files; ``labels`` / ``images`` replace the training split's."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    write_idx(root / "train-images-idx3-ubyte.gz",
              images if images is not None else rng.integers(0, 255, (n, 28, 28), dtype=np.uint8))
    write_idx(root / "train-labels-idx1-ubyte.gz",
              labels if labels is not None else (np.arange(n) % 10).astype(np.uint8))
    write_idx(root / "t10k-images-idx3-ubyte", rng.integers(0, 255, (10, 28, 28), dtype=np.uint8))
    write_idx(root / "t10k-labels-idx1-ubyte", (np.arange(10) % 10).astype(np.uint8))
    return root


def refuses(name: str, root: Path, *needles: str, **options) -> str:
    """Loading raises DatasetFormatError (one line) holding every needle."""
    with pytest.raises(DatasetFormatError) as err:
        load_dataset(name, root=str(root), **options)
    message = str(err.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


# ----------------------------------------------------------------------------------- IDX
def test_idx_corrupt_gzip_stream(tmp_path: Path) -> None:
    root = fake_mnist(tmp_path / "m")
    target = root / "train-images-idx3-ubyte.gz"
    blob = bytearray(target.read_bytes())
    blob[20:60] = bytes(40)  # damage the deflate stream, keep the gzip header: zlib.error today
    target.write_bytes(bytes(blob))
    refuses("mnist", root, str(target), "cannot read IDX file", "t10k-labels-idx1-ubyte")


def test_idx_truncated_gzip(tmp_path: Path) -> None:
    root = fake_mnist(tmp_path / "m")
    target = root / "train-labels-idx1-ubyte.gz"
    target.write_bytes(target.read_bytes()[:-12])  # EOFError today
    refuses("mnist", root, str(target), "cannot read IDX file")


def test_idx_gz_file_that_is_not_gzip(tmp_path: Path) -> None:
    root = fake_mnist(tmp_path / "m")
    target = root / "train-labels-idx1-ubyte.gz"
    target.write_bytes(b"plain text, not gzip")
    refuses("mnist", root, str(target), "cannot read IDX file")


def test_idx_empty_split(tmp_path: Path) -> None:
    root = fake_mnist(tmp_path / "m", images=np.zeros((0, 28, 28), np.uint8), labels=np.zeros(0, np.uint8))
    refuses("mnist", root, "train-images-idx3-ubyte.gz", "0 samples", "non-empty train split")


def test_idx_negative_label(tmp_path: Path) -> None:
    labels = (np.arange(20) % 10).astype(np.int8)
    labels[3] = -1
    root = fake_mnist(tmp_path / "m", labels=labels)
    refuses("mnist", root, "train-labels-idx1-ubyte.gz", "labels outside", "0..9", "-1")


def test_idx_label_past_the_class_count(tmp_path: Path) -> None:
    labels = (np.arange(20) % 10).astype(np.uint8)
    labels[7] = 10
    root = fake_mnist(tmp_path / "m", labels=labels)
    refuses("fashion_mnist", root, "train-labels-idx1-ubyte.gz", "labels outside", "0..9", "10")


def test_idx_float_labels_are_not_truncated(tmp_path: Path) -> None:
    labels = (np.arange(20) % 10).astype(">f4")
    labels[5] = 1.5
    root = fake_mnist(tmp_path / "m", labels=labels)
    refuses("mnist", root, "train-labels-idx1-ubyte.gz", "1.5", "not a whole class id")


def test_idx_nan_pixels(tmp_path: Path) -> None:
    images = np.full((20, 28, 28), 0.5, dtype=">f4")
    images[2, 3, 4] = np.nan
    root = fake_mnist(tmp_path / "m", images=images)
    refuses("mnist", root, "train-images-idx3-ubyte.gz", "not a finite number")


def test_read_idx_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x05")[:-4])
    with pytest.raises(DatasetFormatError, match="x-idx1-ubyte.gz"):
        read_idx(path)


# ----------------------------------------------------------------------------------- FEMNIST
def _user(labels: list, value: float = 0.5) -> dict:
    return {"x": [[value] * 784 for _ in labels], "y": labels}


def leaf(root: Path, train: dict[str, dict], test: dict[str, dict] | None = None) -> Path:
    """A LEAF layout with one json per split."""
    for split, users in (("train", train), ("test", test or {"w0": _user([1])})):
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / split / f"all_data_0_{split}.json").write_text(json.dumps(
            {"users": list(users), "num_samples": [len(u["y"]) for u in users.values()], "user_data": users}))
    return root


@pytest.mark.parametrize("labels, needles", [
    ([0, -1], ("labels outside", "0..61", "-1")),
    ([0, 62], ("labels outside", "0..61", "62")),
    ([0, 1.5], ("1.5", "not a whole class id")),
    ([0, "a"], ("integer class ids",)),
    ([0, None], ("integer class ids",)),
])
def test_femnist_bad_labels(tmp_path: Path, labels: list, needles: tuple[str, ...]) -> None:
    root = leaf(tmp_path, {"w0": _user(labels)})
    refuses("femnist", root, "all_data_0_train.json", "user 'w0'", "LEAF layout", *needles)


def test_femnist_nan_pixels(tmp_path: Path) -> None:
    root = leaf(tmp_path, {"w0": _user([1, 2])})
    path = root / "train" / "all_data_0_train.json"
    data = json.loads(path.read_text())
    data["user_data"]["w0"]["x"][1][100] = float("nan")
    path.write_text(json.dumps(data))  # json writes NaN, which Python's reader accepts
    refuses("femnist", root, str(path), "not a finite number")


def test_femnist_num_samples_that_disagree(tmp_path: Path) -> None:
    root = leaf(tmp_path, {"w0": _user([1, 2])})
    path = root / "train" / "all_data_0_train.json"
    data = json.loads(path.read_text())
    data["num_samples"] = [5]
    path.write_text(json.dumps(data))
    refuses("femnist", root, str(path), "num_samples", "2 samples")


def test_femnist_drops_writers_without_samples(tmp_path: Path) -> None:
    root = leaf(tmp_path, {"w0": _user([1, 2]), "empty": _user([]), "w1": _user([3])})
    data = load_dataset("femnist", root=str(root))
    assert data.meta["users"] == ["w0", "w1"]
    assert [len(c) for c in data.natural_clients] == [2, 1]


def test_femnist_only_empty_writers(tmp_path: Path) -> None:
    root = leaf(tmp_path, {"a": _user([]), "b": _user([])})
    refuses("femnist", root, "0 samples", str(root / "train"))


def test_femnist_empty_test_split(tmp_path: Path) -> None:
    root = leaf(tmp_path, {"w0": _user([1])}, test={"w0": _user([])})
    refuses("femnist", root, "test", "0 samples")


# ----------------------------------------------------------------------------------- CIFAR-10
def cifar(root: Path, bad: dict | None = None, which: str = "data_batch_2") -> Path:
    """Six pickle batches of two images; ``bad`` replaces batch ``which``."""
    root.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}
        if name == which and bad is not None:
            batch = bad
        (root / name).write_bytes(pickle.dumps(batch))
    return root


@pytest.mark.parametrize("bad, needles", [
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, -1]}, ("labels outside", "0..9")),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, ("labels outside", "0..9")),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1.5]}, ("1.5", "not a whole class id")),
    ({b"data": np.full((2, 3072), np.nan, np.float32), b"labels": [0, 1]}, ("float32", "uint8 pixel values")),
    ({b"data": np.full((2, 3072), 300, np.int32), b"labels": [0, 1]}, ("uint8 pixel values",)),
    ({b"data": np.zeros((0, 3072), np.uint8), b"labels": []}, ("0 images",)),
])
def test_cifar_bad_batches(tmp_path: Path, bad: dict, needles: tuple[str, ...]) -> None:
    root = cifar(tmp_path / "c", bad)
    refuses("cifar10", root, "data_batch_2", *needles)


# ----------------------------------------------------------------------------------- Shakespeare
PLAY = """THE TRAGEDY OF TESTING

ACT I.

SCENE I. A room.

HAMLET.
To be, or not to be, that is the question of every careful tester today.

HORATIO.
Ay.

HAMLET.
Whether 'tis nobler in the mind to suffer the slings of failing builds.
"""


def test_shakespeare_corrupt_gzip(tmp_path: Path) -> None:
    good = gzip.compress(PLAY.encode() * 20)
    damaged = good[:30] + bytes(60) + good[90:]  # zlib.error today
    (tmp_path / "testing_gut.txt.gz").write_bytes(damaged)
    refuses("shakespeare", tmp_path, "testing_gut.txt.gz", "cannot read", "speaker's name")


def test_shakespeare_drops_roles_without_a_training_window(tmp_path: Path) -> None:
    (tmp_path / "testing_gut.txt").write_text(PLAY)
    data = load_dataset("shakespeare", root=str(tmp_path), seq_len=8, test_fraction=0.5)
    # HORATIO's "Ay." leaves 1 training character: no window, so no client
    assert [name for _, name in data.meta["clients"]] == ["HAMLET"]
    assert all(len(c) > 0 for c in data.natural_clients)


def test_shakespeare_no_test_windows(tmp_path: Path) -> None:
    (tmp_path / "testing_gut.txt").write_text("ACT I.\n\nHAMLET.\nAbcdefghij.\n")
    refuses("shakespeare", tmp_path, "0 test windows", str(tmp_path), seq_len=4, test_fraction=0.05)


# ----------------------------------------------------------------------------------- StackOverflow
def test_stackoverflow_drops_users_without_examples(tmp_path: Path) -> None:
    (tmp_path / "stackoverflow_train.json").write_text(json.dumps({"a": ["x y"], "b": [], "c": ["z"]}))
    (tmp_path / "stackoverflow_test.json").write_text(json.dumps({"t": ["x"]}))
    data = load_dataset("stackoverflow", root=str(tmp_path), seq_len=4)
    assert data.meta["users"] == ["a", "c"] and all(len(c) > 0 for c in data.natural_clients)


def test_stackoverflow_no_test_examples(tmp_path: Path) -> None:
    (tmp_path / "stackoverflow_train.json").write_text(json.dumps({"a": ["x y"]}))
    (tmp_path / "stackoverflow_test.json").write_text(json.dumps({"t": []}))
    refuses("stackoverflow", tmp_path, "no test examples", "stackoverflow_test.json", seq_len=4)


# ----------------------------------------------------------------------------------- natural partitions
def test_a_custom_loaders_empty_natural_client_is_refused() -> None:
    labels = np.zeros(6, dtype=np.int64)
    natural = [np.array([0, 1, 2]), np.array([], dtype=np.int64), np.array([3, 4, 5])]
    with pytest.raises(DatasetFormatError, match="natural client #1 of the data set has no sample"):
        make_partition(labels, 2, "natural", np.random.default_rng(0), natural=natural)
    with pytest.raises(DatasetFormatError, match="indexes outside the 6 training samples"):
        make_partition(labels, 2, "natural", np.random.default_rng(0), natural=[np.array([0, 9]), np.array([1])])
