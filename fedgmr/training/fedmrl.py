"""FedMRL's client half and standalone local training (docs/methods/fedmrl.md).

``fedmrl``: every client trains the shared small model G (the run's global model: sent,
trained, uploaded, averaged like FedAvg's), its own heterogeneous model F_i and its
personal projector P_i on the summed loss of both heads (:mod:`fedgmr.algorithm.mrl`).
F_i (extractor and head), P_i and the client's optimiser state stay on the client: they
are its *state*, which the simulator keeps between jobs, hands to every executor and
saves in checkpoints.

``standalone``: every client trains its own F_i alone and never sends anything (the
paper's "Standalone").

Both need the whole config (the model family, ``fedmrl.*``): the registered client
method binds to it (:meth:`FedMRLClient.bind`) before a run is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn as nn

from fedgmr.algorithm.masks import flops_per_weight
from fedgmr.algorithm.mrl import fuse, matryoshka_logits, mrl_loss
from fedgmr.algorithm.params import ParamSpace, get_buffers, set_buffers
from fedgmr.errors import ConfigError
from fedgmr.models import build_model
from fedgmr.models.rep import is_representation_model
from fedgmr.training.client_base import ClientResult
from fedgmr.training.extras import ExtrasSchema
from fedgmr.training.local import ModelSGDStep, TrainOutcome, run_local_steps
from fedgmr.algorithm.losses import task_loss


@dataclass(frozen=True)
class MRLSpec:
    """The architectures of one FedMRL run: G, each client's F_i and P_i (picklable)."""

    model: str
    options: tuple[tuple[str, Any], ...]
    num_classes: int
    input_shape: tuple[int, ...]
    d1: int
    d2: int
    g_width: float
    widths: tuple[float, ...]
    seed: int

    def _build(self, width: float, rep_dim: int) -> nn.Module:
        # weights are always loaded or seeded explicitly: building leaves the global RNG untouched
        with torch.random.fork_rng(devices=[]):
            return build_model(self.model, self.num_classes, self.input_shape, width=width, rep_dim=rep_dim,
                               **dict(self.options))

    def shared(self) -> nn.Module:
        """G: the shared small homogeneous model (representation size d1)."""
        return self._build(self.g_width, self.d1)

    def width(self, client: int) -> float:
        """F_i's width rate: ``widths[i mod len]`` (round-robin)."""
        return self.widths[client % len(self.widths)]

    def local(self, client: int) -> nn.Module:
        """F_i: client ``client``'s heterogeneous local model (representation size d2)."""
        return self._build(self.width(client), self.d2)

    def projector(self) -> nn.Linear:
        """P_i: ``R^(d1+d2) -> R^d2``."""
        with torch.random.fork_rng(devices=[]):
            return nn.Linear(self.d1 + self.d2, self.d2)

    def reference(self) -> nn.Module:
        """The full-width model of the family (width 1, representation d2): what
        ``network.model_size_mb`` and the flops compute model measure against."""
        return self._build(1.0, self.d2)

    def initial(self, client: int) -> tuple[nn.Module, nn.Module]:
        """F_i and P_i at their initial weights, seeded by (run seed, client)."""
        seed = int(np.random.SeedSequence([self.seed, 0x3A1, client]).generate_state(1, dtype=np.uint32)[0])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            f = build_model(self.model, self.num_classes, self.input_shape, width=self.width(client),
                            rep_dim=self.d2, **dict(self.options))
            return f, nn.Linear(self.d1 + self.d2, self.d2)


def mrl_spec(cfg: Any, data: Any) -> MRLSpec:
    """The spec of ``cfg``; refuses, in one line, masks or widths on G and a model
    without a representation layer."""
    if cfg.submodel.policy != "full":  # G is FedMRL's small model already
        raise ConfigError(f"local.algorithm {cfg.local.algorithm!r} trains the whole shared model on every client: "
                          f"submodel.policy must be 'full', not {cfg.submodel.policy!r} "
                          f"(use method={cfg.local.algorithm})")
    if "rep_dim" in cfg.model.options:
        raise ConfigError("'model.options.rep_dim' is set by FedMRL: use fedmrl.d1 (the shared model G) and "
                          "fedmrl.d2 (each client's local model F_i)")
    m = cfg.fedmrl
    spec = MRLSpec(cfg.model.name, tuple(sorted(cfg.model.options.items())), data.num_classes,
                   tuple(data.input_shape), m.d1, m.d2, m.g_width, tuple(m.widths), cfg.seed)
    try:
        probe = spec.shared()
    except TypeError:
        probe = None
    if probe is None or not is_representation_model(probe):
        raise ConfigError(f"local.algorithm {cfg.local.algorithm!r} needs a representation model (an extractor, "
                          f"a linear head and a rep_dim option, e.g. model.name: rep_cnn), got {cfg.model.name!r}")
    return spec


