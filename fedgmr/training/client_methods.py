"""Client procedures of the data-heterogeneity methods, by name (``local.algorithm``).

A client method is the client half of a method: what one job trains, what the client
keeps between its jobs (its *state*: SCAFFOLD's ``c_i``, Ditto's personal model ``v``,
FedBN's BatchNorm layers) and which model the client would use itself (its *personal
model*, scored by personalised evaluation). It knows nothing about the runtime: the
simulator keeps each client's state and hands it to the job, whichever executor runs it,
and takes the new state back from the result; a checkpoint stores it (safetensors).

Every method trains with FedGMR's masked local SGD (:func:`masked_local_training`), so a
pruned coordinate stays exactly zero; the extra terms are masked too
(:mod:`fedgmr.algorithm.local_rules`). Register your own::

    from fedgmr.training.client_methods import CLIENT_METHODS
    CLIENT_METHODS.register("mine", lambda local: MyClient(...))

A factory's keyword arguments after ``local`` are the options it takes from
``local.options`` (``def feddyn(local, alpha=0.01)``; fedgmr/baselines/feddyn.py).

State is a flat ``dict[str, Tensor]``; a method whose state is empty is stateless.

Optional hooks, for a method whose clients train more than the global model (FedMRL,
``fedgmr.training.fedmrl``): ``bind(cfg, data)`` returns the method bound to the whole
config; ``shared_model()`` builds the run's global model instead of ``model``;
``reference_numel()`` is the full model's size ``network.model_size_mb`` stands for;
``job_work(client, example)`` is a job's FLOPs relative to that model (the ``flops``
compute model); and ``personal_model`` may return ``(module, None)``, a model of the
client's own architecture.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
import torch.nn as nn

from fedgmr.algorithm.local_rules import batch_norm_coordinates, scaffold_control_update, seed_new_coordinates
from fedgmr.algorithm.params import ParamSpace
from fedgmr.options import check_option_names
from fedgmr.registry import Registry
from fedgmr.training.client_base import (ClientMethod, ClientResult, SGDClient, _full, _sub_seed,  # noqa: F401
                                        stored_model)
from fedgmr.training.extras import ExtrasSchema, ExtraSpec
from fedgmr.training.local import LocalTerms, masked_local_training


@dataclass(frozen=True)
class FedProxClient(SGDClient):
    """FedProx: ``F_k(w) + mu/2 ||(w - w_start) * m||^2``, w_start = the model received
    (under asynchrony, the stale one)."""

    mu: float = 0.01

    def terms(self, job: Any) -> LocalTerms | None:
        return LocalTerms(prox_mu=self.mu)


@dataclass(frozen=True)
class ScaffoldClient(SGDClient):
    """SCAFFOLD option II on the mask. State: ``c_i`` (zero at the start) and the mask it
    lives on (``held``); a coordinate new to the mask takes the server's ``c``."""

    stateful: ClassVar[bool] = True
    needs_extras: ClassVar[tuple[str, ...]] = ("c",)
    reply_extras: ClassVar[ExtrasSchema] = (ExtraSpec(
        "delta_c", "values", "a SCAFFOLD reply needs delta_c: one float per coordinate of its values ({n})",
        nonfinite="delta_c contains NaN or Inf"),)

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult:
        c = job.extras["c"]
        mask = _full(job.mask, c.numel(), c.device)
        state = job.state or {}
        if "c_i" in state:
            c_i = seed_new_coordinates(state["c_i"], state["held"], mask, c)
        else:  # first contact: control variates start at zero
            c_i = torch.zeros_like(c)
        fmask = mask.to(c.dtype)
        out = self._train(workload, job, x, y, val, terms=LocalTerms(correction=(c - c_i) * fmask))
        x0 = job.start * fmask
        c_new, delta = scaffold_control_update(c_i, c, x0, out.params, int(out.steps or 1),
                                               workload.settings.lr, mask)
        return ClientResult(out, {"c_i": c_new, "held": mask.clone()}, {"delta_c": delta})


