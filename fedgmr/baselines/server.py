"""Server-side pieces of the baselines: label split, static BatchNorm statistics and
structured payload sizes, as plug-ins and options of the shared strategy and simulator."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
import torch.nn as nn

from fedgmr.algorithm.params import ParamSpace, get_buffers
from fedgmr.baselines.structure import WidthStructure
from fedgmr.device import module_device
from fedgmr.models.scaler import has_batch_norm, recompute_bn_stats
from fedgmr.strategy.messages import Reply
from fedgmr.strategy.plugins import ServerPlugin


def label_keep_masks(space: ParamSpace, client_labels: Sequence[torch.Tensor], num_classes: int) -> list[torch.Tensor]:
    """Per client, a mask over the flat vector that drops the output layer's rows (and
    bias entries) of the classes absent from the client's data."""
    out_params = [p for p in space.params if p.name.startswith(f"{space.output_layer}.") and p.shape[0] == num_classes]
    masks = []
    for labels in client_labels:
        present = torch.zeros(num_classes, dtype=torch.bool)
        present[torch.unique(labels.long())] = True
        keep = torch.ones(space.numel, dtype=torch.bool)
        for p in out_params:
            rows = present.view(-1, *([1] * (len(p.shape) - 1))).expand(p.shape)
            keep[p.slice] = rows.reshape(-1)
        masks.append(keep)
    return masks


class BNStatistics:
    """The server's static-BatchNorm pass: after each aggregation, one pass over ``x``
    (the server's validation split) re-estimates the global model's running statistics
    (cumulative average). With ``widths`` (FjORD) it also keeps statistics for every
    width sub-model (shared affine parameters, separate statistics), by list position."""

    def __init__(self, model: nn.Module, space: ParamSpace, x: torch.Tensor, batch_size: int = 256,
                 structure: WidthStructure | None = None, widths: Sequence[float] = ()) -> None:
        self.model, self.space, self.x, self.batch_size = model, space, x, batch_size  # x: on any device
        self.structure = structure
        self.widths = list(widths)
        self.width_buffers: list[dict[str, torch.Tensor]] = []

    def _batches(self) -> list[torch.Tensor]:
        """The split in batches, on the model's device."""
        device = module_device(self.model)
        return [self.x[i:i + self.batch_size].to(device) for i in range(0, len(self.x), self.batch_size)]

    def __call__(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        self.space.load(self.model, params)
        recompute_bn_stats(self.model, self._batches())
        if self.structure is not None:
            self.width_buffers = []
            for p in self.widths:
                sub, sub_space = self.structure.model(p)
                sub_space.load(sub, params[self.structure.slice(p, 0).gather])
                recompute_bn_stats(sub, self._batches())
                self.width_buffers.append(get_buffers(sub))
        return get_buffers(self.model)


class LabelSplit(ServerPlugin):
    """HeteroFL's label split, a plug-in of the shared strategy: a reply is restricted to
    ``assigned mask & keep`` before validation, which the strategy accepts as a subset of
    the assigned mask.

    label_keep: per client, the coordinates it may contribute.
    """

    name = "HeteroFL's label split"

    def __init__(self, label_keep: Sequence[torch.Tensor]) -> None:
        self.label_keep = list(label_keep)

    def bind(self, strategy: Any) -> None:
        super().bind(strategy)
        self.label_keep = [k.to(strategy.device) for k in self.label_keep]

    def prepare(self, reply: Reply) -> Reply:
        cid = reply.client_id
        if isinstance(cid, int) and 0 <= cid < len(self.label_keep) \
                and reply.mask is None and isinstance(reply.values, torch.Tensor) and reply.values.ndim == 1:
            a = self.strategy.job(cid)
            if a is not None and reply.values.numel() == int(a.mask.sum()):
                keep = self.label_keep[cid]
                values = reply.values.to(self.strategy.device)
                reply = dataclasses.replace(reply, mask=a.mask & keep, values=values[keep[a.mask]])
        return reply


def has_bn(model: nn.Module) -> bool:
    return has_batch_norm(model)
