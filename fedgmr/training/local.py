"""Masked local training (docs/reference.md §3.4).

The client starts from ``W * m``, runs ``local_steps`` SGD steps and pruned coordinates
stay exactly zero - also under momentum and weight decay - because their gradients are
masked before the optimiser sees them (a zero weight with a zero gradient gets a zero
weight-decay term and a zero momentum buffer). With plain SGD (no momentum, no weight
decay) the mask is applied inside the step instead, ``p - lr * g * m`` in one pass
(:func:`_masked_sgd_step`). Buffers are trained normally, never masked.

This module also holds the one client training loop every client method trains
through: :func:`run_local_steps` draws the batches (:class:`BatchOrder`, seeded by the
job) and hands each to a step - :class:`ModelSGDStep` (``torch.optim.SGD`` on a
model's parameters with loss, gradient-mask and gradient-term hooks: masked local
training, FedMRL's two models) or a method's own (FjORD's per-batch width and FIARSE's
threshold-controlled gradient, on :class:`FlatSGD`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
import torch.nn as nn

from fedgmr.algorithm.local_rules import proximal_gradient
from fedgmr.algorithm.maskinfo import memo
from fedgmr.algorithm.params import ParamSpace, model_refs
from fedgmr.training.evaluate import evaluate
from fedgmr.algorithm.losses import task_loss


def _grad_mask_plan(space: ParamSpace, mask: torch.Tensor | None) -> list[tuple[str, torch.Tensor]]:
    """Per-parameter float masks for the partly masked parameters of ``mask``, cached per
    mask object (level masks are shared by many jobs)."""
    if mask is None:
        return []

    def plan() -> list[tuple[str, torch.Tensor]]:
        out = []
        for info in space.params:
            m = mask[info.slice]
            if not bool(m.all()):
                out.append((info.name, m.view(info.shape).to(torch.float32)))
        return out

    return memo(mask, ("grad_plan", space.params), plan)  # keyed by the layout itself


class BatchOrder:
    """The clients' batch order: batches of ``batch_size`` (at most ``n``) drawn without
    replacement from a permutation seeded by ``gen``, reshuffled after each pass."""

    def __init__(self, n: int, batch_size: int, gen: torch.Generator) -> None:
        self.n, self.bs, self.gen = n, min(batch_size, n), gen
        self.perm = torch.randperm(n, generator=gen)
        self.pos = 0

    def next(self) -> torch.Tensor:
        if self.pos + self.bs > self.n:
            self.perm = torch.randperm(self.n, generator=self.gen)
            self.pos = 0
        idx = self.perm[self.pos:self.pos + self.bs]
        self.pos += self.bs
        return idx


@dataclass(frozen=True)
class TrainSettings:
    """Local optimisation settings (SGD)."""

    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 20
    local_steps: int = 5
    loss: Literal["ce", "bce"] = "ce"
    task: str = "classification"
    pad_index: int | None = None
    clip_grad_norm: float | None = None
    #: (kind, step_every, gamma, total_steps, min_lr) of fedgmr.training.schedules.lr_at; None: constant
    lr_schedule: tuple | None = None
    #: (flip, crop_padding) of fedgmr.training.augment.augment_images; None: no augmentation
    augment: tuple | None = None

    def for_version(self, version: int) -> "TrainSettings":
        """These settings with the learning rate of model ``version`` (the schedule's)."""
        if self.lr_schedule is None:
            return self
        from dataclasses import replace

        from fedgmr.training.schedules import lr_at

        kind, every, gamma, total, min_lr = self.lr_schedule
        lr = lr_at(kind, self.lr, version, every, gamma, total, min_lr)
        return self if lr == self.lr else replace(self, lr=lr)


@dataclass(frozen=True)
class LocalTerms:
    """Extra terms of the local objective's gradient, applied on the mask only
    (:mod:`fedgmr.algorithm.local_rules`).

    prox_mu, prox_anchor: ``mu/2 ||(w - anchor) * m||^2`` (FedProx: anchor = the model
        received, ``W * m``; Ditto's personal model: anchor = the global model). ``None``
        anchors at the start vector ``start * m``.
    correction: a flat vector added to every gradient on the mask (SCAFFOLD: ``c - c_i``).
    """

    prox_mu: float = 0.0
    prox_anchor: torch.Tensor | None = None
    correction: torch.Tensor | None = None


@dataclass
class TrainOutcome:
    """What local training produced."""

    params: torch.Tensor  # full flat vector, zero outside the mask
    buffers: dict[str, torch.Tensor]
    loss: float
    num_samples: int  # the client's training-set size (FedAvg's n_k)
    val_score: float | None = None
    num_processed: int | None = None  # samples the local steps went through
    steps: int | None = None  # local steps actually taken (a straggler takes fewer)


def masked_local_training(model: nn.Module, space: ParamSpace, start: torch.Tensor,
                          buffers: dict[str, torch.Tensor], mask: torch.Tensor | None,
                          x: torch.Tensor, y: torch.Tensor, settings: TrainSettings, seed: int,
                          val: tuple[torch.Tensor, torch.Tensor] | None = None,
                          optimizer: torch.optim.SGD | None = None, terms: LocalTerms | None = None,
                          steps: int | None = None) -> TrainOutcome:
    """Train ``model`` from ``start * mask`` on ``(x, y)``; deterministic for ``seed``.

    ``mask=None`` trains the full model. Pass ``optimizer`` (an SGD over ``model``'s
    parameters) to reuse it across jobs; its state (momentum) is reset for every job. Batches are drawn without replacement from a
    permutation seeded by ``seed``, reshuffled each pass over the data.

    Training runs on the model's device: ``start``, ``buffers`` and ``mask`` must be
    there too; the data may live anywhere (each batch moves to the model's device).

    ``terms`` adds a proximal pull and/or a constant correction to every gradient, on the
    mask only; ``steps`` overrides ``settings.local_steps`` (a straggler's partial work).
    """
    if len(y) == 0:
        raise ValueError("cannot train on an empty client data set")
    refs = model_refs(model)  # the model's parameters, buffers and modules, looked up once per model
    plan = dict(_grad_mask_plan(space, mask))
    params = refs.params
    with torch.no_grad():  # W * m, written straight into the parameters (one pass)
        for info in space.params:
            src = start[info.slice].view(info.shape)
            m = plan.get(info.name)
            if m is None:
                params[info.name].copy_(src)
            else:
                torch.mul(src, m, out=params[info.name].data)
        named_buffers = refs.buffers
        for n, b in buffers.items():  # set_buffers
            named_buffers[n].copy_(b)
    if optimizer is None:
        opt = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum,
                              weight_decay=settings.weight_decay)
    else:
        opt = optimizer
        opt.state.clear()  # no momentum carried between jobs
        for group in opt.param_groups:
            group.update(lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)
    step = ModelSGDStep(model, opt, settings, grad_masks=plan,
                        terms=_term_plan(space, params, plan, start, terms))
    num_steps = settings.local_steps if steps is None else int(steps)
    batches = run_local_steps(x, y, settings.batch_size, seed, num_steps, step.device, step)
    # pruned coordinates are still exactly 0.0: zero weight, zero (masked) gradient, so
    # SGD's weight decay and momentum terms are zero too (tests assert it bit for bit)
    flat = space.flatten(model)
    val_score = None
    if val is not None and len(val[1]) > 0:
        val_score, _ = evaluate(model, val[0], val[1], settings.task, settings.pad_index)
    trained_buffers = {n: b.detach().clone() for n, b in refs.buffers.items()}  # get_buffers
    return TrainOutcome(flat, trained_buffers, float(step.total) / max(num_steps, 1),
                        len(y), val_score, num_steps * batches.bs, num_steps)


