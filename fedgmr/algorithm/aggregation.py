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
    counts: dict[int, int] = {}  # per mask object: clients on one level share their level's mask
    for mask, values in updates:
        kept = counts.get(id(mask))
        if kept is None:
            if mask.shape != previous.shape:
                raise ValueError(f"mask shape {tuple(mask.shape)} != model shape {tuple(previous.shape)}")
            kept = counts[id(mask)] = mask_count(mask)
        if values.numel() != kept:
            raise ValueError(f"{values.numel()} values for a mask of {kept} coordinates")
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
    # clients on one level share a mask: its (cached) facts are looked up once per call, and
    # coverage takes one pass per mask: [mask, summed weight, indices (None: every coordinate)]
    mask_weight: dict[int, list] = {}
    for (mask, values), w in zip(updates, weights):
        vals = values.to(dtype)
        entry = mask_weight.get(id(mask))
        if entry is None:
            entry = mask_weight[id(mask)] = [mask, 0.0,
                                             None if mask_count(mask) == mask.numel() else mask_indices(mask)]
        if entry[2] is None:
            acc.add_(vals, alpha=w)
        else:
            acc.index_add_(0, entry[2], vals, alpha=w)
        entry[1] += w
    if not coverage:
        return acc, None
    den = torch.zeros(shape, dtype=dtype, device=device)
    for mask, w, idx in mask_weight.values():
        if idx is None:
            den.add_(w)
        else:
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
        idx = mask.nonzero().view(-1)[nz]  # distinct coordinates: one addition each
        num.index_add_(0, idx, w * values[nz].double())
        den.index_add_(0, idx, torch.full((idx.numel(),), float(w), dtype=den.dtype, device=den.device))
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


# ---------------------------------------------------------------------- robust rules
def _stacked(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float]) -> torch.Tensor:
    """The updates with a positive weight as rows of an ``(n, N)`` matrix, NaN where a
    client's mask does not cover a coordinate (float64 up to 2**20 coordinates)."""
    dtype = torch.float64 if previous.numel() <= (1 << 20) else torch.float32
    rows = [(mask, values) for (mask, values), w in zip(updates, weights) if w > 0]
    out = torch.full((len(rows), previous.numel()), float("nan"), dtype=dtype, device=previous.device)
    for i, (mask, values) in enumerate(rows):
        out[i, mask] = values.to(dtype)
    return out


def _sorted_covered(previous: torch.Tensor, updates: Sequence[Update],
                    weights: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each coordinate's covering values sorted ascending (NaN, the uncovered, last) and
    how many clients cover it."""
    stack = _stacked(previous, updates, weights)
    count = (~torch.isnan(stack)).sum(0)
    return torch.sort(stack, dim=0).values, count  # torch.sort puts NaN last


def _on_covered(previous: torch.Tensor, count: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``previous`` with ``value`` on the coordinates some client covers (``count > 0``)."""
    out = previous.clone()
    covered = count > 0
    out[covered] = value[covered].to(previous.dtype)
    return out


def coordinate_median(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float]) -> torch.Tensor:
    """Coordinate-wise median (Yin et al., 2018) under masks: each coordinate is the median
    of the values of the clients whose mask covers it (the mean of the two middle ones for
    an even count); a coordinate nobody covers keeps its previous value. Weights only
    select (an update of weight 0 takes no part): the median is unweighted."""
    _check(previous, updates, weights)
    values, count = _sorted_covered(previous, updates, weights)
    lo = ((count - 1).clamp(min=0) // 2).unsqueeze(0)
    hi = (count // 2).clamp(max=max(values.shape[0] - 1, 0)).unsqueeze(0)
    return _on_covered(previous, count, (values.gather(0, lo) + values.gather(0, hi)).squeeze(0) / 2)


def trimmed_mean(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float],
                 trim: float = 0.1) -> torch.Tensor:
    """Coordinate-wise trimmed mean (Yin et al., 2018) under masks: of the ``k`` clients
    covering a coordinate, the ``floor(trim * k)`` largest and as many smallest values are
    left out and the rest averaged; a coordinate nobody covers keeps its previous value.
    Unweighted, like :func:`coordinate_median`."""
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}")
    _check(previous, updates, weights)
    values, count = _sorted_covered(previous, updates, weights)
    cut = torch.floor(trim * count.to(torch.float64)).to(torch.long)
    rank = torch.arange(values.shape[0], device=values.device).unsqueeze(1)
    keep = (rank >= cut) & (rank < count - cut)  # inside [cut, count - cut) of the sorted covering values
    total = torch.where(keep, values, torch.zeros_like(values)).sum(0)
    return _on_covered(previous, count, total / (count - 2 * cut).clamp(min=1))


