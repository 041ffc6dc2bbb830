"""A generated classification task of any size (for scale tests and benchmarks)."""

from __future__ import annotations

import torch

from fedgmr.data.base import ArrayDataset, FederatedData
from fedgmr.data.registry import DATASETS
from fedgmr.errors import ConfigError
from fedgmr.options import int_option


@DATASETS.register("synthetic")
def load_synthetic(root: str | None = None, num_samples: int = 20000, num_features: int = 32,
                   num_classes: int = 10, test_samples: int = 2000, seed: int = 0) -> FederatedData:
    """Gaussian clusters from scikit-learn's ``make_classification``; ``root`` is ignored."""
    num_samples = int_option("data.options.num_samples", num_samples)
    num_features = int_option("data.options.num_features", num_features, minimum=2)
    num_classes = int_option("data.options.num_classes", num_classes, minimum=2)
    test_samples = int_option("data.options.test_samples", test_samples)
    seed = int_option("data.options.seed", seed, minimum=0)
    informative = max(2, num_features // 2)
    if num_classes > 2 ** informative:
        raise ConfigError(f"invalid value for 'data.options.num_classes': at most {2 ** informative} classes with "
                          f"{num_features} features (got {num_classes})")
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=num_samples + test_samples, n_features=num_features,
                               n_informative=max(2, num_features // 2), n_classes=num_classes,
                               n_clusters_per_class=1, random_state=seed)
    xt = torch.tensor(x, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.long)
    return FederatedData(name="synthetic", train=ArrayDataset(xt[:num_samples], yt[:num_samples]),
                         test=ArrayDataset(xt[num_samples:], yt[num_samples:]), num_classes=num_classes)
