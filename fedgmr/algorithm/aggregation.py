"""Aggregation rules (docs/reference.md §4) as pure functions on flat vectors.

An update is a pair ``(mask, values)``: a bool mask over the flat parameter vector and
the float values at the masked coordinates (``values.numel() == mask.sum()``). Model
rules (MA, GA, FA, FedAsync) consume the client's trained weights, so a buffered update
can be used again at a later step; ``ga_delta`` consumes its change
``delta = w_i - W_start`` on the mask and applies it once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch

from fedgmr.algorithm.maskinfo import mask_count, mask_indices
from fedgmr.registry import Registry

Update = tuple[torch.Tensor, torch.Tensor]  # (bool mask over N, values at mask)


def dense(mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Scatter masked values into a zero vector of the mask's size (on the values' device)."""
    out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
    out[mask] = values
    return out


def _check(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float]) -> None:
    if len(updates) != len(weights):
        raise ValueError(f"{len(updates)} updates but {len(weights)} weights")
    for mask, values in updates:
        if mask.shape != previous.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} != model shape {tuple(previous.shape)}")
        if values.numel() != mask_count(mask):
            raise ValueError(f"{values.numel()} values for a mask of {mask_count(mask)} coordinates")
    if any(w < 0 for w in weights):
        raise ValueError("aggregation weights must be >= 0")


def _weighted_sum(shape: torch.Size, updates: Sequence[Update], weights: Sequence[float], coverage: bool = False,
                  device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """sum_i w_i * dense(update_i) (and sum_i w_i * m_i when ``coverage``), on ``device``
    (the model's).

    Sparse updates are added through their (cached) index lists and full ones directly,
    so the cost follows the number of kept coordinates, not the model size per update.
    Accumulates in float64 only for vectors up to 2**20 entries, float32 beyond.
    """
    dtype = torch.float64 if shape.numel() <= (1 << 20) else torch.float32
    acc = torch.zeros(shape, dtype=dtype, device=device)
    mask_weight: dict[int, list] = {}  # clients on one level share a mask: one coverage pass each
    for (mask, values), w in zip(updates, weights):
        vals = values.to(dtype)
        if mask_count(mask) == mask.numel():
            acc.add_(vals, alpha=w)
        else:
            acc.index_add_(0, mask_indices(mask), vals, alpha=w)
        mask_weight.setdefault(id(mask), [mask, 0.0])[1] += w
    if not coverage:
        return acc, None
    den = torch.zeros(shape, dtype=dtype, device=device)
    for mask, w in mask_weight.values():
        if mask_count(mask) == mask.numel():
            den.add_(w)
        else:
            idx = mask_indices(mask)
            den.index_add_(0, idx, torch.full((idx.numel(),), w, dtype=dtype, device=device))
    return acc, den


def mask_aware_average(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float],
                       floor: float = 0.0) -> torch.Tensor:
    """MA ("MaskFedAvg"): each coordinate is the weighted average over the clients that
    cover it; a coordinate nobody covers keeps its previous value.

    ``floor`` > 0 (``aggregation.coverage_floor``, a rule of this library, not the
    paper's) floors the denominator at ``floor`` x the total weight:
    ``sum_i b_i w_i m_i / max(sum_i b_i m_i, floor * sum_i b_i)``, so a coordinate that
    clients holding less than ``floor`` of the weight cover shrinks toward zero in
    proportion, as FA shrinks it. ``floor = 1`` is FA on every covered coordinate; once
    every client holds the full model it is MA whatever the floor.
    """
    _check(previous, updates, weights)
    num, den = _weighted_sum(previous.shape, updates, weights, coverage=True, device=previous.device)
    assert den is not None
    covered = den > 0
    least = max(floor * float(sum(weights)), 1e-30) if floor else 1e-30
    num.div_(den.clamp_min_(least))  # in place: both are this call's own buffers
    return torch.where(covered, num, previous.to(num.dtype)).to(previous.dtype)


def floored_ma_rule(floor: float) -> "AggregationRule":
    """MA with a coverage floor (:func:`mask_aware_average`'s ``floor``) as a rule."""
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"coverage floor must be in [0, 1], got {floor}")
    return AggregationRule("ma_floor", "model", functools.partial(mask_aware_average, floor=floor))


