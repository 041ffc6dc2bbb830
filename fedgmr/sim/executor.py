"""Executors run client training jobs. A job's inputs are fixed when it is dispatched
(model snapshot, mask, seed), so any executor gives the same results for a seed.

:class:`SerialExecutor` trains in the calling process; process-pool and Ray executors
implement the same two methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import torch
import torch.nn as nn

from fedgmr.algorithm.params import ParamSpace
from fedgmr.training.local import TrainSettings, masked_local_training


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


@dataclass
class JobResult:
    """A finished job, already compact: values only at the job's mask."""

    client_id: int
    version: int
    values: torch.Tensor
    buffers: dict[str, torch.Tensor]
    num_samples: int
    loss: float
    val_score: float | None


class ClientWorkload:
    """The client side of a simulation: each client's data and one model instance to
    train on (reused for every job; only its parameters change)."""

    def __init__(self, model_factory: Callable[[], nn.Module], client_data: list[tuple[torch.Tensor, torch.Tensor]],
                 client_val: list[tuple[torch.Tensor, torch.Tensor]], settings: TrainSettings) -> None:
        self.model = model_factory()
        self.space = ParamSpace(self.model)
        self.client_data = client_data
        self.client_val = client_val
        self.settings = settings

    def run(self, job: TrainJob) -> JobResult:
        x, y = self.client_data[job.client_id]
        val = self.client_val[job.client_id] if job.validate else None
        out = masked_local_training(self.model, self.space, job.start, job.buffers, job.mask, x, y,
                                    self.settings, job.seed, val)
        flat = out.params
        if job.kind == "delta":
            start = job.start if job.mask is None else job.start * job.mask
            flat = flat - start
        values = flat if job.mask is None else flat[job.mask]
        return JobResult(job.client_id, job.version, values.clone(), out.buffers, out.num_samples,
                         out.loss, out.val_score)


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
