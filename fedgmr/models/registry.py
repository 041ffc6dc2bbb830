"""Model registry.

Every builder has the signature ``builder(num_classes, input_shape, width=1.0, **options)``
and returns an ``nn.Module``. ``width`` scales hidden channels/units as
``ceil(width * base)`` (inputs and the classifier's outputs never change), so one
definition per architecture serves every sub-model policy.
"""

from __future__ import annotations

import math
from typing import Callable

import torch.nn as nn

from fedgmr.errors import ConfigError
from fedgmr.registry import Registry

ModelBuilder = Callable[..., nn.Module]
MODELS: Registry[ModelBuilder] = Registry("model")


def scaled(channels: int, width: float) -> int:
    """Hidden size at a width rate: ``ceil(width * channels)``, at least 1."""
    if not 0.0 < width <= 1.0:
        raise ValueError(f"width must be in (0, 1], got {width}")
    return max(1, math.ceil(width * channels - 1e-9))


def shape_mismatch(model: str, needs: str, input_shape: tuple[int, ...]) -> ConfigError:
    """The error for a model whose inputs the data set does not provide."""
    return ConfigError(f"invalid value for 'model.name': model '{model}' needs {needs} inputs, but the data set "
                       f"gives samples of shape {tuple(input_shape)} (choose a model for this data set)")


def build_model(name: str, num_classes: int, input_shape: tuple[int, ...], **options) -> nn.Module:
    """Build a registered model by name."""
    return MODELS.get(name)(num_classes=num_classes, input_shape=tuple(input_shape), **options)
