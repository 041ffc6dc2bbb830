"""Small vision models: an MLP, a small CNN and the paper's Conv-2."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from fedgmr.models.pooling import MaxPool2d
from fedgmr.models.registry import MODELS, scaled, shape_mismatch
from fedgmr.options import bool_option, int_option, ints_option


class MLP(nn.Module):
    """Flatten -> hidden layers with ReLU -> classifier."""

    def __init__(self, in_features: int, num_classes: int, hidden: tuple[int, ...] = (64, 64)) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        prev = in_features
        for h in hidden:
            layers += [nn.Linear(prev, h), nn.ReLU()]
            prev = h
        layers.append(nn.Linear(prev, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """Two 3x3 conv blocks (with optional BatchNorm) and a linear classifier."""

    def __init__(self, in_channels: int, num_classes: int, channels: tuple[int, int] = (16, 32),
                 batch_norm: bool = True) -> None:
        super().__init__()
        c1, c2 = channels

        def block(cin: int, cout: int) -> list[nn.Module]:
            mods: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1)]
            if batch_norm:
                mods.append(nn.BatchNorm2d(cout))
            mods += [nn.ReLU(), MaxPool2d(2)]
            return mods

        self.features = nn.Sequential(*block(in_channels, c1), *block(c1, c2), nn.AdaptiveAvgPool2d(2))
        self.classifier = nn.Linear(c2 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class Conv2(nn.Module):
    """The paper's FEMNIST model: 5x5 conv 32 -> 5x5 conv 64 -> FC 2048 -> classes."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int,
                 channels: tuple[int, int] = (32, 64), hidden: int = 2048, batch_norm: bool = False) -> None:
        super().__init__()
        c1, c2 = channels

        def block(cin: int, cout: int) -> list[nn.Module]:
            norm: list[nn.Module] = [nn.BatchNorm2d(cout)] if batch_norm else []
            return [nn.Conv2d(cin, cout, 5, padding=2), *norm, nn.ReLU(), MaxPool2d(2)]

        self.features = nn.Sequential(*block(in_channels, c1), *block(c1, c2))
        side = image_size // 4
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(c2 * side * side, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _image_shape(input_shape: tuple[int, ...], model: str) -> tuple[int, int]:
    if len(input_shape) != 3:
        raise shape_mismatch(model, "image (C, H, W)", input_shape)
    return input_shape[0], input_shape[1]


@MODELS.register("mlp")
def build_mlp(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0,
              hidden: tuple[int, ...] = (64, 64)) -> nn.Module:
    """Multi-layer perceptron on flattened inputs."""
    hidden = ints_option("model.options.hidden", hidden)
    return MLP(math.prod(input_shape), num_classes, tuple(scaled(h, width) for h in hidden))


@MODELS.register("cnn")
def build_cnn(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0,
              channels: tuple[int, int] = (16, 32), batch_norm: bool = True) -> nn.Module:
    """Small CNN: two conv blocks (BatchNorm by default) and a linear classifier."""
    channels = ints_option("model.options.channels", channels, length=2)
    batch_norm = bool_option("model.options.batch_norm", batch_norm)
    cin, _ = _image_shape(input_shape, "cnn")
    return SmallCNN(cin, num_classes, (scaled(channels[0], width), scaled(channels[1], width)), batch_norm)


@MODELS.register("conv2")
def build_conv2(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0,
                channels: tuple[int, int] = (32, 64), hidden: int = 2048, batch_norm: bool = False) -> nn.Module:
    """The paper's Conv-2 (FEMNIST model); ``batch_norm: true`` adds BatchNorm after each conv
    (not in the paper: for FedBN and feature-shift studies)."""
    channels = ints_option("model.options.channels", channels, length=2)
    hidden = int_option("model.options.hidden", hidden)
    batch_norm = bool_option("model.options.batch_norm", batch_norm)
    cin, size = _image_shape(input_shape, "conv2")
    if size < 4:
        raise shape_mismatch("conv2", "image (C, H, W) with H, W >= 4", input_shape)
    return Conv2(cin, size, num_classes, (scaled(channels[0], width), scaled(channels[1], width)),
                 scaled(hidden, width), batch_norm)
