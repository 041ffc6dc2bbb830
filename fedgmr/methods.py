"""Named methods: each is FedGMR's machinery with some settings fixed.

A method fixes the config keys that define it (e.g. ``fedgmr_wo_gmr`` fixes
``restoration.trigger: none``) and may change the defaults of others (``fedasync``'s
alpha 0.9 and staleness exponent 0.5, which a config can still set); everything else
stays configurable. Register your own::

    from fedgmr.methods import METHODS, Method
    METHODS.register("my_variant", Method("my_variant", "FedGMR with GA", {"aggregation.rule": "ga"}))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedgmr.config import ExperimentConfig, check_sections, get_dotted, parse_config, set_dotted
from fedgmr.errors import ConfigError
from fedgmr.registry import Registry


@dataclass(frozen=True)
class Method:
    """A named bundle of fixed settings, plus defaults a config may override."""

    name: str
    description: str
    fixed: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)


METHODS: Registry[Method] = Registry("method")

_FULL_MODEL = {"submodel.policy": "full", "restoration.trigger": "none", "network.ims": False}
# MA with its denominator floored at half the buffer's weight (fedgmr_floor, fedgmr_floor_deadline)
_FLOOR = {"aggregation.rule": "ma", "aggregation.coverage_floor": 0.5}

for _m in [
    Method("fedgmr", "FedGMR: masked sub-models, GMR, semi-async buffered MA aggregation, IMS"),
    Method("fedgmr_wo_gmr", "FedGMR without restoration (fixed densities)", {"restoration.trigger": "none"}),
    Method("fedgmr_wo_asyn", "FedGMR with synchronous coordination", {"coordination.mode": "sync"}),
    Method("fedgmr_wo_buffer", "FedGMR aggregating arrivals only", {"aggregation.buffer": False}),
    Method("fedgmr_wo_ims", "FedGMR sending each sub-model whole", {"network.ims": False}),
    Method("fedgmr_fixed_time", "FedGMR restoring at fixed fractions of a horizon",
           {"restoration.trigger": "fixed_time"}),
    Method("fedgmr_deadline", "FedGMR restoring on a plateau or at each rung's deadline, whichever comes first "
           "(a rule of this library, not the paper's)", {"restoration.trigger": "deadline"}),
    Method("fedgmr_ma", "FedGMR with mask-aware aggregation (the default rule)", {"aggregation.rule": "ma"}),
    Method("fedgmr_ga", "FedGMR with gradient averaging", {"aggregation.rule": "ga"}),
    Method("fedgmr_fa", "FedGMR with zero-padded FedAvg", {"aggregation.rule": "fa"}),
    Method("fedgmr_floor", "FedGMR with MA's denominator floored at half the buffer's weight: under-covered "
           "coordinates shrink as under FA until restoration covers them (a rule of this library, not the "
           "paper's)", dict(_FLOOR)),
    Method("fedgmr_floor_deadline", "fedgmr_floor restoring on a plateau or at each rung's deadline (both rules "
           "of this library, not the paper's)",
           {**_FLOOR, "restoration.trigger": "deadline"}),
    Method("fedavg", "Synchronous FedAvg on the full model, sample-weighted",
           {**_FULL_MODEL, "coordination.mode": "sync", "aggregation.rule": "ma", "aggregation.buffer": False,
            "aggregation.staleness.kind": "constant", "aggregation.weighting": "samples"}),
    Method("fedasync", "FedAsync: each full-model arrival mixed in on its own, with alpha * s(tau)",
           {**_FULL_MODEL, "coordination.mode": "semi_async", "coordination.trigger": "k", "coordination.k": 1,
            "aggregation.rule": "fedasync", "aggregation.buffer": False},
           # FedAsync's common setting (docs/reference.md §7); the authors' runs used a = 0.6
           {"aggregation.fedasync_alpha": 0.9, "aggregation.staleness.kind": "polynomial",
            "aggregation.staleness.a": 0.5}),
]:
    METHODS.register(_m.name, _m)

# The data-heterogeneity methods (docs/methods/fedprox.md, scaffold.md, ditto.md, fedbn.md): FedAvg's server with
# another client procedure (local.algorithm), and FedGMR with FedProx's proximal term.
_FEDAVG = dict(METHODS.get("fedavg").fixed)
for _m in [
    Method("fedprox", "FedProx: FedAvg with the proximal term mu/2 ||w - w_start||^2 (local.prox_mu)",
           {**_FEDAVG, "local.algorithm": "fedprox"}),
    Method("fedgmr_prox", "FedGMR with FedProx's proximal term, masked (local.prox_mu)",
           {"local.algorithm": "fedprox"}),
    Method("scaffold", "SCAFFOLD (option II): control variates c, c_i correct client drift; synchronous",
           {**{k: v for k, v in _FEDAVG.items() if k != "aggregation.weighting"}, "local.algorithm": "scaffold"},
           # the paper's server step is the plain mean of the client changes
           {"aggregation.weighting": "equal"}),
    Method("ditto", "Ditto: FedAvg's global model plus a personal model v per client (local.ditto_lambda)",
           {**_FEDAVG, "local.algorithm": "ditto"}),
    Method("fedbn", "FedBN: FedAvg with BatchNorm parameters and statistics kept on each client",
           {**_FEDAVG, "local.algorithm": "fedbn"}),
]:
    METHODS.register(_m.name, _m)

# Methods in a module of their own (fedgmr/baselines/feddyn.py, fednova.py): the module registers its client and
# server halves when imported; its settings are registered here, where listing methods and resolving a config load
# no PyTorch.
_FEDAVG_EQUAL = {k: v for k, v in _FEDAVG.items() if k != "aggregation.weighting"}
METHODS.register("feddyn", Method("feddyn", "FedDyn: dynamic regularisation, client gradient state h_i and server "
                                  "state h (local.options.alpha); synchronous, full model",
                                  {**_FEDAVG_EQUAL, "local.algorithm": "feddyn"}, {"aggregation.weighting": "equal"}))
METHODS.register("fednova", Method("fednova", "FedNova: updates normalised by each client's local steps tau_i, "
                                   "server step tau_eff; synchronous, full model",
                                   {**_FEDAVG, "local.algorithm": "fednova"}))

#: ``local.algorithm`` values whose clients keep a model of their own (Ditto's personal model, FedBN's
#: BatchNorm layers, FedMRL's F_i and projector, FedMD's local models, local_only's and standalone's
#: never-aggregated models): what these methods are for is each client's accuracy on its own test split
#: (``personal_accuracy``), not the server model's. Their runs carve that split by default.
PERSONAL_ALGORITHMS = ("ditto", "fedbn", "fedmrl", "fedmd", "local_sgd", "standalone")
#: of those, the ones whose server model is a model in its own right (Ditto trains FedAvg's global model
#: beside the personal ones); the others' server model is never used alone (FedBN's has no BatchNorm
#: statistics of its own, FedMRL's is the small shared G, the rest aggregate nothing)
GLOBAL_MODEL_MEANINGFUL = ("ditto",)
#: the client test split a personalised method carves, and its evaluation, when the config does not set
#: them (``run.personal_eval_every: null`` keeps the evaluation off)
PERSONAL_DEFAULTS = {"data.client_test_fraction": 0.2, "run.personal_eval_every": 1}


def is_personalised(algorithm: str | None) -> bool:
    """Whether a run of ``local.algorithm`` is judged by its clients' personal accuracy."""
    return algorithm in PERSONAL_ALGORITHMS