def krum_scores(updates: Sequence[Update], byzantine: int) -> list[float]:
    """Krum's score of each update (Blanchard et al., 2017) under masks: the sum of its
    squared distances to its ``n - f - 2`` nearest others (at least 1), a distance being
    the mean squared difference over the coordinates both masks cover (so pairs with
    different overlaps compare); two updates with no coordinate in common are infinitely
    far apart."""
    n = len(updates)
    if n == 0:
        return []
    dense_rows, masks = [], []
    for mask, values in updates:
        dense_rows.append(dense(mask, values.to(torch.float64)))
        masks.append(mask)
    dist = torch.full((n, n), float("inf"), dtype=torch.float64)
    for i in range(n):
        dist[i, i] = 0.0
        for j in range(i + 1, n):
            both = masks[i] & masks[j]
            k = int(both.sum())
            if k:
                d = float(((dense_rows[i] - dense_rows[j])[both] ** 2).sum()) / k
                dist[i, j] = dist[j, i] = d
    neighbours = max(n - byzantine - 2, 1)
    scores = []
    for i in range(n):
        others = torch.cat([dist[i, :i], dist[i, i + 1:]])
        scores.append(float(torch.sort(others).values[:neighbours].sum()) if others.numel() else 0.0)
    return scores


def krum(previous: torch.Tensor, updates: Sequence[Update], weights: Sequence[float], byzantine: int = 1,
         select: int | None = None) -> torch.Tensor:
    """(Multi-)Krum under masks: the ``select`` updates with the lowest
    :func:`krum_scores` (default ``n - f``, at least 1; ``select=1`` is Krum) are kept and
    combined by mask-aware averaging with their weights; the others take no part (ties:
    the earlier update first)."""
    if byzantine < 0:
        raise ValueError(f"the number of Byzantine clients must be >= 0, got {byzantine}")
    if select is not None and select < 1:
        raise ValueError(f"krum selects at least one update, got {select}")
    _check(previous, updates, weights)
    live = [(u, w) for u, w in zip(updates, weights) if w > 0]
    if not live:
        return previous.clone()
    scores = krum_scores([u for u, _ in live], byzantine)
    m = min(len(live), select if select is not None else max(len(live) - byzantine, 1))
    chosen = sorted(range(len(live)), key=lambda i: (scores[i], i))[:m]
    return mask_aware_average(previous, [live[i][0] for i in chosen], [live[i][1] for i in chosen])


def trimmed_mean_rule(trim: float) -> "AggregationRule":
    """:func:`trimmed_mean` with its trimmed share as a rule (``aggregation.trim``)."""
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"aggregation.trim must be in [0, 0.5), got {trim}")
    return AggregationRule("trimmed_mean", "model", functools.partial(trimmed_mean, trim=trim))


def krum_rule(byzantine: int, select: int | None = None) -> "AggregationRule":
    """:func:`krum` with its assumed Byzantine count and selection size as a rule."""
    if byzantine < 0 or (select is not None and select < 1):
        raise ValueError(f"krum needs byzantine >= 0 and select >= 1, got {byzantine}, {select}")
    return AggregationRule("krum", "model", functools.partial(krum, byzantine=byzantine, select=select))


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
# robust rules (docs/reference.md §4.2): with their default options; aggregation.trim,
# aggregation.krum_byzantine and aggregation.krum_select set them in a config
RULES.register("median", AggregationRule("median", "model", coordinate_median))
RULES.register("trimmed_mean", trimmed_mean_rule(0.1))
RULES.register("krum", krum_rule(1))
