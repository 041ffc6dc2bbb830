"""Clustered FL on FedGMR's strategy (``clustering.kind``; docs/methods/ifca.md, cfl.md).

Cluster routing is a server plug-in (:class:`ClusterRouting`,
:mod:`fedgmr.strategy.plugins`) composed into the one
:class:`~fedgmr.strategy.masked_buffered.MaskedBufferedStrategy`: it keeps one model per
cluster and each client's cluster. Every aggregation runs the configured rule (MA by
default, on masks) *within* each cluster, from that cluster's model (the strategy's
``aggregate_model``); ``params`` (what the global ``accuracy``, GMR's validation and the
mask ranking see) is the model of the cluster with the most clients. Each client's own
model (its personalised evaluation) is its cluster's model. The math is
:mod:`fedgmr.algorithm.clustering`.

* :class:`IfcaRouting`: k models; every job downloads all of them, the client trains the
  one with the lowest loss on its data and reports the losses; its update joins that
  cluster.
* :class:`CflRouting`: one cluster at the start; a job downloads its cluster's model;
  after each synchronous round a cluster whose updates meet Sattler's criterion is split
  in two by the cosine similarity of the updates, on the coordinates every update holds.

Neither knows the runtime: models travel in the assignment's
:class:`~fedgmr.strategy.messages.Wire` (``models``), losses in ``Reply.extras``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from fedgmr.algorithm.aggregation import dense
from fedgmr.algorithm.clustering import (cfl_should_split, cluster_purity, common_coordinates, cosine_similarities,
                                         lowest_loss, same_partition, split_clients, update_norms)
from fedgmr.registry import Registry
from fedgmr.strategy.messages import Assignment, StepReport
from fedgmr.strategy.plugins import ServerPlugin
from fedgmr.strategy.update import Update
from fedgmr.training.model_choice import MODEL_LOSSES

log = logging.getLogger(__name__)

Model = tuple[torch.Tensor, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class ClusterView:
    """The cluster models and assignments of one model version (what its evaluations see)."""

    models: tuple[torch.Tensor, ...]
    buffers: tuple[dict[str, torch.Tensor], ...]
    clusters: tuple[int, ...]  # per client; -1: none yet


class ClusterRouting(ServerPlugin):
    """The cluster part of FedGMR's one strategy: one model per cluster.

    cluster_models: initial weights of the clusters after the first (whose weights are the
        strategy's ``params``); IFCA's k - 1 other random initialisations, none for CFL.
    true_groups: each client's true group (the rotation it sees), to score the
        clustering (``cluster_purity``, ``clusters_recovered`` in the metrics); None: unknown.

    Hooks: ``wire`` (which models a job is sent), ``on_assign`` / ``on_accept`` (the cluster a
    reply is routed to), ``step_models`` (each cluster's updates aggregated into its own
    model by ``strategy.aggregate_model``; the representative becomes ``params``),
    ``client_models``, ``record_keys`` and the checkpoint (``cluster/<j>/...`` tensors and
    the ``clustering`` state, as the clustered strategy class wrote them).
    """

    name = "cluster routing"
    #: the cluster of each client before its first aggregated update
    initial_cluster: int = 0

    def __init__(self, cluster_models: Sequence[torch.Tensor] = (), true_groups: Sequence[int] | None = None) -> None:
        self._initial = list(cluster_models)
        self._true_groups = true_groups

    def bind(self, strategy: Any) -> None:
        super().bind(strategy)
        s = strategy
        if s.bn_stats is not None:
            raise ValueError("clustered methods keep BatchNorm statistics per cluster: aggregation.bn_stats "
                             "'server' re-estimates one global model's")
        if s.bounds_norm:
            raise ValueError("the update-norm bounds measure updates from the global model, not from a cluster's: "
                             "unset aggregation.max_update_norm and aggregation.update_norm_multiple")
        self.models: list[torch.Tensor] = [s.params] + [m.detach().to(s.device, torch.float32).clone()
                                                        for m in self._initial]
        self.model_buffers: list[dict[str, torch.Tensor]] = [s.buffers] + [
            {k: v.clone() for k, v in s.buffers.items()} for _ in self._initial]
        self.clusters: list[int] = [self.initial_cluster] * s.num_clients
        true = self._true_groups
        if true is not None and len(true) != s.num_clients:
            raise ValueError(f"true_groups lists {len(true)} groups for {s.num_clients} clients")
        self.true_groups = None if true is None else [int(g) for g in true]
        self._views: dict[int, ClusterView] = {}
        self._snapshot()

    # ------------------------------------------------------------------ views
    def _snapshot(self) -> None:
        """Record what evaluations of the current version see (the last two versions are
        kept: an evaluation may see the version before the newest aggregation)."""
        version = self.strategy.version
        self._views[version] = ClusterView(tuple(self.models), tuple(self.model_buffers), tuple(self.clusters))
        for v in [v for v in self._views if v < version - 1]:
            del self._views[v]

    def view(self, version: int | None = None) -> ClusterView:
        """The clusters of model ``version`` (None or unknown: the current ones)."""
        hit = self._views.get(self.strategy.version if version is None else version)
        return hit if hit is not None else ClusterView(tuple(self.models), tuple(self.model_buffers),
                                                       tuple(self.clusters))

    def representative(self) -> int:
        """The cluster with the most clients (ties: the lowest index; none assigned: 0)."""
        counts = Counter(c for c in self.clusters if c >= 0)
        if not counts:
            return 0
        return min(counts, key=lambda j: (-counts[j], j))

    def client_models(self, version: int | None = None) -> list[Model]:
        """Each client's own model at ``version``: its cluster's (no cluster yet: the
        representative one)."""
        v = self.view(version)
        counts = Counter(c for c in v.clusters if c >= 0)
        rep = min(counts, key=lambda j: (-counts[j], j)) if counts else 0
        return [(v.models[c if c >= 0 else rep], v.buffers[c if c >= 0 else rep]) for c in v.clusters]

    def record_keys(self, version: int) -> dict[str, Any]:
        v = self.view(version)
        rec: dict[str, Any] = {"clusters": list(v.clusters), "num_clusters": len({c for c in v.clusters if c >= 0}),
                               "cluster_models": len(v.models)}
        if self.true_groups is not None:
            rec["true_groups"] = list(self.true_groups)
            rec["cluster_purity"] = cluster_purity(v.clusters, self.true_groups)
            rec["clusters_recovered"] = same_partition(v.clusters, self.true_groups)
        return rec

    # ------------------------------------------------------------------ aggregation
    def _entry_cluster(self, e: Update) -> int:
        """The cluster an update belongs to."""
        raise NotImplementedError

    def _groups(self, used: list[Update]) -> dict[int, list[int]]:
        """Positions in ``used`` by cluster (CFL may split a cluster here)."""
        groups: dict[int, list[int]] = {}
        for i, e in enumerate(used):
            groups.setdefault(self._entry_cluster(e), []).append(i)
        return groups

    def step_models(self, used: list[Update],
                    weights: list[float]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Aggregate each cluster's updates into its own model; returns the representative
        cluster's model (the new global one)."""
        s = self.strategy
        for j, idx in sorted(self._groups(used).items()):
            entries, ws = [used[i] for i in idx], [weights[i] for i in idx]
            new = s.aggregate_model(self.models[j], self.model_buffers[j], entries, ws)
            if new is not None:
                self.models[j], self.model_buffers[j] = new
            else:
                log.error("aggregation of cluster %d at step %d gave non-finite weights; its model is kept", j,
                          s.version)
            for e in entries:
                self.clusters[e.client_id] = j
        r = self.representative()
        return self.models[r], self.model_buffers[r]

    def after_aggregate(self, report: StepReport) -> StepReport:
        r = self.representative()
        self.strategy.params, self.strategy.buffers = self.models[r], self.model_buffers[r]
        self._snapshot()
        return report

    # ------------------------------------------------------------------ checkpoints
    def _cluster_state(self) -> dict[str, Any]:
        return {}

    def _load_cluster_state(self, state: dict[str, Any]) -> None:
        pass

    def state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        for j, (p, b) in enumerate(zip(self.models, self.model_buffers)):
            tensors[f"cluster/{j}/params"] = p
            tensors.update({f"cluster/{j}/buf/{k}": v for k, v in b.items()})
        state["clustering"] = {"models": len(self.models), "clusters": list(self.clusters), **self._cluster_state()}

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        s = self.strategy
        st = state["clustering"]
        self.models = [tensors[f"cluster/{j}/params"].to(s.device).clone() for j in range(int(st["models"]))]
        self.model_buffers = [{k: tensors[f"cluster/{j}/buf/{k}"].to(s.device).clone() for k in s.buffers}
                              for j in range(int(st["models"]))]
        self.clusters = [int(c) for c in st["clusters"]]
        self._load_cluster_state(st)
        r = self.representative()
        s.params, s.buffers = self.models[r], self.model_buffers[r]
        self._views = {}
        self._snapshot()  # a checkpoint is written right after a step: the current version is the published one


class IfcaRouting(ClusterRouting):
    """IFCA (Ghosh et al., 2020): k cluster models, all sent with every job; the client's
    update joins the cluster whose model had the lowest loss on its data."""

    name = "IFCA's cluster routing"
    initial_cluster = -1
    reply_extras = (MODEL_LOSSES,)  # the client's losses of the models offered, checked by the strategy

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the cluster each received update chose (until it is aggregated or replaced)
        self._chosen: dict[int, int] = {}

    def wire(self, a: Assignment) -> Assignment:
        models = list(zip(self.models, self.model_buffers))
        # every cluster model travels; the reply carries one loss per model
        return dataclasses.replace(a, wire=dataclasses.replace(a.wire, models=tuple(models), reply_plain=len(models)))

    def on_accept(self, update: Update) -> None:
        self._chosen[update.client_id] = lowest_loss(update.extras["model_losses"].tolist())

    def _entry_cluster(self, e: Update) -> int:
        return self._chosen[e.client_id]

    def _cluster_state(self) -> dict[str, Any]:
        return {"chosen": {str(c): j for c, j in sorted(self._chosen.items())}}

    def _load_cluster_state(self, state: dict[str, Any]) -> None:
        self._chosen = {int(c): int(j) for c, j in state.get("chosen", {}).items()}


class CflRouting(ClusterRouting):
    """CFL (Sattler et al., 2020): recursive bipartitioning by the cosine similarity of the
    clients' updates. Synchronous rounds (the split needs every member's update of a round).

    eps1 / eps2: split when the norm of the cluster's mean update is below ``eps1`` and
        its largest update norm above ``eps2``.
    min_size: split only clusters of more than this many clients.
    warmup: split in no round up to this one (rounds counted from 1).
    """

    name = "CFL's cluster routing"

    def __init__(self, *args: Any, eps1: float = 0.4, eps2: float = 1.6, min_size: int = 2, warmup: int = 20,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not (eps1 > 0 and eps2 > 0 and min_size >= 1 and warmup >= 0):
            raise ValueError(f"CFL needs eps1, eps2 > 0, min_size >= 1, warmup >= 0 (got {eps1}, {eps2}, "
                             f"{min_size}, {warmup})")
        self.eps1, self.eps2, self.min_size, self.warmup = float(eps1), float(eps2), int(min_size), int(warmup)
        self._dispatched: dict[int, int] = {}  # the cluster each outstanding or received job started from
        #: each cluster's (mean update norm, max update norm) in the last round it was measured
        self.norms: dict[int, tuple[float, float]] = {}
        self.splits: list[dict[str, Any]] = []

    def wire(self, a: Assignment) -> Assignment:
        j = self.clusters[a.client_id]
        cluster_model = (self.models[j], self.model_buffers[j])
        return dataclasses.replace(a, wire=dataclasses.replace(a.wire, models=(cluster_model,)))

    def on_assign(self, a: Assignment) -> None:
        self._dispatched[a.client_id] = self.clusters[a.client_id]

    def _entry_cluster(self, e: Update) -> int:
        return self._dispatched[e.client_id]

    def _updates(self, j: int, entries: list[Update]) -> torch.Tensor:
        """The entries' updates from cluster ``j``'s model, on the coordinates all of them
        hold (n x |common|)."""
        common = common_coordinates([e.mask for e in entries])
        base = self.models[j][common].double()
        rows = []
        for e in entries:
            v = dense(e.mask, e.values.double())[common]
            rows.append(v if self.strategy.rule.consumes == "delta" else v - base)
        return torch.stack(rows)

    def _groups(self, used: list[Update]) -> dict[int, list[int]]:
        groups = super()._groups(used)
        s = self.strategy
        round_index = s.version + 1
        for j in sorted(list(groups)):
            idx = groups[j]
            entries = [used[i] for i in idx]
            members = [e.client_id for e in entries]
            if any(e.version != s.version for e in entries):
                continue  # (synchronous rounds only: never happens)
            updates = self._updates(j, entries)
            mean_norm, max_norm = update_norms(updates)
            self.norms[j] = (mean_norm, max_norm)
            if sorted(members) != [c for c in range(s.num_clients) if self.clusters[c] == j]:
                continue  # split only in a round where every member reported
            if not cfl_should_split(mean_norm, max_norm, len(members), round_index, self.eps1, self.eps2,
                                    self.min_size, self.warmup):
                continue
            first, second = split_clients(members, cosine_similarities(updates))
            new = len(self.models)
            self.models.append(self.models[j])
            self.model_buffers.append(self.model_buffers[j])
            position = {c: i for c, i in zip(members, idx)}
            groups[j] = [position[c] for c in first]
            groups[new] = [position[c] for c in second]
            for c in second:
                self._dispatched[c] = new
            self.splits.append({"step": s.version, "cluster": j, "into": [first, second],
                                "mean_norm": mean_norm, "max_norm": max_norm})
            log.info("CFL split cluster %d at step %d (mean update norm %.4g < %g, max %.4g > %g): %s | %s",
                     j, s.version, mean_norm, self.eps1, max_norm, self.eps2, first, second)
        return groups

    def record_keys(self, version: int) -> dict[str, Any]:
        rec = super().record_keys(version)
        rec["cfl_splits"] = len(self.splits)
        return rec

    def _cluster_state(self) -> dict[str, Any]:
        return {"dispatched": {str(c): j for c, j in sorted(self._dispatched.items())},
                "norms": {str(j): list(v) for j, v in sorted(self.norms.items())}, "splits": self.splits}

    def _load_cluster_state(self, state: dict[str, Any]) -> None:
        # jobs rebuilt from the checkpoint are not assigned again (no on_assign): the saved
        # clusters they started from stay
        self._dispatched = {int(c): int(j) for c, j in state.get("dispatched", {}).items()}
        self.norms = {int(j): (float(v[0]), float(v[1])) for j, v in state.get("norms", {}).items()}
        self.splits = list(state.get("splits", []))


#: cluster routing by ``clustering.kind``
CLUSTERINGS: Registry[type[ClusterRouting]] = Registry("clustering")
CLUSTERINGS.register("ifca", IfcaRouting)
CLUSTERINGS.register("cfl", CflRouting)


def true_groups(shifts: Sequence[str], num_clients: int) -> list[int] | None:
    """Each client's true group under ``data.feature_shift`` (client i sees
    ``shifts[i mod len]``; groups numbered by first appearance); None without shifts."""
    if not shifts:
        return None
    order = list(dict.fromkeys(shifts))
    return [order.index(shifts[i % len(shifts)]) for i in range(num_clients)]


def clustering_half(cfg: Any, factory: Callable[[], torch.nn.Module], init_seed: int,
                    device: torch.device | str) -> dict[str, Any]:
    """The strategy arguments of ``clustering.kind``: its :class:`ClusterRouting` plug-in
    with IFCA's k - 1 further models, each from its own seeded initialisation (the first is
    the run's own), CFL's thresholds, and the data's true groups."""
    from fedgmr.algorithm.params import ParamSpace

    c = cfg.clustering
    cls = CLUSTERINGS.get(c.kind)
    kwargs: dict[str, Any] = {"true_groups": true_groups(cfg.data.feature_shift, cfg.clients.num_clients)}
    if cls is IfcaRouting:
        models = []
        for j in range(1, c.k):
            seed = int(np.random.SeedSequence([int(init_seed), 0xC1A5, j]).generate_state(1, dtype=np.uint32)[0])
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                m = factory()
            models.append(ParamSpace(m).flatten(m).to(device))
        kwargs["cluster_models"] = models
    elif cls is CflRouting:
        kwargs.update(eps1=c.eps1, eps2=c.eps2, min_size=c.min_size, warmup=c.warmup)
    return {"plugins": (cls(**kwargs),)}


__all__ = ["ClusterView", "ClusterRouting", "IfcaRouting", "CflRouting", "CLUSTERINGS", "true_groups",
           "clustering_half"]
