"""scikit-learn's 8x8 digits: the embedded default data set (no download needed)."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch

from fedgmr.data.base import ArrayDataset, FederatedData
from fedgmr.data.registry import DATASETS
from fedgmr.options import float_option, int_option


@DATASETS.register("digits")
def load_digits(root: str | None = None, test_fraction: float = 0.2, seed: int = 0,
                image_size: int = 8) -> FederatedData:
    """1,797 8x8 grey digits (10 classes), scaled to [0, 1], shape (1, 8, 8).

    ``root`` is ignored (the data ships with scikit-learn). The test split is a fixed,
    stratified ``test_fraction`` of the samples chosen with ``seed``. ``image_size``
    resamples the images (bilinear), e.g. 28 to run MNIST-sized models such as Conv-2.
    """
    test_fraction = float_option("data.options.test_fraction", test_fraction, 0.0, 1.0, low_open=True, high_open=True)
    seed = int_option("data.options.seed", seed, minimum=0)
    image_size = int_option("data.options.image_size", image_size)
    images, target = _digits_arrays()
    x = torch.tensor(images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(target, dtype=torch.long)
    if image_size != 8:
        x = torch.nn.functional.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    rng = np.random.default_rng(seed)
    test_idx: list[int] = []
    for c in range(10):
        idx = np.flatnonzero(target == c)
        rng.shuffle(idx)
        test_idx.extend(idx[: int(round(len(idx) * test_fraction))].tolist())
    test_mask = np.zeros(len(y), dtype=bool)
    test_mask[test_idx] = True
    train = ArrayDataset(x[~test_mask], y[~test_mask])
    test = ArrayDataset(x[test_mask], y[test_mask])
    return FederatedData(name="digits", train=train, test=test, num_classes=10)


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) float64, target (1797,) int): what ``sklearn.datasets.load_digits()``
    returns as ``images`` and ``target``, read from the file it reads (scikit-learn's
    ``datasets/data/digits.csv.gz``) the way it reads it, without importing scikit-learn
    (~1.4 s of CPU per process: every run, sweep cell and Flower process on digits paid it).
    Falls back to scikit-learn's loader where the file is not found in its package folder."""
    spec = importlib.util.find_spec("sklearn")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, mode="rt", encoding="utf-8") as fh:
                data = np.loadtxt(fh, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int, copy=False)
    from sklearn.datasets import load_digits as _load  # pragma: no cover - an unusual install

    bunch = _load()  # pragma: no cover
    return bunch.images, bunch.target  # pragma: no cover
