"""Typed, validated experiment configuration.

The tree mirrors the objects it builds (data, model, clients, training, sub-models,
aggregation, restoration, coordination, network, run). Unknown keys and bad values raise
:class:`~fedgmr.errors.ConfigError` with a one-line message naming the key.

One module per section (or group of close sections), all on the shared base
:class:`~fedgmr.config.base.Section`:

- :mod:`~fedgmr.config.data`: ``data``, ``model``, ``clients``
- :mod:`~fedgmr.config.training`: ``training`` (with its schedule and augmentation), ``local``, ``fedmrl``
- :mod:`~fedgmr.config.submodel`: ``submodel`` and ``submodel.baseline``
- :mod:`~fedgmr.config.aggregation`: ``aggregation`` (with ``aggregation.staleness``)
- :mod:`~fedgmr.config.clustering`: ``clustering``
- :mod:`~fedgmr.config.restoration`: ``restoration``, ``coordination``
- :mod:`~fedgmr.config.network`: ``network`` (with ``network.compute``)
- :mod:`~fedgmr.config.run`: ``run`` and the device forms it accepts
- :mod:`~fedgmr.config.distill`: ``distill`` (with ``distill.proxy``)
- :mod:`~fedgmr.config.experiment`: :class:`ExperimentConfig` and the checks that span sections
- :mod:`~fedgmr.config.loading`: reading files, ``--set`` overrides, dotted keys, one-line
  errors, the YAML dump

Every public name is importable from here (``from fedgmr.config import ExperimentConfig``).
The package imports nothing of fedgmr but :mod:`fedgmr.errors` and :mod:`fedgmr.safe_read`
(and, to check ``data.feature_shift``, the registry :mod:`fedgmr.data.shift`).
"""

from __future__ import annotations

from fedgmr.config.aggregation import AggregationConfig, StalenessConfig
from fedgmr.config.base import Section, check_known, is_real, short_repr
from fedgmr.config.clustering import ClusteringConfig
from fedgmr.config.data import ClientsConfig, DataConfig, ModelConfig
from fedgmr.config.distill import DistillConfig, ProxyConfig
from fedgmr.config.experiment import CLUSTERED_CLIENTS, ExperimentConfig
from fedgmr.config.loading import (MAX_CONFIG_BYTES, apply_overrides, check_sections, dump_config, get_dotted,
                                   parse_config, parse_value, read_config_file, set_dotted)
from fedgmr.config.network import ComputeConfig, NetworkConfig
from fedgmr.config.restoration import CoordinationConfig, RestorationConfig
from fedgmr.config.run import (DEVICE_FORMS, DEVICE_PATTERN, MAX_DEVICE_INDEX, MAX_TORCH_THREADS, RunConfig,
                               device_index_error)
from fedgmr.config.submodel import BaselineConfig, SubmodelConfig
from fedgmr.config.training import AugmentConfig, FedMRLConfig, LocalConfig, LRScheduleConfig, TrainingConfig

__all__ = [
    # sections
    "Section", "DataConfig", "ModelConfig", "ClientsConfig", "LRScheduleConfig", "AugmentConfig", "TrainingConfig",
    "LocalConfig", "FedMRLConfig", "BaselineConfig", "SubmodelConfig", "StalenessConfig", "AggregationConfig",
    "ClusteringConfig", "RestorationConfig", "CoordinationConfig", "ComputeConfig", "NetworkConfig", "RunConfig",
    "ProxyConfig", "DistillConfig", "ExperimentConfig",
    # constants
    "CLUSTERED_CLIENTS", "DEVICE_FORMS", "DEVICE_PATTERN", "MAX_CONFIG_BYTES", "MAX_DEVICE_INDEX",
    "MAX_TORCH_THREADS",
    # helpers
    "apply_overrides", "check_known", "check_sections", "device_index_error", "dump_config", "get_dotted",
    "is_real", "parse_config", "parse_value", "read_config_file", "set_dotted", "short_repr",
]