# FedMRL (docs/methods/fedmrl.md): FedAvg's server on the shared small model G; each client's heterogeneous F_i and
# projector P_i stay local. standalone: every client trains its own F_i alone (the paper's "Standalone").
for _m in [
    Method("fedmrl", "FedMRL: shared small model G averaged, local F_i + projector P_i, Matryoshka heads (fedmrl.*)",
           {**_FEDAVG, "local.algorithm": "fedmrl"}),
    Method("standalone", "Standalone: each client trains its own model F_i (fedmrl.widths), never aggregated",
           {**_FEDAVG, "local.algorithm": "standalone"}),
    Method("local_only", "Local-only: each client trains its own copy of the run's model, never aggregated",
           {**_FEDAVG, "local.algorithm": "local_sgd"}),
]:
    METHODS.register(_m.name, _m)

# Federated distillation (docs/methods/feddf.md, fedmd.md): FedDF's server-side ensemble distillation on FedAvg's
# and on FedGMR's server; FedMD's logit exchange (synchronous, full local models). Each needs distill.proxy.
for _m in [
    Method("feddf", "FedDF: FedAvg plus server-side ensemble distillation on unlabelled proxy data (distill.*)",
           {**_FEDAVG, "distill.server": True}),
    Method("fedgmr_df", "FedGMR plus FedDF's server-side ensemble distillation, teachers under their masks",
           {"distill.server": True}),
    Method("fedmd", "FedMD: clients exchange logits on public data, digest the consensus, keep their own models",
           {**_FEDAVG, "local.algorithm": "fedmd"}),
]:
    METHODS.register(_m.name, _m)

