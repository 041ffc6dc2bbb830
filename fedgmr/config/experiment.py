"""The whole experiment (:class:`ExperimentConfig`: one field per section) and the checks
that span sections (combinations that each section accepts alone but a run cannot run)."""

from __future__ import annotations

from pydantic import Field, model_validator

from fedgmr.config.aggregation import AggregationConfig
from fedgmr.config.base import Section
from fedgmr.config.clustering import ClusteringConfig
from fedgmr.config.data import ClientsConfig, DataConfig, ModelConfig
from fedgmr.config.distill import DistillConfig
from fedgmr.config.network import NetworkConfig
from fedgmr.config.restoration import CoordinationConfig, RestorationConfig
from fedgmr.config.run import RunConfig
from fedgmr.config.submodel import SubmodelConfig
from fedgmr.config.training import FedMRLConfig, LocalConfig, TrainingConfig


#: client methods that train the model they are sent, so that a clustered server can send a cluster's
#: model to one of them
CLUSTERED_CLIENTS = ("sgd", "fedprox", "ditto", "fedbn")


def _check_clustering(cfg: "ExperimentConfig") -> None:
    """Combinations clustered FL cannot run (ValueError, one line)."""
    kind = cfg.clustering.kind
    if kind == "none":
        return
    agg = cfg.aggregation
    if cfg.local.algorithm not in CLUSTERED_CLIENTS:
        raise ValueError(f"clustering.kind {kind!r} sends each client a cluster model to train: local.algorithm "
                         f"must be one of {', '.join(CLUSTERED_CLIENTS)}, not {cfg.local.algorithm!r}")
    if kind == "cfl" and cfg.coordination.mode != "sync":
        raise ValueError("clustering.kind 'cfl' is synchronous-only (a split compares every member's update of one "
                         "round): set coordination.mode: sync (e.g. method=cfl or fedgmr_wo_asyn)")
    if cfg.network.ims:
        raise ValueError(f"clustering.kind {kind!r} sends per-cluster models, which IMS cannot multicast as one "
                         f"model's blocks: set network.ims: false")
    if agg.bn_stats == "server":
        raise ValueError(f"clustering.kind {kind!r} keeps BatchNorm statistics per cluster: aggregation.bn_stats "
                         f"'server' re-estimates one global model's")
    if agg.max_update_norm is not None or agg.update_norm_multiple is not None:
        raise ValueError(f"clustering.kind {kind!r}: the update-norm bounds measure updates from the global model, "
                         f"not a cluster's: unset aggregation.max_update_norm and update_norm_multiple")
    if getattr(getattr(cfg, "distill", None), "server", False):
        raise ValueError(f"clustering.kind {kind!r} cannot combine with distill.server (one global model)")


#: client methods that keep their own models and aggregate no global one (local_only, standalone)
#: or only a small shared part (fedmrl): a server-side distillation has nothing to distil
_OWN_MODEL_CLIENTS = ("local_sgd", "standalone", "fedmrl")


def _check_distill(cfg: "ExperimentConfig") -> None:
    """Combinations federated distillation cannot run (ValueError, one line)."""
    d, fedmd = cfg.distill, cfg.local.algorithm == "fedmd"
    if d.server and fedmd:
        raise ValueError("distill.server (FedDF) distils a global model, which local.algorithm 'fedmd' does not "
                         "have: use one of them")
    if (d.server or fedmd) and d.proxy.name is None:
        raise ValueError("federated distillation needs proxy data: set distill.proxy.name (e.g. fashion_mnist, "
                         "digits)")
    if d.server and cfg.local.algorithm in _OWN_MODEL_CLIENTS:
        raise ValueError(f"distill.server (FedDF) distils the aggregated global model; local.algorithm "
                         f"{cfg.local.algorithm!r} keeps each client's own model (FedMRL shares only its small G): "
                         "there is no global model of the clients' to distil into; drop one of them")
    if d.server and cfg.local.algorithm in ("scaffold", "fedbn"):
        raise ValueError(f"distill.server (FedDF) is not supported with local.algorithm "
                         f"{cfg.local.algorithm!r} (its teachers need each client's whole model)")
    if d.server and cfg.aggregation.rule in ("ga_delta", "fiarse"):
        raise ValueError(f"distill.server (FedDF) needs the clients' models as teachers; aggregation.rule "
                         f"{cfg.aggregation.rule!r} receives deltas")
    if fedmd and (cfg.coordination.mode != "sync" or cfg.submodel.policy != "full"):
        raise ValueError("local.algorithm 'fedmd' exchanges logits, not sub-models: it runs synchronous on full "
                         "local models (method=fedmd)")
    if d.loss == "mse" and d.server:
        raise ValueError("distill.loss 'mse' is FedMD's; FedDF (distill.server) distils with kl")


