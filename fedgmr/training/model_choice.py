"""A client offered several models (IFCA's cluster models) trains the one with the lowest
loss on its own training data (docs/methods/ifca.md).

Each candidate is scored as the client would train it: on the job's mask (pruned
coordinates zero), with its own buffers, in evaluation mode; the choice is
:func:`fedgmr.algorithm.clustering.lowest_loss` (ties: the first). Pure evaluation: the
client's data, the seed and the result do not depend on the runtime.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fedgmr.algorithm.clustering import lowest_loss
from fedgmr.algorithm.params import set_buffers
from fedgmr.training.evaluate import evaluate
from fedgmr.training.extras import ExtraSpec


def _some_loss(losses: torch.Tensor) -> str | None:
    """A choice needs at least one loss that is a number."""
    return MODEL_LOSSES.needs if bool(torch.isnan(losses).all()) else None


#: what a reply to a job offering several models carries: one loss per model, float64 as
#: computed (a NaN marks a model that could not be scored; all NaN rejects the reply)
MODEL_LOSSES = ExtraSpec("model_losses", "whole", "an IFCA reply needs model_losses, one loss per cluster model ({n})",
                         finite=False, dtype=None, check=_some_loss)


def candidate_losses(workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean loss on (x, y) of every model a job offers: (start, buffers) first, then
    ``job.alternatives`` in order; float64, one per model."""
    settings = workload.settings
    losses = []
    for params, buffers in ((job.start, job.buffers), *job.alternatives):
        flat = params if job.mask is None else params * job.mask.to(params.dtype)
        workload.space.load(workload.model, flat)
        set_buffers(workload.model, buffers)
        losses.append(evaluate(workload.model, x, y, settings.task, settings.pad_index)[1])
    return torch.tensor(losses, dtype=torch.float64)


def choose_model(workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """The job set to start from its lowest-loss model (no alternatives left), and the
    losses of all of them, scored on the first ``workload.choice_samples`` samples (None:
    all; ``clustering.loss_samples``)."""
    cap = getattr(workload, "choice_samples", None)
    losses = candidate_losses(workload, job, x[:cap], y[:cap])
    j = lowest_loss(losses.tolist())
    start, buffers = (job.start, job.buffers) if j == 0 else job.alternatives[j - 1]
    return dataclasses.replace(job, start=start, buffers=buffers, alternatives=()), losses


__all__ = ["MODEL_LOSSES", "candidate_losses", "choose_model"]
