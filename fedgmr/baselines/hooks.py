"""Wiring of the baselines into :func:`fedgmr.experiment.build.build_experiment`.

:func:`baseline_setup` looks at the policy a config selected and returns what differs
from FedGMR's defaults: the client method, the strategy class and its extra arguments
(label split, static-BN statistics), the simulator class (structured payload sizes), the
aggregation rule (FIARSE's server learning rate) and the ladder's reported densities.
Everything else (server, buffer, staleness, GMR, IMS, virtual clock) is shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from fedgmr.algorithm.aggregation import AggregationRule, fiarse_rule
from fedgmr.algorithm.params import ParamSpace
from fedgmr.algorithm.policies import SubmodelPolicy
from fedgmr.algorithm.restoration import DensityLadder
from fedgmr.baselines.policies import FiarsePolicy, OrderedDropoutPolicy, RollingPolicy, WidthPolicy

#: the sub-model policies whose methods train with their own client procedure
BASELINE_POLICIES: tuple[type, ...] = (WidthPolicy, FiarsePolicy)
from fedgmr.baselines.server import BNStatistics, LabelSplit, has_bn, label_keep_masks
from fedgmr.baselines.training import (FiarseClient, ModelSpec, OrderedDropoutClient, WidthClient,
                                       spec_options)
from fedgmr.errors import ConfigError
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy


def width_builder(cfg: Any, data: Any) -> ModelSpec:
    """The configured model as a picklable ``build(width)``."""
    return ModelSpec(cfg.model.name, data.num_classes, tuple(data.input_shape), spec_options(cfg.model.options))


@dataclass
class BaselineSetup:
    """What a baseline changes in an experiment's wiring."""

    #: the baseline's client method (:mod:`fedgmr.baselines.training`), in place of
    #: ``local.algorithm``'s: a baseline trains with its own client procedure
    client_method: Any = None
    strategy_cls: type[MaskedBufferedStrategy] = MaskedBufferedStrategy
    strategy_kwargs: dict[str, Any] = field(default_factory=dict)
    rule: AggregationRule | None = None
    densities: list[float] | None = None

    def ladder(self, ladder: DensityLadder) -> DensityLadder:
        """Report each level's parameter fraction instead of the nominal budget."""
        if self.densities is None:
            return ladder
        return DensityLadder(tuple(self.densities), list(ladder.levels))


def baseline_setup(cfg: Any, data: Any, partition: Any, space: ParamSpace, policy: SubmodelPolicy,
                   model_factory: Any, device: torch.device | str = "cpu") -> BaselineSetup | None:
    """The baseline wiring for ``policy`` (None for FedGMR's own policies); the server's
    static-BN model lives on ``device`` (the global model's)."""
    b = cfg.submodel.baseline
    if isinstance(policy, FiarsePolicy):
        if cfg.aggregation.rule == "fiarse":
            rule = fiarse_rule(b.server_lr)
        else:
            rule = None
        return BaselineSetup(client_method=FiarseClient(b.threshold_scope), rule=rule,
                             densities=policy.level_densities())
    if not isinstance(policy, WidthPolicy):
        return None
    spec = policy.structure.build
    setup = BaselineSetup(densities=policy.level_densities())
    rates, sizes = tuple(policy.rates), tuple(policy.level_sizes())
    if isinstance(policy, OrderedDropoutPolicy):
        setup.client_method = OrderedDropoutClient(spec, rates, sizes, policy.p_values, b.distill)
    else:
        setup.client_method = WidthClient(spec, rates, sizes, b.scaler, b.label_split and data.task == "classification")
        if b.label_split and data.task == "classification":
            y = data.train.y
            setup.strategy_kwargs["plugins"] = (LabelSplit(label_keep_masks(
                space, [y[torch.as_tensor(idx, dtype=torch.long)] for idx in partition.clients], data.num_classes)),)
    eval_model: nn.Module = model_factory().to(device)
    if b.static_bn and has_bn(eval_model):
        val_idx = torch.as_tensor(partition.server_val, dtype=torch.long)
        if len(val_idx) == 0:
            raise ConfigError("static BatchNorm statistics need a server validation split (data.val_fraction > 0)")
        widths: list[float] = []
        if isinstance(policy, OrderedDropoutPolicy):
            widths = sorted({*policy.p_values, *policy.rates})
        setup.strategy_kwargs["bn_stats"] = BNStatistics(eval_model, space, data.train.x[val_idx],
                                                         structure=policy.structure if widths else None,
                                                         widths=widths)
    return setup


__all__ = ["BaselineSetup", "baseline_setup", "width_builder", "RollingPolicy"]
