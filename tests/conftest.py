"""Shared fixtures: tiny configs that run in a second or two."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    # tests run in parallel on 2 cores; oversubscribed BLAS threads only slow them down
    torch.set_num_threads(1)


def tiny_config(**sections: Any) -> dict[str, Any]:
    """A raw config dict for a seconds-long digits run; keyword sections are merged in."""
    cfg: dict[str, Any] = {
        "name": "tiny",
        "method": "fedgmr",
        "seed": 0,
        "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "clients": {"num_clients": 10, "heterogeneity": "high"},
        "training": {"lr": 0.1, "local_steps": 2},
        "restoration": {"check_interval": 2, "patience": 1},
        "network": {"model_size_mb": 2.0},
        "run": {"max_steps": 30, "eval_every": 2},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


@pytest.fixture
def tiny() -> Any:
    return tiny_config