def gradient_average(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float]) -> torch.Tensor:
    """GA on buffered models: ``W + sum_i b_i ((w_i - W) * m_i) / sum_i b_i``.

    Each update's change is taken against the current global model ``W``, so a fresh
    update (downloaded at ``W``) contributes exactly its local change ``delta_i`` (the
    paper's GA, ``W + (1/C) sum_i delta_i * m_i`` with equal weights), and a buffered
    one can be used at every step without being applied twice: it pulls ``W`` toward the
    client's model on its mask, diluted by the total weight of all participants.
    """
    _check(previous, updates, weights)
    total = float(sum(weights))
    if total <= 0:
        return previous.clone()
    acc, den = _weighted_sum(previous.shape, updates, weights, coverage=True, device=previous.device)
    assert den is not None
    prev = previous.to(acc.dtype)
    return (prev + (acc - den * prev) / total).to(previous.dtype)


def delta_average(previous: torch.Tensor, deltas: Sequence[Update], weights: Sequence[float]) -> torch.Tensor:
    """GA on deltas (``ga_delta``): ``W + sum_i w_i (delta_i * m_i) / sum_i w_i``; each
    delta ``w_i - W_start`` is applied once, so it works on arrivals only."""
    _check(previous, deltas, weights)
    total = float(sum(weights))
    if total <= 0:
        return previous.clone()
    acc, _ = _weighted_sum(previous.shape, deltas, weights, device=previous.device)
    return (previous.to(acc.dtype) + acc / total).to(previous.dtype)


def zero_padded_average(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float]) -> torch.Tensor:
    """FA: weighted average of zero-padded client models (the pitfall baseline).

    With equal weights this is ``(1/C) sum_i w_i * m_i``; missing coordinates count as 0.
    """
    _check(previous, updates, weights)
    total = float(sum(weights))
    if total <= 0:
        return previous.clone()
    acc, _ = _weighted_sum(previous.shape, updates, weights, device=previous.device)
    return (acc / total).to(previous.dtype)


def fedasync_mix(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float]) -> torch.Tensor:
    """FedAsync: for each update in order, ``W <- (1 - a) W + a w_i`` with ``a`` its weight
    (``alpha * s(tau)``); only the update's masked coordinates move."""
    _check(previous, updates, weights)
    out = previous.clone()
    for (mask, values), a in zip(updates, weights):
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"FedAsync mixing weight must be in [0, 1], got {a}")
        if mask_count(mask) == mask.numel():
            out.mul_(1.0 - a).add_(values.to(out.dtype), alpha=a)
        else:
            idx = mask_indices(mask)
            out.index_copy_(0, idx, (1.0 - a) * out.index_select(0, idx) + a * values.to(out.dtype))
    return out


def nonzero_delta_average(previous: torch.Tensor, deltas: Sequence[Update], weights: Sequence[float],
                          server_lr: float = 1.0) -> torch.Tensor:
    """FIARSE: ``W + lr * avg_i delta_i`` per coordinate over the clients whose delta there
    is non-zero (weighted by their weights); coordinates nobody changed keep their value."""
    _check(previous, deltas, weights)
    num = torch.zeros_like(previous, dtype=torch.float64)
    den = torch.zeros_like(previous, dtype=torch.float64)
    for (mask, values), w in zip(deltas, weights):
        nz = values != 0
        idx = mask.nonzero().view(-1)[nz]
        num[idx] += w * values[nz].double()
        den[idx] += w
    out = previous.clone()
    moved = den > 0
    out[moved] = (previous[moved].double() + server_lr * num[moved] / den[moved]).to(previous.dtype)
    return out


def fiarse_rule(server_lr: float = 1.0) -> "AggregationRule":
    """The FIARSE rule with a server learning rate."""
    if server_lr <= 0:
        raise ValueError(f"server learning rate must be > 0, got {server_lr}")
    return AggregationRule("fiarse", "delta",
                           lambda prev, ups, ws: nonzero_delta_average(prev, ups, ws, server_lr))


def coverage_counts(masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Gamma(n) = number of masks holding coordinate n (shared mask objects counted once
    and multiplied, so clients on one level cost one pass)."""
    groups: dict[int, list] = {}
    for m in masks:
        groups.setdefault(id(m), [m, 0])[1] += 1
    out = (torch.zeros(masks[0].shape, dtype=torch.int32, device=masks[0].device) if masks
           else torch.zeros(0, dtype=torch.int32))
    for m, k in groups.values():
        out.add_(m.to(torch.int32), alpha=k)
    return out


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
RULES.register("ga", AggregationRule("ga", "model", gradient_average))
RULES.register("ga_delta", AggregationRule("ga_delta", "delta", delta_average))
RULES.register("fa", AggregationRule("fa", "model", zero_padded_average))
RULES.register("fedasync", AggregationRule("fedasync", "model", fedasync_mix, sequential=True))
RULES.register("fiarse", fiarse_rule(1.0))