# Clustered FL (docs/methods/ifca.md, cfl.md): FedAvg's synchronous full-model server with one model per cluster.
for _m in [
    Method("ifca", "IFCA: k cluster models, each client trains the one with the lowest loss on its data (clustering.k)",
           {**_FEDAVG, "clustering.kind": "ifca"}),
    Method("cfl", "CFL (Sattler et al.): clusters split in two by the cosine similarity of client updates "
           "(clustering.eps1/eps2)", {**_FEDAVG, "clustering.kind": "cfl"}),
]:
    METHODS.register(_m.name, _m)

# Model-heterogeneous baselines (docs/reference.md §7, docs/methods/): the original synchronous form, "+Aux" (the
# semi-asynchronous buffered workflow with IMS where masks are nested) and "+Aux+GMR".
_BASELINES: dict[str, tuple[str, dict[str, Any]]] = {
    "heterofl": ("HeteroFL: width-prefix sub-models, scaler, static BN, count-averaged, label split",
                 {"submodel.policy": "heterofl", "aggregation.rule": "ma", "aggregation.weighting": "equal"}),
    "fedrolex": ("FedRolex: rolling-window sub-models (one shift per round), count-averaged",
                 {"submodel.policy": "fedrolex", "aggregation.rule": "ma", "aggregation.weighting": "equal"}),
    "fjord": ("FjORD: ordered dropout (one width per batch), sample-weighted coverage averaging",
              {"submodel.policy": "fjord", "aggregation.rule": "ma", "aggregation.weighting": "samples"}),
    "fiarse": ("FIARSE: importance-aware threshold masks, threshold-controlled gradient, non-zero delta average",
               {"submodel.policy": "fiarse", "aggregation.rule": "fiarse", "aggregation.weighting": "equal"}),
}
# HeteroFL's and FedRolex's published client loops clip every local gradient at norm 1
# (clip_grad_norm_(model.parameters(), 1)); without it their scaler (activations / r) lets a
# narrow sub-model's amplified gradients diverge (measured: FedRolex at chance on a 64-unit MLP).
_BASELINE_DEFAULTS: dict[str, dict[str, Any]] = {
    "heterofl": {"training.clip_grad_norm": 1.0},
    "fedrolex": {"training.clip_grad_norm": 1.0},
}
_SYNC = {"coordination.mode": "sync", "aggregation.buffer": False, "aggregation.staleness.kind": "constant",
         "restoration.trigger": "none", "network.ims": False}
_AUX = {"coordination.mode": "semi_async", "aggregation.buffer": True, "network.ims": True}
for _name, (_desc, _fixed) in _BASELINES.items():
    _aux = dict(_AUX)
    _aux_desc = " + Aux (semi-async, buffer, IMS)"
    if _name == "fiarse":  # its rule applies each client delta once: arrivals only
        _aux["aggregation.buffer"] = False
        _aux_desc = " + Aux (semi-async, IMS; arrivals only: deltas are applied once)"
    _defaults = _BASELINE_DEFAULTS.get(_name, {})
    METHODS.register(_name, Method(_name, _desc + " (synchronous, as published)", {**_fixed, **_SYNC}, _defaults))
    METHODS.register(f"{_name}_aux", Method(f"{_name}_aux", _desc + _aux_desc,
                                            {**_fixed, **_aux, "restoration.trigger": "none"}, _defaults))
    METHODS.register(f"{_name}_aux_gmr", Method(f"{_name}_aux_gmr", _desc + _aux_desc.replace(")", ") + GMR"),
                                                {**_fixed, **_aux, "restoration.trigger": "early_stopping"},
                                                _defaults))

