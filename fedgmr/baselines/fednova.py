"""FedNova (Wang et al., NeurIPS 2020, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization"), plain local SGD (no momentum variant): one module,
registered like a plugin (client half in ``CLIENT_METHODS``, server half in
``SERVER_HALVES``; the method ``fednova`` in :mod:`fedgmr.methods`).

Client i runs tau_i local SGD steps (fewer than ``training.local_steps`` when it is a
straggler, ``local.stragglers``) and reports tau_i beside its model. The server normalises
each update by its steps and takes one step of the effective length tau_eff:

    d_i = (w_server - w_i) / tau_i,     p_i = n_i / sum_j n_j  (participants' sample counts)
    w  <- w_server - tau_eff * sum_i p_i d_i,     tau_eff = sum_i p_i tau_i

With equal tau_i this is FedAvg. Full models and synchronous rounds only
(``method=fednova``); momentum is refused (its normalisation differs). docs/methods.md (FedDyn and FedNova).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, ClassVar

import torch
import torch.nn as nn

from fedgmr.algorithm.params import ParamSpace
from fedgmr.errors import ConfigError, InvalidUpdateError
from fedgmr.strategy.update import Update
from fedgmr.strategy.messages import Assignment, StepReport
from fedgmr.strategy.plugins import ServerPlugin
from fedgmr.strategy.server_halves import SERVER_HALVES
from fedgmr.training.client_methods import CLIENT_METHODS, ClientResult, SGDClient
from fedgmr.training.extras import ExtrasSchema, ExtraSpec

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- the math (pure)
def fednova_server_model(received: torch.Tensor, models: list[torch.Tensor], taus: list[float],
                         weights: list[float]) -> torch.Tensor:
    """``w_server - tau_eff sum_i p_i (w_server - w_i) / tau_i`` with ``p_i = weights_i /
    sum(weights)`` and ``tau_eff = sum_i p_i tau_i`` (computed in float64)."""
    if not models or len(models) != len(taus) or len(models) != len(weights):
        raise ValueError("FedNova needs one model, one tau and one weight per participant")
    if any(not (t >= 1 and math.isfinite(t)) for t in taus) or any(not w > 0 for w in weights):
        raise ValueError(f"FedNova needs tau_i >= 1 and weights > 0 (got taus {taus}, weights {weights})")
    total = math.fsum(weights)
    p = [w / total for w in weights]
    tau_eff = math.fsum(pi * t for pi, t in zip(p, taus))
    w0 = received.double()
    d = torch.zeros_like(w0)
    for pi, t, w in zip(p, taus, models):
        d += (pi / t) * (w0 - w.double())
    return (w0 - tau_eff * d).to(received.dtype)


# ---------------------------------------------------------------------- client half
@dataclasses.dataclass(frozen=True)
class FedNovaClient(SGDClient):
    """Masked local SGD that reports its local steps tau_i (``raw_extras["tau"]``)."""

    #: tau_i, one float (the server checks it is a whole number of steps within its bound)
    reply_extras: ClassVar[ExtrasSchema] = (ExtraSpec("tau", "whole", "a FedNova reply needs tau: its local steps, "
                                                                      "one float", flat=False, finite=False),)

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult:
        out = self._train(workload, job, x, y, val)
        tau = torch.tensor([float(out.steps or workload.settings.local_steps)], dtype=torch.float32)
        return ClientResult(out, raw_extras={"tau": tau})


def make_client(local: Any) -> FedNovaClient:
    """``CLIENT_METHODS`` factory (no options)."""
    return FedNovaClient(local.stragglers)


# ---------------------------------------------------------------------- server half
class FedNovaStep(ServerPlugin):
    """FedNova's normalised average in place of the configured rule's result (sample
    counts weight the clients, as the server knows them). ``max_tau``: the most local
    steps a reply may report."""

    name = "FedNova's normalised step"
    reply_extras = FedNovaClient.reply_extras  # tau, its shape checked by the strategy

    def __init__(self, max_tau: int) -> None:
        if max_tau < 1:
            raise ValueError(f"max_tau must be >= 1, got {max_tau}")
        self.max_tau = int(max_tau)
        self._taus: dict[int, float] = {}  # tau_i of the replies accepted since the last aggregation

    def wire(self, a: Assignment) -> Assignment:
        # tau_i travels as one float32 beside the values
        return dataclasses.replace(a, wire=dataclasses.replace(a.wire, reply_plain=1))

    def check_extras(self, client_id: int, extras: dict[str, torch.Tensor]) -> None:
        value = float(extras["tau"].reshape(()))
        if not math.isfinite(value) or value != int(value) or not 1 <= value <= self.max_tau:
            raise InvalidUpdateError(f"tau must be a whole number of local steps in [1, {self.max_tau}], got {value}")

    def on_accept(self, update: Update) -> None:
        self._taus[update.client_id] = float(update.extras["tau"].reshape(()))

    def fuse(self, params: torch.Tensor, buffers: dict[str, torch.Tensor],
             used: list[Update]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        s = self.strategy
        new = fednova_server_model(s.params, [s.full_values(e) for e in used],
                                   [self._taus[e.client_id] for e in used], [float(e.num_samples) for e in used])
        return new, buffers

    def after_aggregate(self, report: StepReport) -> StepReport:
        self._taus.clear()  # arrivals only (no buffer): every pending reply was used or dropped
        return report

    def state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        state["fednova"] = {"taus": {str(c): t for c, t in sorted(self._taus.items())}}

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        self._taus = {int(c): float(t) for c, t in state.get("fednova", {}).get("taus", {}).items()}


def server_half(cfg: Any, model: nn.Module, space: ParamSpace) -> tuple[None, dict[str, Any]]:
    """``SERVER_HALVES`` entry: the :class:`FedNovaStep` plug-in; refuses masks, asynchrony, FedDF and momentum."""
    if cfg.submodel.policy != "full":
        raise ConfigError("local.algorithm 'fednova' normalises whole-model updates: set submodel.policy: full "
                          "(e.g. method=fednova); masked sub-models are not supported")
    if cfg.coordination.mode != "sync" or cfg.aggregation.buffer:
        raise ConfigError("local.algorithm 'fednova' is synchronous-only: set coordination.mode: sync and "
                          "aggregation.buffer: false (e.g. method=fednova)")
    if cfg.distill.server:
        raise ConfigError("distill.server (FedDF) is not supported with local.algorithm 'fednova' (it brings its "
                          "own server)")
    if cfg.training.momentum:
        raise ConfigError("local.algorithm 'fednova' normalises plain SGD's updates: set training.momentum: 0 "
                          "(FedNova's momentum variant is not implemented)")
    return None, {"plugins": (FedNovaStep(cfg.training.local_steps),)}


CLIENT_METHODS.register("fednova", make_client)
SERVER_HALVES.register("fednova", server_half)

__all__ = ["FedNovaClient", "FedNovaStep", "fednova_server_model"]
