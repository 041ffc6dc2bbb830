"""Coverage metrics of one aggregation (docs/methods/epm.md), as pure functions.

Over the ``K`` updates one aggregation used, with masks ``m_1..m_K`` over the ``N``
coordinates of the flat parameter vector:

* coverage ``Γ(n) = Σ_i m_i(n)`` (:func:`~fedgmr.algorithm.aggregation.coverage_counts`);
* the histogram ``h[c] = #{n : Γ(n) = c}`` for ``c = 0..K`` (:func:`coverage_histogram`);
* ``Γ*`` over the union ``U = {n : Γ(n) ≥ 1}`` of the aggregated masks:
  ``min_{n∈U} Γ(n)``, 0 when ``U`` is empty (:func:`union_min_coverage`);
* per density group ``g`` (the aggregated clients dispatched at one ladder density), with
  ``S_g`` the union of the group's masks: ``c*_g = min_{n∈S_g} Γ(n)`` (FedGMR's appendix
  E.1: ``c*_{g,k} = min_{n∈S_{g,k}} |C_k^(n)|``; :func:`group_min_coverage`);
* the pruned-weight energy ``‖θ − θ⊙m‖² = Σ_{n: m(n)=0} θ(n)²`` (:func:`pruned_energy`).

Over time (:class:`CoverageWindow`): the coverage summed over the last ``W`` aggregations,
``Γ_W(n) = Σ_{j=k-W+1..k} Γ_j(n)``, its minimum over *all* coordinates
(``window_coverage_min``, 0 as soon as one coordinate went untrained for ``W``
aggregations) and the share it leaves at 0 (``window_coverage_none``); and the share of
coordinates no aggregated update has ever covered (``coverage_never``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

import torch

from fedgmr.algorithm.aggregation import coverage_counts


def coverage_histogram(cov: torch.Tensor, num_updates: int) -> list[int]:
    """``h[c]`` = number of coordinates covered by exactly ``c`` updates, ``c = 0..num_updates``
    (``sum(h)`` is the number of coordinates)."""
    if num_updates < 0:
        raise ValueError(f"num_updates must be >= 0, got {num_updates}")
    if cov.numel() and int(cov.max()) > num_updates:
        raise ValueError(f"a coordinate is covered {int(cov.max())} times by {num_updates} updates")
    return [int(c) for c in torch.bincount(cov.reshape(-1).long(), minlength=num_updates + 1).tolist()]


def union_min_coverage(cov: torch.Tensor) -> int:
    """``Γ*`` over the coordinates some update covers (0 when none is covered)."""
    covered = cov[cov > 0]
    return int(covered.min()) if covered.numel() else 0


def group_min_coverage(cov: torch.Tensor, groups: Sequence[Sequence[torch.Tensor]]) -> list[int]:
    """``c*_g = min Γ(n)`` over the union ``S_g`` of each group's masks (0 for a group whose
    masks hold nothing)."""
    out = []
    for masks in groups:
        s = torch.zeros(cov.shape, dtype=torch.bool, device=cov.device)
        for m in masks:
            s |= m
        out.append(int(cov[s].min()) if bool(s.any()) else 0)
    return out


def pruned_energy(params: torch.Tensor, mask: torch.Tensor) -> float:
    """``‖θ − θ⊙m‖²``: the squared norm of the weights ``mask`` leaves out (float64 sum)."""
    return float(params.double().masked_fill(mask, 0.0).square().sum())


def aggregation_coverage(masks: Sequence[torch.Tensor], densities: Sequence[float],
                         numel: int) -> dict[str, object]:
    """The record keys of one aggregation: ``coverage_hist``, ``coverage_min`` (Γ* on the
    union), ``coverage_groups`` (the groups' densities, increasing) and
    ``coverage_group_min`` (``c*_g`` in that order). ``densities[i]`` is the ladder
    density update ``i`` was dispatched at; ``numel`` sizes the histogram when no update
    was aggregated."""
    if len(masks) != len(densities):
        raise ValueError(f"{len(masks)} masks but {len(densities)} densities")
    cov = coverage_counts(masks) if masks else torch.zeros(numel, dtype=torch.int32)
    levels = sorted(set(float(d) for d in densities))
    groups = [[m for m, d in zip(masks, densities) if float(d) == lv] for lv in levels]
    return {"coverage_hist": coverage_histogram(cov, len(masks)), "coverage_min": union_min_coverage(cov),
            "coverage_groups": levels, "coverage_group_min": group_min_coverage(cov, groups)}


def level_energy(params: torch.Tensor, level_masks: Sequence[torch.Tensor],
                 client_levels: Sequence[int]) -> dict[str, object]:
    """``pruned_energy`` (one value per ladder level: ``‖θ − θ⊙m_l‖²``) and
    ``pruned_energy_mean`` (its mean over the clients, each at its current level)."""
    per_level = [pruned_energy(params, m) for m in level_masks]
    mean = sum(per_level[lv] for lv in client_levels) / len(client_levels) if client_levels else 0.0
    return {"pruned_energy": per_level, "pruned_energy_mean": mean}


class CoverageWindow:
    """Coverage of the last ``size`` aggregations together, and the coordinates ever covered
    (see the module docstring). Feed it each aggregation's masks with :meth:`add`."""

    def __init__(self, numel: int, size: int, device: torch.device | str = "cpu") -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.numel = int(numel)
        self.size = int(size)
        self.counts: deque[torch.Tensor] = deque()
        self.total = torch.zeros(numel, dtype=torch.int32, device=device)
        self.ever = torch.zeros(numel, dtype=torch.bool, device=device)

    def add(self, masks: Sequence[torch.Tensor]) -> None:
        """One aggregation's masks (none: an aggregation that used no update)."""
        cov = (coverage_counts(masks).to(self.total.device) if masks
               else torch.zeros_like(self.total))
        self.counts.append(cov)
        self.total += cov
        if len(self.counts) > self.size:
            self.total -= self.counts.popleft()
        self.ever |= cov > 0

    def stats(self) -> dict[str, Any]:
        """``coverage_window`` (aggregations counted: ``size`` once that many happened),
        ``window_coverage_min``, ``window_coverage_none`` and ``coverage_never`` (before
        the first aggregation: nothing covered)."""
        n = max(self.numel, 1)
        return {"coverage_window": len(self.counts), "window_coverage_min": int(self.total.min()),
                "window_coverage_none": int((self.total == 0).sum()) / n,
                "coverage_never": int((~self.ever).sum()) / n}

    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        tensors = {f"count/{i}": c for i, c in enumerate(self.counts)}
        return {"size": self.size, "counts": len(self.counts)}, {**tensors, "ever": self.ever}

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        if int(state["size"]) != self.size:
            raise ValueError(f"the checkpoint counted coverage over {state['size']} aggregations, this run over "
                             f"{self.size} (run.coverage_window)")
        dev = self.total.device
        self.counts = deque(tensors[f"count/{i}"].to(dev, torch.int32, copy=True) for i in range(int(state["counts"])))
        self.total = torch.zeros_like(self.total)
        for c in self.counts:
            self.total += c
        self.ever = tensors["ever"].to(dev, torch.bool, copy=True)