# The same transport for everyone (docs/protocol.md): FedGMR multicasts the blocks a dispatch wave shares
# (network.ims); these are the baselines in their published coordination with that transport too. A full
# model is one block and width prefixes or FIARSE's threshold masks are nested, so each wave's shared
# blocks cross the server's uplink once. FedRolex's rolling windows are not nested (no IMS variant).
for _name in ("fedavg", "fedasync", "heterofl", "fjord", "fiarse"):
    _base = METHODS.get(_name)
    METHODS.register(f"{_name}_ims", Method(f"{_name}_ims", _base.description + "; IMS multicast downloads, as "
                                            "FedGMR's", {**_base.fixed, "network.ims": True}, dict(_base.defaults)))


def resolve_config(data: dict[str, Any], explicit: dict[str, Any] | None = None) -> ExperimentConfig:
    """Apply the chosen method's fixed settings to a raw config dict and validate it.

    ``explicit`` holds keys the user set on the command line: contradicting a method's
    fixed setting there is an error rather than a silent override.
    """
    if not isinstance(data, dict):
        raise ConfigError("a config must be a mapping of keys to values")
    check_sections(data)  # before a method's settings are merged into the sections
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    method = METHODS.get(str(data.get("method", "fedgmr")))
    for key, value in method.defaults.items():
        if get_dotted(data, key) is None:
            _set_copy(data, key, value)
    for key, value in method.fixed.items():
        if explicit and key in explicit and explicit[key] != value:
            raise ConfigError(f"'{key}' is fixed to {value!r} by method '{method.name}' (got {explicit[key]!r})")
        _set_copy(data, key, value)
    if is_personalised(get_dotted(data, "local.algorithm")):
        _personal_split(data, method.name)
    cfg = parse_config(data)
    check_builder_options(cfg)
    if cfg.restoration.trigger in _HORIZON_DEFAULTS and cfg.restoration.horizon is None:
        keys = _HORIZON_DEFAULTS[cfg.restoration.trigger]
        horizon = next((getattr(cfg.run, k) for k in keys if getattr(cfg.run, k) is not None), None)
        if horizon is None:
            raise ConfigError(f"restoration.horizon is required for the {cfg.restoration.trigger} trigger when "
                              + " and ".join(f"run.{k}" for k in keys) + (" are" if len(keys) > 1 else " is")
                              + " unset")
        cfg.restoration.horizon = horizon
    return cfg


#: where a time-based trigger's horizon comes from when restoration.horizon is unset, first
#: set wins: fixed-time restorations span the run; the deadlines end where accuracy is read
_HORIZON_DEFAULTS: dict[str, tuple[str, ...]] = {"fixed_time": ("max_time",), "deadline": ("t_star", "max_time")}


def check_builder_options(cfg: ExperimentConfig) -> None:
    """Refuse an unknown data set or model name, or an option its registered builder does
    not take, before anything is loaded or built (values are checked by the builders).

    While no plugin has loaded the model and data registries, their built-in names and
    options are read from the source (:mod:`fedgmr.builtin_names`): a mistake here is
    reported without importing PyTorch."""
    from fedgmr.builtin_names import UNREADABLE, static_builders
    from fedgmr.options import check_accepted, check_option_names

    for section, kind, package, name, options, reserved in (
            ("data", "dataset", "data", cfg.data.name, cfg.data.options, ("root",)),
            ("model", "model", "models", cfg.model.name, cfg.model.options, ("num_classes", "input_shape", "width"))):
        static = static_builders(package)
        if static is not None and static.get(name, None) is not UNREADABLE:
            if name not in static:
                raise ConfigError(f"invalid value for '{section}.name': unknown {kind} {name!r} "
                                  f"(known: {', '.join(sorted(static))})")
            check_accepted(section, kind, name, static[name], options, reserved)  # type: ignore[arg-type]
            continue
        registry = _live_registry(package)
        if name not in registry:
            raise ConfigError(f"invalid value for '{section}.name': unknown {kind} {name!r} "
                              f"(known: {', '.join(registry.names())})")
        check_option_names(section, kind, name, registry.get(name), options, reserved)
    check_registered_names(cfg)
    if cfg.local.options:  # the client method's options: names and values, checked by building it
        from fedgmr.training.client_methods import client_method

        client_method(cfg.local)


