"""``fedgmr masks``: how each ladder level's sub-model spreads over the model's layers, at
initialisation: per prunable layer the coordinates the level's mask keeps. A density is one
number; this says where it goes (a small density may leave a layer at its per-layer floor)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from fedgmr.algorithm.params import ParamSpace


def layer_rows(space: ParamSpace, masks: Sequence[torch.Tensor], ladder: Sequence[float]) -> list[dict[str, Any]]:
    """One row per ladder level and prunable layer (``kept`` of ``numel`` coordinates), then
    per level one row for the coordinates no mask prunes (biases, the output layer, norms)
    and one for the whole model. ``masks[i]`` is level ``ladder[i]``'s mask over the flat
    parameter vector."""
    if len(masks) != len(ladder):
        raise ValueError(f"{len(masks)} masks for a ladder of {len(ladder)} levels")
    prunable = space.prunable_layers
    fixed = space.numel - sum(p.numel for p in prunable)
    rows: list[dict[str, Any]] = []
    for density, mask in zip(ladder, masks):
        if mask.numel() != space.numel:
            raise ValueError(f"a mask of {mask.numel()} coordinates for a model of {space.numel}")
        mask = mask.bool().cpu()
        kept_prunable = 0
        for p in prunable:
            kept = int(mask[p.slice].sum())
            kept_prunable += kept
            rows.append({"level": float(density), "layer": p.name, "shape": "x".join(map(str, p.shape)),
                         "kept": kept, "of": p.numel})
        rest = int(mask.sum()) - kept_prunable
        rows.append({"level": float(density), "layer": "(not pruned)", "shape": "", "kept": rest, "of": fixed})
        rows.append({"level": float(density), "layer": "(model)", "shape": "", "kept": int(mask.sum()),
                     "of": space.numel})
    for row in rows:
        row["kept_pct"] = 100.0 * row["kept"] / row["of"] if row["of"] else float("nan")
    return rows


def policy_masks(exp: Any) -> tuple[list[float], list[torch.Tensor]]:
    """The ladder and each level's mask of a built experiment's sub-model policy, as the
    run starts (before any refresh)."""
    from fedgmr.errors import ConfigError

    policy = getattr(exp.strategy, "policy", None)
    if policy is None:
        raise ConfigError(f"method {exp.config.method!r} has no sub-model policy whose masks could be shown")
    ladder = [float(d) for d in policy.ladder]
    return ladder, [policy.mask(i) for i in range(len(ladder))]
