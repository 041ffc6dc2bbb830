"""The client side of the Flower deployment, free of Flower imports.

:func:`train_handler` is what the ClientApp's ``@app.train()`` runs: decode the masked
sub-model of the instruction, train it on this node's data with
:func:`~fedgmr.training.local.masked_local_training` (through the same
:class:`~fedgmr.sim.executor.ClientWorkload` the simulator uses), and reply with the
trained values at the mask - values only: the server knows the mask it assigned.

This node's data is partition ``partition-id`` (Flower's node config; the simulation
runtime sets it, a SuperNode gets it from ``--node-config``) of the data set named by
the run's FedGMR config.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import torch

from fedgmr.algorithm.params import get_buffers
from fedgmr.config import ExperimentConfig
from fedgmr.flower.payload import decode_instruction, encode_reply
from fedgmr.sim.executor import ClientWorkload, TrainJob

log = logging.getLogger(__name__)

_WORKLOADS: dict[str, ClientWorkload] = {}


def load_run_config(run_config: Mapping[str, Any]) -> ExperimentConfig:
    """The FedGMR config a Flower run names: ``config`` (a YAML/TOML path) or the
    ``quickstart`` preset, with ``seed`` overridden when the run config sets it."""
    from fedgmr.config import read_config_file
    from fedgmr.methods import resolve_config

    path = str(run_config.get("config", "") or "")
    if path:
        raw = read_config_file(Path(path))
    else:
        from importlib.resources import files

        import yaml

        raw = yaml.safe_load((files("fedgmr.presets") / "quickstart.yaml").read_text())
    if "seed" in run_config:
        raw["seed"] = int(run_config["seed"])
    raw.setdefault("run", {})["executor"] = "serial"
    return resolve_config(raw)


def workload_for(cfg: ExperimentConfig) -> ClientWorkload:
    """This process's workload for ``cfg``: data, the same partition as
    :func:`~fedgmr.experiment.build.build_experiment` makes for the seed, one model.
    Built once per process (Flower may start a ClientApp process per message, so this
    builds only what a client needs), its model on the config's ``run.device``."""
    key = cfg.model_dump_json()
    if key not in _WORKLOADS:
        from fedgmr.data import load_dataset
        from fedgmr.device import resolve_device
        from fedgmr.experiment.build import build_workload, client_partition

        device = resolve_device(cfg.run.device)  # before the data: a missing GPU fails fast
        data = load_dataset(cfg.data.name, root=cfg.data.root, **cfg.data.options)
        _WORKLOADS[key] = build_workload(cfg, data, client_partition(cfg, data)).to(device)
    return _WORKLOADS[key]


def train_handler(fields: Mapping[str, Any], run_config: Mapping[str, Any], node_config: Mapping[str, Any],
                  node_id: int) -> dict[str, Any]:
    """Train the sub-model of one instruction; returns the reply fields."""
    cfg = load_run_config(run_config)
    workload = workload_for(cfg)
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    n = len(workload.client_data)
    part = node_config.get("partition-id")
    partition = int(part) if part is not None else int(node_id) % n
    if not 0 <= partition < n:
        raise ValueError(f"partition-id {partition} is outside the {n} partitions of the config")
    # decoded against this node's own model: its size bounds what a message may make us allocate
    ins = decode_instruction(fields, workload.settings, workload.space.numel, get_buffers(workload.model))
    full = bool(ins.mask.all())
    job = TrainJob(partition, ins.version, ins.seed, ins.start, ins.buffers, None if full else ins.mask,
                   ins.kind, ins.validate)
    saved = workload.settings
    workload.settings = ins.settings
    try:
        res = workload.run(job)
    finally:
        workload.settings = saved
    # values only: the server decodes them against the mask it assigned (ins.mask)
    num_processed = getattr(res, "num_processed", None)
    return encode_reply(ins.client, ins.version, ins.mask, res.values, res.buffers, res.num_samples,
                        res.loss, res.val_score, num_processed=num_processed)
