"""Representation models: a feature extractor with an explicit representation layer and
a linear head, as FedMRL needs them (docs/methods/fedmrl.md).

A representation model has ``extractor`` (inputs -> a ``rep_dim`` vector) and ``head``
(an ``nn.Linear(rep_dim, num_classes)``); its builder takes ``rep_dim``. ``width`` scales
the hidden sizes, never ``rep_dim``, so models of every width share the representation
size (the paper's heterogeneous CNNs all end in one 500-unit layer).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from fedgmr.models.pooling import MaxPool2d
from fedgmr.models.registry import MODELS, scaled, shape_mismatch
from fedgmr.options import int_option, ints_option


class RepCNN(nn.Module):
    """5x5 conv -> pool -> 5x5 conv -> pool -> FC ``hidden`` -> FC ``rep_dim`` (the
    representation, after ReLU) -> linear head. The paper's CNN family, scaled down."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int, channels: tuple[int, int] = (16, 32),
                 hidden: int = 256, rep_dim: int = 100) -> None:
        super().__init__()
        c1, c2 = channels
        side = image_size // 4
        self.extractor = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5, padding=2), nn.ReLU(), MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), MaxPool2d(2), nn.Flatten(),
            nn.Linear(c2 * side * side, hidden), nn.ReLU(), nn.Linear(hidden, rep_dim), nn.ReLU(),
        )
        self.head = nn.Linear(rep_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.extractor(x))


def is_representation_model(model: nn.Module) -> bool:
    """Whether ``model`` has an ``extractor`` and a linear ``head``."""
    return isinstance(getattr(model, "extractor", None), nn.Module) and isinstance(getattr(model, "head", None),
                                                                                   nn.Linear)


@MODELS.register("rep_cnn")
def build_rep_cnn(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0,
                  channels: tuple[int, int] = (16, 32), hidden: int = 256, rep_dim: int = 100) -> nn.Module:
    """CNN with a ``rep_dim`` representation layer (FedMRL's model family)."""
    channels = ints_option("model.options.channels", channels, length=2)
    hidden = int_option("model.options.hidden", hidden)
    rep_dim = int_option("model.options.rep_dim", rep_dim)
    if len(input_shape) != 3 or input_shape[1] < 4:
        raise shape_mismatch("rep_cnn", "image (C, H, W) with H, W >= 4", input_shape)
    assert rep_dim is not None and hidden is not None
    return RepCNN(input_shape[0], input_shape[1], num_classes,
                  (scaled(channels[0], width), scaled(channels[1], width)), scaled(hidden, width), rep_dim)


__all__ = ["RepCNN", "build_rep_cnn", "is_representation_model"]
