"""Nested magnitude masks (docs/reference.md §3.1-3.3) and their IMS increments (§6.5).

One global ranking of all prunable coordinates is computed from the global model;
the mask of density ``rho`` holds the always-kept coordinates plus the first
``round(rho * P)`` entries of the ranking, so masks of increasing density are nested.
Every prunable layer's top ``floor`` fraction comes first, so no layer is ever cut off.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn as nn

from fedgmr.algorithm.params import ParamSpace


def flops_per_weight(model: nn.Module, space: ParamSpace, example: torch.Tensor) -> dict[str, float]:
    """Multiply-accumulates each weight performs per sample (conv: output positions).

    Measured with forward hooks on one example batch. Parameters of modules the hooks
    cannot classify count 1 MAC per weight.
    """
    factors: dict[str, float] = {}
    hooks = []
    for mod_name, module in model.named_modules():
        if isinstance(module, nn.modules.conv._ConvNd):
            def hook(mod, inp, out, name=mod_name):
                factors[name] = float(math.prod(out.shape[2:]))
        elif isinstance(module, nn.Linear):
            def hook(mod, inp, out, name=mod_name):
                factors[name] = float(math.prod(out.shape[1:-1])) if out.ndim > 2 else 1.0
        else:
            continue
        hooks.append(module.register_forward_hook(hook))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(example[:1])
    model.train(was_training)
    for h in hooks:
        h.remove()
    out: dict[str, float] = {}
    for p in space.params:
        module_name = p.name.rsplit(".", 1)[0] if "." in p.name else ""
        out[p.name] = factors.get(module_name, 1.0)
    return out


#: The authors' FEMNIST constants for Conv-2's prunable layers (conv1, conv2, fc1), in
#: seconds per parameter: ``COMM_COEFFICIENT + NUM_LOCAL_UPDATES * COMP_COEFFICIENT_l``
#: with 5.561621e-6 s and per-update compute 0, 7.098850e-6 and 1.927325e-7 s (timings
#: carried over from PruneFL; their configs/femnist.py). ``submodel.layer_costs`` replays them.
FEMNIST_CONV2_COSTS = (5.561621025626998e-06 + 5 * 0.0,
                       5.561621025626998e-06 + 5 * 7.098850e-06,
                       5.561621025626998e-06 + 5 * 1.927325e-07)


def layer_costs(space: ParamSpace, comm: float, comp: dict[str, float] | None = None) -> dict[str, float]:
    """The authors' per-layer cost ``c_l = comm + comp_l``, in seconds per parameter.

    ``comm`` is the time one parameter adds to a transfer (the same for every layer);
    ``comp_l`` the time one weight of layer ``l`` adds to a client's local training (all
    local steps). A coordinate's importance is ``|w| / c_l``: of two equally large
    weights the one in the cheaper layer is kept first. Only the ratios matter.
    """
    comp = comp or {}
    return {p.name: comm + comp.get(p.name, 0.0) for p in space.prunable_layers}


def compute_costs(space: ParamSpace, macs_per_weight: dict[str, float], seconds: float) -> dict[str, float]:
    """``comp_l`` of a compute model in which a job's ``seconds`` follow its sub-model's
    multiply-accumulates (``network.compute.kind: flops``): each weight's share of them."""
    total = sum(p.numel * macs_per_weight.get(p.name, 1.0) for p in space.params) or 1.0
    return {p.name: seconds * macs_per_weight.get(p.name, 1.0) / total for p in space.prunable_layers}


def explicit_costs(space: ParamSpace, given: Sequence[float] | dict[str, float]) -> dict[str, float]:
    """Per-layer costs given by the user: one per prunable layer, in layer order, or a
    mapping from parameter name (every prunable layer named)."""
    names = [p.name for p in space.prunable_layers]
    if isinstance(given, dict):
        missing = [n for n in names if n not in given]
        unknown = [n for n in given if n not in names]
        if missing or unknown:
            raise ValueError(f"submodel.layer_costs must name the prunable layers {names}"
                             + (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else ""))
        return {n: float(given[n]) for n in names}
    if len(given) != len(names):
        raise ValueError(f"submodel.layer_costs lists {len(given)} costs for {len(names)} prunable layers {names}")
    return {n: float(c) for n, c in zip(names, given)}


