"""The clients a config makes, before anything trains: each client's samples and label
shares (the partition the run would draw from its seed) and its bandwidth tier
(``fedgmr data clients``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedgmr.config import ExperimentConfig
from fedgmr.data import FederatedData, load_dataset
from fedgmr.data.client_summary import ClientSummary, client_csv, format_client_table, summarise_clients
from fedgmr.data.layout import loaded_layout
from fedgmr.experiment.build import client_partition
from fedgmr.sim.network import tier_densities


@dataclass(frozen=True)
class ClientsReport:
    """Every client of one config: :class:`ClientSummary` rows, each client's start
    density (its bandwidth tier's, where FedGMR starts it) and a one-line description."""

    clients: list[ClientSummary]
    densities: list[float]
    title: str

    def markdown(self, top: int = 3, threshold: float = 0.05) -> str:
        return f"{self.title}\n\n" + format_client_table(self.clients, self.densities, top, threshold)

    def csv(self) -> str:
        return client_csv(self.clients, self.densities)


def _scheme(cfg: ExperimentConfig) -> str:
    d = cfg.data
    return {"dirichlet": f"Dirichlet(α = {d.alpha:g}) over labels", "iid": "IID",
            "shards": f"label-sorted shards, {d.shards_per_client} per client",
            "natural": "the data set's natural clients"}.get(d.partition, d.partition)


def describe_clients(cfg: ExperimentConfig, data: FederatedData | None = None) -> ClientsReport:
    """The partition ``cfg`` draws (its seed's partition stream, exactly as a run of it
    does) summarised per client; ``data``: a loaded data set to reuse."""
    data = data or load_dataset(cfg.data.name, root=cfg.data.root, **cfg.data.options)
    partition = client_partition(cfg, data)
    labels, _ = loaded_layout(data)  # the partition indexes the loaded row order
    clients = summarise_clients(labels, partition, data.num_classes)  # sequence targets: sample counts only
    n = cfg.clients.num_clients
    held = sum(s.samples for s in clients)
    title = (f"{cfg.data.name}, seed {cfg.seed}: {n} clients, {_scheme(cfg)}; {held:,} training samples held by "
             f"clients, {len(partition.server_val):,} in the server's validation split")
    return ClientsReport(clients, tier_densities(cfg.clients.heterogeneity, n), title)


__all__ = ["ClientsReport", "describe_clients"]
