"""FedGMR: model-heterogeneous federated learning with Gradual Model Restoration.

The public API in one import::

    from fedgmr import resolve_config, build_experiment, run_experiment

    cfg = resolve_config({"method": "fedgmr", "run": {"max_steps": 50}})
    exp = build_experiment(cfg, on_record=print)
    exp.simulator.run(max_steps=50)
"""

from fedgmr.config import ExperimentConfig, parse_config
from fedgmr.data import DATASETS, FederatedData, load_dataset
from fedgmr.errors import ConfigError, DatasetFormatError, FedGMRError, InvalidUpdateError
from fedgmr.experiment.build import EXECUTORS, Experiment, build_experiment
from fedgmr.experiment.metrics import acc_at_t, compare_runs, mri, time_to_accuracy
from fedgmr.experiment.runner import run_experiment
from fedgmr.methods import METHODS, Method, resolve_config
from fedgmr.models import MODELS, build_model

__version__ = "0.1.0"

__all__ = [
    "ExperimentConfig", "parse_config", "resolve_config", "METHODS", "Method",
    "build_experiment", "run_experiment", "Experiment", "EXECUTORS",
    "DATASETS", "FederatedData", "load_dataset", "MODELS", "build_model",
    "acc_at_t", "mri", "time_to_accuracy", "compare_runs",
    "FedGMRError", "ConfigError", "DatasetFormatError", "InvalidUpdateError",
]
