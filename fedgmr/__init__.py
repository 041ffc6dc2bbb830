"""FedGMR: model-heterogeneous federated learning with Gradual Model Restoration.

The public API in one import::

    from fedgmr import resolve_config, build_experiment, run_experiment

    cfg = resolve_config({"method": "fedgmr", "run": {"max_steps": 50}})
    exp = build_experiment(cfg, on_record=print)
    exp.simulator.run(max_steps=50)

The names below are imported on first use (PEP 562), so that ``import fedgmr`` and the
commands that build no model (``fedgmr table``, ``compare``, ``methods``, ``presets``)
start without loading PyTorch or matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "ExperimentConfig": "fedgmr.config", "parse_config": "fedgmr.config",
    "DATASETS": "fedgmr.data", "FederatedData": "fedgmr.data", "load_dataset": "fedgmr.data",
    "ConfigError": "fedgmr.errors", "DatasetFormatError": "fedgmr.errors", "FedGMRError": "fedgmr.errors",
    "InvalidUpdateError": "fedgmr.errors",
    "EXECUTORS": "fedgmr.experiment.build", "Experiment": "fedgmr.experiment.build",
    "build_experiment": "fedgmr.experiment.build",
    "acc_at_t": "fedgmr.experiment.metrics", "compare_runs": "fedgmr.experiment.metrics",
    "mri": "fedgmr.experiment.metrics", "time_to_accuracy": "fedgmr.experiment.metrics",
    "run_experiment": "fedgmr.experiment.runner",
    "METHODS": "fedgmr.methods", "Method": "fedgmr.methods", "resolve_config": "fedgmr.methods",
    "MODELS": "fedgmr.models", "build_model": "fedgmr.models",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see: the eager imports
    from fedgmr.config import ExperimentConfig, parse_config
    from fedgmr.data import DATASETS, FederatedData, load_dataset
    from fedgmr.errors import ConfigError, DatasetFormatError, FedGMRError, InvalidUpdateError
    from fedgmr.experiment.build import EXECUTORS, Experiment, build_experiment
    from fedgmr.experiment.metrics import acc_at_t, compare_runs, mri, time_to_accuracy
    from fedgmr.experiment.runner import run_experiment
    from fedgmr.methods import METHODS, Method, resolve_config
    from fedgmr.models import MODELS, build_model


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access and cache the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedgmr' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
