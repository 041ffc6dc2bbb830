"""The client side of the Flower deployment, free of Flower imports.

:func:`train_handler` is what the ClientApp's ``@app.train()`` runs: decode the masked
sub-model of the instruction, train it on this node's data with
:func:`~fedgmr.training.local.masked_local_training` (through the same
:class:`~fedgmr.sim.executor.ClientWorkload` the simulator uses), and reply with the
trained values at the mask - values only: the server knows the mask it assigned.

This node's data is partition ``partition-id`` (Flower's node config; the simulation
runtime sets it, a SuperNode gets it from ``--node-config``) of the data set named by
the run's FedGMR config.

Client state (SCAFFOLD's ``c_i``, Ditto's personal model, FedBN's BatchNorm layers,
FedDyn's ``h_i``: what the simulator keeps in ``Simulator.client_states``) stays on the
node: the handler reads it from, and writes it back to, a ``store`` - a flat record of
``state.<partition>.<name>`` fields (raw bytes, dtype, shape) that the ClientApp keeps in
Flower's ``Context.state``, which the SuperNode holds across the messages of a run (also
when each message runs in a new ClientApp process). It is keyed by the partition, never
sent to the server, and kept whether or not the server accepts the reply (as in the
simulator). Values beside the model (SCAFFOLD's ``c`` down, ``delta_c`` up; FedNova's
``tau``) travel in the payload (:mod:`fedgmr.flower.payload`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping, MutableMapping

import torch

from fedgmr.algorithm.params import get_buffers
from fedgmr.config import ExperimentConfig
from fedgmr.flower.payload import STATE_DTYPES, decode_buffers, decode_instruction, encode_buffers, encode_reply
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
        from fedgmr.experiment.build import baseline_client_method, build_workload, client_partition

        device = resolve_device(cfg.run.device)  # before the data: a missing GPU fails fast
        data = load_dataset(cfg.data.name, root=cfg.data.root, **cfg.data.options)
        partition = client_partition(cfg, data)
        # a width baseline trains with its own client procedure, as in the simulator
        method = baseline_client_method(cfg, data, partition)
        _WORKLOADS[key] = build_workload(cfg, data, partition, method).to(device)
    return _WORKLOADS[key]


def state_prefix(partition: int) -> str:
    """The prefix of one partition's state fields in a node's store."""
    return f"state.{int(partition)}."


def load_state(store: Mapping[str, Any], partition: int) -> dict[str, torch.Tensor]:
    """The client state ``partition`` left in ``store`` (empty: none yet)."""
    return decode_buffers(store, prefix=state_prefix(partition), dtypes=STATE_DTYPES)


def save_state(store: MutableMapping[str, Any], partition: int, state: Mapping[str, torch.Tensor]) -> None:
    """Replace the state of ``partition`` in ``store`` with ``state``."""
    prefix = state_prefix(partition)
    for key in [k for k in store if k.startswith(prefix)]:
        del store[key]
    store.update(encode_buffers(state, prefix=prefix, dtypes=STATE_DTYPES))


def train_handler(fields: Mapping[str, Any], run_config: Mapping[str, Any], node_config: Mapping[str, Any],
                  node_id: int, store: MutableMapping[str, Any] | None = None) -> dict[str, Any]:
    """Train the sub-model of one instruction; returns the reply fields.

    ``store`` holds the client state between this node's messages (the ClientApp passes
    the record it keeps in ``Context.state``); a method that keeps state needs one."""
    cfg = load_run_config(run_config)
    workload = workload_for(cfg)
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    n = len(workload.client_data)
    part = node_config.get("partition-id")
    partition = int(part) if part is not None else int(node_id) % n
    if not 0 <= partition < n:
        raise ValueError(f"partition-id {partition} is outside the {n} partitions of the config")
    method = getattr(workload, "client_method", None)
    stateful = bool(getattr(method, "stateful", False))
    if stateful and store is None:
        raise ValueError(f"local.algorithm {cfg.local.algorithm!r} keeps client state between jobs: "
                         "train_handler needs a store")
    # decoded against this node's own model: its size bounds what a message may make us allocate
    ins = decode_instruction(fields, workload.settings, workload.space.numel, get_buffers(workload.model),
                             extras=tuple(getattr(method, "needs_extras", ())))
    full = bool(ins.mask.all())
    state = load_state(store, partition) if stateful and store is not None else {}
    job = TrainJob(partition, ins.version, ins.seed, ins.start, ins.buffers, None if full else ins.mask,
                   ins.kind, ins.validate, ins.upload_mask, ins.extras, state)
    saved = workload.settings
    workload.settings = ins.settings
    t0 = time.perf_counter()
    try:
        res = workload.run(job)
    finally:
        compute_s = time.perf_counter() - t0
        workload.settings = saved
    if res.state is not None and store is not None:  # the client's own: kept whatever the server does with the reply
        save_state(store, partition, res.state)
    # values only: the server decodes them against the mask it assigned (the upload mask, else ins.mask)
    num_processed = getattr(res, "num_processed", None)
    up = ins.mask if ins.upload_mask is None else ins.upload_mask
    return encode_reply(ins.client, ins.version, up, res.values, res.buffers, res.num_samples,
                        res.loss, res.val_score, num_processed=num_processed, extras=res.extras,
                        compute_s=compute_s)
