"""A plugin: your own data set and model, used from the command line with ``--import``.

    fedgmr run quickstart --out runs/sensors --import examples/my_plugin.py --set data.name=my_sensors
    fedgmr run quickstart --out runs/sensors-net --import examples/my_plugin.py \\
        --set data.name=my_sensors --set model.name=sensor_net

Importing this file registers the data set ``my_sensors`` and the model ``sensor_net``;
any config can then name them. Installed as a package, the same module would be a
``fedgmr.plugins`` entry point instead (see docs/plugins.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from fedgmr.data import DATASETS, ArrayDataset, FederatedData
from fedgmr.models import MODELS, scaled
from fedgmr.options import float_option, int_option, ints_option

#: activity classes: each is a wave across the sensor grid with its own direction and frequency
PATTERNS = [(0.0, 1.0), (90.0, 1.0), (45.0, 1.5), (135.0, 1.5), (0.0, 2.5), (90.0, 2.5)]


@DATASETS.register("my_sensors")
def load_my_sensors(root: str | None = None, image_size: int = 16, num_samples: int = 1500,
                    test_samples: int = 300, noise: float = 2.0, seed: int = 0) -> FederatedData:
    """A square grid of ``image_size`` x ``image_size`` sensors read at one instant, shape
    (1, image_size, image_size): one of 6 activity patterns (a wave with its own direction
    and frequency, random phase and amplitude) under Gaussian noise. Generated from
    ``seed``, identically on every machine; ``root`` is ignored. ``image_size`` is named
    like the ``digits`` option, so the quickstart preset's ``data.options`` fit."""
    image_size = int_option("data.options.image_size", image_size, minimum=4)
    num_samples = int_option("data.options.num_samples", num_samples)
    test_samples = int_option("data.options.test_samples", test_samples)
    noise = float_option("data.options.noise", noise, 0.0, 10.0)
    seed = int_option("data.options.seed", seed, minimum=0)
    gen = torch.Generator().manual_seed(seed)
    n = num_samples + test_samples
    y = torch.randint(len(PATTERNS), (n,), generator=gen)
    grid = torch.linspace(0.0, 1.0, image_size)
    rows, cols = torch.meshgrid(grid, grid, indexing="ij")
    angle = torch.tensor([math.radians(a) for a, _ in PATTERNS])[y].view(n, 1, 1)
    freq = torch.tensor([f for _, f in PATTERNS])[y].view(n, 1, 1)
    phase = 2 * math.pi * torch.rand(n, 1, 1, generator=gen)
    amplitude = 0.5 + torch.rand(n, 1, 1, generator=gen)
    along = torch.cos(angle) * cols + torch.sin(angle) * rows
    x = amplitude * torch.sin(2 * math.pi * freq * along + phase)
    x = (x + noise * torch.randn(n, image_size, image_size, generator=gen)).unsqueeze(1)
    return FederatedData(name="my_sensors", train=ArrayDataset(x[:num_samples], y[:num_samples]),
                         test=ArrayDataset(x[num_samples:], y[num_samples:]), num_classes=len(PATTERNS))


class SensorNet(nn.Module):
    """Two 3x3 convolutions, global average pooling and a linear classifier."""

    def __init__(self, in_channels: int, num_classes: int, channels: tuple[int, int]) -> None:
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(nn.Conv2d(in_channels, c1, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(c2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


@MODELS.register("sensor_net")
def build_sensor_net(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0,
                     channels: tuple[int, int] = (16, 32)) -> nn.Module:
    """``SensorNet`` on (C, H, W) readings; ``width`` scales both convolutions' channels.
    It takes ``channels`` like ``cnn``, so the quickstart's ``model.options`` fit."""
    channels = ints_option("model.options.channels", channels, length=2)
    return SensorNet(input_shape[0], num_classes, (scaled(channels[0], width), scaled(channels[1], width)))