LocalStep = Callable[[torch.Tensor, torch.Tensor], None]
"""One local step on a batch ``(xb, yb)`` already on the training device: forward,
backward, gradient hooks, clipping, the update (:class:`ModelSGDStep`, or a method's own)."""


def run_local_steps(x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int, num_steps: int,
                    device: torch.device | str, step: LocalStep) -> BatchOrder:
    """The one client training loop: ``num_steps`` batches drawn by :class:`BatchOrder`
    from a CPU generator seeded by ``seed`` (the same batches on every device), each moved
    to ``device`` and handed to ``step``. Returns the batch order (its ``bs`` is the batch
    size used). Every client method trains through it; what differs between methods is
    the ``step`` (:class:`ModelSGDStep` with its hooks, or FjORD's and FIARSE's flat-vector
    steps in :mod:`fedgmr.baselines.training`)."""
    if len(y) == 0:
        raise ValueError("cannot train on an empty client data set")
    batches = BatchOrder(len(y), batch_size, torch.Generator().manual_seed(int(seed)))
    for _ in range(num_steps):
        idx = batches.next()
        step(x[idx].to(device), y[idx].to(device))
    return batches


class ModelSGDStep:
    """One SGD step on ``model``'s parameters with ``opt`` (a :class:`LocalStep`).

    Hooks: ``loss_fn(xb, yb)`` (default: the task loss of ``model(xb)``; FedMRL: the
    summed loss of its two heads), ``grad_masks`` (parameter name -> float mask, applied
    to the gradients after backward, or inside the step for plain SGD), ``terms``
    (:func:`_term_plan`: proximal pulls, SCAFFOLD's correction). The step clips the
    gradients (``settings.clip_grad_norm``) and steps ``opt``; the optimiser's state is
    the caller's (masked local training resets it per job, FedMRL restores a client's).
    :attr:`total` sums the batch losses (a tensor on the model's device)."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, settings: TrainSettings,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 grad_masks: dict[str, torch.Tensor] | None = None, terms: list[tuple[Any, ...]] | None = None) -> None:
        refs = model_refs(model)
        params = refs.params
        self.model, self.opt, self.settings = model, opt, settings
        self.loss_fn = loss_fn if loss_fn is not None else self._task_loss
        self.grad_masks = [(params[name], m) for name, m in (grad_masks or {}).items()]
        self.by_param = {id(p): m for p, m in self.grad_masks}
        self.terms = terms or []
        refs.train(model)  # model.train(), unless every module trains already
        self.device = _device(refs)
        self.total = torch.zeros((), device=self.device)
        plain = not settings.momentum and not settings.weight_decay \
            and settings.clip_grad_norm is None  # clipping needs the masked gradient's norm first
        # plain SGD with masks: the mask is applied in the step, one pass per parameter
        # (p - lr * g * m), instead of masking the gradient first and stepping after
        self.fused = plain and bool(self.grad_masks)
        # plain SGD without masks on the CPU: the very update torch.optim.SGD makes there
        # (p.add_(g, alpha=-lr), one tensor at a time), without its per-step bookkeeping
        self.bare = plain and not self.grad_masks and self.device.type == "cpu" and _plain_sgd(opt)
        self.opt_params = [p for group in opt.param_groups for p in group["params"]]
        self.own_zero_grad = type(opt).zero_grad is torch.optim.Optimizer.zero_grad

    def _task_loss(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        s = self.settings
        return task_loss(self.model(xb), yb, s.task, s.loss, s.pad_index)

    def __call__(self, xb: torch.Tensor, yb: torch.Tensor) -> None:
        if self.own_zero_grad:  # opt.zero_grad(set_to_none=True)
            for p in self.opt_params:
                p.grad = None
        else:
            self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(xb, yb)
        loss.backward()
        if not self.fused:
            for p, m in self.grad_masks:
                if p.grad is not None:  # a layer outside this forward pass has no gradient
                    p.grad.mul_(m)
        for p, m, anchor, corr, mu in self.terms:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            g = p.grad
            if mu:
                g = proximal_gradient(g, p.detach(), anchor, mu, m)
            if corr is not None:  # SCAFFOLD: g - c_i + c, the correction c - c_i given whole
                g = g + corr if m is None else (g + corr) * m
            p.grad = g
        clip_gradients(self.model, self.settings.clip_grad_norm)
        if self.fused or self.bare:
            _masked_sgd_step(self.opt, self.by_param, self.settings.lr)
        else:
            self.opt.step()
        self.total += loss.detach()


def flat_grad(model: nn.Module, space: ParamSpace) -> torch.Tensor:
    """``model``'s gradients as one flat vector in ``space``'s layout (zero where a
    parameter has none)."""
    named = dict(model.named_parameters())
    return torch.cat([(named[p.name].grad if named[p.name].grad is not None
                       else torch.zeros(p.shape, device=named[p.name].device)).reshape(-1) for p in space.params])


def flat_backward(model: nn.Module, space: ParamSpace, params: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor,
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward/backward of ``model`` at the flat weights ``params``: loads them, clears the
    gradients, computes ``loss_fn(model(xb), yb)`` and returns ``(flat gradient, loss,
    model output)``. The gradient step of trainers that move a flat vector (FjORD, FIARSE)."""
    space.load(model, params)
    for q in model.parameters():
        q.grad = None
    out = model(xb)
    loss = loss_fn(out, yb)
    loss.backward()
    return flat_grad(model, space), loss, out


