"""Client methods of the width baselines and FIARSE (the workload's one extension point,
:class:`~fedgmr.training.client_base.ClientMethod`; :func:`fedgmr.baselines.hooks.baseline_setup`
picks one for a ``submodel.policy``).

Each ``train(workload, job, x, y, val)`` returns a :class:`ClientResult` whose outcome is
the full flat vector (zero outside the job's mask), so the workload's reply code (values
at the mask, deltas) is shared by every method. All three are stateless and exchange no
extras; they train through the one client loop (:func:`~fedgmr.training.local.run_local_steps`).

* :class:`WidthClient` (HeteroFL, FedRolex) extracts the width-``r`` sub-model the job's
  mask describes, trains that smaller model with masked local SGD (scaler and label-split
  logit masking as forward hooks; static BatchNorm) and scatters its weights back.
* :class:`OrderedDropoutClient` (FjORD) samples one width per batch from the tier's
  allowed set and trains that width's sub-model; gradients land on the tier's ``p_max``
  weights, optionally with self-distillation from ``p_max``.
* :class:`FiarseClient` trains the full model with FIARSE's shrinking masks and
  threshold-controlled gradient.

FjORD and FIARSE move a flat weight vector (:class:`~fedgmr.training.local.FlatSGD`),
not the model's parameters through ``torch.optim.SGD``: their update is computed in
separate roundings, which the optimiser's fused kernels would change in the last bits.

Methods hold only picklable configuration; model caches are rebuilt lazily per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from fedgmr.algorithm.losses import task_loss
from fedgmr.algorithm.params import ParamSpace, get_buffers, set_buffers
from fedgmr.baselines import fiarse_math
from fedgmr.baselines.policies import allowed_widths
from fedgmr.baselines.structure import WidthStructure
from fedgmr.models import build_model
from fedgmr.models.scaler import attach_scaler
from fedgmr.training.client_base import ClientResult
from fedgmr.training.extras import ExtrasSchema
from fedgmr.training.evaluate import evaluate
from fedgmr.training.local import (FlatSGD, TrainOutcome, TrainSettings, flat_backward, masked_local_training,
                                   run_local_steps)


@dataclass(frozen=True)
class ModelSpec:
    """A picklable ``build(width)``: a registered model with fixed options."""

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    options: tuple[tuple[str, Any], ...] = ()

    def __call__(self, width: float) -> nn.Module:
        opts = {k: (tuple(v) if isinstance(v, list) else v) for k, v in self.options}
        opts.pop("width", None)
        return build_model(self.name, self.num_classes, self.input_shape, width=width, **opts)


class _Stateless:
    """What the baselines' client methods share: no state between jobs, no extras, and
    the global model as every client's own."""

    stateful: ClassVar[bool] = False
    needs_extras: ClassVar[tuple[str, ...]] = ()
    reply_extras: ClassVar[ExtrasSchema] = ()

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult:
        """Train one job (:meth:`outcome`), nothing beside the model."""
        return ClientResult(self.outcome(workload, job, x, y, val))

    def outcome(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
                val: tuple[torch.Tensor, torch.Tensor] | None) -> TrainOutcome:
        """The trained model: the full flat vector, zero outside ``job.mask``."""
        raise NotImplementedError

    def personal_model(self, model: nn.Module, space: ParamSpace, params: torch.Tensor,
                       buffers: dict[str, torch.Tensor],
                       state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The global model: a stateless client uses what the server sends."""
        return params, buffers


@dataclass
class _WidthBase(_Stateless):
    build: ModelSpec
    rates: tuple[float, ...]  # width rate per ladder level
    sizes: tuple[int, ...]  # mask size per level (identifies a job's level)
    _ws: WidthStructure | None = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_ws"] = None
        return state

    def structure(self, workload: Any) -> WidthStructure:
        if self._ws is None:
            self._ws = WidthStructure(self.build, workload.model)
        return self._ws

    def rate_of(self, mask: torch.Tensor | None) -> float:
        if mask is None:
            return 1.0
        k = int(mask.sum())
        if k not in self.sizes:
            raise ValueError(f"a mask of {k} coordinates matches no width level ({list(self.sizes)})")
        return self.rates[self.sizes.index(k)]


@dataclass
class WidthClient(_WidthBase):
    """HeteroFL / FedRolex client: train the actual width-``r`` model.

    scaler: divide hidden activations by ``r`` in training (HeteroFL's scaler).
    label_split: set the logits of classes absent from the client's data to 0 in training.
    """

    scaler: bool = True
    label_split: bool = False

    def outcome(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
                val: tuple[torch.Tensor, torch.Tensor] | None) -> TrainOutcome:
        ws = self.structure(workload)
        rate = self.rate_of(job.mask)
        device = job.start.device
        mask = job.mask if job.mask is not None else torch.ones(ws.space.numel, dtype=torch.bool, device=device)
        sl = ws.slice_from_mask(mask, rate)
        sub, sub_space = ws.model(rate)
        # the hooks of the shared loop here are forward hooks on the sub-model
        handles = attach_scaler(sub, rate, ws.space.output_layer) if self.scaler else []
        settings: TrainSettings = workload.settings
        if self.label_split and settings.task == "classification":
            handles.append(sub.register_forward_hook(_label_mask_hook(y, self.build.num_classes, device)))
        try:
            out = masked_local_training(sub, sub_space, job.start[sl.gather], {}, None, x, y, settings,
                                        job.seed, val)
        finally:
            for h in handles:
                h.remove()
        full = torch.zeros(ws.space.numel, device=out.params.device)
        full[sl.gather] = out.params
        # static BatchNorm: no statistics travel; the server re-estimates them
        return TrainOutcome(full, job.buffers, out.loss, out.num_samples, out.val_score, out.num_processed)


def _label_mask_hook(y: torch.Tensor, num_classes: int,
                     device: torch.device | str = "cpu") -> Callable[..., torch.Tensor]:
    present = torch.zeros(num_classes, dtype=torch.bool)
    present[torch.unique(y)] = True
    present = present.to(device)  # the logits' device

    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        return output.masked_fill(~present, 0.0) if module.training else output

    return hook


@dataclass
class OrderedDropoutClient(_WidthBase):
    """FjORD client: one width per batch, drawn uniformly from the tier's allowed set.

    p_values: FjORD's width grid; the tier samples every value below its ``p_max`` and
        ``p_max`` itself (widths are list positions, never dict keys).
    distill: train ``p_max`` on the labels first and use its softmax as the sampled
        width's soft target (self-distillation).
    """

    p_values: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
    distill: bool = False

    def outcome(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
                val: tuple[torch.Tensor, torch.Tensor] | None) -> TrainOutcome:
        if len(y) == 0:
            raise ValueError("cannot train on an empty client data set")
        ws = self.structure(workload)
        s: TrainSettings = workload.settings
        rate = self.rate_of(job.mask)
        device = job.start.device
        mask = job.mask if job.mask is not None else torch.ones(ws.space.numel, dtype=torch.bool, device=device)
        top = ws.slice_from_mask(mask, rate)
        widths = allowed_widths(self.p_values, rate)
        pos = torch.full((ws.space.numel,), -1, dtype=torch.long, device=device)
        pos[top.gather] = torch.arange(top.gather.numel(), device=device)
        maps = []
        for p in widths:
            m = pos[ws.slice(p, 0).gather]
            if bool((m < 0).any()):
                raise ValueError(f"width {p} is not nested in the tier's width {rate}")
            maps.append(m)
        sgd = FlatSGD(job.start[top.gather].clone(), s)
        pgen = torch.Generator().manual_seed((int(job.seed) * 2654435761 + 1) % (2 ** 63))
        total = 0.0
        last = len(widths) - 1

        def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
            """The per-batch width (and its distillation target) over the shared loop."""
            nonlocal total
            j = int(torch.randint(len(widths), (1,), generator=pgen))
            grad = torch.zeros_like(sgd.w)
            target = None
            if self.distill and j != last:
                t_logits, _ = self._grad(ws, rate, sgd.w, maps[last], xb, yb, None, s, grad)
                target = F.softmax(t_logits.detach(), dim=-1)
            _, loss = self._grad(ws, widths[j], sgd.w, maps[j], xb, yb, target, s, grad)
            total += loss
            sgd.step(grad)

        batches = run_local_steps(x, y, s.batch_size, job.seed, s.local_steps, device, step)
        w = sgd.w
        val_score = None
        if val is not None and len(val[1]) > 0:
            sub, sub_space = ws.model(rate)
            sub_space.load(sub, w)
            val_score, _ = evaluate(sub, val[0], val[1], s.task, s.pad_index)
        full = torch.zeros(ws.space.numel, device=device)
        full[top.gather] = w
        return TrainOutcome(full, job.buffers, total / max(s.local_steps, 1), len(y), val_score,
                            s.local_steps * batches.bs)

    @staticmethod
    def _grad(ws: WidthStructure, p: float, w: torch.Tensor, index: torch.Tensor, xb: torch.Tensor,
              yb: torch.Tensor, target: torch.Tensor | None, s: TrainSettings,
              grad: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Forward/backward of the width-``p`` model at ``w[index]``; adds its gradient."""
        model, space = ws.model(p)
        model.train()

        def loss_fn(logits: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            if target is None:
                return task_loss(logits, yb, s.task, s.loss, s.pad_index)
            return -(target * F.log_softmax(logits, dim=-1)).sum(-1).mean()

        g, loss, logits = flat_backward(model, space, w[index], xb, yb, loss_fn)
        grad.index_add_(0, index, g)
        return logits, float(loss.detach())


@dataclass
class FiarseClient(_Stateless):
    """FIARSE client: full model, masks recomputed from the moving weights (they only
    shrink), threshold-controlled gradient. ``scope``: ``global`` or ``stage`` thresholds."""

    scope: str = "global"
    _groups: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def outcome(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
                val: tuple[torch.Tensor, torch.Tensor] | None) -> TrainOutcome:
        if self._groups is None or self._groups.device != job.start.device:
            self._groups = fiarse_math.score_groups(workload.model, workload.space, self.scope).to(job.start.device)
        return fiarse_local_training(workload.model, workload.space, job.start, job.buffers, job.mask,
                                     self._groups, x, y, workload.settings, job.seed, val)


def fiarse_local_training(model: nn.Module, space: ParamSpace, start: torch.Tensor,
                          buffers: dict[str, torch.Tensor], mask: torch.Tensor | None, groups: torch.Tensor,
                          x: torch.Tensor, y: torch.Tensor, settings: TrainSettings, seed: int,
                          val: tuple[torch.Tensor, torch.Tensor] | None = None,
                          on_step: Callable[[torch.Tensor], None] | None = None) -> TrainOutcome:
    """FIARSE local training from the global ``start`` with the extracted ``mask``.

    The thresholds are fixed at extraction (the smallest kept score of each group); after
    every step the mask becomes ``mask & (|w| >= theta)`` on scored coordinates, so weights
    may drop out but never re-enter. The forward pass uses ``w * mask``; the gradient on kept
    scored weights is multiplied by ``1 + 2 theta |w| / (|w| + theta)^2``. Returns the moved
    weights at the extracted mask (zero elsewhere); ``on_step(mask)`` sees each step's mask.
    """
    if len(y) == 0:
        raise ValueError("cannot train on an empty client data set")
    device = start.device  # the model's: masks, groups and batches follow it
    extracted = torch.ones(space.numel, dtype=torch.bool, device=device) if mask is None else mask.clone()
    groups = groups.to(device)
    scored = groups >= 0
    theta = fiarse_math.thresholds_from_mask(start, extracted, groups)
    sgd = FlatSGD(start.clone(), settings)
    m = extracted.clone()
    # the kept scored coordinates, ascending, and their thresholds: only these can drop out
    # (an unscored coordinate has theta 0, one outside the mask is out already), so the
    # set shrinks step by step without a scan of the whole mask
    kept = (scored & m).nonzero().squeeze(1)
    theta_kept = theta.index_select(0, kept)
    set_buffers(model, buffers)
    model.train()
    total = 0.0

    def loss_fn(out: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return task_loss(out, yb, settings.task, settings.loss, settings.pad_index)

    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        """FIARSE's masked forward, threshold-controlled gradient and shrinking mask."""
        nonlocal m, kept, theta_kept, total
        w = sgd.w
        g, loss, _ = flat_backward(model, space, w * m, xb, yb, loss_fn)
        g = g * m
        g.index_copy_(0, kept, g.index_select(0, kept) * fiarse_math.multiplier(w.index_select(0, kept), theta_kept))
        sgd.step(g, decay_mask=m, step_mask=extracted)
        dropped = sgd.w.index_select(0, kept).abs() < theta_kept  # the mask becomes m & (|w| >= theta)
        if bool(dropped.any()):
            m[kept[dropped]] = False  # m is this job's own copy
            stay = ~dropped
            kept, theta_kept = kept[stay], theta_kept[stay]
        total += float(loss.detach())
        if on_step is not None:
            on_step(m.clone())

    batches = run_local_steps(x, y, settings.batch_size, seed, settings.local_steps, device, step)
    w = sgd.w
    space.load(model, w * m)
    val_score = None
    if val is not None and len(val[1]) > 0:
        val_score, _ = evaluate(model, val[0], val[1], settings.task, settings.pad_index)
    return TrainOutcome(w * extracted, get_buffers(model), total / max(settings.local_steps, 1),
                        len(y), val_score, settings.local_steps * batches.bs)


def spec_options(options: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Model options as a hashable, picklable tuple for :class:`ModelSpec`."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))


__all__ = ["ModelSpec", "WidthClient", "OrderedDropoutClient", "FiarseClient", "fiarse_local_training",
           "spec_options"]