class ExperimentConfig(Section):
    """A whole experiment."""

    name: str = "experiment"
    method: str = "fedgmr"
    seed: int = Field(0, ge=0)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    clients: ClientsConfig = Field(default_factory=ClientsConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    local: LocalConfig = Field(default_factory=LocalConfig)
    fedmrl: FedMRLConfig = Field(default_factory=FedMRLConfig)
    submodel: SubmodelConfig = Field(default_factory=SubmodelConfig)
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    clustering: ClusteringConfig = Field(default_factory=ClusteringConfig)
    restoration: RestorationConfig = Field(default_factory=RestorationConfig)
    coordination: CoordinationConfig = Field(default_factory=CoordinationConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    run: RunConfig = Field(default_factory=lambda: RunConfig(max_steps=100))
    distill: DistillConfig = Field(default_factory=DistillConfig)

    @model_validator(mode="after")
    def _consistent(self) -> "ExperimentConfig":
        if self.run.client_eval_every is not None and self.data.client_val_fraction <= 0:
            raise ValueError("run.client_eval_every needs each client's held-out split: set data.client_val_fraction "
                             "> 0 (e.g. 0.1)")
        if self.restoration.per_client_patience is not None and self.data.client_val_fraction <= 0:
            raise ValueError("restoration.per_client_patience needs data.client_val_fraction > 0 "
                             "(clients score their local model on their own validation split)")
        if self.run.personal_eval_every is not None and self.data.client_test_fraction <= 0:
            raise ValueError("run.personal_eval_every needs each client's own test split: set "
                             "data.client_test_fraction > 0 (e.g. 0.2)")
        if self.local.algorithm == "scaffold":
            if self.training.momentum or self.training.weight_decay:
                raise ValueError("local.algorithm 'scaffold' (option II) is invalid with momentum or weight decay: "
                                 "set training.momentum and training.weight_decay to 0")
            if self.coordination.mode != "sync":
                raise ValueError("local.algorithm 'scaffold' is synchronous-only (a stale delta_c has no theory): "
                                 "set coordination.mode: sync (e.g. method=fedgmr_wo_asyn)")
        _check_distill(self)
        _check_clustering(self)
        n = self.clients.num_clients
        conc = self.clients.concurrency
        if conc is not None and conc > n:
            raise ValueError(f"clients.concurrency {conc} is more than the {n} clients (clients.num_clients): at "
                             f"most {n} can train at once; set it at most {n}, or null for all")
        coord = self.coordination
        if coord.mode == "semi_async" and coord.trigger == "k" and coord.k > (conc or n):
            what = f"{conc} clients training at once (clients.concurrency)" if conc else \
                f"{n} clients (clients.num_clients)"
            raise ValueError(f"coordination.k {coord.k} is more than the {what}: a step could never gather "
                             f"{coord.k} updates; set it at most {conc or n}")
        tiers = self.clients.heterogeneity
        if isinstance(tiers, list) and len(tiers) != n:
            raise ValueError(f"clients.heterogeneity lists {len(tiers)} densities for {n} clients "
                             "(clients.num_clients); give one initial density per client")
        speeds = self.network.compute.speeds
        if speeds is not None and len(speeds) != n:
            raise ValueError(f"network.compute.speeds lists {len(speeds)} speeds for {n} clients "
                             "(clients.num_clients); give one speed per client")
        return self
