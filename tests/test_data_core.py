"""Embedded digits, the IDX loader on real files, partitions and the validation split."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED_DATA
from fedgmr.data import load_dataset, make_partition
from fedgmr.data.idx import read_idx
from fedgmr.errors import ConfigError, DatasetFormatError


def test_digits_loads_offline_with_a_stratified_test_split():
    d = load_dataset("digits")
    assert d.num_classes == 10 and d.input_shape == (1, 8, 8)
    assert len(d.train) + len(d.test) == 1797
    assert set(d.test.y.tolist()) == set(range(10))
    assert float(d.train.x.max()) <= 1.0



def test_digits_are_scikit_learns_digits_read_without_importing_it():
    """The embedded digits are exactly ``sklearn.datasets.load_digits()``'s images and
    targets, read from its file in a fresh process that never imports scikit-learn."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from fedgmr.data.digits import _digits_arrays

    images, target = _digits_arrays()
    want = load_digits()
    assert images.dtype == want.images.dtype and target.dtype == want.target.dtype
    assert np.array_equal(images, want.images) and np.array_equal(target, want.target)
    code = ("import sys; from fedgmr.data import load_dataset; load_dataset('digits'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr

def _write_idx(path: Path, array: np.ndarray, gz: bool = True) -> None:
    code = {np.uint8: 0x08}[array.dtype.type]
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", s) for s in array.shape)
    data = header + array.tobytes()
    (gzip.open if gz else open)(path, "wb").write(data)


def _fake_mnist(root: Path, n_train: int = 50, n_test: int = 20) -> None:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    _write_idx(root / "train-images-idx3-ubyte.gz", rng.integers(0, 255, (n_train, 28, 28), dtype=np.uint8))
    _write_idx(root / "train-labels-idx1-ubyte.gz", (np.arange(n_train) % 10).astype(np.uint8))
    _write_idx(root / "t10k-images-idx3-ubyte", rng.integers(0, 255, (n_test, 28, 28), dtype=np.uint8), gz=False)
    _write_idx(root / "t10k-labels-idx1-ubyte", (np.arange(n_test) % 10).astype(np.uint8), gz=False)


def test_idx_loader_reads_gzip_and_plain_files(tmp_path: Path):
    _fake_mnist(tmp_path / "m")
    d = load_dataset("mnist", root=str(tmp_path / "m"))
    assert d.train.x.shape == (50, 1, 28, 28) and d.test.x.shape == (20, 1, 28, 28)
    assert d.num_classes == 10 and float(d.train.x.max()) <= 1.0


def test_idx_loader_errors_name_the_layout(tmp_path: Path):
    with pytest.raises(DatasetFormatError, match="train-images-idx3-ubyte"):
        load_dataset("mnist", root=str(tmp_path))
    with pytest.raises(DatasetFormatError, match="needs data.root"):
        load_dataset("fashion_mnist")
    _fake_mnist(tmp_path / "m")
    (tmp_path / "m" / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05ab")
    with pytest.raises(DatasetFormatError, match="header announces"):
        load_dataset("mnist", root=str(tmp_path / "m"))
    (tmp_path / "junk").write_bytes(b"not an idx file")
    with pytest.raises(DatasetFormatError, match="bad magic"):
        read_idx(tmp_path / "junk")


def test_partitions_are_disjoint_cover_and_hold_out_validation():
    labels = np.repeat(np.arange(10), 100)
    rng = np.random.default_rng(0)
    for scheme in ("iid", "dirichlet", "shards"):
        p = make_partition(labels, 10, scheme, rng, alpha=0.3, val_fraction=0.1, client_val_fraction=0.2)
        parts = [*p.clients, *p.client_val, p.server_val]
        allidx = np.concatenate(parts)
        assert len(allidx) == len(set(allidx.tolist())) == 1000
        assert len(p.server_val) == 100
        assert all(len(v) > 0 for v in p.client_val)


def test_dirichlet_skews_labels_and_is_seeded():
    labels = np.repeat(np.arange(10), 100)
    a = make_partition(labels, 10, "dirichlet", np.random.default_rng(1), alpha=0.1)
    b = make_partition(labels, 10, "dirichlet", np.random.default_rng(1), alpha=0.1)
    assert all(np.array_equal(x, y) for x, y in zip(a.clients, b.clients))
    distinct = [len(set(labels[c].tolist())) for c in a.clients]
    assert min(distinct) < 10  # label skew: some client misses classes


def test_shards_deal_label_sorted_shards_of_equal_size():
    labels = np.repeat(np.arange(10), 100)
    a = make_partition(labels, 10, "shards", np.random.default_rng(3), val_fraction=0.0, shards_per_client=2)
    b = make_partition(labels, 10, "shards", np.random.default_rng(3), val_fraction=0.0, shards_per_client=2)
    assert all(np.array_equal(x, y) for x, y in zip(a.clients, b.clients))
    # 20 shards of 50: each shard is one class, so a client holds 1 or 2 classes, 100 samples
    assert [len(c) for c in a.clients] == [100] * 10
    assert all(1 <= len(set(labels[c].tolist())) <= 2 for c in a.clients)
    assert sorted(np.concatenate(a.clients).tolist()) == list(range(1000))
    one = make_partition(labels, 10, "shards", np.random.default_rng(3), val_fraction=0.0, shards_per_client=1)
    assert sorted(int(labels[c][0]) for c in one.clients) == list(range(10))
    assert all(len(set(labels[c].tolist())) == 1 for c in one.clients)


def test_bad_partition_settings_are_config_errors():
    labels = np.zeros(10, dtype=int)
    with pytest.raises(ConfigError):
        make_partition(labels, 20, "iid", np.random.default_rng(0))
    with pytest.raises(ConfigError):
        make_partition(labels, 2, "natural", np.random.default_rng(0))
    with pytest.raises(ConfigError):
        make_partition(labels, 2, "dirichlet", np.random.default_rng(0), alpha=0)
    with pytest.raises(ConfigError, match="shards"):
        make_partition(labels, 5, "shards", np.random.default_rng(0), val_fraction=0.0, shards_per_client=3)


@pytest.mark.data
@pytest.mark.parametrize("name, counts", [
    ("mnist", [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]),
    ("fashion-mnist", [6000] * 10),
])
def test_real_idx_data_when_present(name, counts):
    root = SHARED_DATA / name
    if not root.is_dir():
        pytest.skip(f"{root} is absent (real data lives in ../shared/data only on the team's machines)")
    d = load_dataset(name.replace("-", "_"), root=str(root))
    assert np.bincount(d.train.y.numpy()).tolist() == counts
    assert d.test.x.shape == (10000, 1, 28, 28)