def magnitude_ranking(flat: torch.Tensor, space: ParamSpace, floor: float = 0.02,
                      costs: dict[str, float] | None = None) -> torch.Tensor:
    """Rank prunable coordinates (flat indices), most important first.

    Importance is ``|w| / cost(layer)``; each layer's top ``floor`` fraction (at least one
    coordinate) comes first, then every other coordinate by importance. Ties are broken by
    position, so the ranking is deterministic.
    """
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"floor must be in [0, 1], got {floor}")
    head_idx, head_score, tail_idx, tail_score = [], [], [], []
    for p in space.prunable_layers:
        score = flat[p.slice].abs().double()
        if costs is not None:
            score = score / costs[p.name]
        order = torch.sort(score, descending=True, stable=True).indices
        n_floor = min(p.numel, max(1, math.ceil(floor * p.numel))) if floor > 0 else 0
        idx = order + p.offset
        head_idx.append(idx[:n_floor])
        head_score.append(score[order[:n_floor]])
        tail_idx.append(idx[n_floor:])
        tail_score.append(score[order[n_floor:]])
    if not head_idx:
        return torch.zeros(0, dtype=torch.long, device=flat.device)

    def _merge(idx: list[torch.Tensor], sc: list[torch.Tensor]) -> torch.Tensor:
        all_idx, all_sc = torch.cat(idx), torch.cat(sc)
        # sort by score desc, then by flat index asc for ties
        by_index = torch.argsort(all_idx, stable=True)
        all_idx, all_sc = all_idx[by_index], all_sc[by_index]
        return all_idx[torch.sort(all_sc, descending=True, stable=True).indices]

    return torch.cat([_merge(head_idx, head_score), _merge(tail_idx, tail_score)])


def _select_mth_largest(score: torch.Tensor, m: int) -> torch.Tensor:
    """The ``m``-th largest entry of a 1-D ``score`` (``1 <= m <= n``), as a 0-dim tensor,
    by a selection of the smaller side (topk slows down as its k grows; kthvalue's
    quickselect degrades to seconds on the near-sorted scores of `rolling`)."""
    n = score.numel()
    if m <= n - m + 1:
        return torch.topk(score, m, sorted=False).values.min()
    return torch.topk(score, n - m + 1, largest=False, sorted=False).values.max()  # the (n - m + 1)-th smallest


#: below this many entries :func:`mth_largest` selects directly
_SAMPLED_SELECTION_MIN = 1 << 16


def mth_largest(score: torch.Tensor, m: int, nan_free: bool = False) -> torch.Tensor:
    """The ``m``-th largest entry of a 1-D ``score``, exactly (the value
    :func:`_select_mth_largest` gives), in a few linear passes: a strided sample's sorted
    values bracket it, the entries between the brackets are selected from (a few percent
    of them), and the count above the upper bracket says which one it is. A sample that
    does not bracket it (scores arranged against the stride) falls back to the full
    selection."""
    n = score.numel()
    if n < _SAMPLED_SELECTION_MIN or (not nan_free and bool(torch.isnan(score).any())):  # topk puts NaN first
        return _select_mth_largest(score, m)
    stride = n // (_SAMPLED_SELECTION_MIN // 2)
    sample = torch.sort(score[::stride], descending=True).values
    s = sample.numel()
    q = (m * s) // n  # where the m-th largest falls in the sample
    margin = max(64, 4 * math.isqrt(s))
    hi = sample[q - margin] if q - margin >= 0 else None  # above the m-th largest, whp
    lo = sample[q + margin] if q + margin < s else None  # below it
    above = 0 if hi is None else int(torch.count_nonzero(score > hi))
    if above >= m:
        return _select_mth_largest(score, m)
    inside = None
    if lo is not None:
        inside = score >= lo
    if hi is not None:
        inside = score <= hi if inside is None else inside.logical_and_(score <= hi)
    candidates = score if inside is None else score[inside]
    if above + candidates.numel() < m:
        return _select_mth_largest(score, m)
    return _select_mth_largest(candidates, m - above)


def top_positions(score: torch.Tensor, m: int, tie: torch.Tensor | None = None,
                  nan_free: bool = False) -> torch.Tensor:
    """Bool mask of the ``m`` largest entries of a 1-D ``score``: the first ``m`` of a
    stable descending sort by ``(score, tie)``, ties left by position. Found in linear
    time: a selection for the threshold, then the entries tied at it by ``tie`` (largest
    first) and position. ``nan_free``: the caller vouches that ``score`` holds no NaN."""
    n = score.numel()
    out = torch.zeros(n, dtype=torch.bool, device=score.device)
    if m <= 0:
        return out
    if m >= n:
        return out.fill_(True)
    threshold = mth_largest(score, m, nan_free)
    torch.gt(score, threshold, out=out)
    missing = m - int(torch.count_nonzero(out))
    tied = torch.nonzero(score == threshold).squeeze(1)
    if tie is None or missing >= tied.numel():
        out[tied[:missing]] = True
    else:
        out[tied[top_positions(tie[tied], missing)]] = True
    return out


