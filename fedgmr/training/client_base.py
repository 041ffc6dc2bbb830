"""The base of every client method (:mod:`fedgmr.training.client_methods`): what a job
returns (:class:`ClientResult`), the protocol a client method follows
(:class:`ClientMethod`) and plain masked local SGD (:class:`SGDClient`), which the other
client methods extend. A module of its own so that methods in modules of their own
(FedMD, FedMRL, FedDyn, ...) build on it without importing the registry that lists them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
import torch.nn as nn

from fedgmr.algorithm.local_rules import straggler_steps
from fedgmr.algorithm.params import ParamSpace
from fedgmr.training.extras import ExtrasSchema
from fedgmr.training.local import LocalTerms, TrainOutcome, masked_local_training


@dataclass
class ClientResult:
    """What a client method's job produced, before the workload compacts it.

    outcome: the trained model (full flat vector, zero off the mask).
    state: the client's new state (None: it keeps none).
    extras: full-length vectors sent back beside the values, at the upload mask
        (SCAFFOLD's ``delta_c``).
    send_buffers: names of the buffers uploaded (None: all of them).
    """

    outcome: TrainOutcome
    state: dict[str, torch.Tensor] | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    send_buffers: tuple[str, ...] | None = None
    #: vectors sent back as they are, not at the upload mask (FedMD's logits)
    raw_extras: dict[str, torch.Tensor] = field(default_factory=dict)


class ClientMethod(Protocol):
    """The client half of a method. Must be picklable (it travels to worker processes)."""

    #: whether the client keeps state between jobs
    stateful: ClassVar[bool]
    #: server -> client vectors a job needs (in ``job.extras``)
    needs_extras: ClassVar[tuple[str, ...]]
    #: client -> server vectors its replies carry, declared (:mod:`fedgmr.training.extras`):
    #: the strategy rejects a reply that breaks the schema, on every runtime
    reply_extras: ClassVar[ExtrasSchema]

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult: ...

    def personal_model(self, model: nn.Module, space: ParamSpace, params: torch.Tensor,
                       buffers: dict[str, torch.Tensor],
                       state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


def _full(mask: torch.Tensor | None, numel: int, device: torch.device) -> torch.Tensor:
    return torch.ones(numel, dtype=torch.bool, device=device) if mask is None else mask


def stored_model(state: dict[str, torch.Tensor], key: str, params: torch.Tensor,
                 buffers: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A model a client keeps in its state (``state[key]`` and ``buf/<name>``), on the
    devices of ``params``/``buffers``; before the client's first job: ``(params, buffers)``."""
    if key not in state:
        return params, buffers
    return state[key].to(params.device), {k: state.get(f"buf/{k}", b).to(b.device) for k, b in buffers.items()}


def _sub_seed(seed: int, tag: int) -> int:
    return int(np.random.SeedSequence([int(seed), tag]).generate_state(1, dtype=np.uint32)[0])


@dataclass(frozen=True)
class SGDClient:
    """Masked local SGD (FedGMR, FedAvg); ``stragglers``: FedProx's straggler model, the
    fraction of jobs that run a random number of steps in [1, E) and are still sent."""

    stragglers: float = 0.0
    stateful: ClassVar[bool] = False
    needs_extras: ClassVar[tuple[str, ...]] = ()
    reply_extras: ClassVar[ExtrasSchema] = ()

    def steps(self, job: Any, local_steps: int) -> int:
        return straggler_steps(job.seed, self.stragglers, local_steps)

    def terms(self, job: Any) -> LocalTerms | None:
        return None

    def _train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
               val: tuple[torch.Tensor, torch.Tensor] | None, start: torch.Tensor | None = None,
               buffers: dict[str, torch.Tensor] | None = None, terms: LocalTerms | None = None) -> TrainOutcome:
        return masked_local_training(workload.model, workload.space, job.start if start is None else start,
                                     job.buffers if buffers is None else buffers, job.mask, x, y, workload.settings,
                                     job.seed, val, workload.optimizer, terms=terms,
                                     steps=self.steps(job, workload.settings.local_steps))

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult:
        return ClientResult(self._train(workload, job, x, y, val, terms=self.terms(job)))

    def personal_model(self, model: nn.Module, space: ParamSpace, params: torch.Tensor,
                       buffers: dict[str, torch.Tensor],
                       state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The global model: a stateless client uses what the server sends."""
        return params, buffers


__all__ = ["ClientMethod", "ClientResult", "SGDClient", "stored_model"]
