"""VGG-11 without BatchNorm (the paper's CIFAR-10 model)."""

from __future__ import annotations

import torch
import torch.nn as nn

from fedgmr.models.pooling import MaxPool2d
from fedgmr.models.registry import MODELS, scaled, shape_mismatch
from fedgmr.options import ints_option

VGG11_CFG: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(nn.Module):
    """3x3 conv + ReLU stacks with max pooling, global average pool, MLP classifier.

    A pooling step is skipped once the feature map is 1x1, so inputs smaller than 32x32
    work; larger inputs are averaged down to 1x1 before the classifier.
    """

    def __init__(self, in_channels: int, image_size: int, num_classes: int,
                 cfg: tuple[int | str, ...] = VGG11_CFG, hidden: tuple[int, ...] = (512, 512)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        prev, side = in_channels, image_size
        for item in cfg:
            if item == "M":
                if side > 1:
                    layers.append(MaxPool2d(2, ceil_mode=True))
                    side = (side + 1) // 2
            else:
                layers += [nn.Conv2d(prev, int(item), 3, padding=1), nn.ReLU(inplace=True)]
                prev = int(item)
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        head: list[nn.Module] = []
        for h in hidden:
            head += [nn.Linear(prev, h), nn.ReLU(inplace=True)]
            prev = h
        head.append(nn.Linear(prev, num_classes))
        self.classifier = nn.Sequential(*head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


@MODELS.register("vgg11")
def build_vgg11(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0,
                hidden: tuple[int, ...] = (512, 512)) -> nn.Module:
    """VGG-11, no BatchNorm, classifier 512-512-classes; ``width`` scales every hidden layer."""
    hidden = ints_option("model.options.hidden", hidden)
    if len(input_shape) != 3:
        raise shape_mismatch("vgg11", "image (C, H, W)", input_shape)
    cfg = tuple(c if c == "M" else scaled(int(c), width) for c in VGG11_CFG)
    return VGG(input_shape[0], min(input_shape[1], input_shape[2]), num_classes, cfg,
               tuple(scaled(h, width) for h in hidden))
