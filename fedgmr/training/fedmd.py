"""FedMD's client (Li & Wang, 2019; docs/methods/fedmd.md): each client keeps its own
model. A job *digests* the server's consensus (distils towards it on the public set),
*revisits* its own data (``training.local_steps`` of local SGD) and returns its logits
on the public set - only logits travel, never weights.

State: the client's model ``w`` and its buffers (``buf/NAME``); before its first job a
client starts from the shared initial model (derived from the run's seed, so nothing is
downloaded for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn as nn

from fedgmr.algorithm.distillation import DistillLoss, batch_indices, distill_loss
from fedgmr.algorithm.params import ParamSpace, set_buffers
from fedgmr.device import module_device
from fedgmr.training.client_base import ClientResult, SGDClient, stored_model
from fedgmr.training.extras import ExtrasSchema, ExtraSpec


def _sub_seed(seed: int, tag: int) -> int:
    return int(np.random.SeedSequence([int(seed), tag]).generate_state(1, dtype=np.uint32)[0])


@torch.no_grad()
def model_logits(model: nn.Module, space: ParamSpace, params: torch.Tensor, buffers: dict[str, torch.Tensor],
                 x: torch.Tensor, batch: int = 500) -> torch.Tensor:
    """Logits (n, classes) of the model ``params``/``buffers`` on ``x``, in eval mode."""
    space.load(model, params)
    set_buffers(model, buffers)
    model.eval()
    device = module_device(model)
    return torch.cat([model(x[i:i + batch].to(device)).float() for i in range(0, len(x), batch)])


def digest(model: nn.Module, space: ParamSpace, params: torch.Tensor, buffers: dict[str, torch.Tensor],
           public: torch.Tensor, targets: torch.Tensor, temperature: float, kind: DistillLoss, steps: int,
           batch_size: int, lr: float, seed: int) -> torch.Tensor:
    """``steps`` Adam steps of ``model`` (from ``params``) towards soft ``targets`` on
    ``public``, in eval mode (BatchNorm statistics stay as they are); returns the weights."""
    space.load(model, params)
    set_buffers(model, buffers)
    model.eval()
    device = module_device(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(int(seed))
    for idx in batch_indices(len(public), batch_size, steps, gen):
        opt.zero_grad(set_to_none=True)
        loss = distill_loss(model(public[idx].to(device)), targets[idx.to(targets.device)], temperature, kind)
        loss.backward()
        opt.step()
    return space.flatten(model)


@dataclass(frozen=True)
class FedMDClient(SGDClient):
    """FedMD: digest the consensus (``consensus`` in the job's extras; none before the
    first aggregation), revisit the private data, send logits on ``public``."""

    public: torch.Tensor | None = None
    temperature: float = 1.0
    loss: DistillLoss = "kl"
    digest_steps: int = 20
    batch_size: int = 64
    lr: float = 1e-3
    stateful: ClassVar[bool] = True
    #: the logits on the public set, flat, every value finite
    reply_extras: ClassVar[ExtrasSchema] = (ExtraSpec("logits", "whole", "a FedMD reply needs {n} finite logits"),)

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult:
        if self.public is None:
            raise RuntimeError("FedMD's client needs the public data (distill.proxy)")
        state = job.state or {}
        params = state["w"].to(job.start.device) if "w" in state else job.start
        buffers = {k: state.get(f"buf/{k}", b).to(b.device) for k, b in job.buffers.items()}
        consensus = job.extras.get("consensus")
        if consensus is not None:
            targets = torch.softmax(consensus.view(len(self.public), -1).float() / self.temperature, dim=-1)
            params = digest(workload.model, workload.space, params, buffers, self.public, targets, self.temperature,
                            self.loss, self.digest_steps, self.batch_size, self.lr, _sub_seed(job.seed, 0xFED3D))
        out = self._train(workload, job, x, y, val, start=params, buffers=buffers)  # revisit
        logits = model_logits(workload.model, workload.space, out.params, out.buffers, self.public)
        new = {"w": out.params}
        new.update({f"buf/{k}": b for k, b in out.buffers.items()})
        return ClientResult(out, new, send_buffers=(), raw_extras={"logits": logits.reshape(-1).cpu()})

    def personal_model(self, model: nn.Module, space: ParamSpace, params: torch.Tensor,
                       buffers: dict[str, torch.Tensor],
                       state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The client's own model (before its first job: the shared initial model)."""
        return stored_model(state, "w", params, buffers)


__all__ = ["FedMDClient", "digest", "model_logits"]