class MRLNet(nn.Module):
    """A client's whole FedMRL model: G's extractor and head, F_i, P_i. ``forward`` is the
    personal prediction (F_i's head on all of the fused representation); :meth:`heads`
    returns both heads' logits for training."""

    def __init__(self, g: nn.Module, f: nn.Module, projector: nn.Module, d1: int) -> None:
        super().__init__()
        self.g, self.f, self.projector, self.d1 = g, f, projector, d1

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fused = fuse(self.g.extractor(x), self.f.extractor(x), self.projector)
        return matryoshka_logits(fused, self.g.head, self.f.head, self.d1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(x)[1]


def module_macs(model: nn.Module, example: torch.Tensor) -> float:
    """Multiply-accumulates of one forward pass of ``model`` on one sample."""
    space = ParamSpace(model)
    per = flops_per_weight(model, space, example)
    return float(sum(p.numel * per[p.name] for p in space.params))


# ---------------------------------------------------------------------- state
def _put(state: dict[str, torch.Tensor], prefix: str, module: nn.Module) -> None:
    state[prefix] = ParamSpace(module).flatten(module)
    state.update({f"{prefix}_buf/{k}": v for k, v in get_buffers(module).items()})


def _get(state: dict[str, torch.Tensor], prefix: str, module: nn.Module) -> None:
    ParamSpace(module).load(module, state[prefix].to(next(module.parameters()).device))
    set_buffers(module, {k: state[f"{prefix}_buf/{k}"] for k, _ in module.named_buffers()})


def _momentum(opt: torch.optim.SGD, groups: dict[str, list[nn.Parameter]]) -> dict[str, torch.Tensor]:
    """The optimiser's momentum buffers, one flat vector per group (none without momentum)."""
    out = {}
    for name, params in groups.items():
        bufs = [opt.state.get(p, {}).get("momentum_buffer") for p in params]
        if bufs and all(b is not None for b in bufs):
            out[f"opt/{name}"] = torch.cat([b.detach().reshape(-1).clone() for b in bufs])
    return out


def _restore_momentum(opt: torch.optim.SGD, groups: dict[str, list[nn.Parameter]],
                      state: dict[str, torch.Tensor]) -> None:
    for name, params in groups.items():
        flat = state.get(f"opt/{name}")
        if flat is None:
            continue
        offset = 0
        for p in params:
            n = p.numel()
            opt.state[p]["momentum_buffer"] = flat[offset:offset + n].view_as(p).to(p.device).clone()
            offset += n


def _sgd(params: list[nn.Parameter], settings: Any) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)


# ---------------------------------------------------------------------- client methods
@dataclass(frozen=True)
class FedMRLClient:
    """FedMRL's client: G (the job's model) + F_i + P_i trained on ``CE(z_G) + CE(z_F)``.

    State: ``f`` (F_i, head included), ``p`` (P_i), their buffers and, with momentum,
    the optimiser's buffers ``opt/g``, ``opt/f``, ``opt/p`` - one optimiser per client,
    never shared. Unbound (no spec) until :meth:`bind`."""

    spec: MRLSpec | None = None
    stateful: ClassVar[bool] = True
    needs_extras: ClassVar[tuple[str, ...]] = ()
    reply_extras: ClassVar[ExtrasSchema] = ()
    _cache: dict[Any, nn.Module] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def bind(self, cfg: Any, data: Any) -> "FedMRLClient":
        """This method for ``cfg``'s architectures."""
        return type(self)(mrl_spec(cfg, data))

    @property
    def bound(self) -> MRLSpec:
        if self.spec is None:
            raise RuntimeError(f"{type(self).__name__} is not bound to a config (call bind(cfg, data))")
        return self.spec

    # the run's wiring (fedgmr.experiment.build)
    def shared_model(self) -> nn.Module:
        """The run's global model: G."""
        return self.bound.shared()

    def reference_numel(self) -> int:
        return ParamSpace(self.bound.reference()).numel

    def job_work(self, client: int, example: torch.Tensor) -> float:
        """A job's multiply-accumulates relative to the reference model's: G + F_i + P_i."""
        s = self.bound
        f, p = s.initial(client)
        return (module_macs(s.shared(), example) + module_macs(f, example) + p.in_features * p.out_features) \
            / module_macs(s.reference(), example)

    def _modules(self, client: int, device: torch.device, state: dict[str, torch.Tensor]) -> tuple[nn.Module, ...]:
        """F_i and P_i with the client's weights (its initial ones before its first job);
        module objects are reused per width in this process, their weights always loaded."""
        s = self.bound
        key = ("f", s.width(client))
        if key not in self._cache:
            self._cache[key] = s.local(client)
        if "p" not in self._cache:
            self._cache["p"] = s.projector()
        f, p = self._cache[key].to(device), self._cache["p"].to(device)
        if "f" not in state:  # first contact
            f0, p0 = s.initial(client)
            state = {}
            _put(state, "f", f0)
            _put(state, "p", p0)
        _get(state, "f", f)
        if "p" in state:  # standalone keeps no projector
            _get(state, "p", p)
        return f, p

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult:
        if job.mask is not None:
            raise ValueError("FedMRL trains the whole shared model: its jobs carry no mask")
        settings, g, device = workload.settings, workload.model, workload.device
        workload.space.load(g, job.start)
        set_buffers(g, job.buffers)
        state = job.state or {}
        f, p = self._modules(job.client_id, device, state)
        groups = {"g": list(g.parameters()), "f": list(f.parameters()), "p": list(p.parameters())}
        opt = _sgd([q for ps in groups.values() for q in ps], settings)
        _restore_momentum(opt, groups, state)
        net = MRLNet(g, f, p, self.bound.d1)
        loss_sum, steps, bs = _run_steps(net, opt, x, y, settings, job.seed,
                                         lambda xb, yb: mrl_loss(*net.heads(xb), yb, settings.task, settings.loss,
                                                                 settings.pad_index))
        new: dict[str, torch.Tensor] = {"client": torch.tensor([job.client_id], dtype=torch.int64)}
        _put(new, "f", f)
        _put(new, "p", p)
        new.update(_momentum(opt, groups))
        out = TrainOutcome(workload.space.flatten(g), get_buffers(g), loss_sum / max(steps, 1), len(y), None,
                           steps * bs, steps)
        return ClientResult(out, new)

    def personal_model(self, model: nn.Module, space: ParamSpace, params: torch.Tensor,
                       buffers: dict[str, torch.Tensor],
                       state: dict[str, torch.Tensor]) -> tuple[Any, Any]:
        """The client's MRLNet with the current global G (before its first job: G with its
        own head, the global model), as ``(module, None)``."""
        if "f" not in state:
            return params, buffers
        s = self.bound
        g = s.shared().to(params.device)
        space.load(g, params)
        set_buffers(g, buffers)
        f, p = s.local(state_client(state)), s.projector()
        f, p = f.to(params.device), p.to(params.device)
        _get(state, "f", f)
        _get(state, "p", p)
        return MRLNet(g, f, p, s.d1), None