def ranked_mask(score: torch.Tensor, space: ParamSpace, density: float, floor: float = 0.02,
                basis: str = "model", tie: torch.Tensor | None = None) -> torch.Tensor:
    """``mask_from_ranking(magnitude_ranking(score, space, floor), space, density, floor,
    basis)`` for finite scores, without ranking every coordinate: each layer's floor by
    selection, then the rest by one selection over all prunable coordinates (ties by
    position, as the ranking breaks them). Linear instead of ``O(P log P)``, for masks
    drawn once per client and dispatch.

    tie: a second key, over all coordinates, ordering the coordinates of equal ``score``
    (largest first) before their position: the mask of the lexicographic order
    ``(score, tie, -position)``."""
    k = prefix_length(space, density, floor, basis)
    mask = space.always_kept.to(score.device, copy=True)
    layers = sorted(space.prunable_layers, key=lambda p: p.offset)
    if not layers:
        return mask
    score = score.double()
    if tie is not None:
        tie = tie.to(score.device, torch.float64)
    head = torch.zeros(space.numel, dtype=torch.bool, device=score.device)
    for p in layers:
        n_floor = min(p.numel, max(1, math.ceil(floor * p.numel))) if floor > 0 else 0
        head[p.slice] = top_positions(score[p.slice], n_floor, None if tie is None else tie[p.slice])
    rest = torch.cat([score[p.slice].masked_fill(head[p.slice], -math.inf) for p in layers])
    rest_tie = None if tie is None else torch.cat([tie[p.slice] for p in layers])
    taken = top_positions(rest, k - int(head.sum()), rest_tie)
    start = 0
    for p in layers:
        mask[p.slice] |= head[p.slice] | taken[start:start + p.numel]
        start += p.numel
    return mask


def floor_count(space: ParamSpace, floor: float) -> int:
    """How many coordinates the per-layer floor reserves in total."""
    if floor <= 0:
        return 0
    return sum(min(p.numel, max(1, math.ceil(floor * p.numel))) for p in space.prunable_layers)


def _asked_length(space: ParamSpace, density: float, basis: str) -> int:
    """How many ranked (prunable) coordinates ``density`` asks for, before the floor and
    the model's size bound it (:func:`prefix_length`)."""
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")
    if basis == "prunable":
        return int(round(density * space.num_prunable))
    if basis == "model":
        return int(round(density * space.numel)) - (space.numel - space.num_prunable)
    raise ValueError(f"basis must be 'prunable' or 'model', got {basis!r}")


def floor_sets_size(space: ParamSpace, density: float, floor: float = 0.02, basis: str = "model") -> bool:
    """Whether a mask of ``density`` is larger than asked for because the per-layer floor's
    total is more than the density leaves for the prunable weights (:func:`prefix_length`
    takes the floor then): every prunable layer then holds just its floor."""
    return density < 1.0 and _asked_length(space, density, basis) < floor_count(space, floor)


def prefix_length(space: ParamSpace, density: float, floor: float = 0.02, basis: str = "model") -> int:
    """How many ranked (prunable) coordinates a mask of ``density`` takes.

    ``basis="prunable"``: ``round(rho * P)`` of the ``P`` prunable weights, the always-kept
    coordinates on top. ``basis="model"``: the mask holds ``round(rho * N)`` of all ``N``
    coordinates, the always-kept ones included, so its payload is rho of the full model's.
    Never below the per-layer floor's total, never above ``P``.
    """
    k = _asked_length(space, density, basis)
    if density >= 1.0:
        k = space.num_prunable
    return min(space.num_prunable, max(k, floor_count(space, floor)))


def mask_from_ranking(ranking: torch.Tensor, space: ParamSpace, density: float, floor: float = 0.02,
                      basis: str = "model") -> torch.Tensor:
    """Mask of a given density: always-kept coordinates + a prefix of ``ranking``
    (:func:`prefix_length` says how long).

    The prefix never drops below the per-layer floor, so a density smaller than the
    floor's total yields the floor itself.
    """
    k = prefix_length(space, density, floor, basis)
    mask = space.always_kept.to(ranking.device, copy=True)  # on the ranking's (the model's) device
    mask[ranking[:k]] = True
    return mask