def check_registered_names(cfg: ExperimentConfig) -> None:
    """Refuse a client algorithm, clustering or logger name its registry does not hold.
    The registries live above the config schema (training, strategy, experiment): the
    schema takes any name and this top-level check, which every entry point runs through
    :func:`resolve_config`, holds it against them (the defaults need no registry)."""
    checks: list[tuple[str, str, list[str], Any]] = []
    if cfg.local.algorithm != "sgd":
        from fedgmr.training.client_methods import CLIENT_METHODS

        checks.append(("local.algorithm", "client algorithm", [cfg.local.algorithm], CLIENT_METHODS))
    if cfg.clustering.kind != "none":
        from fedgmr.strategy.clustered import CLUSTERINGS

        checks.append(("clustering.kind", "clustering", [cfg.clustering.kind], CLUSTERINGS))
    for key, what, names, registry in checks:
        unknown = [n for n in names if n not in registry]
        if unknown:
            raise ConfigError(f"invalid value for '{key}': unknown {what} {unknown[0]!r} "
                              f"(known: {', '.join(registry.names())}) (got {names[0]!r})")
    if cfg.run.loggers:  # the trackers' registry sits below the schema: no tracker is imported
        from fedgmr.logger_names import known_loggers

        known = known_loggers()
        unknown = [n for n in cfg.run.loggers if n not in known]
        if unknown:
            raise ConfigError(f"invalid value for 'run.loggers': unknown logger {unknown[0]!r} "
                              f"(known: {', '.join(known)}) (got {list(cfg.run.loggers)!r})")


def _live_registry(package: str) -> Registry:
    if package == "data":
        from fedgmr.data import DATASETS

        return DATASETS
    from fedgmr.models import MODELS

    return MODELS


def _personal_split(data: dict[str, Any], method: str) -> None:
    """A personalised method is scored on each client's own test split: carve one
    (:data:`PERSONAL_DEFAULTS`) unless the config sets it; refuse a config that turns it off."""
    fraction = get_dotted(data, "data.client_test_fraction")
    if fraction is not None and isinstance(fraction, (int, float)) and not isinstance(fraction, bool) \
            and fraction <= 0:
        raise ConfigError(f"method '{method}' keeps a model per client, scored on each client's own test split: "
                          f"data.client_test_fraction must be > 0 (default for this method: "
                          f"{PERSONAL_DEFAULTS['data.client_test_fraction']})")
    for key, value in PERSONAL_DEFAULTS.items():
        if _absent(data, key):  # an explicit null turns the personal evaluation off
            _set_copy(data, key, value)


def _absent(data: dict[str, Any], key: str) -> bool:
    """Whether the dotted ``key`` is not in ``data`` at all (set to null is present)."""
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return True
        node = node[part]
    return False


def _set_copy(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is not None and not isinstance(child, dict):
            section = ".".join(parts[:i + 1])
            raise ConfigError(f"invalid value for '{section}': '{section}' is a section: give a mapping of its keys "
                              f"(got {child!r:.60})")
        child = dict(child) if isinstance(child, dict) else {}
        node[part] = child
        node = child
    node[parts[-1]] = value


__all__ = ["METHODS", "Method", "PERSONAL_ALGORITHMS", "GLOBAL_MODEL_MEANINGFUL", "is_personalised",
           "resolve_config", "check_builder_options", "get_dotted", "set_dotted", "ExperimentConfig"]