@dataclass(frozen=True)
class DittoClient(SGDClient):
    """Ditto: the ordinary global update, plus ``personal_steps`` steps on the personal
    model ``v`` with ``F_k(v) + lam/2 ||(v - w) * m||^2`` (w = the global model received).
    State: ``v``, its buffers and the mask it lives on; new coordinates are seeded from w."""

    lam: float = 1.0
    personal_steps: int | None = None
    stateful: ClassVar[bool] = True

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult:
        out = self._train(workload, job, x, y, val)  # the global update w_k, as FedAvg's
        mask = _full(job.mask, job.start.numel(), job.start.device)
        state = job.state or {}
        w = job.start * mask.to(job.start.dtype)
        v = seed_new_coordinates(state.get("v"), state.get("held"), mask, w)
        vbuf = {k: state.get(f"buf/{k}", b) for k, b in job.buffers.items()}
        steps = workload.settings.local_steps if self.personal_steps is None else self.personal_steps
        personal = masked_local_training(workload.model, workload.space, v, vbuf, job.mask, x, y, workload.settings,
                                         _sub_seed(job.seed, 0xD1770), None, workload.optimizer,
                                         terms=LocalTerms(prox_mu=self.lam, prox_anchor=job.start), steps=steps)
        new = {"v": personal.params, "held": mask.clone()}
        new.update({f"buf/{k}": b for k, b in personal.buffers.items()})
        return ClientResult(out, new)

    def personal_model(self, model: nn.Module, space: ParamSpace, params: torch.Tensor,
                       buffers: dict[str, torch.Tensor],
                       state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """v (before the client's first job: the global model)."""
        return stored_model(state, "v", params, buffers)


@dataclass(frozen=True)
class FedBNClient(SGDClient):
    """FedBN: BatchNorm layers (selected by module type) stay local. The job starts from
    the global model with the client's own BatchNorm parameters and statistics; they are
    kept as state and never sent (the server's upload mask leaves them out)."""

    stateful: ClassVar[bool] = True
    _local: tuple[torch.Tensor, tuple[str, ...]] | None = field(default=None, init=False, repr=False,
                                                                  compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_local": None}

    def local(self, model: nn.Module, space: ParamSpace) -> tuple[torch.Tensor, tuple[str, ...]]:
        if self._local is None:  # a cache (not part of the value): set once per process
            object.__setattr__(self, "_local", batch_norm_coordinates(model, space))
        assert self._local is not None
        return self._local

    def _localise(self, model: nn.Module, space: ParamSpace, params: torch.Tensor, buffers: dict[str, torch.Tensor],
                  state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if "bn" not in state:
            return params, buffers
        local, _ = self.local(model, space)
        local = local.to(params.device)
        out = params.clone()
        out[local] = state["bn"].to(params.device)
        return out, {k: state.get(f"buf/{k}", b).to(b.device) for k, b in buffers.items()}

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult:
        local, names = self.local(workload.model, workload.space)
        start, bufs = self._localise(workload.model, workload.space, job.start, job.buffers, job.state or {})
        out = self._train(workload, job, x, y, val, start=start, buffers=bufs)
        state = {"bn": out.params[local.to(out.params.device)].clone()}
        state.update({f"buf/{k}": out.buffers[k] for k in names})
        return ClientResult(out, state, send_buffers=tuple(k for k in out.buffers if k not in names))

    def personal_model(self, model: nn.Module, space: ParamSpace, params: torch.Tensor,
                       buffers: dict[str, torch.Tensor],
                       state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The global model with the client's own BatchNorm layers."""
        return self._localise(model, space, params, buffers, state)


@dataclass(frozen=True)
class LocalClient(SGDClient):
    """``local_sgd``: local training only, on the run's own model (any architecture; the
    FedMRL family's ``standalone`` needs a representation model). The client trains its
    own model, which never leaves it (the server's upload mask is empty). State: ``w`` and
    its buffers; the first job starts from the model the server sent (the common
    initialisation)."""

    stateful: ClassVar[bool] = True

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult:
        state = job.state or {}
        start = state["w"].to(job.start.device) if "w" in state else job.start
        bufs = {k: state.get(f"buf/{k}", b).to(b.device) for k, b in job.buffers.items()}
        out = self._train(workload, job, x, y, val, start=start, buffers=bufs)
        new = {"w": out.params.clone()}
        new.update({f"buf/{k}": b for k, b in out.buffers.items()})
        return ClientResult(out, new)

    def personal_model(self, model: nn.Module, space: ParamSpace, params: torch.Tensor,
                       buffers: dict[str, torch.Tensor],
                       state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The client's own model (before its first job: the common initialisation)."""
        return stored_model(state, "w", params, buffers)


#: client methods by name (``local.algorithm``): ``factory(local_config) -> ClientMethod``
CLIENT_METHODS: Registry[Callable[[Any], ClientMethod]] = Registry("client method")
CLIENT_METHODS.register("sgd", lambda local: SGDClient(local.stragglers))
CLIENT_METHODS.register("fedprox", lambda local: FedProxClient(local.stragglers, local.prox_mu))
CLIENT_METHODS.register("scaffold", lambda local: ScaffoldClient(local.stragglers))
CLIENT_METHODS.register("ditto", lambda local: DittoClient(local.stragglers, local.ditto_lambda,
                                                           local.personal_steps))
CLIENT_METHODS.register("fedbn", lambda local: FedBNClient(local.stragglers))
CLIENT_METHODS.register("local_sgd", lambda local: LocalClient(local.stragglers))


def _mrl_client(name: str) -> ClientMethod:
    """FedMRL's and standalone training's clients (fedgmr.training.fedmrl), unbound: they
    bind to the whole config when a run is built (``bind(cfg, data)``)."""
    from fedgmr.training import fedmrl

    return getattr(fedmrl, name)()


CLIENT_METHODS.register("fedmrl", lambda local: _mrl_client("FedMRLClient"))
CLIENT_METHODS.register("standalone", lambda local: _mrl_client("StandaloneClient"))


def _fedmd(local: Any) -> ClientMethod:
    """FedMD (fedgmr.training.fedmd); the public data and distillation settings are set
    when the run is built (fedgmr.strategy.distill.attach_public)."""
    from fedgmr.training.fedmd import FedMDClient

    return FedMDClient(local.stragglers)


CLIENT_METHODS.register("fedmd", _fedmd)


def client_method(local: Any) -> ClientMethod:
    """The client method a ``local`` config section names, built with its ``local.options``:
    a factory ``factory(local, **options)`` declares the options it takes as keyword
    arguments (ConfigError naming an option it does not take) and checks their values."""
    factory = CLIENT_METHODS.get(local.algorithm)
    options = dict(getattr(local, "options", None) or {})
    check_option_names("local", "client algorithm", local.algorithm, factory, options, ("local",))
    return factory(local, **options)


#: built-in methods that live in a module of their own: importing one registers its client
#: half here and its server half in ``SERVER_HALVES``, as a plugin module would
BUILTIN_METHOD_MODULES = ("fedgmr.baselines.feddyn", "fedgmr.baselines.fednova")
for _module in BUILTIN_METHOD_MODULES:
    importlib.import_module(_module)


__all__ = ["ClientResult", "ClientMethod", "SGDClient", "FedProxClient", "ScaffoldClient", "DittoClient",
           "FedBNClient", "LocalClient", "CLIENT_METHODS", "client_method"]