class FlatSGD:
    """SGD on a flat weight vector ``w`` (FjORD, FIARSE): :meth:`step` clips the gradient
    (:func:`clip_flat`), adds weight decay, momentum, and moves ``w``.

    Why not :class:`ModelSGDStep`'s ``torch.optim.SGD``: these trainers compute their
    update in separate roundings (``w - lr * g``, ``g + wd * w``, one norm over the whole
    vector), while ``torch.optim.SGD`` fuses them (``p.add_(g, alpha=-lr)`` and
    ``g.add(p, alpha=wd)`` are fused multiply-adds on the CPU) and
    ``clip_grad_norm_`` takes the norm of per-tensor norms; the results would differ in
    the last bits, so the runs of these baselines would not be reproduced. (They also sum
    their batch losses as Python floats, where :class:`ModelSGDStep` sums a float32
    tensor: the reported loss would change too.) They share the rest of the loop: the
    batches (:func:`run_local_steps`) and the forward/backward (:func:`flat_backward`)."""

    def __init__(self, w: torch.Tensor, settings: TrainSettings) -> None:
        self.w, self.settings = w, settings
        self.momentum = torch.zeros_like(w)

    def step(self, grad: torch.Tensor, decay_mask: torch.Tensor | None = None,
             step_mask: torch.Tensor | None = None) -> None:
        """``w <- w - lr * g`` with ``g`` clipped, plus ``weight_decay * w`` (times
        ``decay_mask``), through momentum; the step is multiplied by ``step_mask``."""
        s = self.settings
        grad = clip_flat(grad, s.clip_grad_norm)
        if s.weight_decay:
            decay = s.weight_decay * self.w
            grad = grad + (decay if decay_mask is None else decay * decay_mask)
        if s.momentum:
            self.momentum = s.momentum * self.momentum + grad
            grad = self.momentum
        update = s.lr * grad
        self.w = self.w - (update if step_mask is None else update * step_mask)


