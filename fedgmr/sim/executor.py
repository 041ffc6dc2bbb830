"""Executors run client training jobs. A job's inputs are fixed when it is dispatched
(model snapshot, mask, seed), so any executor gives the same results for a seed.

:class:`SerialExecutor` trains in the calling process; process-pool and Ray executors
implement the same two methods.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol

import numpy as np
import torch
import torch.nn as nn

from fedgmr.algorithm.maskinfo import gather
from fedgmr.algorithm.params import ParamSpace
from fedgmr.device import to_device
from fedgmr.training.local import TrainOutcome, TrainSettings, masked_local_training


@dataclass(frozen=True)
class TrainJob:
    """Everything a client needs to train, fixed at dispatch."""

    client_id: int
    version: int
    seed: int
    start: torch.Tensor  # flat global weights at dispatch (shared, never mutated)
    buffers: dict[str, torch.Tensor]
    mask: torch.Tensor | None  # None = full model
    kind: str = "model"  # reply with trained weights ("model") or their change ("delta")
    validate: bool = False

    def to(self, device: torch.device | str) -> "TrainJob":
        """The job with its tensors on ``device`` (itself when they are there already)."""
        start, buffers = self.start.to(device), to_device(self.buffers, device)
        mask = None if self.mask is None else self.mask.to(device)
        if start is self.start and buffers is self.buffers and mask is self.mask:
            return self
        return replace(self, start=start, buffers=buffers, mask=mask)


@dataclass
class JobResult:
    """A finished job, already compact: values only at the job's mask."""

    client_id: int
    version: int
    values: torch.Tensor
    buffers: dict[str, torch.Tensor]
    num_samples: int  # training-set size
    loss: float
    val_score: float | None
    num_processed: int | None = None  # samples processed by the local steps

    def to(self, device: torch.device | str) -> "JobResult":
        """The result with its tensors on ``device`` (the CPU before it leaves a worker)."""
        values, buffers = self.values.to(device), to_device(self.buffers, device)
        if values is self.values and buffers is self.buffers:
            return self
        return replace(self, values=values, buffers=buffers)


class ClientTrainer(Protocol):
    """A pluggable client procedure (the baselines' trainers): called as
    ``trainer(workload, job, x, y, val)``, returns a :class:`TrainOutcome` whose ``params``
    is the full flat vector, zero outside ``job.mask``. Must be picklable."""

    def __call__(self, workload: "ClientWorkload", job: TrainJob, x: torch.Tensor, y: torch.Tensor,
                 val: tuple[torch.Tensor, torch.Tensor] | None) -> TrainOutcome: ...


class ClientWorkload:
    """The client side of a simulation: each client's data and one model instance to
    train on (reused for every job; only its parameters change).

    The model lives on :attr:`device` (the CPU until :meth:`to` moves it; executors move
    it to the run's device in the process that trains); a job's tensors are moved there
    when it runs, and the client data stays where it is (batches move one at a time)."""

    def __init__(self, model_factory: Callable[[], nn.Module], client_data: list[tuple[torch.Tensor, torch.Tensor]],
                 client_val: list[tuple[torch.Tensor, torch.Tensor]], settings: TrainSettings,
                 trainer: "ClientTrainer | None" = None) -> None:
        self.device = torch.device("cpu")
        self.model = model_factory()
        #: a method's own client procedure (baselines); None = masked local training
        self.trainer = trainer
        self.space = ParamSpace(self.model)
        self.client_data = client_data
        self.client_val = client_val
        self.settings = settings
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=settings.lr, momentum=settings.momentum,
                                         weight_decay=settings.weight_decay)

    def to(self, device: torch.device | str) -> "ClientWorkload":
        """Move the model (in place: the optimiser keeps its parameters) to ``device``;
        returns the workload."""
        self.model.to(device)
        self.device = torch.device(device)
        return self

    def run(self, job: TrainJob) -> JobResult:
        job = job.to(getattr(self, "device", "cpu"))
        x, y = self.client_data[job.client_id]
        val = self.client_val[job.client_id] if job.validate else None
        if getattr(self, "trainer", None) is not None:
            out = self.trainer(self, job, x, y, val)
        else:
            out = masked_local_training(self.model, self.space, job.start, job.buffers, job.mask, x, y,
                                        self.settings, job.seed, val, self.optimizer)
        if job.mask is None:
            values = out.params - job.start if job.kind == "delta" else out.params
        else:
            values = gather(out.params, job.mask)
            if job.kind == "delta":
                values = values - gather(job.start, job.mask)
        return JobResult(job.client_id, job.version, values, out.buffers, out.num_samples,
                         out.loss, out.val_score, out.num_processed)


class JobHandle(Protocol):
    def result(self) -> JobResult: ...


class Executor(Protocol):
    """Runs jobs; ``submit`` may return before the job finished."""

    def submit(self, job: TrainJob) -> JobHandle: ...

    def close(self) -> None: ...


@dataclass
class DoneHandle:
    value: JobResult

    def result(self) -> JobResult:
        return self.value


class SerialExecutor:
    """Trains each job at submission, in this process."""

    def __init__(self, workload: ClientWorkload) -> None:
        self.workload = workload

    def submit(self, job: TrainJob) -> JobHandle:
        return DoneHandle(self.workload.run(job))

    def close(self) -> None:
        pass


def job_seed(root_seed: int, client_id: int, dispatch_count: int) -> int:
    """A job's training seed: independent of dispatch order and of the executor."""
    ss = np.random.SeedSequence([int(root_seed), 0x7A1, int(client_id), int(dispatch_count)])
    return int(ss.generate_state(1, dtype=np.uint32)[0])
