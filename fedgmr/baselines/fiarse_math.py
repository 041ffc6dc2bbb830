"""FIARSE's importance-aware masks and threshold-controlled gradient (pure functions).

Scores are ``|w|`` over every parameter outside normalisation layers (conv/linear weights
and biases); the threshold of a size ``s`` is the ``k``-th largest score with
``k = floor(numel * s)`` and the mask keeps ``|w| >= theta`` (ties may keep more). The
layer-wise variant uses one threshold per top-level stage. On kept weights the gradient
is multiplied by ``1 + 2 theta |w| / (|w| + theta)^2``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn

from fedgmr.algorithm.masks import mth_largest
from fedgmr.algorithm.params import _NORM_TYPES, ParamSpace


def _kept_count(numel: int, size: float) -> int:
    if not 0.0 < size <= 1.0:
        raise ValueError(f"size must be in (0, 1], got {size}")
    return int(math.floor(numel * size + 1e-9))


def thresholds(scores: torch.Tensor, sizes: Sequence[float]) -> list[float]:
    """For each size, the ``k``-th largest score, ``k = floor(numel * size)`` (``inf`` when
    ``k == 0``): one selection per size (a sort when ``scores`` hold NaN)."""
    ks = [_kept_count(scores.numel(), size) for size in sizes]
    if not any(ks):
        return [math.inf] * len(ks)
    flat = scores.flatten()
    if bool(torch.isnan(flat).any()):  # a sort puts NaN first; keep its order exactly
        ordered = torch.sort(flat, descending=True).values
        return [float(ordered[k - 1]) if k else math.inf for k in ks]
    # the k-th largest by a linear-time selection: the very entry a full sort would put at k - 1
    return [float(mth_largest(flat, k, nan_free=True)) if k else math.inf for k in ks]


def threshold(scores: torch.Tensor, size: float) -> float:
    """The ``k``-th largest score, ``k = floor(numel * size)``; ``inf`` when ``k == 0``."""
    return thresholds(scores, [size])[0]


def multiplier(w: torch.Tensor, theta: torch.Tensor | float) -> torch.Tensor:
    """Threshold-controlled gradient multiplier ``1 + 2 theta |w| / (|w| + theta)^2``.

    Taken as its limit 1 where the ratio is undefined: ``|w| = theta = 0`` (a full-size
    sub-model whose smallest kept weight is exactly zero) and ``theta = inf``. Without
    this, one exact zero in a full client's weights made every gradient NaN.
    """
    a = w.abs()
    theta = torch.as_tensor(theta, dtype=a.dtype, device=a.device)
    denom = (a + theta) ** 2
    defined = (denom > 0) & torch.isfinite(theta)
    return 1.0 + torch.where(defined, 2.0 * theta * a / denom, 0.0)


def _stage_names(model: nn.Module) -> dict[str, str]:
    """Module name -> its stage: the top-level child, or one level deeper when that child
    is a container of containers (ResNet ``layers.i``, Transformer ``blocks.i``)."""
    out: dict[str, str] = {}
    for top, child in model.named_children():
        kids = list(child.named_children())
        deeper = isinstance(child, (nn.Sequential, nn.ModuleList)) and kids and \
            all(len(list(k.children())) > 0 for _, k in kids)
        for name, _ in child.named_modules():
            full = f"{top}.{name}" if name else top
            out[full] = f"{top}.{name.split('.')[0]}" if deeper and name else top
    return out


def score_groups(model: nn.Module, space: ParamSpace, scope: str = "global") -> torch.Tensor:
    """Per flat coordinate: its threshold group (0.. for scored, -1 for norm parameters).

    ``scope`` is ``global`` (one group) or ``stage`` (one group per top-level stage).
    """
    if scope not in ("global", "stage"):
        raise ValueError(f"scope must be 'global' or 'stage', got {scope!r}")
    modules = dict(model.named_modules())
    stages = _stage_names(model)
    ids: dict[str, int] = {}
    groups = torch.full((space.numel,), -1, dtype=torch.long)
    for info in space.params:
        mod_name = info.name.rsplit(".", 1)[0] if "." in info.name else ""
        if isinstance(modules.get(mod_name), _NORM_TYPES):
            continue
        key = "" if scope == "global" else stages.get(mod_name, mod_name.split(".")[0])
        groups[info.slice] = ids.setdefault(key, len(ids))
    return groups


def level_masks(params: torch.Tensor, groups: torch.Tensor, sizes: Sequence[float]) -> list[torch.Tensor]:
    """:func:`level_mask` for every size in ``sizes``, sorting each group's scores once."""
    masks = [groups < 0 for _ in sizes]
    scores = params.abs()
    for g in range(int(groups.max()) + 1 if groups.numel() else 0):
        sel = (groups == g).nonzero().squeeze(1)
        group_scores = scores.index_select(0, sel)
        for mask, theta in zip(masks, thresholds(group_scores, sizes)):
            mask[sel] = group_scores >= theta
    return masks


def level_mask(params: torch.Tensor, groups: torch.Tensor, size: float) -> torch.Tensor:
    """Keep every unscored coordinate and, per group, ``|w| >= theta_g(size)``."""
    return level_masks(params, groups, [size])[0]


def thresholds_from_mask(start: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Per coordinate, its group's threshold as fixed at extraction: the smallest kept
    score of the group (``inf`` for a group with nothing kept, 0 for unscored)."""
    theta = torch.zeros_like(start)
    scores = start.abs()
    for g in range(int(groups.max()) + 1 if groups.numel() else 0):
        sel = groups == g
        kept = scores[sel & mask]
        theta[sel] = float(kept.min()) if kept.numel() else math.inf
    return theta