def _device(refs: Any) -> torch.device:
    """The device of the model's first parameter (or buffer); the CPU for an empty model
    (:func:`fedgmr.device.module_device`)."""
    for t in refs.params.values():
        return t.device
    for t in refs.buffers.values():
        return t.device
    return torch.device("cpu")


def _plain_sgd(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` is a ``torch.optim.SGD`` whose step on the CPU is
    ``p.add_(g, alpha=-lr)`` for each parameter with a gradient (no momentum, no weight
    decay, not maximising, no foreach or fused kernel, a float learning rate)."""
    if type(opt) is not torch.optim.SGD:
        return False
    return all(not g["momentum"] and not g["weight_decay"] and not g.get("maximize") and not g.get("foreach")
               and not g.get("fused") and not g.get("differentiable") and isinstance(g["lr"], float)
               for g in opt.param_groups)


def clip_gradients(model: nn.Module, max_norm: float | None) -> None:
    """``torch.nn.utils.clip_grad_norm_`` over ``model``'s gradients; ``None`` leaves them."""
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def clip_flat(grad: torch.Tensor, max_norm: float | None) -> torch.Tensor:
    """``grad`` scaled to L2 norm at most ``max_norm``, with the coefficient of
    ``torch.nn.utils.clip_grad_norm_`` (``max_norm / (norm + 1e-6)``, capped at 1); ``None``
    returns it unchanged. For trainers that step a flat vector (FjORD, FIARSE)."""
    if max_norm is None:
        return grad
    coef = torch.clamp(max_norm / (torch.linalg.vector_norm(grad) + 1e-6), max=1.0)
    return grad * coef


@torch.no_grad()
def _masked_sgd_step(opt: torch.optim.Optimizer, masks: dict[int, torch.Tensor], lr: float) -> None:
    """Plain SGD (no momentum, no weight decay) on masked gradients: ``p <- p - lr * g * m``
    in one pass (``addcmul``) for the partly masked parameters, ``p <- p - lr * g`` (as
    ``torch.optim.SGD``) for the rest. A pruned coordinate (0, with m = 0) stays exactly 0.
    ``m`` is 0/1, so a gradient already on the mask gives the same step; the result may
    differ from ``SGD.step`` on the masked gradient in the last bit (two roundings, not one).
    Measured: 4.0-5.1 ms against 7.5-8.9 ms per step on Conv-2's 6.4 M-weight layer."""
    for group in opt.param_groups:
        for p in group["params"]:
            g = p.grad
            if g is None:  # a layer outside this forward pass
                continue
            m = masks.get(id(p))
            if m is None:
                p.add_(g, alpha=-lr)
            else:
                p.addcmul_(g, m, value=-lr)


def _term_plan(space: ParamSpace, params: dict[str, nn.Parameter], plan: dict[str, torch.Tensor],
               start: torch.Tensor, terms: LocalTerms | None) -> list[tuple[Any, ...]]:
    """Per parameter: (param, float mask or None, prox anchor view, correction view, mu)."""
    if terms is None or (not terms.prox_mu and terms.correction is None):
        return []
    anchor = start if terms.prox_anchor is None else terms.prox_anchor
    out = []
    for info in space.params:
        m = plan.get(info.name)
        a = anchor[info.slice].view(info.shape)
        if m is not None:
            a = a * m  # the client received W * m: the pull never reaches pruned coordinates
        corr = None if terms.correction is None else terms.correction[info.slice].view(info.shape)
        out.append((params[info.name], m, a, corr, float(terms.prox_mu)))
    return out
