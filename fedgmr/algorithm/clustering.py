"""The math of clustered FL (docs/methods/ifca.md, docs/methods/cfl.md), as pure functions.

* IFCA (Ghosh et al., 2020): a client takes the cluster model with the lowest loss on its
  own data, :func:`lowest_loss`; each cluster model is then aggregated from its clients.
* CFL (Sattler et al., 2020): a cluster is split in two when its clients' updates nearly
  cancel (small norm of the mean update) while some are still large (:func:`cfl_should_split`);
  the two halves come from complete-linkage clustering of the updates' cosine similarities
  (:func:`bipartition`), mapped back from positions in the cluster to client ids
  (:func:`split_clients`).
* :func:`cluster_purity` and :func:`same_partition` score an assignment against the data's
  true groups.

Updates under masks are compared on the coordinates every update holds
(:func:`common_coordinates`): with FedGMR's nested masks, the lowest level's sub-model.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch


def lowest_loss(losses: Sequence[float]) -> int:
    """IFCA's cluster choice: the index of the smallest loss (ties: the lowest index;
    NaN never wins)."""
    best, best_loss = 0, float("inf")
    for j, loss in enumerate(losses):
        if loss == loss and loss < best_loss:  # loss == loss: not NaN
            best, best_loss = j, float(loss)
    return best


def common_coordinates(masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """The coordinates every mask holds (their intersection)."""
    if not masks:
        raise ValueError("no masks")
    out = masks[0].clone()
    for m in masks[1:]:
        out &= m
    return out


def cosine_similarities(updates: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Pairwise cosine similarity of the rows of ``updates`` (n x d), in float64:
    ``<a, b> / (|a| |b| + eps)`` as in Sattler's reference code (a zero update is
    orthogonal to everything)."""
    u = updates.double()
    norms = u.norm(dim=1)
    return (u @ u.T) / (norms[:, None] * norms[None, :] + eps)


def update_norms(updates: torch.Tensor) -> tuple[float, float]:
    """(norm of the mean update, largest update norm) of the rows of ``updates``: CFL's
    two statistics (the reference code's ``compute_mean_update_norm`` and
    ``compute_max_update_norm``)."""
    u = updates.double()
    return float(u.mean(dim=0).norm()), float(u.norm(dim=1).max())


def cfl_should_split(mean_norm: float, max_norm: float, size: int, round_index: int, eps1: float, eps2: float,
                     min_size: int = 2, warmup: int = 20) -> bool:
    """CFL's split criterion: the cluster is near a stationary point of the joint objective
    (``mean_norm < eps1``) while some client is still far from its own (``max_norm > eps2``),
    it has more than ``min_size`` clients and more than ``warmup`` rounds have passed."""
    return mean_norm < eps1 and max_norm > eps2 and size > min_size and round_index > warmup


def bipartition(similarity: torch.Tensor) -> tuple[list[int], list[int]]:
    """Two groups of positions ``0..n-1`` from complete-linkage agglomerative clustering
    on the similarity matrix (n >= 2): start from singletons and merge, while more than two
    groups remain, the pair whose *least* similar members are most similar. Ties merge
    the pair that comes first (groups ordered by their smallest member). Returns the two
    groups, each sorted, the one holding position 0 first."""
    s = similarity.double()
    n = s.shape[0]
    if n < 2 or s.shape != (n, n):
        raise ValueError(f"bipartition needs an n x n similarity matrix with n >= 2, got {tuple(s.shape)}")
    groups: list[list[int]] = [[i] for i in range(n)]
    while len(groups) > 2:
        best: tuple[float, int, int] | None = None
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                link = float(s[groups[a]][:, groups[b]].min())
                if best is None or link > best[0]:
                    best = (link, a, b)
        assert best is not None
        _, a, b = best
        groups[a] = sorted(groups[a] + groups[b])
        del groups[b]
        groups.sort(key=lambda g: g[0])
    return groups[0], groups[1]


def split_clients(members: Sequence[int], similarity: torch.Tensor) -> tuple[list[int], list[int]]:
    """Bipartition the cluster ``members`` (client ids; ``similarity`` is indexed by their
    positions in ``members``) and return the two halves as *client ids*. Sattler's
    reference code used the positions themselves as client ids, which is wrong for every
    cluster but the first (docs/methods/cfl.md, pitfalls)."""
    first, second = bipartition(similarity)
    return [int(members[i]) for i in first], [int(members[i]) for i in second]


def cluster_purity(assignment: Sequence[int], truth: Sequence[int]) -> float | None:
    """Purity of a clustering against true groups: the share of clients that belong to
    their cluster's most common true group. Clients with no cluster yet (``-1``) are left
    out; None when none has one."""
    pairs = [(c, t) for c, t in zip(assignment, truth) if c >= 0]
    if not pairs:
        return None
    by_cluster: dict[int, Counter[int]] = {}
    for c, t in pairs:
        by_cluster.setdefault(c, Counter())[t] += 1
    return sum(max(cnt.values()) for cnt in by_cluster.values()) / len(pairs)


def same_partition(assignment: Sequence[int], truth: Sequence[int]) -> bool:
    """Whether the clusters are exactly the true groups, up to their labels (every client
    assigned)."""
    if len(assignment) != len(truth) or any(c < 0 for c in assignment):
        return False
    forward: dict[int, int] = {}
    backward: dict[int, int] = {}
    for c, t in zip(assignment, truth):
        if forward.setdefault(c, t) != t or backward.setdefault(t, c) != c:
            return False
    return True


__all__ = ["lowest_loss", "common_coordinates", "cosine_similarities", "update_norms", "cfl_should_split",
           "bipartition", "split_clients", "cluster_purity", "same_partition"]
