"""ResNet-18 with BatchNorm (the paper's ImageNet-100 model)."""

from __future__ import annotations

import torch
import torch.nn as nn

from fedgmr.models.registry import MODELS, scaled, shape_mismatch
from fedgmr.options import bool_option


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus a shortcut (1x1 conv + BN when the shape changes)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet with BasicBlocks; ``small_input`` uses a 3x3 stride-1 stem without max pooling."""

    def __init__(self, in_channels: int, num_classes: int, blocks: tuple[int, ...] = (2, 2, 2, 2),
                 channels: tuple[int, ...] = (64, 128, 256, 512), small_input: bool = True) -> None:
        super().__init__()
        stem = channels[0]
        if small_input:
            self.stem = nn.Sequential(nn.Conv2d(in_channels, stem, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(stem), nn.ReLU(inplace=True))
        else:
            self.stem = nn.Sequential(nn.Conv2d(in_channels, stem, 7, stride=2, padding=3, bias=False),
                                      nn.BatchNorm2d(stem), nn.ReLU(inplace=True),
                                      nn.MaxPool2d(3, stride=2, padding=1))
        stages: list[nn.Module] = []
        prev = stem
        for i, (n, c) in enumerate(zip(blocks, channels)):
            stride = 1 if i == 0 else 2
            stage = [BasicBlock(prev, c, stride)] + [BasicBlock(c, c) for _ in range(n - 1)]
            stages.append(nn.Sequential(*stage))
            prev = c
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(prev, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


@MODELS.register("resnet18")
def build_resnet18(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0,
                   small_input: bool | None = None) -> nn.Module:
    """ResNet-18 (BasicBlock, [2, 2, 2, 2], 64..512 channels scaled by ``width``).

    ``small_input`` selects the CIFAR-style stem; by default it is used when H <= 64.
    """
    small_input = bool_option("model.options.small_input", small_input, optional=True)
    if len(input_shape) != 3:
        raise shape_mismatch("resnet18", "image (C, H, W)", input_shape)
    if small_input is None:
        small_input = input_shape[1] <= 64
    channels = tuple(scaled(c, width) for c in (64, 128, 256, 512))
    return ResNet(input_shape[0], num_classes, (2, 2, 2, 2), channels, small_input)
