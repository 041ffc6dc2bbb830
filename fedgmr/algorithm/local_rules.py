"""The update rules of the data-heterogeneity methods as pure functions on flat vectors
(FedProx, SCAFFOLD option II, Ditto, FedBN's coordinate selection, FedProx's stragglers).

Every function takes the client's mask ``m`` (a bool vector over the flat parameters;
``None`` = the full model) and leaves coordinates outside it exactly as they were: a
pruned coordinate never moves. No I/O, no clock, no runtime: the client procedures in
:mod:`fedgmr.training.client_methods` and the SCAFFOLD server in
:mod:`fedgmr.strategy.scaffold` call these. Exact hand-derived vectors are in
``tests/test_local_rules_vectors.py``; the update rules as equations in docs/methods/.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from fedgmr.algorithm.params import ParamSpace


def _on_mask(value: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return value if mask is None else value * mask.to(value.dtype)


def proximal_gradient(grad: torch.Tensor, w: torch.Tensor, anchor: torch.Tensor, mu: float,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """Gradient of ``F(w) + mu/2 ||(w - anchor) * m||^2``: ``(g + mu (w - anchor)) * m``.

    FedProx (anchor = the model the client received) and Ditto's personal objective
    (anchor = the global model w, ``mu`` = lambda) share it."""
    return _on_mask(grad + mu * (w - anchor), mask)


def scaffold_corrected_gradient(grad: torch.Tensor, c_i: torch.Tensor, c: torch.Tensor,
                                mask: torch.Tensor | None = None) -> torch.Tensor:
    """SCAFFOLD's corrected local gradient ``(g - c_i + c) * m``."""
    return _on_mask(grad - c_i + c, mask)


def scaffold_control_update(c_i: torch.Tensor, c: torch.Tensor, x: torch.Tensor, y: torch.Tensor, steps: int,
                            lr: float, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Option II: ``c_i+ = c_i - c + (x - y) / (K lr)`` on the mask (zero elsewhere), with
    ``x`` the model the client received, ``y`` its trained model and ``K`` the local steps
    actually taken. Returns ``(c_i+, delta_c = c_i+ - c_i)``, both zero off the mask."""
    if steps < 1 or not lr > 0:
        raise ValueError(f"SCAFFOLD's control update needs K >= 1 steps and lr > 0 (got K={steps}, lr={lr})")
    new = _on_mask(c_i - c + (x - y) / (steps * lr), mask)
    return new, _on_mask(new - c_i, mask)


def scaffold_server_control(c: torch.Tensor, updates: list[tuple[torch.Tensor, torch.Tensor]],
                            coverage: torch.Tensor) -> torch.Tensor:
    """``c + sum_i delta_c_i * m_i / N_j``: each client's change of its control variate
    (values at its mask ``m_i``) summed and divided, per coordinate ``j``, by ``N_j`` = the
    number of clients in the population whose mask holds ``j`` (N for the full model,
    SCAFFOLD's 1/N with N = all clients, not the sampled ones). Coordinates no update
    covers keep their value. Returns a new tensor."""
    total = torch.zeros_like(c, dtype=torch.float64)
    for mask, values in updates:
        if mask.dtype != torch.bool or values.numel() != int(mask.sum()):
            raise ValueError("each update needs a bool mask and one value per kept coordinate")
        total[mask] += values.double()
    touched = total != 0
    if bool((coverage[touched] < 1).any()):
        raise ValueError("a control-variate update covers a coordinate that no client holds")
    out = c.double().clone()
    out[touched] += total[touched] / coverage[touched].double()
    return out.to(c.dtype)


def seed_new_coordinates(value: torch.Tensor | None, held: torch.Tensor | None, mask: torch.Tensor,
                         source: torch.Tensor) -> torch.Tensor:
    """A per-client vector that lives on the client's mask, carried to a new mask:
    coordinates the client held keep ``value``, coordinates new to it (restoration, a
    refreshed ranking, first contact) take ``source`` (Ditto: the global model w;
    SCAFFOLD: the server's c), coordinates it no longer holds become 0."""
    if value is None or held is None:
        return _on_mask(source.clone(), mask)
    kept = mask & held
    out = torch.where(kept, value, source)
    return _on_mask(out, mask)


def straggler_steps(seed: int, fraction: float, local_steps: int) -> int:
    """FedProx's straggler model: with probability ``fraction`` the job is a straggler and
    runs a uniform random number of steps in ``[1, E)`` (``E`` = ``local_steps``; 1 when
    E = 1), else ``E``. Drawn from the job's seed, so every executor draws the same."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"the straggler fraction must be in [0, 1], got {fraction}")
    if fraction == 0 or local_steps <= 1:
        return local_steps
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x57A6]))
    if rng.random() >= fraction:
        return local_steps
    return int(rng.integers(1, local_steps))


def batch_norm_coordinates(model: nn.Module, space: ParamSpace) -> tuple[torch.Tensor, tuple[str, ...]]:
    """FedBN's local part, selected by module type (every ``torch.nn`` BatchNorm, never by
    name): a bool mask of their affine parameters in the flat vector and the names of
    their buffers (running mean / var, batch count)."""
    local = torch.zeros(space.numel, dtype=torch.bool)
    offsets = {p.name: p for p in space.params}
    buffers: list[str] = []
    for mod_name, module in model.named_modules():
        if not isinstance(module, nn.modules.batchnorm._BatchNorm):
            continue
        prefix = f"{mod_name}." if mod_name else ""
        for n, _ in module.named_parameters(recurse=False):
            info = offsets.get(prefix + n)
            if info is not None:
                local[info.slice] = True
        buffers += [prefix + n for n, b in module.named_buffers(recurse=False) if b is not None]
    return local, tuple(buffers)


def personal_summary(accuracies: list[float], worst_fraction: float = 0.1) -> dict[str, float]:
    """Mean, population std and mean of the worst ``ceil(10 %)`` of per-client accuracies
    (``personal_accuracy``, ``personal_std``, ``personal_worst10``)."""
    values = [float(a) for a in accuracies if a is not None]
    if not values:
        raise ValueError("no client accuracy to summarise")
    k = max(1, math.ceil(worst_fraction * len(values)))
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    worst = sorted(values)[:k]
    return {"personal_accuracy": mean, "personal_std": std, "personal_worst10": math.fsum(worst) / k}


__all__ = ["proximal_gradient", "scaffold_corrected_gradient", "scaffold_control_update",
           "scaffold_server_control", "seed_new_coordinates", "straggler_steps", "batch_norm_coordinates",
           "personal_summary"]
