"""FedDyn (Acar et al., ICLR 2021, "Federated Learning Based on Dynamic Regularization"):
one module, registered like a plugin (client half in ``CLIENT_METHODS``, server half in
``SERVER_HALVES``; the method ``feddyn`` in :mod:`fedgmr.methods`).

Client i keeps ``h_i`` (the gradient of its loss at its last model; zero at first) and
minimises ``L_i(w) - <h_i, w> + alpha/2 ||w - w_server||^2`` by local SGD, then

    h_i <- h_i - alpha (w_i - w_server)

The server keeps ``h`` (zero at first); over the participants P of a round, m = all clients:

    h <- h - alpha (1/m) sum_{i in P} (w_i - w_server)
    w <- mean_{i in P} w_i - h / alpha

``alpha`` is ``local.options.alpha`` (default 0.01, > 0). Full models and synchronous
rounds only (``method=feddyn``): a masked sub-model, asynchrony, the update buffer and
FedDF's distillation are refused when the run is built. docs/methods.md (FedDyn and FedNova).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn as nn

from fedgmr.algorithm.params import ParamSpace
from fedgmr.errors import ConfigError
from fedgmr.strategy.update import Update
from fedgmr.strategy.messages import StepReport
from fedgmr.strategy.plugins import ServerPlugin
from fedgmr.strategy.server_halves import SERVER_HALVES
from fedgmr.training.client_methods import CLIENT_METHODS, ClientResult, SGDClient
from fedgmr.training.local import LocalTerms

#: the paper's common setting of alpha
DEFAULT_ALPHA = 0.01


# ---------------------------------------------------------------------- the math (pure)
def feddyn_local_terms(h_i: torch.Tensor, alpha: float) -> LocalTerms:
    """The extra gradient of the local objective, ``-h_i + alpha (w - w_server)``: a
    proximal pull anchored at the model received plus the constant correction ``-h_i``."""
    return LocalTerms(prox_mu=float(alpha), correction=-h_i)


def feddyn_client_state(h_i: torch.Tensor, trained: torch.Tensor, received: torch.Tensor, alpha: float,
                        mask: torch.Tensor | None = None) -> torch.Tensor:
    """``h_i - alpha (w_i - w_server)`` on ``mask`` (None: everywhere); unchanged elsewhere."""
    new = h_i - alpha * (trained - received)
    return new if mask is None else torch.where(mask, new, h_i)


def feddyn_server_state(h: torch.Tensor, received: torch.Tensor, models: list[torch.Tensor], alpha: float,
                        num_clients: int) -> torch.Tensor:
    """``h - alpha (1/m) sum_i (w_i - w_server)`` over the participants' models (m = all clients)."""
    if num_clients < 1 or not alpha > 0:
        raise ValueError(f"FedDyn's server state needs m >= 1 clients and alpha > 0 (got m={num_clients}, "
                         f"alpha={alpha})")
    total = torch.zeros_like(h, dtype=torch.float64)
    for w in models:
        total += w.double() - received.double()
    return (h.double() - alpha * total / num_clients).to(h.dtype)


def feddyn_server_model(mean: torch.Tensor, h: torch.Tensor, alpha: float) -> torch.Tensor:
    """The new global model ``mean_i w_i - h / alpha`` (``h`` already updated this round)."""
    return mean - h / alpha


# ---------------------------------------------------------------------- client half
@dataclass(frozen=True)
class FedDynClient(SGDClient):
    """Masked local SGD on FedDyn's local objective. State: ``h_i`` (a full-length vector,
    zero before the client's first job)."""

    alpha: float = DEFAULT_ALPHA
    stateful: ClassVar[bool] = True

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult:
        state = job.state or {}
        h_i = state["h_i"].to(job.start.device) if "h_i" in state else torch.zeros_like(job.start)
        out = self._train(workload, job, x, y, val, terms=feddyn_local_terms(h_i, self.alpha))
        received = job.start if job.mask is None else job.start * job.mask.to(job.start.dtype)
        return ClientResult(out, {"h_i": feddyn_client_state(h_i, out.params, received, self.alpha, job.mask)})


def alpha_option(value: Any) -> float:
    """``local.options.alpha``: a finite number > 0 (ConfigError naming the key otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"invalid value for 'local.options.alpha': FedDyn's alpha must be a number > 0 "
                          f"(got {value!r:.40})")
    return float(value)


def make_client(local: Any, alpha: float = DEFAULT_ALPHA) -> FedDynClient:
    """``CLIENT_METHODS`` factory: ``local.options`` may set ``alpha``."""
    return FedDynClient(local.stragglers, alpha_option(alpha))


# ---------------------------------------------------------------------- server half
class FedDynState(ServerPlugin):
    """FedDyn's server state ``h``: the rule's result (the plain mean, with
    ``method=feddyn``'s settings) minus ``h / alpha``."""

    name = "FedDyn's server state"

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        if not alpha > 0:
            raise ValueError(f"FedDyn's alpha must be > 0, got {alpha}")
        self.alpha = float(alpha)
        self._h_next: torch.Tensor | None = None  # h after the aggregation in progress

    def bind(self, strategy: Any) -> None:
        super().bind(strategy)
        #: the server state h (zero at the start)
        self.h = torch.zeros_like(strategy.params)

    def fuse(self, params: torch.Tensor, buffers: dict[str, torch.Tensor],
             used: list[Update]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        s = self.strategy
        self._h_next = feddyn_server_state(self.h, s.params, [s.full_values(e) for e in used], self.alpha,
                                           s.num_clients)
        return feddyn_server_model(params, self._h_next, self.alpha), buffers

    def after_aggregate(self, report: StepReport) -> StepReport:
        if report.used and self._h_next is not None:  # kept only when the new model was (finite)
            self.h = self._h_next
        self._h_next = None
        return report

    def state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        tensors["feddyn/h"] = self.h

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        self.h = tensors["feddyn/h"].clone()


def refuse_unsupported(cfg: Any, name: str) -> None:
    """One-line ConfigErrors for what a round-based, full-model method cannot run."""
    if cfg.submodel.policy != "full":
        raise ConfigError(f"local.algorithm {name!r} trains the whole model: set submodel.policy: full (e.g. "
                          f"method={name}); masked sub-models are not supported")
    if cfg.coordination.mode != "sync" or cfg.aggregation.buffer:
        raise ConfigError(f"local.algorithm {name!r} is synchronous-only: set coordination.mode: sync and "
                          f"aggregation.buffer: false (e.g. method={name})")
    if cfg.distill.server:
        raise ConfigError(f"distill.server (FedDF) is not supported with local.algorithm {name!r} (it brings its own "
                          f"server)")


def server_half(cfg: Any, model: nn.Module, space: ParamSpace) -> tuple[None, dict[str, Any]]:
    """``SERVER_HALVES`` entry: the :class:`FedDynState` plug-in with the client method's alpha."""
    from fedgmr.training.client_methods import client_method

    refuse_unsupported(cfg, "feddyn")
    return None, {"plugins": (FedDynState(client_method(cfg.local).alpha),)}


CLIENT_METHODS.register("feddyn", make_client)
SERVER_HALVES.register("feddyn", server_half)

__all__ = ["DEFAULT_ALPHA", "FedDynClient", "FedDynState", "feddyn_client_state", "feddyn_local_terms",
           "feddyn_server_model", "feddyn_server_state"]
