"""Build a runnable experiment from a config: data, partition, model, strategy,
network and simulator, each with its own seeded random stream."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn

from fedgmr.algorithm.aggregation import RULES, floored_ma_rule, krum_rule, trimmed_mean_rule
from fedgmr.algorithm.encoding import payload_nbytes
from fedgmr.algorithm.masks import compute_costs, explicit_costs, flops_per_weight, layer_costs
from fedgmr.algorithm.params import ParamSpace, get_buffers, set_buffers
from fedgmr.algorithm.policies import POLICIES, FullModelPolicy, MagnitudePolicy, SubmodelPolicy
from fedgmr.algorithm import extraction as _extraction  # noqa: F401 - registers random, rolling, coverage_max
from fedgmr.algorithm.restoration import (DeadlineTrigger, DensityLadder, EarlyStoppingTrigger, FixedTimeTrigger,
                                          NoTrigger, RestorationTrigger)
from fedgmr.algorithm.staleness import make_staleness
from fedgmr.baselines import hooks as baseline_hooks
from fedgmr.config import ExperimentConfig
from fedgmr.data import FederatedData, Partition, load_dataset, make_partition
from fedgmr.data.layout import client_ordered, in_current_layout, loaded_layout, rows, shards
from fedgmr.device import resolve_device, to_device
from fedgmr.errors import ConfigError
from fedgmr.experiment.diagnostics import Diagnostics
from fedgmr.models import build_model
from fedgmr.registry import Registry
from fedgmr.sim.evalworker import test_worker_for
from fedgmr.sim.executor import ClientWorkload, Executor, SerialExecutor
from fedgmr.sim.executors import make_process_executor, make_ray_executor
from fedgmr.sim.network import Network, tier_densities
from fedgmr.sim.simulator import ComputeModel, Coordination, Simulator
from fedgmr.strategy.distill import attach_public, distill_half
from fedgmr.strategy.compose import ServerPart, compose_strategy
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.server_halves import server_half
from fedgmr.training.evaluate import class_report, evaluate
from fedgmr.training.local import TrainSettings

#: executors by name: ``factory(workload, config) -> Executor``
EXECUTORS: Registry[Callable[[ClientWorkload, ExperimentConfig], Executor]] = Registry("executor")
EXECUTORS.register("serial", lambda workload, cfg: SerialExecutor(workload.to(resolve_device(cfg.run.device))))
EXECUTORS.register("process", make_process_executor)
EXECUTORS.register("ray", make_ray_executor)


@dataclass
class Streams:
    """Independent random streams derived from one seed."""

    partition: np.random.Generator
    init: int
    sampling: np.random.Generator
    network: np.random.Generator

    @classmethod
    def from_seed(cls, seed: int) -> "Streams":
        part, init, samp, net = np.random.SeedSequence(seed).spawn(4)
        return cls(np.random.default_rng(part), int(init.generate_state(1, dtype=np.uint32)[0]),
                   np.random.default_rng(samp), np.random.default_rng(net))


@dataclass
class Experiment:
    """Everything a run needs, already wired together."""

    config: ExperimentConfig
    data: FederatedData
    partition: Partition
    space: ParamSpace
    strategy: MaskedBufferedStrategy
    simulator: Simulator
    executor: Executor

#: rules whose options are config keys: the rule built from the aggregation section
_RULE_OPTIONS: dict[str, Any] = {
    "trimmed_mean": lambda agg: trimmed_mean_rule(agg.trim),
    "krum": lambda agg: krum_rule(agg.krum_byzantine, agg.krum_select),
}


def bound_client_method(cfg: ExperimentConfig, data: FederatedData) -> Any:
    """The configured client method (``local.algorithm``), bound to the whole config when
    it needs more than its ``local`` section (FedMRL: ``bind(cfg, data)``)."""
    from fedgmr.training.client_methods import client_method

    method = client_method(cfg.local)
    bind = getattr(method, "bind", None)
    return method if bind is None else bind(cfg, data)


def model_factory(cfg: ExperimentConfig, data: FederatedData) -> Callable[[], nn.Module]:
    """A zero-argument builder of the run's global model: the configured model, or the
    shared model a client method defines (FedMRL's small model G)."""
    shared = getattr(bound_client_method(cfg, data), "shared_model", None)
    if shared is not None:
        return shared

    def build() -> nn.Module:
        return build_model(cfg.model.name, data.num_classes, data.input_shape, **cfg.model.options)

    return build


def init_model(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    """Build the model with a seeded initialisation, leaving global RNG state untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory()


def _partition(cfg: ExperimentConfig, data: FederatedData, rng: np.random.Generator) -> Partition:
    labels, natural = loaded_layout(data)  # a client-ordered data set partitions as the loaded one
    if labels.ndim != 1 and cfg.data.partition in ("dirichlet", "shards"):
        raise ConfigError(f"data.partition {cfg.data.partition!r} needs one label per sample; use 'natural' or 'iid'")
    if labels.ndim != 1:
        labels = np.zeros(len(labels), dtype=np.int64)
    return in_current_layout(make_partition(labels, cfg.clients.num_clients, cfg.data.partition, rng, cfg.data.alpha,
                                            cfg.data.val_fraction, cfg.data.client_val_fraction, natural,
                                            cfg.data.client_test_fraction, cfg.data.shards_per_client), data)


def client_partition(cfg: ExperimentConfig, data: FederatedData) -> Partition:
    """The client partition a config makes (from its seed's *partition* stream)."""
    return _partition(cfg, data, Streams.from_seed(cfg.seed).partition)


def train_settings(cfg: ExperimentConfig, data: FederatedData) -> TrainSettings:
    """Local training settings from the config and the data set's task."""
    t = cfg.training
    s = t.lr_schedule
    schedule = None if s.kind == "constant" else (s.kind, s.step_every, s.gamma, s.total_steps, s.min_lr)
    augment = (t.augment.flip, t.augment.crop_padding) if t.augment.flip or t.augment.crop_padding else None
    if augment is not None and data.train.x.dim() != 4:
        raise ConfigError(f"training.augment works on images (N, C, H, W); data set {cfg.data.name!r} gives "
                          f"samples of shape {tuple(data.train.x.shape[1:])}")
    return TrainSettings(t.lr, t.momentum, t.weight_decay, t.batch_size, t.local_steps, t.loss,
                         data.task, data.pad_index, t.clip_grad_norm or None, schedule, augment)


@dataclass
class ClientSplits:
    """Each client's training, validation and test samples (feature-shifted when
    ``data.feature_shift`` is set), and the shared splits the server evaluates on."""

    train: Sequence[tuple[torch.Tensor, torch.Tensor]]  # views of one storage (ClientShards) when client-ordered
    val: Sequence[tuple[torch.Tensor, torch.Tensor]]
    test: Sequence[tuple[torch.Tensor, torch.Tensor]]
    global_test: tuple[torch.Tensor, torch.Tensor]
    server_val: tuple[torch.Tensor, torch.Tensor]


def client_splits(cfg: ExperimentConfig, data: FederatedData, partition: Partition) -> ClientSplits:
    """The samples of every client and of the server, under the configured feature shift."""
    x, y = data.train.x, data.train.y
    # views of the training rows when the partition is laid out in client order (client_ordered)
    parts = [shards(x, y, group)
             for group in (partition.clients, partition.client_val,
                           partition.client_test or [np.zeros(0, dtype=np.int64)] * len(partition.clients))]
    val_idx = partition.server_val
    out = ClientSplits(parts[0], parts[1], parts[2], (data.test.x, data.test.y), (rows(x, val_idx), rows(y, val_idx)))
    shifts = cfg.data.feature_shift
    if shifts:
        from fedgmr.data.shift import shift_by_client, shift_cycling

        lo, hi = float(x.min()), float(x.max())
        out.train, out.val, out.test = (
            [(xs, yi) for xs, (_, yi) in zip(shift_by_client(shifts, [xi for xi, _ in split], lo, hi, cfg.seed, stream),
                                             split)]
            for stream, split in enumerate((out.train, out.val, out.test)))
        out.global_test = (shift_cycling(shifts, data.test.x, lo, hi, cfg.seed, 3), data.test.y)
        out.server_val = (shift_cycling(shifts, out.server_val[0], lo, hi, cfg.seed, 4), out.server_val[1])
    return out


def build_workload(cfg: ExperimentConfig, data: FederatedData, partition: Partition,
                   client_method: Any = None) -> ClientWorkload:
    """The client side of a run: each client's data shards, one model to train on and its
    client method: ``client_method`` when given (a width baseline's), else the configured
    one (``local.algorithm``)."""
    splits = client_splits(cfg, data, partition)
    return ClientWorkload(model_factory(cfg, data), splits.train, splits.val, train_settings(cfg, data),
                          client_method=client_method if client_method is not None else bound_client_method(cfg, data))


def check_bn_statistics(cfg: ExperimentConfig, model: nn.Module, ladder: DensityLadder, baseline: bool) -> None:
    """Refuse a FedGMR-policy run whose BatchNorm running statistics would never be
    aggregated: ``aggregation.bn_stats: full`` takes them from full-density clients only, and
    with no client on the full model (none starts there and none is ever restored to it)
    the global model would be evaluated with its initial statistics, at chance, silently."""
    if baseline or cfg.aggregation.bn_stats != "full" or not get_buffers(model):
        return
    from fedgmr.models.scaler import has_batch_norm

    if not has_batch_norm(model):
        return
    starts_full = any(ladder.ladder[level] >= 1.0 for level in ladder.levels)
    reaches_full = cfg.restoration.trigger != "none" and ladder.ladder[-1] >= 1.0
    if not (starts_full or reaches_full):
        raise ConfigError(f"aggregation.bn_stats 'full' takes BatchNorm statistics from full-density clients only, "
                          f"and no client of this run ever trains the full model (ladder "
                          f"{list(cfg.submodel.ladder)}, restoration.trigger {cfg.restoration.trigger!r}): the global "
                          f"model would keep its initial statistics; set aggregation.bn_stats to 'all' or 'density'")


def baseline_client_method(cfg: ExperimentConfig, data: FederatedData, partition: Partition) -> Any:
    """A width baseline's own client procedure (HeteroFL's and FedRolex's width sub-models,
    FjORD's ordered dropout, FIARSE's threshold masks) for a client that builds its side
    alone (a Flower ClientApp); None for every other method. The same object
    :func:`build_experiment` gives its workload: built from the same seeded model and
    sub-model policy."""
    factory_of_policy = POLICIES.get(cfg.submodel.policy)
    if not (isinstance(factory_of_policy, type) and issubclass(factory_of_policy, baseline_hooks.BASELINE_POLICIES)):
        return None  # FedGMR's own policies: masked local training, nothing to build
    streams = Streams.from_seed(cfg.seed)
    factory = model_factory(cfg, data)
    model = init_model(factory, streams.init)
    space = ParamSpace(model, prune_output=cfg.submodel.prune_output)
    params = space.flatten(model)
    policy = _policy(cfg, space, params, model, data.train.x[:1], baseline_hooks.width_builder(cfg, data))
    baseline = baseline_hooks.baseline_setup(cfg, data, partition, space, policy, factory, "cpu")
    return None if baseline is None else baseline.client_method


def wants_client_validation(cfg: ExperimentConfig) -> bool:
    """Whether clients score their local model (per-client GMR monitors)."""
    return cfg.data.client_val_fraction > 0 and cfg.restoration.per_client_patience is not None


def full_payload_nbytes(space: ParamSpace) -> int:
    """Bytes of the whole model as a payload (what ``network.model_size_mb`` stands for)."""
    return payload_nbytes(space.numel)


def byte_scale(cfg: ExperimentConfig, space: ParamSpace, full_numel: int | None = None) -> float:
    """Factor on every payload so that the full model weighs ``network.model_size_mb``
    (``full_numel``: the full model's size when it is not the global model's, e.g.
    FedMRL's full-width local model beside its small shared G)."""
    size = cfg.network.model_size_mb
    if size is None:
        return 1.0
    return size * 1e6 / (full_payload_nbytes(space) if full_numel is None else payload_nbytes(full_numel))


def mask_costs(cfg: ExperimentConfig, space: ParamSpace, model: nn.Module,
               example: torch.Tensor) -> dict[str, float] | None:
    """Per-layer costs of the magnitude ranking (None: plain |w|), by the authors' rule
    ``c_l = comm + comp_l`` in seconds per parameter (docs/methods.md).

    Given explicitly (``submodel.layer_costs``), or from this simulator's time model:
    ``comm`` = one float32 value on a full-density client's uplink, ``comp_l`` = what one
    weight of layer ``l`` adds to a job's compute time (zero under the constant compute
    model, where a job's time does not depend on its sub-model)."""
    sub = cfg.submodel
    if not sub.cost_weighted:
        return None
    if sub.layer_costs is not None:
        try:
            return explicit_costs(space, sub.layer_costs)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    net = cfg.network
    comm = 4 * byte_scale(cfg, space) / (net.up_per_tier * 1e6)
    comp = None
    if net.compute.kind == "flops":
        comp = compute_costs(space, flops_per_weight(model, space, example), net.compute.seconds_per_round)
    return layer_costs(space, comm, comp)


def refresh_steps(cfg: ExperimentConfig) -> int | None:
    """Server steps between mask-ranking refreshes (``check_interval`` resolved)."""
    every = cfg.submodel.refresh_every
    return cfg.restoration.check_interval if every == "check_interval" else every


def _policy(cfg: ExperimentConfig, space: ParamSpace, params: torch.Tensor, model: nn.Module,
            example: torch.Tensor, width_builder: Callable[[float], nn.Module] | None = None) -> SubmodelPolicy:
    name = cfg.submodel.policy
    factory = POLICIES.get(name)
    if cfg.submodel.per_client and not getattr(factory, "supports_per_client", False):
        able = ", ".join(n for n in POLICIES.names() if getattr(POLICIES.get(n), "supports_per_client", False))
        raise ConfigError(f"submodel.per_client draws every client its own mask, which submodel.policy {name!r} "
                          f"does not: use one of {able}")
    if cfg.submodel.prune_output and (hasattr(factory, "from_config") or factory is FullModelPolicy):
        raise ConfigError(f"submodel.prune_output ranks the output layer with FedGMR's masks; submodel.policy "
                          f"{name!r} builds its own sub-models (FIARSE already prunes the output layer)")
    if hasattr(factory, "from_config"):  # structured baseline policies (fedgmr.baselines)
        return factory.from_config(space, params, model, cfg, width_builder)
    if factory is FullModelPolicy:
        return FullModelPolicy(space, device=params.device)
    if factory is MagnitudePolicy:
        return MagnitudePolicy(space, cfg.submodel.ladder, params, cfg.submodel.layer_floor,
                               mask_costs(cfg, space, model, example), refresh_steps(cfg), cfg.submodel.density_basis)
    return factory(space=space, ladder=cfg.submodel.ladder, params=params, model=model, config=cfg)


def _trigger(cfg: ExperimentConfig) -> RestorationTrigger:
    r = cfg.restoration
    if r.trigger == "early_stopping":
        return EarlyStoppingTrigger(r.patience, r.min_delta, r.cooldown)
    if r.trigger == "fixed_time":
        assert r.horizon is not None
        return FixedTimeTrigger(r.horizon, r.fractions)
    if r.trigger == "deadline":
        assert r.horizon is not None
        return DeadlineTrigger(r.patience, r.horizon, r.fractions, r.min_delta, r.cooldown)
    return NoTrigger()


def _rule(cfg: ExperimentConfig, baseline: Any) -> Any:
    """The aggregation rule: the configured one with its options, or the width baseline's own."""
    agg = cfg.aggregation
    rule = RULES.get(agg.rule) if agg.coverage_floor is None else floored_ma_rule(agg.coverage_floor)
    if agg.rule in _RULE_OPTIONS:
        rule = _RULE_OPTIONS[agg.rule](agg)
    if baseline is not None and baseline.rule is not None:
        rule = baseline.rule
    return rule


def _server_parts(cfg: ExperimentConfig, data: FederatedData, partition: Partition, model: nn.Module,
                  space: ParamSpace, factory: Callable[[], nn.Module], streams: Streams, device: torch.device,
                  baseline: Any) -> tuple[list[ServerPart], torch.Tensor | None]:
    """What each part of ``cfg`` asks of the server (:func:`compose_strategy` takes them
    together), and the proxy data distillation loaded (None when it distils nothing)."""
    if baseline is not None and baseline.client_method is not None \
            and (cfg.local.algorithm != "sgd" or cfg.local.stragglers > 0):
        what = (f"local.algorithm {cfg.local.algorithm!r}" if cfg.local.algorithm != "sgd"
                else "local.stragglers")
        raise ConfigError(f"{what} needs FedGMR's masked local training; submodel.policy "
                          f"{cfg.submodel.policy!r} trains with its own client procedure")
    parts: list[ServerPart] = []
    if baseline is not None:  # a width baseline's server (HeteroFL, FedRolex, FjORD, FIARSE)
        parts.append(ServerPart(f"submodel.policy {cfg.submodel.policy!r}", baseline.strategy_cls,
                                dict(baseline.strategy_kwargs)))
    half_cls, half_kwargs = server_half(cfg, model, space)  # the client method's server half
    from fedgmr.training.client_methods import client_method

    method = baseline.client_method if baseline is not None and baseline.client_method is not None \
        else client_method(cfg.local)  # what its replies carry, as it declares it (a class attribute)
    parts.append(ServerPart(f"local.algorithm {cfg.local.algorithm!r}", half_cls, half_kwargs,
                            tuple(getattr(method, "reply_extras", ()))))
    distill_cls, distill_kwargs, proxy = distill_half(  # federated distillation (FedDF, FedMD)
        cfg, data, factory, space, device, lambda: client_splits(cfg, data, partition).server_val, baseline)
    parts.append(ServerPart("distill.server (FedDF)" if cfg.distill.server else f"local.algorithm {cfg.local.algorithm!r}",
                            distill_cls, distill_kwargs))
    if cfg.clustering.kind != "none":  # clustered FL (IFCA, CFL): a plug-in keeping one model per cluster
        from fedgmr.strategy.clustered import clustering_half

        own = [p for p in parts if p.brings_class]
        plugins = [q for p in parts for q in p.kwargs.get("plugins", ())]  # a cluster's step runs no plug-in
        if baseline is not None or own or plugins:
            what = (f"submodel.policy {cfg.submodel.policy!r} (a width baseline)" if baseline is not None
                    else f"{own[0].strategy_cls.__name__}" if own  # type: ignore[union-attr]
                    else plugins[0].name)
            raise ConfigError(f"clustering.kind {cfg.clustering.kind!r} needs FedGMR's own server; {what} brings "
                              f"its own")
        parts.append(ServerPart(f"clustering.kind {cfg.clustering.kind!r}", None,
                                clustering_half(cfg, factory, streams.init, device)))
    agg = cfg.aggregation
    if agg.bn_stats == "server" and not any("bn_stats" in p.kwargs for p in parts) and get_buffers(model):
        if len(partition.server_val) == 0:
            raise ConfigError("aggregation.bn_stats 'server' needs a server validation split (data.val_fraction > 0)")
        from fedgmr.baselines.server import BNStatistics  # the baselines' static-BN pass

        x = data.train.x
        parts.append(ServerPart("aggregation.bn_stats 'server'", None, {"bn_stats": BNStatistics(
            factory().to(device), space, x[torch.as_tensor(partition.server_val, dtype=torch.long)])}))
    return parts, proxy


def _strategy(cfg: ExperimentConfig, parts: list[ServerPart], space: ParamSpace, params: torch.Tensor,
              buffers: dict[str, torch.Tensor], policy: SubmodelPolicy, ladder: DensityLadder, rule: Any,
              partition: Partition) -> MaskedBufferedStrategy:
    """The server strategy: FedGMR's, or the one class a part brings, with every part's arguments."""
    strategy_cls, extra = compose_strategy(parts)
    agg = cfg.aggregation
    try:
        strategy = strategy_cls(
            space, params, buffers, policy, ladder, rule,
            make_staleness(agg.staleness.kind, agg.staleness.a, agg.staleness.b), agg.weighting, agg.buffer,
            agg.max_staleness, agg.fedasync_alpha, _trigger(cfg), cfg.restoration.per_client_patience,
            cfg.restoration.min_delta, bn_rule="all" if agg.bn_stats == "server" else agg.bn_stats,
            # bounds on one client's influence: the server knows each client's training-set size and
            # the local work it asks for (docs/distributed.md); the norm bounds are off unless set
            client_samples=[len(idx) for idx in partition.clients], max_samples=agg.max_samples,
            max_processed=cfg.training.local_steps * cfg.training.batch_size,
            max_update_norm=agg.max_update_norm, norm_multiple=agg.update_norm_multiple, **extra,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.run.coverage_eval_every is not None and cfg.run.coverage_window is not None:
        strategy.track_coverage(cfg.run.coverage_window)
    return strategy


@dataclass
class _Evaluation:
    """The server's evaluator and the diagnostics it feeds (built by :func:`_evaluation`)."""

    evaluator: Callable[[torch.Tensor, dict[str, torch.Tensor], str], tuple[float, float]]
    diagnostics: Diagnostics
    sims: list[Simulator]  # the simulator, once it exists (its client states are read at each evaluation)


def _evaluation(cfg: ExperimentConfig, data: FederatedData, partition: Partition, space: ParamSpace,
                factory: Callable[[], nn.Module], device: torch.device, strategy: MaskedBufferedStrategy,
                method: Any) -> _Evaluation:
    """Test/validation evaluation of the published models, and the per-level, per-client,
    personal, coverage and per-class diagnostics at their own cadences."""
    n = cfg.clients.num_clients
    eval_model = factory().to(device)
    shared = client_splits(cfg, data, partition)
    splits = {"test": shared.global_test, "val": shared.server_val}
    sims: list[Simulator] = []

    def loaded(flat: torch.Tensor, bufs: dict[str, torch.Tensor]) -> nn.Module:
        """The evaluation model holding ``flat`` and ``bufs``."""
        space.load(eval_model, flat)
        set_buffers(eval_model, bufs)
        return eval_model

    def evaluate_split(flat: torch.Tensor, bufs: dict[str, torch.Tensor], sx: torch.Tensor,
                       sy: torch.Tensor) -> tuple[float, float]:
        return evaluate(loaded(flat, bufs), sx, sy, data.task, data.pad_index)

    def evaluate_personal(own: Any, bufs: Any, sx: torch.Tensor, sy: torch.Tensor) -> tuple[float, float]:
        """A client's own model: global-architecture weights, or a module of its own (FedMRL)."""
        if isinstance(own, nn.Module):
            return evaluate(own.to(device), sx, sy, data.task, data.pad_index)
        return evaluate_split(own, bufs, sx, sy)

    def evaluator(flat: torch.Tensor, bufs: dict[str, torch.Tensor], split: str) -> tuple[float, float]:
        sx, sy = splits[split]
        if len(sy) == 0:
            raise ConfigError(f"the {split} split is empty (check data.val_fraction)")
        if cfg.local.algorithm == "fedmd" and sims:  # no global model: the mean over the client models
            held = sims[0].published_states
            scores = [evaluate_split(*method.personal_model(eval_model, space, flat, bufs, held.get(c, {})), sx, sy)
                      for c in range(n)]
            return sum(a for a, _ in scores) / n, sum(loss for _, loss in scores) / n
        return evaluate_split(flat, bufs, sx, sy)

    def personal_models(flat: torch.Tensor, bufs: dict[str, torch.Tensor]) -> list[tuple[Any, Any]]:
        """Each client's own model: the global one, or its personal model (Ditto, FedBN)."""
        if method is None or not sims:
            return [(flat, bufs)] * n
        held = sims[0].client_states
        own = strategy.client_models(sims[0].published_version)  # clustering: each client's cluster model
        models = own if own is not None else [(flat, bufs)] * n
        return [method.personal_model(eval_model, space, p, b, held.get(c, {})) for c, (p, b) in enumerate(models)]

    def class_report_of(flat: torch.Tensor, bufs: dict[str, torch.Tensor]) -> dict[str, Any]:
        tx, ty = splits["test"]
        return class_report(loaded(flat, bufs), tx, ty, data.num_classes)

    if cfg.run.class_eval_every is not None:
        if data.task != "classification":
            raise ConfigError(f"run.class_eval_every needs a classification task; {cfg.data.name!r} is {data.task!r}")
        if cfg.local.algorithm == "fedmd":
            raise ConfigError("run.class_eval_every reads the global model, and fedmd has none (its clients keep "
                              "their own models)")

    diagnostics = Diagnostics(
        evaluate_test=lambda flat, bufs: evaluator(flat, bufs, "test")[0],
        level_masks=lambda: [strategy.policy.mask(level) for level in range(len(strategy.ladder.ladder))],
        levels=lambda: list(strategy.ladder.ladder),
        client_splits=shared.val if cfg.run.client_eval_every else [],
        evaluate_split=evaluate_split,
        level_every=cfg.run.level_eval_every, client_every=cfg.run.client_eval_every,
        personal_splits=shared.test if cfg.run.personal_eval_every else [],
        personal_models=personal_models, personal_every=cfg.run.personal_eval_every,
        evaluate_personal=evaluate_personal,
        coverage_stats=strategy.coverage_stats, client_levels=lambda: list(strategy.ladder.levels),
        coverage_every=cfg.run.coverage_eval_every,
        class_report=class_report_of, class_every=cfg.run.class_eval_every)
    return _Evaluation(evaluator, diagnostics, sims)


def _network_and_compute(cfg: ExperimentConfig, tiers: list[float], streams: Streams, model: nn.Module,
                         space: ParamSpace, example: torch.Tensor, method: Any) -> tuple[Network, ComputeModel]:
    """The clients' links (tier rates, jitter on its own stream) and the compute-time model."""
    n = cfg.clients.num_clients
    net = cfg.network
    network = Network(tiers, net.down_per_tier, net.up_per_tier, net.server_up, net.server_down,
                      net.jitter_sigma, streams.network, net.message_bytes, net.message_latency)
    macs = flops_per_weight(model, space, example)
    full_flops = sum(p.numel * macs[p.name] for p in space.params)

    def flops_fraction(mask: torch.Tensor) -> float:
        kept = sum(int(mask[p.slice].sum()) * macs[p.name] for p in space.params)
        return kept / full_flops

    if net.compute.speeds is not None and len(net.compute.speeds) != n:
        raise ConfigError(f"network.compute.speeds lists {len(net.compute.speeds)} speeds for {n} clients")
    # a client method that trains more than the global model (FedMRL: G + F_i + P_i) times its jobs itself
    job_work = getattr(method, "job_work", None) if net.compute.kind == "flops" else None
    client_work = None if job_work is None else [job_work(c, example) for c in range(n)]
    compute = ComputeModel(net.compute.kind, net.compute.seconds_per_round, net.compute.speeds, flops_fraction,
                           client_work)
    return network, compute


def build_experiment(cfg: ExperimentConfig, on_record: Callable[[dict[str, Any]], None] | None = None,
                     data: FederatedData | None = None) -> Experiment:
    """Wire up a :class:`Simulator` for ``cfg`` (pass ``data`` to reuse a loaded data set).

    The model is initialised on the CPU (the same weights on every device), then the
    global model, its buffers, masks, aggregation and evaluation live on ``run.device``.
    Each part has its builder: the sub-model policy and ladder, the server parts and the
    strategy they compose (:mod:`fedgmr.strategy.compose`), the client workload, the
    evaluation, the network and compute models, the executor and the simulator."""
    device = resolve_device(cfg.run.device)  # first: a missing GPU is refused before any work
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    streams = Streams.from_seed(cfg.seed)
    data = data or load_dataset(cfg.data.name, root=cfg.data.root, **cfg.data.options)
    partition = _partition(cfg, data, streams.partition)
    factory = model_factory(cfg, data)
    model = init_model(factory, streams.init)
    space = ParamSpace(model, prune_output=cfg.submodel.prune_output)
    params = space.flatten(model).to(device)
    buffers = to_device(get_buffers(model), device)
    n = cfg.clients.num_clients
    tiers = tier_densities(cfg.clients.heterogeneity, n)
    example = data.train.x[:1].clone()  # the loaded set's first sample (not a view that would keep it alive)
    # the training rows in client order, the partition renumbered: every client's shard is a
    # view of one storage, and the loaded layout is freed unless the caller holds it
    data, partition = client_ordered(data, partition)
    policy = _policy(cfg, space, params, model, example, baseline_hooks.width_builder(cfg, data))
    baseline = baseline_hooks.baseline_setup(cfg, data, partition, space, policy, factory, device)
    if isinstance(policy, FullModelPolicy):
        ladder = DensityLadder((1.0,), [0] * n)
    else:
        ladder = DensityLadder.from_densities(cfg.submodel.ladder, tiers)
        if baseline is not None:
            ladder = baseline.ladder(ladder)
    check_bn_statistics(cfg, model, ladder, baseline is not None)
    rule = _rule(cfg, baseline)
    parts, proxy = _server_parts(cfg, data, partition, model, space, factory, streams, device, baseline)
    strategy = _strategy(cfg, parts, space, params, buffers, policy, ladder, rule, partition)
    workload = build_workload(cfg, data, partition, baseline.client_method if baseline is not None else None)
    workload.choice_samples = cfg.clustering.loss_samples  # IFCA's loss on at most this many samples
    attach_public(cfg, workload, proxy)
    method = workload.client_method
    ev = _evaluation(cfg, data, partition, space, factory, device, strategy, method)
    network, compute = _network_and_compute(cfg, tiers, streams, model, space, example, method)
    coord = Coordination(cfg.coordination.mode, cfg.coordination.trigger, cfg.coordination.k,
                         cfg.coordination.deadline_slack, cfg.clients.concurrency, cfg.coordination.server_time,
                         cfg.network.ims)
    full_numel = method.reference_numel() if hasattr(method, "reference_numel") else None
    # FEDGMR_TEST_WORKER=1: the test split evaluated in a forked worker (before the pool forks)
    test_worker = test_worker_for(cfg, device, lambda flat, bufs: ev.evaluator(flat, bufs, "test"))
    try:
        executor = EXECUTORS.get(cfg.run.executor)(workload, cfg)  # last: nothing below can leak its workers
    except BaseException:
        if test_worker is not None:
            test_worker.close()
        raise
    try:
        sim = Simulator(strategy, space, executor, network, coord, compute, ev.evaluator, cfg.seed, streams.sampling,
                        cfg.run.eval_every, cfg.restoration.check_interval, byte_scale(cfg, space, full_numel),
                        wants_client_validation(cfg), on_record, cfg.run.eval_interval,
                        ev.diagnostics if ev.diagnostics.enabled else None, eval_from=cfg.run.eval_from or 0.0)
    except BaseException:
        executor.close()
        if test_worker is not None:
            test_worker.close()
        raise
    sim.test_worker = test_worker
    ev.sims.append(sim)
    ev.diagnostics.personal_stamp = lambda: sim.client_state_epoch
    return Experiment(cfg, data, partition, space, strategy, sim, executor)