def nested_masks(ranking: torch.Tensor, space: ParamSpace, densities: Sequence[float],
                 floor: float = 0.02, basis: str = "model") -> list[torch.Tensor]:
    """Masks for increasing ``densities``; each is a subset of the next."""
    if list(densities) != sorted(densities):
        raise ValueError(f"densities must be increasing, got {list(densities)}")
    return [mask_from_ranking(ranking, space, d, floor, basis) for d in densities]


def nested_ranked_masks(flat: torch.Tensor, space: ParamSpace, densities: Sequence[float],
                        floor: float = 0.02, basis: str = "model",
                        costs: dict[str, float] | None = None) -> list[torch.Tensor]:
    """``nested_masks(magnitude_ranking(flat, space, floor, costs), space, densities, floor,
    basis)``, bit for bit, without ranking every coordinate.

    Each layer's floor by one selection, then one selection per level over the other
    prunable coordinates (ties by flat position, as the ranking breaks them), from the
    densest level down, each inside the previous level's selection. Linear instead of
    ``O(P log P)``: what a mask refresh costs. Scores that are NaN or negative (a
    non-finite model, negative costs) take the ranking's path.
    """
    if list(densities) != sorted(densities):
        raise ValueError(f"densities must be increasing, got {list(densities)}")
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"floor must be in [0, 1], got {floor}")
    ks = [prefix_length(space, d, floor, basis) for d in densities]
    layers = sorted(space.prunable_layers, key=lambda p: p.offset)
    if not layers:
        return [space.always_kept.to(flat.device, copy=True) for _ in ks]
    scores = []
    for p in layers:  # the ranking's scores, computed by the same operations
        score = flat[p.slice].abs().double()
        if costs is not None:
            score = score / costs[p.name]
        scores.append(score)
    rest = torch.cat(scores)
    if not float(rest.min()) >= 0.0:  # NaN (min propagates it) or a negative score
        return nested_masks(magnitude_ranking(flat, space, floor, costs), space, densities, floor, basis)
    # each layer's top floor fraction (ties by position): the head of the ranking
    head = torch.zeros(rest.numel(), dtype=torch.bool, device=rest.device)
    start = 0
    for p, score in zip(layers, scores):
        n_floor = min(p.numel, max(1, math.ceil(floor * p.numel))) if floor > 0 else 0
        head[start:start + p.numel] = top_positions(score, n_floor, nan_free=True)
        start += p.numel
    n_head = int(torch.count_nonzero(head))
    rest.masked_fill_(head, -math.inf)  # the tail: every other prunable coordinate
    # from the densest level down: the m largest of the tail lie inside the m' >= m largest
    # (the same order), so each level selects within the previous level's selection
    taken: list[torch.Tensor] = [None] * len(ks)  # type: ignore[list-item]
    pool: torch.Tensor | None = None  # tail positions of the previous selection, increasing
    for i in reversed(range(len(ks))):
        m = ks[i] - n_head
        if pool is None:
            sel = top_positions(rest, m, nan_free=True)
            if 2 * m < rest.numel():  # narrow the pool only when it halves the work
                pool = torch.nonzero(sel).squeeze(1)
        else:
            inner = top_positions(rest[pool], m, nan_free=True)
            sel = torch.zeros(rest.numel(), dtype=torch.bool, device=rest.device)
            sel[pool[inner]] = True
            pool = pool[inner]
        taken[i] = sel
    out = []
    for sel in taken:
        sel |= head
        mask = space.always_kept.to(flat.device, copy=True)
        start = 0
        for p in layers:
            mask[p.slice] |= sel[start:start + p.numel]
            start += p.numel
        out.append(mask)
    return out


def ims_increments(masks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """IMS blocks: the first mask, then what each level adds to the previous one.

    The blocks are disjoint and their union is the last mask.
    """
    blocks, prev = [], None
    for m in masks:
        blocks.append(m.clone() if prev is None else m & ~prev)
        prev = m
    return blocks


def coverage(masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Coverage counts Gamma(n): how many masks hold each coordinate."""
    return torch.stack([m.to(torch.int32) for m in masks]).sum(0)
