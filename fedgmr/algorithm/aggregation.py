"""Aggregation rules (SPEC 4) as pure functions on flat vectors.

An update is a pair ``(mask, values)``: a bool mask over the flat parameter vector and
the float values at the masked coordinates (``values.numel() == mask.sum()``). Model
rules (MA, FA, FedAsync) consume the client's trained weights; GA consumes its change
``delta = w_i - W_start`` on the mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch

from fedgmr.registry import Registry

Update = tuple[torch.Tensor, torch.Tensor]  # (bool mask over N, values at mask)


def dense(mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Scatter masked values into a zero vector of the mask's size."""
    out = torch.zeros(mask.shape, dtype=values.dtype)
    out[mask] = values
    return out


def _check(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float]) -> None:
    if len(updates) != len(weights):
        raise ValueError(f"{len(updates)} updates but {len(weights)} weights")
    for mask, values in updates:
        if mask.shape != previous.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} != model shape {tuple(previous.shape)}")
        if values.numel() != int(mask.sum()):
            raise ValueError(f"{values.numel()} values for a mask of {int(mask.sum())} coordinates")
    if any(w < 0 for w in weights):
        raise ValueError("aggregation weights must be >= 0")


def mask_aware_average(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float]) -> torch.Tensor:
    """MA ("MaskFedAvg"): each coordinate is the weighted average over the clients that
    cover it; a coordinate nobody covers keeps its previous value."""
    _check(previous, updates, weights)
    num = torch.zeros_like(previous, dtype=torch.float64)
    den = torch.zeros_like(previous, dtype=torch.float64)
    for (mask, values), w in zip(updates, weights):
        num[mask] += w * values.double()
        den[mask] += w
    covered = den > 0
    out = previous.clone()
    out[covered] = (num[covered] / den[covered]).to(previous.dtype)
    return out


def gradient_average(previous: torch.Tensor, deltas: Sequence[Update], weights: Sequence[float]) -> torch.Tensor:
    """GA: ``W + sum_i w_i (delta_i * m_i) / sum_i w_i`` over all participants."""
    _check(previous, deltas, weights)
    total = float(sum(weights))
    if total <= 0:
        return previous.clone()
    acc = torch.zeros_like(previous, dtype=torch.float64)
    for (mask, values), w in zip(deltas, weights):
        acc[mask] += w * values.double()
    return (previous.double() + acc / total).to(previous.dtype)


def zero_padded_average(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float]) -> torch.Tensor:
    """FA: weighted average of zero-padded client models (the pitfall baseline).

    With equal weights this is ``(1/C) sum_i w_i * m_i``; missing coordinates count as 0.
    """
    _check(previous, updates, weights)
    total = float(sum(weights))
    if total <= 0:
        return previous.clone()
    acc = torch.zeros_like(previous, dtype=torch.float64)
    for (mask, values), w in zip(updates, weights):
        acc[mask] += w * values.double()
    return (acc / total).to(previous.dtype)


def fedasync_mix(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float]) -> torch.Tensor:
    """FedAsync: for each update in order, ``W <- (1 - a) W + a w_i`` with ``a`` its weight
    (``alpha * s(tau)``); only the update's masked coordinates move."""
    _check(previous, updates, weights)
    out = previous.clone()
    for (mask, values), a in zip(updates, weights):
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"FedAsync mixing weight must be in [0, 1], got {a}")
        out[mask] = (1.0 - a) * out[mask] + a * values.to(out.dtype)
    return out


def coverage_counts(masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Gamma(n) = number of masks holding coordinate n."""
    return torch.stack([m.to(torch.int32) for m in masks]).sum(0)


def average_buffers(buffers: Sequence[dict[str, torch.Tensor]], weights: Sequence[float],
                    previous: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weighted average of float buffers (BatchNorm statistics); integer buffers
    (``num_batches_tracked``) take the maximum. Buffers are never masked."""
    if not buffers:
        return {k: v.clone() for k, v in previous.items()}
    total = float(sum(weights)) or 1.0
    out: dict[str, torch.Tensor] = {}
    for name, prev in previous.items():
        if prev.is_floating_point():
            acc = torch.zeros_like(prev, dtype=torch.float64)
            for b, w in zip(buffers, weights):
                acc += w * b[name].double()
            out[name] = (acc / total).to(prev.dtype) if sum(weights) > 0 else prev.clone()
        else:
            out[name] = torch.stack([b[name] for b in buffers]).max(0).values
    return out


@dataclass(frozen=True)
class AggregationRule:
    """A named rule: what it consumes (client models or deltas) and the function."""

    name: str
    consumes: Literal["model", "delta"]
    fn: Callable[[torch.Tensor, Sequence[Update], Sequence[float]], torch.Tensor]
    sequential: bool = False  # FedAsync: weights are per-update mixing rates

    def __call__(self, previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float]) -> torch.Tensor:
        return self.fn(previous, updates, weights)


RULES: Registry[AggregationRule] = Registry("aggregation rule")
RULES.register("ma", AggregationRule("ma", "model", mask_aware_average))
RULES.register("ga", AggregationRule("ga", "delta", gradient_average))
RULES.register("fa", AggregationRule("fa", "model", zero_padded_average))
RULES.register("fedasync", AggregationRule("fedasync", "model", fedasync_mix, sequential=True))
