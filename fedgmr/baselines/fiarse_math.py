"""FIARSE's importance-aware masks and threshold-controlled gradient (pure functions).

Scores are ``|w|`` over every parameter outside normalisation layers (conv/linear weights
and biases); the threshold of a size ``s`` is the ``k``-th largest score with
``k = floor(numel * s)`` and the mask keeps ``|w| >= theta`` (ties may keep more). The
layer-wise variant uses one threshold per top-level stage. On kept weights the gradient
is multiplied by ``1 + 2 theta |w| / (|w| + theta)^2``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from fedgmr.algorithm.params import _NORM_TYPES, ParamSpace


def threshold(scores: torch.Tensor, size: float) -> float:
    """The ``k``-th largest score, ``k = floor(numel * size)``; ``inf`` when ``k == 0``."""
    if not 0.0 < size <= 1.0:
        raise ValueError(f"size must be in (0, 1], got {size}")
    k = int(math.floor(scores.numel() * size + 1e-9))
    if k == 0:
        return math.inf
    return float(torch.topk(scores.double(), k, sorted=True).values[-1])


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


def level_mask(params: torch.Tensor, groups: torch.Tensor, size: float) -> torch.Tensor:
    """Keep every unscored coordinate and, per group, ``|w| >= theta_g(size)``."""
    mask = groups < 0
    scores = params.abs()
    for g in range(int(groups.max()) + 1 if groups.numel() else 0):
        sel = groups == g
        theta = threshold(scores[sel], size)
        mask[sel] = scores[sel] >= theta
    return mask


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
