"""Typed, validated experiment configuration.

The tree mirrors the objects it builds (data, model, clients, training, sub-models,
aggregation, restoration, coordination, network, run). Unknown keys and bad values raise
:class:`~fedgmr.errors.ConfigError` with a one-line message naming the key.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from fedgmr.errors import ConfigError


def _check_known(names: list[str], registry: Any, what: str) -> None:
    """ValueError naming the first of ``names`` that ``registry`` lacks, with the known names."""
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise ValueError(f"unknown {what} {unknown[0]!r} (known: {', '.join(registry.names())})")


#: the most torch threads a run may ask for: far above any machine's core count, far below
#: the ~100k at which torch's thread pool crashes the process (a fixed bound, so a config
#: validates the same on every machine)
MAX_TORCH_THREADS = 1024

#: the forms ``run.device`` accepts (whether the machine has the device is checked when
#: the run is built: fedgmr.device.resolve_device)
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
DEVICE_FORMS = "auto, cpu, cuda, cuda:N (N = 0, 1, ...) or mps"
#: the largest device index torch represents (an 8-bit index: ``cuda:128`` wraps to -128)
MAX_DEVICE_INDEX = 127


def device_index_error(spec: str) -> str | None:
    """Why a well-formed ``cuda:N`` cannot name any device (N above torch's range); None if it can."""
    _, sep, index = spec.partition(":")
    if sep and index.isdigit() and int(index) > MAX_DEVICE_INDEX:
        return (f"device index {index[:30]} is out of range: torch numbers devices 0 to {MAX_DEVICE_INDEX} "
                f"(e.g. cuda:0)")
    return None


def _holds_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_bool(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_bool(v) for v in value.values())
    return False


def _types(annotation: Any) -> set[Any]:
    """Every type named in an annotation (``list[float] | None`` -> list, float, NoneType)."""
    found = {get_origin(annotation) or annotation}
    for arg in get_args(annotation):
        if get_origin(annotation) is not Literal:
            found |= _types(arg)
    return found


def _numeric(annotation: Any) -> bool:
    """Whether a field holds numbers and no booleans: ``int``, ``float``, lists of them."""
    types = _types(annotation)
    return bool(types & {int, float}) and not types & {bool, Any}


def _real(value: Any) -> bool:
    """A finite int or float that is not a boolean (YAML's ``.nan``/``.inf`` are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Section(BaseModel):
    """Base of every config section: unknown keys, inf/NaN and booleans given for
    numbers are refused (``true`` is not the integer 1)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _numeric(field.annotation) and _holds_bool(value):
            raise ValueError("must be a number, not a boolean")
        return value


class DataConfig(_Section):
    """Data set and client partition."""

    name: str = "digits"
    root: str | None = None
    partition: Literal["iid", "dirichlet", "shards", "natural"] = "dirichlet"
    alpha: float = Field(0.6, gt=0)
    #: ``shards`` partition: label-sorted shards per client (at most that many classes each)
    shards_per_client: int = Field(2, ge=1)
    val_fraction: float = Field(0.1, ge=0, lt=1)
    client_val_fraction: float = Field(0.0, ge=0, lt=1)
    #: each client's own held-out *test* split, carved from its shard after
    #: ``client_val_fraction`` (personalised evaluation: ``run.personal_eval_every``)
    client_test_fraction: float = Field(0.0, ge=0, lt=1)
    #: feature-shifted clients: client i's images (train, validation and test) under the
    #: fixed transform ``feature_shift[i mod len]`` (fedgmr.data.shift.FEATURE_SHIFTS:
    #: none, invert, rotate, noise, blur, low_contrast, and the exact rotations rot0,
    #: rot90, rot180, rot270); the global test split cycles through them sample by
    #: sample. Empty: no shift.
    feature_shift: list[str] = Field(default_factory=list)
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("feature_shift")
    @classmethod
    def _shifts(cls, v: list[str]) -> list[str]:
        from fedgmr.data.shift import FEATURE_SHIFTS

        _check_known(v, FEATURE_SHIFTS, "feature shift")
        return v


class ModelConfig(_Section):
    """Model architecture (a registered builder) and its options."""

    name: str = "cnn"
    options: dict[str, Any] = Field(default_factory=dict)


class ClientsConfig(_Section):
    """Client population: count, bandwidth tiers and concurrency."""

    num_clients: int = Field(10, ge=1)
    heterogeneity: Literal["high", "medium", "low", "none"] | list[float] = "high"
    concurrency: int | None = Field(None, ge=1)

    @field_validator("heterogeneity", mode="before")
    @classmethod
    def _densities(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            if not v:
                raise ValueError("must list one initial density per client")
            for i, d in enumerate(v):
                if not _real(d) or not 0 < float(d) <= 1:
                    raise ValueError(f"density #{i + 1} is {d!r}; each initial density must be a number in (0, 1]")
        elif isinstance(v, str) and v not in ("high", "medium", "low", "none"):
            raise ValueError("must be 'high', 'medium', 'low', 'none' or a list of densities in (0, 1]")
        return v


class LRScheduleConfig(_Section):
    """The clients' learning rate over the server's model versions (fedgmr.training.schedules):
    ``constant``; ``step``: x ``gamma`` every ``step_every`` versions; ``cosine``: from
    ``training.lr`` down to ``min_lr`` over ``total_steps`` versions."""

    kind: Literal["constant", "step", "cosine"] = "constant"
    step_every: int = Field(100, ge=1)
    gamma: float = Field(0.5, gt=0, le=1)
    total_steps: int | None = Field(None, ge=1)
    min_lr: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _cosine_needs_a_length(self) -> "LRScheduleConfig":
        if self.kind == "cosine" and self.total_steps is None:
            raise ValueError("a cosine schedule needs training.lr_schedule.total_steps (server steps)")
        return self


class AugmentConfig(_Section):
    """Image augmentation in local training (fedgmr.training.augment): each job crops every
    image from its copy zero-padded by ``crop_padding`` pixels and flips it left-right with
    probability 1/2 (``flip``), drawn from the job's own seed."""

    flip: bool = False
    crop_padding: int = Field(0, ge=0, le=64)


class TrainingConfig(_Section):
    """Local SGD on each client.

    clip_grad_norm: clip each local step's gradient (on the client's mask, after any
        FedProx/SCAFFOLD term) to this L2 norm, as ``torch.nn.utils.clip_grad_norm_``
        does; null: the method's default (no clipping, except HeteroFL and FedRolex,
        whose published code clips at 1); 0: no clipping.
    """

    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(20, ge=1)
    local_steps: int = Field(5, ge=1)
    loss: Literal["ce", "bce"] = "ce"
    clip_grad_norm: float | None = Field(None, ge=0)
    lr_schedule: LRScheduleConfig = Field(default_factory=LRScheduleConfig)
    augment: AugmentConfig = Field(default_factory=AugmentConfig)


class LocalConfig(_Section):
    """The client half of a method (fedgmr.training.client_methods; docs/methods/).

    algorithm: ``sgd`` (masked local SGD), ``fedprox``, ``scaffold``, ``ditto`` or
        ``fedbn`` (the registry ``CLIENT_METHODS``).
    prox_mu: FedProx's mu (docs/methods/fedprox.md).
    ditto_lambda: Ditto's lambda; personal_steps: its steps on the personal model per job
        (null: ``training.local_steps``).
    server_lr: SCAFFOLD's global step size eta_g.
    stragglers: FedProx's straggler model, for every method: this fraction of jobs runs a
        random number of local steps in [1, E) and is still aggregated.
    options: keyword options of the registered client method (FedDyn's ``alpha``); names
        are checked against its factory's signature, values by the factory
        (:func:`fedgmr.training.client_methods.client_method`).
    """

    algorithm: str = "sgd"
    prox_mu: float = Field(0.01, ge=0)
    ditto_lambda: float = Field(1.0, ge=0)
    personal_steps: int | None = Field(None, ge=1)
    server_lr: float = Field(1.0, gt=0)
    stragglers: float = Field(0.0, ge=0, le=1)
    options: dict[str, Any] = Field(default_factory=dict)


class FedMRLConfig(_Section):
    """FedMRL (``local.algorithm: fedmrl``; docs/methods/fedmrl.md). The model
    (``model.name``, a representation model such as ``rep_cnn``) gives the architecture
    family of both the shared small model G and each client's local model F_i.

    d1: G's representation size: the Matryoshka prefix of the fused representation that
        G's head reads.
    d2: the large representation: each F_i's representation size, the projector's output
        and what F_i's head reads (d1 <= d2).
    g_width: G's width rate (its hidden sizes; the same G on every client).
    widths: F_i's width rate; client i takes ``widths[i mod len]`` (also ``standalone``'s
        model per client).
    """

    d1: int = Field(20, ge=1)
    d2: int = Field(100, ge=1)
    g_width: float = Field(0.25, gt=0, le=1)
    widths: list[float] = Field(default_factory=lambda: [1.0, 0.75, 0.5, 0.375, 0.25])

    @field_validator("widths")
    @classmethod
    def _widths(cls, v: list[float]) -> list[float]:
        if not v or any(not 0 < w <= 1 for w in v):
            raise ValueError("must list one or more width rates in (0, 1]")
        return v

    @model_validator(mode="after")
    def _prefix(self) -> "FedMRLConfig":
        if self.d1 > self.d2:
            raise ValueError(f"fedmrl.d1 ({self.d1}) must be at most fedmrl.d2 ({self.d2}): G's head reads a prefix "
                             f"of the d2-dimensional fused representation")
        return self


class BaselineConfig(_Section):
    """Options of the model-heterogeneous baselines (HeteroFL, FedRolex, FjORD, FIARSE).

    width_rates: width rate per ladder level (HeteroFL/FedRolex/FjORD); None picks, per
        level, the largest width whose sub-model holds at most the level's density.
    scaler: HeteroFL/FedRolex scaler (activations / r in training, identity in eval).
    static_bn: no BatchNorm statistics from clients; the server re-estimates them on its
        validation split after every aggregation (every width for FjORD).
    label_split: HeteroFL/FedRolex output-layer label split (clients train and upload only
        the classifier rows of classes in their data).
    p_values: FjORD's width grid; a tier samples the values below its p_max, and p_max.
    distill: FjORD self-distillation from p_max.
    threshold_scope: FIARSE thresholds: one ``global`` or one per top-level ``stage``.
    server_lr: FIARSE server learning rate.
    """

    width_rates: list[float] | None = None
    scaler: bool = True
    static_bn: bool = True
    label_split: bool = True
    p_values: list[float] = Field(default_factory=lambda: [0.2, 0.4, 0.6, 0.8, 1.0])
    distill: bool = False
    threshold_scope: Literal["global", "stage"] = "global"
    server_lr: float = Field(1.0, gt=0)

    @field_validator("width_rates", "p_values")
    @classmethod
    def _rates(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (not v or any(not 0 < r <= 1 for r in v) or v != sorted(set(v))):
            raise ValueError("must be strictly increasing rates in (0, 1]")
        return v


class SubmodelConfig(_Section):
    """Sub-model policy and density ladder (docs/reference.md §3).

    density_basis: what a density counts. ``model``: a level-ρ mask holds ρ of all the
        model's coordinates, the always-kept ones (output layer, biases, norms) included,
        so its payload weighs ρ x the full model as in the paper's Table 12. ``prunable``:
        ρ of the prunable weights, the always-kept ones on top (the authors' mask count).
    cost_weighted: rank coordinates by ``|w| / c_l`` with the authors' per-layer cost
        ``c_l = comm + T comp_l`` (seconds per parameter; docs/methods.md).
    layer_costs: explicit ``c_l`` per prunable layer (a list in layer order, or a mapping
        by parameter name); None derives them from the simulator's time model.
    refresh_every: recompute the ranking every that many server steps;
        ``check_interval`` (the authors' cadence) follows ``restoration.check_interval``;
        null never refreshes. Magnitude masks only: the extraction policies (``random``,
        ``rolling``, ``coverage_max``) extract again at every server step.
    coverage_decay: ``coverage_max``'s ``λ`` in the recent coverage ``H_k = λ H_{k-1} + Γ_k``
        (docs/methods/epm.md).
    prune_output: the mask policies only: rank the output layer's weight with the other
        prunable weights instead of always keeping it (reference §3.3 keeps it). An option
        of this library, not the paper's: where the output layer is a large share of the
        model (Shakespeare's character LSTM: 15 %), always keeping it makes a density-0.05
        sub-model carry 20 % of the model's bytes, four times what the baselines' 0.05
        sub-models carry; with it on, a level-ρ payload weighs about ρ x the full model.
    per_client: the extraction policies only: draw every client its own mask at each
        dispatch (EPM's setting: the clients of one round cover different coordinates)
        instead of one nested ranking per round that clients of a level share. Needs
        ``network.ims: false`` (IMS multicasts nested level blocks).
    """

    policy: str = "magnitude"
    ladder: list[float] = Field(default_factory=lambda: [0.05, 0.1, 0.2, 0.5, 1.0])
    density_basis: Literal["model", "prunable"] = "model"
    layer_floor: float = Field(0.02, ge=0, le=1)
    cost_weighted: bool = False
    layer_costs: list[float] | dict[str, float] | None = None
    refresh_every: int | Literal["check_interval"] | None = "check_interval"
    coverage_decay: float = Field(0.9, ge=0, le=1)
    prune_output: bool = False
    per_client: bool = False
    baseline: BaselineConfig = Field(default_factory=BaselineConfig)

    @field_validator("refresh_every")
    @classmethod
    def _refresh(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1, 'check_interval' or null")
        return v

    @field_validator("layer_costs")
    @classmethod
    def _costs(cls, v: list[float] | dict[str, float] | None) -> list[float] | dict[str, float] | None:
        values = list(v.values()) if isinstance(v, dict) else v
        if values is not None and (not values or any(not c > 0 for c in values)):
            raise ValueError("must be positive costs, one per prunable layer")
        return v

    @field_validator("ladder")
    @classmethod
    def _ladder(cls, v: list[float]) -> list[float]:
        if not v or any(not 0 < r <= 1 for r in v) or v != sorted(set(v)):
            raise ValueError("must be strictly increasing densities in (0, 1]")
        return v


class ClusteringConfig(_Section):
    """Clustered FL: one model per cluster on the server (fedgmr.strategy.clustered;
    docs/methods/ifca.md, docs/methods/cfl.md).

    kind: ``none``, ``ifca`` (k models, each client takes the one with the lowest loss on
        its data) or ``cfl`` (Sattler et al.'s bipartitioning; synchronous only).
    k: IFCA's number of cluster models (4: IFCA's rotated-MNIST setting).
    eps1, eps2: CFL splits a cluster when the norm of its mean update is below ``eps1``
        and its largest update norm above ``eps2`` (0.4 and 1.6: Sattler's reference code).
    min_size: CFL splits only clusters of more than this many clients (reference: 2).
    warmup: CFL splits nothing in rounds 1..warmup (reference: 20).
    loss_samples: IFCA scores the k models on the first this many samples of a client's
        training shard (null: all of it, as the paper; a cap makes each job cheaper).
    """

    kind: str = "none"
    k: int = Field(4, ge=1)
    eps1: float = Field(0.4, gt=0)
    eps2: float = Field(1.6, gt=0)
    min_size: int = Field(2, ge=1)
    warmup: int = Field(20, ge=0)
    loss_samples: int | None = Field(None, ge=1)


#: client methods that train the model they are sent, so that a clustered server can send a cluster's
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


class StalenessConfig(_Section):
    kind: Literal["constant", "polynomial", "hinge", "fedbuff"] = "polynomial"
    a: float = Field(0.6, ge=0)
    b: float = Field(4.0, ge=0)


class AggregationConfig(_Section):
    """Aggregation rule, weighting, staleness, buffer and BatchNorm statistics (docs/reference.md §4).

    weighting: beta = s(tau) x the client's training-set size (``samples``), x the
        samples its local steps processed (``processed``, the authors' count), or s(tau)
        alone (``equal``).
    bn_stats: how BatchNorm running statistics are aggregated: only full-density
        clients' (``full``), weighted by density (``density``), every client's
        (``all``), or re-estimated on the server's validation split (``server``).
    max_samples: cap on the training-set size a reply claims where the server does not
        know it (the simulator knows every client's; a Flower deployment defaults to the
        largest partition the config makes).
    max_update_norm: L2 bound on one client's update (its change from the model it was
        sent, parameters on its mask plus float buffers); larger updates are clipped to it.
    update_norm_multiple: adaptive bound: this multiple of the median norm of recent
        accepted updates (a Flower deployment defaults to 3 when neither bound is set).
    coverage_floor: a rule of this library, not the paper's: MA's per-coordinate
        denominator is floored at this share of the total weight, so a coordinate that
        clients holding less of the weight cover shrinks toward zero as under FA (0: MA;
        1: FA on covered coordinates). Needs ``rule: ma``.
    trim: ``rule: trimmed_mean``: the share of the covering clients' values cut at each end
        of every coordinate (``floor(trim * k)`` of ``k``).
    krum_byzantine: ``rule: krum``: the number ``f`` of faulty clients assumed; each
        update is scored on its ``n - f - 2`` nearest others.
    krum_select: ``rule: krum``: how many of the best-scored updates are averaged (MA);
        default ``n - f`` (Multi-Krum), 1 for Krum.
    """

    rule: str = "ma"
    weighting: Literal["samples", "processed", "equal"] = "samples"
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)
    buffer: bool = True
    max_staleness: int | None = Field(None, ge=0)
    fedasync_alpha: float = Field(0.9, gt=0, le=1)
    bn_stats: Literal["full", "density", "all", "server"] = "full"
    max_samples: int | None = Field(None, ge=1)
    max_update_norm: float | None = Field(None, gt=0)
    update_norm_multiple: float | None = Field(None, gt=0)
    coverage_floor: float | None = Field(None, ge=0, le=1)
    trim: float = Field(0.1, ge=0, lt=0.5)
    krum_byzantine: int = Field(1, ge=0)
    krum_select: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _floor_needs_ma(self) -> "AggregationConfig":
        if self.coverage_floor is not None and self.rule != "ma":
            raise ValueError(f"aggregation.coverage_floor floors mask-aware aggregation's denominator; it needs "
                             f"aggregation.rule 'ma', got {self.rule!r}")
        return self


class RestorationConfig(_Section):
    """Gradual Model Restoration (docs/reference.md §5)."""

    trigger: Literal["early_stopping", "fixed_time", "deadline", "none"] = "early_stopping"
    check_interval: int = Field(25, ge=1)
    patience: int = Field(5, ge=1)
    min_delta: float = Field(0.0, ge=0)
    cooldown: int | None = Field(None, ge=0)
    per_client_patience: int | None = Field(None, ge=1)
    horizon: float | None = Field(None, gt=0)
    fractions: list[float] = Field(default_factory=lambda: [0.2, 0.4, 0.6, 0.8, 1.0])

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        # fixed_time fires one ladder step at each f x horizon: a fraction <= 0 fires at the
        # start, one > 1 never fires, and an unordered or repeated list hides a typo
        if not v or any(not 0 < f <= 1 for f in v) or any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError("must be a non-empty, strictly increasing list of fractions of the horizon in (0, 1]")
        return v


class CoordinationConfig(_Section):
    """When the server aggregates (docs/reference.md §6.4)."""

    mode: Literal["semi_async", "sync"] = "semi_async"
    trigger: Literal["k", "deadline"] = "deadline"
    k: int = Field(3, ge=1)
    deadline_slack: float = Field(0.5, ge=0)
    server_time: float = Field(0.5, ge=0)


class ComputeConfig(_Section):
    kind: Literal["constant", "flops"] = "constant"
    seconds_per_round: float = Field(0.5, ge=0)
    speeds: list[float] | None = None

    @field_validator("speeds")
    @classmethod
    def _speeds(cls, v: list[float] | None) -> list[float] | None:
        if v is not None:
            bad = next((i for i, c in enumerate(v) if not c > 0), None)
            if not v or bad is not None:
                where = f"speed #{bad + 1} is {v[bad]!r}; " if bad is not None else ""
                raise ValueError(f"{where}must list one finite speed > 0 per client")
        return v


class NetworkConfig(_Section):
    """Bandwidths (MB/s), IMS, jitter and payload sizing (docs/reference.md §6.1-6.5)."""

    ims: bool = True
    down_per_tier: float = Field(20.0, gt=0)
    up_per_tier: float = Field(5.0, gt=0)
    server_up: float = Field(10.0, gt=0)
    server_down: float = Field(50.0, gt=0)
    jitter_sigma: float = Field(0.0, ge=0)
    model_size_mb: float | None = Field(None, gt=0)
    #: bytes every message carries beside its payload (a transport's framing, headers and
    #: fields: what a deployment measures, e.g. with ``fedgmr flower testbed``); they take
    #: link time, unscaled by ``model_size_mb``, and are not counted in ``bytes_up/down``
    message_bytes: float = Field(0.0, ge=0)
    #: seconds every message takes beside its transfer (a transport's per-message latency:
    #: polling, round trips), added to each download's and each upload's finish
    message_latency: float = Field(0.0, ge=0)
    compute: ComputeConfig = Field(default_factory=ComputeConfig)


class RunConfig(_Section):
    """Run length, evaluation, checkpoints and execution.

    eval_interval: test evaluation on a virtual-time grid, every that many seconds, the
        same grid for every method (docs/reference.md §9). eval_every: instead, every that many server
        steps (the authors' cadence). Set at most one; with neither, the grid is
        ``max_time / 100`` (or every 5 steps when only ``max_steps`` is set).
    """

    max_steps: int | None = Field(None, ge=1)
    max_time: float | None = Field(None, gt=0)
    eval_interval: float | None = Field(None, gt=0)
    eval_every: int | None = Field(None, ge=1)
    #: on the time grid, skip the test evaluations before this virtual time (null: none
    #: skipped). Training is unchanged, and so is every record from then on: a sweep that
    #: only needs Acc@t* evaluates its window and saves the rest (most of an asynchronous
    #: run's wall time on a small model is spent evaluating)
    eval_from: float | None = Field(None, ge=0)
    #: checkpoint every that many server steps or ``checkpoint_seconds`` of wall time,
    #: whichever comes first (both null: no checkpoints, the run cannot be resumed)
    checkpoint_every: int | None = Field(100, ge=1)
    checkpoint_seconds: float | None = Field(60.0, gt=0)
    #: the run fails after that many client updates in a row were rejected;
    #: null: 3 x the number of clients training at once
    fail_after_rejections: int | None = Field(None, ge=1)
    executor: str = "serial"
    workers: int | None = Field(None, ge=1)
    torch_threads: int | None = Field(1, ge=1, le=MAX_TORCH_THREADS)
    #: Ray cluster to join (``"auto"`` or ``"HOST:PORT"``); None starts Ray locally
    ray_address: str | None = None
    #: where training, evaluation and aggregation run: ``auto`` (CUDA when available,
    #: else the CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (checked when the run is built)
    device: str = "auto"
    t_star: float | None = Field(None, gt=0)
    #: per-level accuracy (the global model under each ladder level's mask), logged as
    #: ``level_accuracy`` every that many test evaluations (null: off)
    level_eval_every: int | None = Field(None, ge=1)
    #: per-client accuracy (the global model on each client's held-out split; needs
    #: data.client_val_fraction > 0), logged as ``client_accuracy`` every that many test
    #: evaluations (null: off)
    client_eval_every: int | None = Field(None, ge=1)
    #: per-class test accuracy of the global model and the share of test samples it
    #: predicts as each class (classification tasks), logged as ``class_accuracy`` and
    #: ``predicted_share`` every that many test evaluations (null: off)
    class_eval_every: int | None = Field(None, ge=1)
    #: personalised accuracy (each client's own model - the global one, or its personal
    #: model for Ditto / FedBN - on its own test split; needs data.client_test_fraction >
    #: 0), logged as ``personal_accuracy``, ``personal_std``, ``personal_worst10`` and the
    #: per-client ``personal_accuracies`` every that many test evaluations (null: off)
    personal_eval_every: int | None = Field(None, ge=1)
    #: coverage of the last aggregation over the updates it used and the pruned-weight
    #: energy (docs/methods/epm.md), logged as ``coverage_hist``, ``coverage_min``,
    #: ``coverage_groups``, ``coverage_group_min``, ``pruned_energy`` and
    #: ``pruned_energy_mean`` every that many test evaluations (null: off)
    coverage_eval_every: int | None = Field(None, ge=1)
    #: with coverage_eval_every: also the coverage of the last this many aggregations
    #: together (``window_coverage_min``, ``window_coverage_none``) and the share of
    #: coordinates never covered so far (``coverage_never``); null: off
    coverage_window: int | None = Field(10, ge=1)
    #: experiment trackers fed every metrics record: tensorboard, mlflow, wandb
    #: (fedgmr.experiment.loggers; each needs its pip extra, e.g. fedgmr[tensorboard])
    loggers: list[str] = Field(default_factory=list)
    #: MLflow tracking URI (null: $MLFLOW_TRACKING_URI, else file:<run dir>/mlruns)
    mlflow_uri: str | None = None

    @field_validator("loggers")
    @classmethod
    def _loggers(cls, v: list[str]) -> list[str]:
        # the names are checked against the registry by fedgmr.methods.check_builder_options
        if len(set(v)) != len(v):
            raise ValueError("names a logger twice")
        return v

    @field_validator("mlflow_uri")
    @classmethod
    def _tracking_uri(cls, v: str | None) -> str | None:
        if v is None:
            return v
        scheme, sep, rest = v.partition(":")
        well_formed = bool(v.strip()) and v == v.strip() and not any(c in v for c in "\r\n\t\0")
        if sep and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
            well_formed = False
        if sep and scheme.lower() in ("http", "https") and not re.match(r"//[^/\s]+", rest):
            well_formed = False  # http:, https: need a host
        if not well_formed:
            raise ValueError("must be an MLflow tracking URI (http://HOST:PORT, https://..., file:///path, "
                             "sqlite:///path.db, databricks, ...) or a folder path")
        return v

    @field_validator("max_time", mode="before")
    @classmethod
    def _finite_end(cls, v: Any) -> Any:
        if isinstance(v, float) and math.isinf(v):
            raise ValueError("must be finite: a run needs an end (a finite run.max_time, or run.max_steps "
                             "with run.max_time: null)")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not DEVICE_PATTERN.fullmatch(v):
            raise ValueError(f"must be {DEVICE_FORMS}")
        why = device_index_error(v)
        if why:
            raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _length(self) -> "RunConfig":
        if self.max_steps is None and self.max_time is None:
            raise ValueError("set max_steps or max_time")
        if self.eval_interval is not None and self.eval_every is not None:
            raise ValueError("set one of run.eval_interval (virtual seconds) and run.eval_every (server steps), "
                             "not both (e.g. --set run.eval_interval=null for the step cadence)")
        if self.eval_interval is None and self.eval_every is None:
            if self.max_time is not None:
                self.eval_interval = self.max_time / 100
            else:
                self.eval_every = 5
        if self.eval_from is not None:
            if self.eval_interval is None:
                raise ValueError("run.eval_from needs the time grid (run.eval_interval), not run.eval_every")
            window = 10 * self.eval_interval  # Acc@t*'s default window (docs/reference.md §9.2)
            if self.t_star is not None and self.eval_from > self.t_star - window:
                raise ValueError(f"run.eval_from {self.eval_from:g} would leave out part of Acc@t*'s window "
                                 f"[{self.t_star - window:g}, {self.t_star + window:g}]: set it at most "
                                 f"{self.t_star - window:g}")
        return self


class ProxyConfig(_Section):
    """Unlabelled proxy / public data for federated distillation: ``size`` samples of a
    registered data set's ``split`` from sample ``offset`` on (labels are never used).
    ``offset`` keeps an in-domain proxy apart from the samples the clients train on (the
    mnist preset trains on the first 20,000 MNIST training images: ``offset: 20000``)."""

    name: str | None = None
    root: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    split: Literal["train", "test"] = "train"
    size: int = Field(1000, ge=1)
    offset: int = Field(0, ge=0)


class DistillConfig(_Section):
    """Federated distillation (docs/methods/feddf.md, docs/methods/fedmd.md).

    server: FedDF's server-side ensemble distillation after every ``every``-th aggregation.
    proxy: the unlabelled proxy (FedDF) / public (FedMD) data.
    temperature, steps, batch_size, lr: the distillation (Adam, a fresh optimiser each time):
        server steps per distillation (FedDF) or digest steps per client job (FedMD).
    loss: ``kl`` (T^2 KL to the soft targets) or ``mse`` (on the softened probabilities; FedMD only).
    val_every, patience: FedDF's early stopping on the server's validation split (null: off).
    seconds_per_step: virtual seconds one server distillation step adds to the aggregation
        (0: free, as FedDF's paper assumes).
    """

    server: bool = False
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    temperature: float = Field(1.0, gt=0)
    steps: int = Field(20, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0)
    loss: Literal["kl", "mse"] = "kl"
    every: int = Field(1, ge=1)
    val_every: int | None = Field(None, ge=1)
    patience: int = Field(2, ge=1)
    seconds_per_step: float = Field(0.0, ge=0)


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


class ExperimentConfig(_Section):
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


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _key(loc: tuple[Any, ...]) -> str:
    """A dotted config key from a pydantic error location: list positions as ``[i]``,
    union-member tags (``list[float]``, ``literal[...]``, ``int``) dropped."""
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif "[" in part or part in ("int", "float", "str", "bool", "none", "function-after", "function-before"):
            continue
        else:
            key += f".{part}" if key else part
    return key.replace("\n", " ")


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    key = _key(first["loc"]) or "<root>"
    if first["type"] == "extra_forbidden":
        return f"unknown config key '{key}'"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "finite_number":
        msg += " (inf and nan are not allowed here)"
    if first["type"] == "model_type":
        msg = "is a section: give a mapping of its keys"
    if not first["loc"]:
        return f"invalid config: {msg}"
    return f"invalid value for '{key}': {msg} (got {_short(first.get('input'))})"


def _sections(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The fields of ``model`` that are themselves sections."""
    return {name: f.annotation for name, f in model.model_fields.items()
            if isinstance(f.annotation, type) and issubclass(f.annotation, _Section)}


def check_sections(data: dict[str, Any], model: type[BaseModel] | None = None, prefix: str = "") -> None:
    """Refuse a section given as something other than a mapping (``--set coordination=5``,
    an empty ``coordination:`` in YAML), naming it, before method settings are merged."""
    model = model or ExperimentConfig
    for name, section in _sections(model).items():
        if name not in data:
            continue
        key, value = prefix + name, data[name]
        if not isinstance(value, dict):
            raise ConfigError(f"invalid value for '{key}': '{key}' is a section: give a mapping of its keys "
                              f"(e.g. --set {key}.KEY=VALUE) (got {_short(value)})")
        check_sections(value, section, key + ".")


def parse_config(data: dict[str, Any]) -> ExperimentConfig:
    """Validate a plain dict; raises :class:`ConfigError` naming the first bad key."""
    if not isinstance(data, dict):
        raise ConfigError("a config must be a mapping of keys to values")
    check_sections(data)
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from None


#: the largest config or sweep file read (a config is a few kB; a parser would take minutes
#: over a file of this size, and a link to /dev/zero would never end)
MAX_CONFIG_BYTES = 8 << 20


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (or JSON) or TOML file into a dict.

    A regular file of at most :data:`MAX_CONFIG_BYTES` only: a FIFO, a device (a link to
    ``/dev/zero``), a directory or a larger file is one ``ConfigError`` line, never a hang
    or an unbounded read."""
    from fedgmr.errors import RunDirError
    from fedgmr.safe_read import read_run_file

    path = Path(path)
    try:
        data_bytes = read_run_file(path, MAX_CONFIG_BYTES)
    except FileNotFoundError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except RunDirError as exc:  # "cannot read PATH: it is a FIFO (named pipe), not a regular file", ...
        reason = str(exc).split(": ", 1)[-1] if str(exc).startswith("cannot read ") else str(exc)
        reason = reason.replace("a run-directory file may hold", "a config file may hold")
        raise ConfigError(f"cannot read config file {path}: {reason}") from None
    try:
        text = data_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config file {path}: not UTF-8 text (byte {exc.start})") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - any parser error becomes one line
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot parse config file {path}: {first}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys at its top level, "
                          f"not a {type(data).__name__} (got {_short(data)})")
    return data


def parse_value(text: str) -> Any:
    """Parse a ``--set`` value with YAML rules (numbers, booleans, null, lists)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """``set_dotted(d, "a.b", 1)`` sets ``d["a"]["b"] = 1``, creating sections."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"invalid config key '{key}'")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"unknown config key '{key}' ('{'.'.join(parts[:i + 1])}' is not a section)")
        node = child
    node[parts[-1]] = value


def get_dotted(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings to a config dict (in place) and return it."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got '{item}'")
        key, value = item.split("=", 1)
        set_dotted(data, key.strip(), parse_value(value))
    return data


def dump_config(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
