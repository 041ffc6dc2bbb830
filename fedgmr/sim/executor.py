"""Executors run client training jobs. A job's inputs are fixed when it is dispatched
(model snapshot, mask, seed), so any executor gives the same results for a seed.

:class:`SerialExecutor` trains in the calling process; process-pool and Ray executors
implement the same two methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence

import numpy as np
import torch
import torch.nn as nn

from fedgmr.algorithm.maskinfo import gather
from fedgmr.algorithm.params import ParamSpace
from fedgmr.device import to_device
from fedgmr.training.client_base import ClientMethod
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
    #: the coordinates the reply carries (None: ``mask``); FedBN leaves BatchNorm out
    upload_mask: torch.Tensor | None = None
    #: full-length vectors the server sends beside the model (SCAFFOLD's ``c``)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the client's state from its previous job (empty: none yet, or a stateless method)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    #: more models beside (start, buffers) (IFCA's other cluster models): the job trains
    #: the one with the lowest loss on the client's data (fedgmr.training.model_choice)
    alternatives: tuple[tuple[torch.Tensor, dict[str, torch.Tensor]], ...] = ()

    def to(self, device: torch.device | str) -> "TrainJob":
        """The job with its tensors on ``device`` (itself when they are there already)."""
        start, buffers = self.start.to(device), to_device(self.buffers, device)
        mask = None if self.mask is None else self.mask.to(device)
        up = None if self.upload_mask is None else self.upload_mask.to(device)
        extras, state = to_device(self.extras, device), to_device(self.state, device)
        alts = tuple((p.to(device), to_device(b, device)) for p, b in self.alternatives)
        if start is self.start and buffers is self.buffers and mask is self.mask and up is self.upload_mask \
                and extras is self.extras and state is self.state \
                and all(p is q and b is c for (p, b), (q, c) in zip(alts, self.alternatives)):
            return self
        return replace(self, start=start, buffers=buffers, mask=mask, upload_mask=up, extras=extras, state=state,
                       alternatives=alts)


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
    #: the client's new state (None: a stateless method; the simulator keeps it for the next job)
    state: dict[str, torch.Tensor] | None = None
    #: vectors sent back beside the values, at the same coordinates (SCAFFOLD's ``delta_c``)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def to(self, device: torch.device | str) -> "JobResult":
        """The result with its tensors on ``device`` (the CPU before it leaves a worker)."""
        values, buffers = self.values.to(device), to_device(self.buffers, device)
        state = None if self.state is None else to_device(self.state, device)
        extras = to_device(self.extras, device)
        if values is self.values and buffers is self.buffers and state is self.state and extras is self.extras:
            return self
        return replace(self, values=values, buffers=buffers, state=state, extras=extras)


class ClientWorkload:
    """The client side of a simulation: each client's data and one model instance to
    train on (reused for every job; only its parameters change).

    The model lives on :attr:`device` (the CPU until :meth:`to` moves it; executors move
    it to the run's device in the process that trains); a job's tensors are moved there
    when it runs, and the client data stays where it is (batches move one at a time)."""

    def __init__(self, model_factory: Callable[[], nn.Module],
                 client_data: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 client_val: Sequence[tuple[torch.Tensor, torch.Tensor]], settings: TrainSettings,
                 client_method: ClientMethod | None = None) -> None:
        self.device = torch.device("cpu")
        self.model = model_factory()
        #: the client half of a method, the one client extension point
        #: (:class:`fedgmr.training.client_base.ClientMethod`: fedgmr.training.client_methods,
        #: the baselines' fedgmr.baselines.training; None: masked local SGD)
        self.client_method = client_method
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
        """Train one job: with the learning rate of the model version it was sent
        (``training.lr_schedule``) and on freshly augmented images (``training.augment``)."""
        base = self.settings
        self.settings = base.for_version(job.version)
        try:
            return self._run(job, base)
        finally:
            self.settings = base

    def _run(self, job: TrainJob, base: TrainSettings) -> JobResult:
        job = job.to(getattr(self, "device", "cpu"))
        x, y = self.client_data[job.client_id]
        if base.augment is not None:
            from fedgmr.training.augment import augment_images

            gen = torch.Generator().manual_seed((int(job.seed) * 1_000_003 + 0xA06) % (1 << 63))
            x = augment_images(x, gen, *base.augment)
        val = self.client_val[job.client_id] if job.validate else None
        choice: dict[str, torch.Tensor] = {}
        if job.alternatives:  # several models offered (IFCA): train the one with the lowest loss
            from fedgmr.training.model_choice import choose_model

            job, losses = choose_model(self, job, x, y)
            choice["model_losses"] = losses
        state: dict[str, torch.Tensor] | None = None
        extras: dict[str, torch.Tensor] = {}
        raw: dict[str, torch.Tensor] = {}  # vectors sent as they are (FedMD's logits)
        buffers_sent: tuple[str, ...] | None = None
        method = self.client_method
        if method is not None:
            res = method.train(self, job, x, y, val)
            out, state, extras, buffers_sent = res.outcome, res.state, res.extras, res.send_buffers
            raw = res.raw_extras
        else:
            out = masked_local_training(self.model, self.space, job.start, job.buffers, job.mask, x, y,
                                        self.settings, job.seed, val, self.optimizer)
        up = job.upload_mask if job.upload_mask is not None else job.mask
        if up is None:
            values = out.params - job.start if job.kind == "delta" else out.params
        else:
            values = gather(out.params, up)
            if job.kind == "delta":
                values = values - gather(job.start, up)
        sent = {k: v if up is None else gather(v, up) for k, v in extras.items()}
        sent.update(choice)  # not a vector over the parameters: sent as it is
        sent.update(raw)
        buffers = out.buffers if buffers_sent is None else {k: out.buffers[k] for k in buffers_sent}
        return JobResult(job.client_id, job.version, values, buffers, out.num_samples,
                         out.loss, out.val_score, out.num_processed, state, sent)


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
