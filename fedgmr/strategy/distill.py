"""Federated distillation as plug-ins of FedGMR's strategy (docs/methods/feddf.md, fedmd.md).

* :class:`FedDFDistillation` - FedDF (Lin et al., 2020): after the aggregation rule, the
  server distils the aggregated model on unlabelled proxy data towards the averaged
  teacher ``softmax(mean_k z_k / T)`` of the updates that aggregation used, each teacher
  evaluated under its own mask (the sub-model the client trained: zero off its mask, its
  own BatchNorm statistics). Clients do nothing more and send nothing more.
* :class:`FedMDConsensus` - FedMD (Li & Wang, 2019): replies carry logits on the public
  set instead of weights; every aggregation makes their mean the *consensus* that the
  next assignments carry (the client half is :mod:`fedgmr.training.fedmd`).

Neither knows the runtime. Distillation batches come from a stream of their own, seeded
by ``(seed, server version)``, so they need no state in checkpoints and are the same
whichever executor trained the clients.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn

from fedgmr.algorithm.distillation import batch_indices, consensus, distill_loss, ensemble_targets
from fedgmr.algorithm.maskinfo import frozen, mask_indices
from fedgmr.algorithm.params import ParamSpace, set_buffers
from fedgmr.device import module_device
from fedgmr.errors import ConfigError
from fedgmr.strategy.update import Update
from fedgmr.strategy.messages import Assignment, StepReport, Wire
from fedgmr.strategy.plugins import ServerPlugin
from fedgmr.training.fedmd import FedMDClient

log = logging.getLogger(__name__)

#: tag of the server distillation stream (numpy SeedSequence entropy beside the run's seed)
DISTILL_STREAM = 0xD157


def distill_seed(seed: int, version: int) -> int:
    """Seed of the distillation batches at server version ``version``."""
    ss = np.random.SeedSequence([int(seed), DISTILL_STREAM, int(version)])
    return int(ss.generate_state(1, dtype=np.uint32)[0])


@dataclass
class ServerDistiller:
    """FedDF's server-side distillation of one model (Adam, a fresh optimiser each time).

    model: a model instance on the strategy's device (its weights are overwritten).
    proxy: the unlabelled proxy inputs (any device; batches move to the model's).
    val_score: ``val_score(params, buffers) -> accuracy`` on the server's validation
        split, for early stopping every ``val_every`` steps (None: off).
    """

    model: nn.Module
    space: ParamSpace
    proxy: torch.Tensor
    temperature: float = 1.0
    steps: int = 20
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0
    val_every: int | None = None
    patience: int = 2
    val_score: Callable[[torch.Tensor, dict[str, torch.Tensor]], float] | None = None
    #: the last distillation's validation accuracy of the aggregate and of what was kept
    #: (None without ``val_every``): for the metrics, never for the result
    last_val: tuple[float, float] | None = None

    @torch.no_grad()
    def logits(self, params: torch.Tensor, buffers: dict[str, torch.Tensor], batch: int = 500) -> torch.Tensor:
        """Logits (n, classes) of ``params``/``buffers`` on the whole proxy set, eval mode."""
        self.space.load(self.model, params)
        set_buffers(self.model, buffers)
        self.model.eval()
        device = module_device(self.model)
        return torch.cat([self.model(self.proxy[i:i + batch].to(device)).float()
                          for i in range(0, len(self.proxy), batch)])

    def distil(self, params: torch.Tensor, buffers: dict[str, torch.Tensor], teachers: list[torch.Tensor],
               version: int) -> tuple[torch.Tensor, int]:
        """The student ``params`` after distillation towards ``teachers`` (each one's logits on
        the proxy set) and the number of steps taken. Eval mode: the student's BatchNorm
        statistics stay the aggregated ones (the proxy data are another distribution)."""
        targets = ensemble_targets(teachers, self.temperature)
        self.space.load(self.model, params)
        set_buffers(self.model, buffers)
        self.model.eval()
        device = module_device(self.model)
        opt = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        gen = torch.Generator().manual_seed(distill_seed(self.seed, version))
        check = self.val_every if self.val_score is not None else None
        best, best_params, waited = (self.val_score(params, buffers), params, 0) if check else (0.0, params, 0)
        start = best
        taken = 0
        for step, idx in enumerate(batch_indices(len(self.proxy), self.batch_size, self.steps, gen), 1):
            opt.zero_grad(set_to_none=True)
            loss = distill_loss(self.model(self.proxy[idx].to(device)), targets[idx.to(targets.device)],
                                self.temperature)
            loss.backward()
            opt.step()
            taken = step
            if check and step % check == 0:
                current = self.space.flatten(self.model).to(params.device)
                score = self.val_score(current, buffers)
                if score > best:
                    best, best_params, waited = score, current, 0
                else:
                    waited += 1
                    if waited >= self.patience:
                        break
                self.space.load(self.model, current)  # val_score may have used the same model
                set_buffers(self.model, buffers)
                self.model.eval()
        if check:
            self.last_val = (start, best)
            return best_params.clone(), taken
        self.last_val = None
        return self.space.flatten(self.model).to(params.device), taken


class FedDFDistillation(ServerPlugin):
    """FedDF's ensemble distillation of the aggregate, after the rule.

    distiller: the server distillation; every: distil at every that many aggregations;
    seconds_per_step: virtual seconds each distillation step adds to the server's time.
    """

    name = "FedDF's distillation"

    def __init__(self, distiller: ServerDistiller, every: int = 1, seconds_per_step: float = 0.0) -> None:
        self.distiller = distiller
        self.every = int(every)
        self.seconds_per_step = float(seconds_per_step)
        self._teachers: dict[int, tuple[Update, torch.Tensor]] = {}  # a cache: logits per buffered update
        self._seconds = 0.0
        self.distill_steps = 0  # steps taken so far (not in checkpoints: informative only)
        #: distillations so far, how many kept a student over the aggregate (validation
        #: on), and the last one's validation accuracy gain: the metrics' diagnostics
        self.distillations = 0
        self.students_kept = 0
        self.last_val_gain: float | None = None

    def teacher(self, e: Update) -> torch.Tensor:
        """The logits on the proxy set of update ``e``'s model under its own mask
        (cached while the update is the client's latest)."""
        hit = self._teachers.get(e.client_id)
        if hit is not None and hit[0] is e:
            return hit[1]
        full = torch.zeros_like(self.strategy.params)
        full[mask_indices(e.mask)] = e.values
        z = self.distiller.logits(full, e.buffers)
        self._teachers[e.client_id] = (e, z)
        return z

    def fuse(self, params: torch.Tensor, buffers: dict[str, torch.Tensor],
             used: list[Update]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self._seconds = 0.0
        version = self.strategy.version
        if not used or version % self.every:
            return params, buffers
        teachers = [self.teacher(e) for e in used]
        out, steps = self.distiller.distil(params, buffers, teachers, version)
        self._seconds = steps * self.seconds_per_step
        self.distill_steps += steps
        self.distillations += 1
        val = self.distiller.last_val
        self.last_val_gain = None if val is None else val[1] - val[0]
        if val is not None and val[1] > val[0]:
            self.students_kept += 1
        return out, buffers

    def record_keys(self, version: int) -> dict[str, Any]:
        """``distillations`` so far; with validation on, ``students_kept`` (a student beat
        the aggregate on the server's validation split) and ``distill_val_gain`` (the last
        distillation's validation accuracy over the aggregate's; 0 when the aggregate was kept)."""
        rec: dict[str, Any] = {"distillations": self.distillations}
        if self.distiller.val_score is not None and self.distiller.val_every:
            rec["students_kept"] = self.students_kept
            rec["distill_val_gain"] = self.last_val_gain
        return rec

    def state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        state["feddf"] = {"distillations": self.distillations, "students_kept": self.students_kept,
                          "last_val_gain": self.last_val_gain}

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        own = state.get("feddf", {})
        self.distillations = int(own.get("distillations", 0))
        self.students_kept = int(own.get("students_kept", 0))
        self.last_val_gain = own.get("last_val_gain")

    def after_aggregate(self, report: StepReport) -> StepReport:
        live = self.strategy.incoming  # the updates that stay for the next step keep their logits
        self._teachers = {c: t for c, t in self._teachers.items() if live.get(c) is t[0]}
        return dataclasses.replace(report, server_seconds=self._seconds)


class FedMDConsensus(ServerPlugin):
    """FedMD's server: replies carry ``logits`` (public samples x classes, flat) and no
    weights; each aggregation sets the consensus (their mean) that later assignments carry.
    The strategy's own parameters never change (FedMD has no global model)."""

    name = "FedMD's consensus"
    reply_extras = FedMDClient.reply_extras  # the logits, checked by the strategy

    def __init__(self, num_public: int, num_classes: int) -> None:
        self.num_values = int(num_public) * int(num_classes)
        #: the consensus logits (None before the first aggregation)
        self.consensus: torch.Tensor | None = None
        self._logits: dict[int, torch.Tensor] = {}

    def bind(self, strategy: Any) -> None:
        super().bind(strategy)
        self._nothing = frozen(torch.zeros(strategy.space.numel, dtype=torch.bool, device=strategy.device))

    def wire(self, a: Assignment) -> Assignment:
        # no model travels (nor a mask): the consensus goes down whole (once there is one), the logits come back whole
        plain = {} if self.consensus is None else {"consensus": self.consensus}
        return dataclasses.replace(a, mask_changed=False, wire=Wire(models=(), plain=plain, reply_coords=self._nothing,
                                                                    reply_plain=self.num_values))

    def on_accept(self, update: Update) -> None:
        self._logits[update.client_id] = update.extras["logits"]

    def after_aggregate(self, report: StepReport) -> StepReport:
        used = [self._logits[c] for c in sorted(self._logits) if c in set(report.used)]
        if used:
            self.consensus = consensus(used)
        self._logits.clear()
        return report

    def state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        if self.consensus is not None:
            tensors["fedmd/consensus"] = self.consensus
        for cid, z in self._logits.items():
            tensors[f"fedmd/logits/{cid}"] = z
        state["fedmd"] = {"pending": sorted(self._logits), "consensus": self.consensus is not None}

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        own = state.get("fedmd", {})
        self.consensus = tensors["fedmd/consensus"].clone() if own.get("consensus") else None
        self._logits = {int(c): tensors[f"fedmd/logits/{c}"].clone() for c in own.get("pending", [])}


# ---------------------------------------------------------------------- wiring (build)
def load_proxy(cfg: Any, input_shape: tuple[int, ...]) -> torch.Tensor:
    """The proxy inputs ``distill.proxy`` names: ``size`` samples of the split from
    ``offset`` on (a one-line ConfigError when they do not fit the model's input or the
    split holds none there)."""
    from fedgmr.data import load_dataset

    p = cfg.distill.proxy
    data = load_dataset(p.name, root=p.root, **p.options)
    split = getattr(data, p.split).x
    x = split[p.offset:p.offset + p.size]
    if len(x) == 0:
        raise ConfigError(f"distill.proxy {p.name!r}: its {p.split} split holds {len(split)} samples, none from "
                          f"distill.proxy.offset {p.offset} on")
    if tuple(x.shape[1:]) != tuple(input_shape):
        raise ConfigError(f"distill.proxy {p.name!r} has inputs of shape {tuple(x.shape[1:])}, the model takes "
                          f"{tuple(input_shape)}: pick proxy data of the training data's shape")
    if len(x) < p.size:
        log.warning("distill.proxy %r holds %d samples in its %s split from offset %d, fewer than "
                    "distill.proxy.size %d", p.name, len(x), p.split, p.offset, p.size)
    return x.float()


def distill_half(cfg: Any, data: Any, model_factory: Callable[[], nn.Module], space: ParamSpace,
                 device: torch.device, val_split: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                 baseline: Any) -> tuple[None, dict[str, Any], torch.Tensor | None]:
    """The strategy arguments (its ``plugins``: FedDF's distillation or FedMD's
    consensus) and the proxy data distillation needs (None, {}, None when the config
    distils nothing); no class of its own."""
    d = cfg.distill
    fedmd = cfg.local.algorithm == "fedmd"
    if not (d.server or fedmd):
        return None, {}, None
    if baseline is not None:
        raise ConfigError(f"federated distillation runs on FedGMR's masked strategy; submodel.policy "
                          f"{cfg.submodel.policy!r} (a width baseline) is not supported")
    proxy = load_proxy(cfg, data.input_shape)
    if fedmd:
        return None, {"plugins": (FedMDConsensus(len(proxy), data.num_classes),)}, proxy
    from fedgmr.training.evaluate import evaluate

    model = model_factory().to(device)
    score = None
    if d.val_every is not None:
        vx, vy = val_split()
        if len(vy) == 0:
            raise ConfigError("distill.val_every needs the server's validation split (data.val_fraction > 0)")

        def score(params: torch.Tensor, buffers: dict[str, torch.Tensor]) -> float:
            space.load(model, params)
            set_buffers(model, buffers)
            return evaluate(model, vx, vy, data.task, data.pad_index)[0]

    distiller = ServerDistiller(model, space, proxy, d.temperature, d.steps, d.batch_size, d.lr, cfg.seed,
                                d.val_every, d.patience, score)
    return None, {"plugins": (FedDFDistillation(distiller, d.every, d.seconds_per_step),)}, proxy


def attach_public(cfg: Any, workload: Any, proxy: torch.Tensor | None) -> None:
    """Give FedMD's client method the public data and the distillation settings."""
    method = workload.client_method
    if isinstance(method, FedMDClient) and proxy is not None:
        d = cfg.distill
        workload.client_method = dataclasses.replace(method, public=proxy, temperature=d.temperature, loss=d.loss,
                                                     digest_steps=d.steps, batch_size=d.batch_size, lr=d.lr)


__all__ = ["ServerDistiller", "FedDFDistillation", "FedMDConsensus", "distill_seed", "load_proxy", "distill_half",
           "attach_public"]