@dataclass(frozen=True)
class StandaloneClient(FedMRLClient):
    """Standalone training: client i trains its own F_i (``fedmrl.widths``) alone, from
    its own initial weights, and sends nothing (the server half keeps every coordinate
    local). State: ``f``, its buffers, ``opt/f``."""

    def job_work(self, client: int, example: torch.Tensor) -> float:
        s = self.bound
        return module_macs(s.initial(client)[0], example) / module_macs(s.reference(), example)

    def train(self, workload: Any, job: Any, x: torch.Tensor, y: torch.Tensor,
              val: tuple[torch.Tensor, torch.Tensor] | None) -> ClientResult:
        settings = workload.settings
        state = job.state or {}
        f, _ = self._modules(job.client_id, workload.device, state)
        groups = {"f": list(f.parameters())}
        opt = _sgd(groups["f"], settings)
        _restore_momentum(opt, groups, state)
        loss_sum, steps, bs = _run_steps(f, opt, x, y, settings, job.seed,
                                         lambda xb, yb: task_loss(f(xb), yb, settings.task, settings.loss,
                                                                  settings.pad_index))
        new: dict[str, torch.Tensor] = {"client": torch.tensor([job.client_id], dtype=torch.int64)}
        _put(new, "f", f)
        new.update(_momentum(opt, groups))
        # nothing of the global model changes, and nothing is sent (no coordinate, no buffer)
        out = TrainOutcome(job.start, dict(job.buffers), loss_sum / max(steps, 1), len(y), None, steps * bs, steps)
        return ClientResult(out, new, send_buffers=())

    def personal_model(self, model: nn.Module, space: ParamSpace, params: torch.Tensor,
                       buffers: dict[str, torch.Tensor],
                       state: dict[str, torch.Tensor]) -> tuple[Any, Any]:
        """F_i, as ``(module, None)`` (before the client's first job: the untouched
        initial global model)."""
        if "f" not in state:
            return params, buffers
        f = self.bound.local(state_client(state)).to(params.device)
        _get(state, "f", f)
        return f, None


def state_client(state: dict[str, torch.Tensor]) -> int:
    """The client a state belongs to (stored with it: F_i's width depends on it)."""
    return int(state["client"][0])


def _run_steps(module: nn.Module, opt: torch.optim.SGD, x: torch.Tensor, y: torch.Tensor, settings: Any, seed: int,
               loss_fn: Any) -> tuple[float, int, int]:
    """``settings.local_steps`` SGD steps through the one client loop
    (:func:`~fedgmr.training.local.run_local_steps`, batches drawn as masked local
    training draws them) with ``loss_fn`` as the loss hook and ``opt``'s state kept (the
    client's momentum); returns (loss sum, steps, batch size)."""
    step = ModelSGDStep(module, opt, settings, loss_fn=loss_fn)
    batches = run_local_steps(x, y, settings.batch_size, seed, settings.local_steps, step.device, step)
    return float(step.total), settings.local_steps, batches.bs


__all__ = ["MRLSpec", "MRLNet", "FedMRLClient", "StandaloneClient", "mrl_spec", "module_macs"]
