"""HeteroFL's scaler and static BatchNorm statistics.

* :func:`attach_scaler` divides the output of every hidden layer (conv, linear,
  embedding; not the output layer) by the width rate ``r`` while the model is training
  and leaves it unchanged in evaluation, so a width-``r`` sub-model's activations match
  the full model's scale in expectation.
* :func:`recompute_bn_stats` is the server's one-pass BatchNorm statistics: running
  statistics are reset and re-estimated as a cumulative average over the given data.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

_SCALED = (nn.modules.conv._ConvNd, nn.Linear, nn.Embedding)


def attach_scaler(model: nn.Module, rate: float, output_layer: str) -> list[RemovableHandle]:
    """Divide hidden-layer outputs by ``rate`` in training mode (identity in eval).

    Returns the hook handles (``handle.remove()`` detaches the scaler).
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"scaler rate must be in (0, 1], got {rate}")

    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        return output / rate if module.training else output

    return [m.register_forward_hook(hook) for name, m in model.named_modules()
            if isinstance(m, _SCALED) and name != output_layer]


def has_batch_norm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


@torch.no_grad()
def recompute_bn_stats(model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
    """Re-estimate every BatchNorm's running statistics in one pass over ``batches``
    (cumulative average, ``momentum=None``); parameters are not touched."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    saved = [(m.momentum, m.track_running_stats) for m in bns]
    for m in bns:
        m.track_running_stats = True
        m.reset_running_stats()
        m.momentum = None
    was_training = model.training
    model.train()
    for xb in batches:
        model(xb)
    model.train(was_training)
    for m, (mom, track) in zip(bns, saved):
        m.momentum, m.track_running_stats = mom, track
