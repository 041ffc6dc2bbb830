"""The FedGMR server strategy: masked sub-models on a density ladder, a staleness-aware
update buffer, a pluggable aggregation rule and Gradual Model Restoration.

The strategy is runtime-agnostic: the virtual-clock simulator, Ray workers and the
Flower ServerApp all drive it through the same four calls -- :meth:`assign`,
:meth:`receive`, :meth:`aggregate` and the restoration hooks.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Sequence

import torch

from fedgmr.algorithm.aggregation import AggregationRule, average_buffers, coverage_counts
from fedgmr.algorithm.coverage import CoverageWindow, aggregation_coverage
from fedgmr.algorithm.maskinfo import frozen, mask_count, memo
from fedgmr.algorithm.params import ParamSpace, all_finite
from fedgmr.algorithm.policies import SubmodelPolicy
from fedgmr.algorithm.restoration import DensityLadder, EarlyStopping, RestorationTrigger
from fedgmr.algorithm.staleness import StalenessFn
from fedgmr.errors import InvalidUpdateError
from fedgmr.strategy.influence import BoundStats, InfluenceBounds
from fedgmr.strategy.messages import Assignment, Reply, StepReport, Wire
from fedgmr.strategy.plugins import ServerPlugin, implements, plugin_conflict
from fedgmr.strategy.restoration import Restoration
from fedgmr.strategy.update import Update
from fedgmr.training.extras import ExtrasSchema, ExtraSpec, merge_schemas, validate_extras

log = logging.getLogger(__name__)


#: how buffered BatchNorm statistics from sub-models fold into the global ones
BN_RULES = ("full", "density", "all")
#: what an update's weight beta counts besides its staleness factor
WEIGHTINGS = ("samples", "processed", "equal")
def _is_variance(name: str) -> bool:
    return name.endswith("running_var")


class MaskedBufferedStrategy:
    """Server logic of FedGMR and of every method expressible as its special case
    (FedAvg: full policy, arrivals only; FedAsync: full policy, mixing rule, K = 1).

    Parameters
    ----------
    space, params, buffers: parameter layout, initial flat weights and buffers.
    policy: sub-model policy (one mask per ladder level).
    ladder: the clients' density levels (restoration moves them up).
    rule: aggregation rule (MA, GA, FA or FedAsync mixing).
    staleness: s(tau).
    weighting: ``samples`` (beta = the client's training-set size x s(tau)), ``processed``
        (samples its local steps went through x s(tau)) or ``equal`` (beta = s(tau)).
    use_buffer: aggregate the latest update of every client (True) or arrivals only. A rule
        that consumes deltas applies each delta once and cannot use the buffer (ValueError).
    max_staleness: drop buffered updates older than this many steps (None: keep).
    fedasync_alpha: base mixing rate of the FedAsync rule.
    trigger: when restoration fires; ``client_patience`` enables per-client monitors.
    bn_rule: BatchNorm running statistics of the aggregated updates: ``full`` (only
        full-density clients' statistics; previous ones kept when none was aggregated),
        ``density`` (weights beta x density) or ``all`` (weights beta). A sub-model's
        statistics describe the sub-model's activations, not the full model's.
    bn_stats: ``bn_stats(params) -> buffers`` re-estimates the statistics on the server
        after every aggregation (overrides ``bn_rule``; the baselines' static BN).

    Bounds on one client's influence (all off by default; see docs/distributed.md), the
    :class:`~fedgmr.strategy.influence.InfluenceBounds` part (:attr:`influence`) every
    accepted reply passes through:

    client_samples: each client's training-set size as the server knows it; the
        ``samples`` weight uses it and ignores the size a reply claims.
    max_samples: where ``client_samples`` is not given, a claimed ``num_samples`` above
        this is capped to it.
    max_processed: the same cap on ``num_processed`` (local steps x batch size).
    max_update_norm: L2 bound on an update - the change from the model the client was
        dispatched on its mask (for a delta rule, the delta) together with the change of
        its floating-point buffers. A larger update is *clipped* to the bound (scaled
        down, direction kept), counted in ``bounds.clipped`` and logged.
    norm_multiple: adaptive bound: ``norm_multiple`` x the median norm of the last
        ``influence.NORM_WINDOW`` accepted updates (before ``influence.NORM_MIN_HISTORY``
        updates were accepted: the norm of what the client was sent). With ``max_update_norm``
        too, the smaller bound applies.

    reply_extras: what a reply carries beside its values (the client method's
        ``reply_extras``, :mod:`fedgmr.training.extras`), merged with the class's own
        :attr:`reply_extras` and the plug-ins'; a reply that breaks it is rejected with
        the spec's message.
    plugins: what a method adds to the server step (:mod:`fedgmr.strategy.plugins`:
        SCAFFOLD's control variate, FedNova's step, FedDF's distillation, ...), each hook
        called in this order; two that both replace the server step or the fusion are
        refused (ValueError, one line).
    """

    #: reply extras every instance of the class checks (a subclass's own server half)
    reply_extras: ExtrasSchema = ()

    def __init__(self, space: ParamSpace, params: torch.Tensor, buffers: dict[str, torch.Tensor],
                 policy: SubmodelPolicy, ladder: DensityLadder, rule: AggregationRule,
                 staleness: StalenessFn, weighting: str = "samples", use_buffer: bool = True,
                 max_staleness: int | None = None, fedasync_alpha: float = 0.6,
                 trigger: RestorationTrigger | None = None, client_patience: int | None = None,
                 client_min_delta: float = 0.0, bn_rule: str = "full",
                 bn_stats: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None,
                 client_samples: Sequence[int] | None = None, max_samples: int | None = None,
                 max_processed: int | None = None, max_update_norm: float | None = None,
                 norm_multiple: float | None = None, local_coords: torch.Tensor | None = None,
                 reply_extras: Sequence[ExtraSpec] = (), plugins: Sequence[ServerPlugin] = ()) -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        if bn_rule not in BN_RULES:
            raise ValueError(f"bn_rule must be one of {BN_RULES}, got {bn_rule!r}")
        if use_buffer and rule.consumes == "delta":
            raise ValueError(f"aggregation rule {rule.name!r} applies each delta once and cannot use the "
                             f"buffer: set aggregation.buffer to false")
        if use_buffer and rule.sequential:
            raise ValueError(f"aggregation rule {rule.name!r} mixes each arrival once and cannot use the "
                             f"buffer: set aggregation.buffer to false")
        self.space = space
        self.params = params.detach().clone().float()
        #: where the global model, its buffers, the masks and every aggregation live (the
        #: device of ``params``); replies from elsewhere are moved here when received
        self.device = self.params.device
        self.buffers = {k: v.to(self.device, copy=True) for k, v in buffers.items()}
        self.policy = policy
        self.ladder = ladder
        self.rule = rule
        self.staleness = staleness
        self.weighting = weighting
        self.use_buffer = use_buffer
        self.bn_rule = bn_rule
        self.bn_stats = bn_stats
        self.max_staleness = max_staleness
        self.fedasync_alpha = fedasync_alpha
        #: Gradual Model Restoration: when clients move up the ladder
        self.restoration = Restoration(ladder, trigger, client_patience, client_min_delta)
        self.version = 0
        self._outstanding: dict[int, Assignment] = {}
        self._buffer: dict[int, Update] = {}
        self._arrivals: list[int] = []
        self._pending: dict[int, Update] = {}
        self._last_used_masks: list[torch.Tensor] = []
        self._last_used_densities: list[float] = []  # the ladder density each was dispatched at
        self._held: dict[int, torch.Tensor] = {}  # the mask each client last received
        #: coverage over the last aggregations (:meth:`track_coverage`; None: off)
        self.coverage_window: CoverageWindow | None = None
        self.rejected = 0
        #: the bounds on one client's influence, applied to every accepted reply
        self.influence = InfluenceBounds(self.num_clients, client_samples, max_samples, max_processed,
                                         max_update_norm, norm_multiple)
        if bn_stats is not None:
            self.buffers = bn_stats(self.params)
        #: coordinates that stay on the clients (FedBN's BatchNorm layers): never uploaded,
        #: never aggregated; the global values there stay as they are
        self.local_coords = None if local_coords is None else local_coords.to(self.device, torch.bool)
        conflict = plugin_conflict(plugins)
        if conflict is not None:
            raise ValueError(conflict)
        #: what the method adds to the server step (bound to this strategy, in order)
        self.plugins: tuple[ServerPlugin, ...] = tuple(plugins)
        #: the extras every reply must carry (:func:`~fedgmr.training.extras.validate_extras`)
        self.reply_extras = merge_schemas(type(self).reply_extras, reply_extras,
                                          *(p.reply_extras for p in self.plugins))
        for p in self.plugins:
            p.bind(self)

    def plugin(self, kind: type[ServerPlugin]) -> Any:
        """The plug-in of class ``kind`` (KeyError when there is none)."""
        for p in self.plugins:
            if isinstance(p, kind):
                return p
        raise KeyError(f"no {kind.__name__} plug-in on this strategy")

    # ------------------------------------------------------------------ dispatch
    @property
    def num_clients(self) -> int:
        return len(self.ladder.levels)

    def assign(self, client_id: int) -> Assignment:
        """Prepare client ``client_id``'s next job at the current model version."""
        level = self.ladder.levels[client_id]
        mask = self.policy.client_mask(client_id, level, self.params)
        held = self._held.get(client_id)
        changed = held is None or (held is not mask and not torch.equal(held, mask))
        a = self._assignment(client_id, self.version, level, self.ladder.ladder[level], mask, changed)
        self._outstanding[client_id] = a
        self._held[client_id] = mask
        self.influence.dispatched(client_id, (self.params, self.buffers))
        for p in self.plugins:
            p.on_assign(a)
        return a

    def _assignment(self, client_id: int, version: int, level: int, density: float, mask: torch.Tensor,
                    changed: bool) -> Assignment:
        """An assignment (also rebuilt for outstanding jobs when a checkpoint is loaded),
        as the plug-ins shape what travels with it."""
        a = Assignment(client_id, version, level, density, mask, self.rule.consumes, changed,
                       Wire(reply_coords=self.upload_mask(mask)))
        for p in self.plugins:
            a = p.wire(a)
        return a

    def job(self, client_id: int) -> Assignment | None:
        """The outstanding assignment of ``client_id`` (None: none)."""
        return self._outstanding.get(client_id)

    def held_masks(self) -> list[torch.Tensor]:
        """The mask each client last received (its level's mask before its first job)."""
        return [self._held.get(c, self.policy.mask(self.ladder.levels[c])) for c in range(self.num_clients)]

    @property
    def incoming(self) -> dict[int, Update]:
        """The accepted updates waiting for the next step, by client (a copy): the buffer,
        or without one the arrivals of this step."""
        return dict(self._incoming)

    def upload_mask(self, mask: torch.Tensor) -> torch.Tensor | None:
        """The coordinates a client with ``mask`` uploads (None: all of ``mask``); one
        tensor per mask object, so level masks keep sharing their cached facts."""
        if self.local_coords is None:
            return None
        local = self.local_coords
        return memo(mask, ("upload", id(local)), lambda: frozen(mask & ~local))

    @property
    def bounds(self) -> BoundStats:
        """How often the bounds on influence acted."""
        return self.influence.stats

    @property
    def median_update_norm(self) -> float | None:
        """Median norm of the recent accepted updates (None until one was measured: only
        measured while a norm bound is on)."""
        return self.influence.median_update_norm

    @property
    def bounds_norm(self) -> bool:
        """Whether updates are norm-bounded (fixed or adaptive)."""
        return self.influence.norm_on

    def densities(self) -> list[float]:
        """Current density of every client (prunable coordinates of its mask)."""
        return self.ladder.densities()

    # ------------------------------------------------------------------ replies
    def full_values(self, e: Update) -> torch.Tensor:
        """Client ``e``'s trained model as a full vector: its values on its mask, the
        global model it was sent elsewhere."""
        if e.values.numel() == self.params.numel():
            return e.values
        out = self.params.clone()
        out[e.mask] = e.values
        return out

    @property
    def _incoming(self) -> dict[int, Update]:
        """Where an accepted reply waits for the next step: the buffer (kept across steps)
        or, without one, the arrivals of this step only."""
        return self._buffer if self.use_buffer else self._pending

    def reject(self, client_id: Any, reason: str) -> bool:
        """Count and log one rejected reply (``rejected update from client 3: <reason>``);
        returns False, what :meth:`receive` returns for it. Every strategy's own checks of a
        reply's extras reject through here; the line goes to the logger of the strategy's own
        module (what a runtime collects from it)."""
        self.rejected += 1
        logging.getLogger(type(self).__module__).warning("rejected update from client %s: %s", client_id, reason)
        return False

    def receive(self, reply: Reply) -> bool:
        """Validate and store a reply. Invalid replies are logged and rejected; they
        never touch the global model. Returns True when accepted.

        The strategy keeps ``reply.values`` as they are (float32): do not modify them
        afterwards."""
        for p in self.plugins:
            reply = p.prepare(reply)
        try:
            entry = self._validate(reply)
        except InvalidUpdateError as exc:
            return self.reject(reply.client_id, str(exc))
        del self._outstanding[reply.client_id]
        self.influence.settled(reply.client_id)
        self._incoming[entry.client_id] = entry
        if entry.client_id not in self._arrivals:
            self._arrivals.append(entry.client_id)
        for p in self.plugins:
            p.on_accept(entry)
        return True

    def _validate(self, reply: Reply) -> Update:
        if isinstance(reply.client_id, bool) or not isinstance(reply.client_id, int) \
                or not 0 <= reply.client_id < self.num_clients:  # True is not client 1
            raise InvalidUpdateError(f"unknown client id {reply.client_id!r}")
        a = self._outstanding.get(reply.client_id)
        if a is None:
            raise InvalidUpdateError("no job is outstanding for this client")
        extras = self._check_extras(reply, a)  # before the rest, as each method's own check always was
        if isinstance(reply.version, bool) or not isinstance(reply.version, int):
            raise InvalidUpdateError(f"model version {reply.version!r} is not an integer")
        if reply.version > self.version:
            raise InvalidUpdateError(f"model version {reply.version} is from the future (server at {self.version})")
        if reply.version != a.version:
            raise InvalidUpdateError(f"model version {reply.version} does not match the dispatched {a.version}")
        if reply.kind != a.consumes:
            raise InvalidUpdateError(f"expected a {a.consumes} update, got {reply.kind}")
        mask = a.reply_mask
        if reply.mask is not None:
            if not isinstance(reply.mask, torch.Tensor) or reply.mask.dtype != torch.bool \
                    or reply.mask.shape != a.mask.shape:
                raise InvalidUpdateError(f"a reported mask must be a bool tensor of shape {tuple(a.mask.shape)}")
            reported = reply.mask.to(self.device)
            outside = reported & ~a.reply_mask
            if bool(outside.any()):
                raise InvalidUpdateError(f"{int(outside.sum())} coordinates outside the client's mask")
            if not bool(reported.any()):  # it would take a step's slot and weight while updating nothing
                raise InvalidUpdateError("the reported mask is empty: the update holds no coordinate")
            mask = reported
        values = reply.values
        kept = mask_count(mask)
        if not isinstance(values, torch.Tensor) or values.ndim != 1 or values.numel() != kept:
            shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
            raise InvalidUpdateError(f"values of shape {shape}; expected ({kept},)")
        if not values.is_floating_point():
            raise InvalidUpdateError(f"values of dtype {values.dtype}; expected floating point")
        # finiteness is checked on what the model will hold: float64 1e300 is inf in float32
        values = values.detach().to(self.device, torch.float32)
        if not all_finite(values):
            raise InvalidUpdateError("values contain NaN or Inf (as float32)")
        for field_name in ("num_samples", "num_processed"):
            ns = getattr(reply, field_name)
            if ns is None and field_name == "num_processed":
                continue
            if isinstance(ns, bool) or not isinstance(ns, (int, float)) or not math.isfinite(ns) or ns <= 0 \
                    or ns != int(ns):
                raise InvalidUpdateError(f"{field_name} must be a positive integer, got {ns!r}")
        buffers = {}
        reply_bufs = reply.buffers if isinstance(reply.buffers, dict) else None
        if reply_bufs is None:
            raise InvalidUpdateError(f"buffers must be a dict, got {type(reply.buffers).__name__}")
        for name in reply_bufs:
            if name not in self.buffers:
                raise InvalidUpdateError(f"unknown buffer {name!r}")
        for name, ref in self.buffers.items():
            b = reply_bufs.get(name)
            if b is None:
                buffers[name] = ref.clone()  # a client that sends no buffers leaves them unchanged
                continue
            if not isinstance(b, torch.Tensor) or b.shape != ref.shape \
                    or b.is_floating_point() != ref.is_floating_point():
                raise InvalidUpdateError(f"buffer {name!r} has a wrong shape or dtype")
            b = b.detach().to(ref.device, ref.dtype)  # checked as the model will hold it
            if not all_finite(b):
                raise InvalidUpdateError(f"buffer {name!r} has non-finite values (as {ref.dtype})")
            if (_is_variance(name) or not b.is_floating_point()) and bool((b < 0).any()):
                raise InvalidUpdateError(f"buffer {name!r} has negative values")
            buffers[name] = b.clone()
        processed = reply.num_processed if reply.num_processed is not None else reply.num_samples
        b = self.influence.bound(reply.client_id, a.consumes, mask, values, buffers, set(reply_bufs),
                                 reply.num_samples, processed, (self.params, self.buffers))
        return Update(reply.client_id, reply.version, mask, b.values, b.num_samples, b.buffers, b.num_processed,
                      a.density, extras)

    def _check_extras(self, reply: Reply, a: Assignment) -> dict[str, torch.Tensor]:
        """The reply's declared extras, checked against :attr:`reply_extras` (the
        values' length: the reported mask's count when one is given, else the assignment's
        reply coordinates)."""
        if not self.reply_extras:
            return {}
        coords = a.reply_mask if reply.mask is None else reply.mask
        n = mask_count(coords) if isinstance(coords, torch.Tensor) and coords.dtype == torch.bool else -1
        extras = validate_extras(self.reply_extras, reply.extras, n, a.wire.reply_plain, self.device)
        self._check_extra_values(reply.client_id, extras)
        return extras

    def _check_extra_values(self, client_id: int, extras: dict[str, torch.Tensor]) -> None:
        """The plug-ins' own tests of a reply's checked extras (raise InvalidUpdateError;
        a bound only the server knows, e.g. FedNova's most local steps)."""
        for p in self.plugins:
            p.check_extras(client_id, extras)

    # ------------------------------------------------------------------ aggregation
    @property
    def arrivals(self) -> list[int]:
        """Clients whose update arrived since the last aggregation (in order)."""
        return list(self._arrivals)

    def _beta(self, e: Update, s: float) -> float:
        if self.rule.sequential:
            return self.fedasync_alpha * s
        if self.weighting == "samples":
            return s * e.num_samples
        if self.weighting == "processed":
            return s * e.num_processed
        return s

    def aggregate(self) -> StepReport:
        """One server step: fold the selected updates into the global model.

        A sequential rule (FedAsync) mixes one arrival per step, with its own staleness;
        later arrivals wait for the next steps."""
        source = self._incoming
        if self.use_buffer:
            entries = list(source.values())
        else:
            entries = [source[c] for c in self._arrivals if c in source]
        if self.rule.sequential:
            entries = entries[:1]
        consumed = {e.client_id for e in entries} if self.rule.sequential else None
        used: list[Update] = []
        taus: list[int] = []
        weights: list[float] = []
        for e in entries:
            tau = self.version - e.version
            if self.max_staleness is not None and tau > self.max_staleness:
                continue
            w = self._beta(e, self.staleness(tau))
            used.append(e)
            taus.append(tau)
            weights.append(w)
        if self.use_buffer and self.max_staleness is not None:
            for cid in [c for c, e in self._buffer.items() if self.version - e.version > self.max_staleness]:
                del self._buffer[cid]
        if used:
            stepper = next((p for p in self.plugins if implements(p, "step_models")), None)
            new = self.aggregate_model(self.params, self.buffers, used, weights, fuse=True) if stepper is None \
                else stepper.step_models(used, weights)  # models of its own (cluster routing)
            if new is not None:
                self.params, self.buffers = new
            else:  # last resort (validated updates should never get here): keep the model
                log.error("aggregation at step %d gave non-finite weights; the model is kept and the %d "
                          "updates used are dropped", self.version, len(used))
                for e in used:
                    self._buffer.pop(e.client_id, None)
                    self._pending.pop(e.client_id, None)
                self.rejected += len(used)
                used, taus, weights = [], [], []
        if self.bn_stats is not None:
            self.buffers = self.bn_stats(self.params)
        self._last_used_masks = [e.mask for e in used]
        self._last_used_densities = [e.density for e in used]
        if self.coverage_window is not None:
            self.coverage_window.add(self._last_used_masks)
        self.policy.observe(self._last_used_masks)
        self.version += 1
        self.policy.refresh(self.version, self.params)
        report = StepReport(self.version, [e.client_id for e in used], taus, weights, self.rejected)
        if consumed is None:
            self._arrivals.clear()
            self._pending.clear()
        else:
            self._arrivals = [c for c in self._arrivals if c not in consumed]
            for c in consumed:
                self._pending.pop(c, None)
        for p in self.plugins:
            report = p.after_aggregate(report)
        return report

    def aggregate_model(self, params: torch.Tensor, buffers: dict[str, torch.Tensor], used: list[Update],
                        weights: list[float], fuse: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
        """One model's aggregation step: the rule applied to ``used`` (weights ``weights``)
        from ``params``, the server step, the BatchNorm statistics folded from ``buffers``
        (kept as they are when ``bn_stats`` re-estimates them) and, with ``fuse``, the
        plug-ins' fusion. Returns the new (params, buffers), or None when they are not
        finite. The global step applies it to the global model; a plug-in with models of
        its own (cluster routing) to each of them."""
        # rules return a new tensor: params are replaced, never mutated in place, so
        # in-flight jobs may share the old vector without copying it
        new_params = self._server_step(params, self.rule(params, [(e.mask, e.values) for e in used], weights))
        new_buffers = self._fold_buffers(used, weights, buffers) if self.bn_stats is None else buffers
        if fuse:
            new_params, new_buffers = self._fuse(new_params, new_buffers, used)
        return (new_params, new_buffers) if self._finite(new_params, new_buffers) else None

    def _fuse(self, params: torch.Tensor, buffers: dict[str, torch.Tensor],
              used: list[Update]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The aggregated model after server-side fusion (a plug-in may distil it from the
        updates used, e.g. FedDF); returns new tensors or the ones given."""
        for p in self.plugins:
            params, buffers = p.fuse(params, buffers, used)
        return params, buffers

    def _server_step(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """The new global model from the rule's result (a plug-in may scale the step,
        e.g. SCAFFOLD's server learning rate); returns a new tensor."""
        for p in self.plugins:
            if implements(p, "server_step"):
                return p.server_step(old, new)
        return new

    @staticmethod
    def _finite(params: torch.Tensor, buffers: dict[str, torch.Tensor]) -> bool:
        return all_finite(params) and all(all_finite(b) for b in buffers.values())

    def _fold_buffers(self, used: list[Update], weights: list[float],
                      base: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """BatchNorm statistics after an aggregation, by :attr:`bn_rule`, from ``base``
        (None: the global model's; a clustered method passes a cluster model's)."""
        base = self.buffers if base is None else base
        if not base:
            return base
        if self.rule.sequential:  # FedAsync: the statistics are mixed like the weights
            out = {k: v.clone() for k, v in base.items()}
            for e, a in zip(used, weights):
                out = average_buffers([out, e.buffers], [1.0 - a, a], out)
            return out
        if self.bn_rule == "full":
            pairs = [(e, w) for e, w in zip(used, weights) if e.density >= 1.0]
            if not pairs:
                return base
            return average_buffers([e.buffers for e, _ in pairs], [w for _, w in pairs], base)
        if self.bn_rule == "density":
            return average_buffers([e.buffers for e in used], [w * e.density for e, w in zip(used, weights)],
                                   base)
        return average_buffers([e.buffers for e in used], weights, base)

    def client_models(self, version: int | None = None) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]] | None:
        """Each client's own model at model ``version`` as a plug-in keeps them (cluster
        routing: its cluster's); None: every client's is the global one."""
        for p in self.plugins:
            own = p.client_models(self.version if version is None else version)
            if own is not None:
                return own
        return None

    def record_keys(self, version: int) -> dict[str, Any]:
        """Extra keys for the metrics record of model ``version`` (a clustered method's
        assignments, the plug-ins' keys)."""
        rec: dict[str, Any] = {}
        for p in self.plugins:
            rec.update(p.record_keys(version))
        return rec

    def min_coverage(self) -> int:
        """Minimum coverage index Gamma* of the last aggregation (0 when some coordinate
        was covered by no update)."""
        if not self._last_used_masks:
            return 0
        return int(coverage_counts(self._last_used_masks).min())

    def track_coverage(self, window: int) -> None:
        """Count coverage over the last ``window`` aggregations from now on (the
        ``window_coverage_*`` and ``coverage_never`` keys of :meth:`coverage_stats`)."""
        self.coverage_window = CoverageWindow(self.space.numel, window, self.device)

    def coverage_stats(self) -> dict[str, Any]:
        """Coverage of the last aggregation over the updates it used (record keys of
        :func:`~fedgmr.algorithm.coverage.aggregation_coverage`; groups are the ladder
        densities the aggregated clients were dispatched at), and over the window of
        :meth:`track_coverage` when it is on."""
        out = aggregation_coverage(self._last_used_masks, self._last_used_densities, self.space.numel)
        if self.coverage_window is not None:
            out.update(self.coverage_window.stats())
        return out

    # ------------------------------------------------------------------ restoration
    @property
    def trigger(self) -> RestorationTrigger:
        """When restoration fires (:attr:`restoration`'s trigger)."""
        return self.restoration.trigger

    @property
    def client_monitors(self) -> list[EarlyStopping] | None:
        """The per-client monitors (None: off)."""
        return self.restoration.client_monitors

    def on_validation(self, score: float) -> list[int]:
        """Feed the global model's validation score; returns clients restored."""
        return self.restoration.on_validation(self.version, score)

    def on_time(self, now: float) -> list[int]:
        """Fixed-time restorations that are due at virtual time ``now``."""
        return self.restoration.on_time(now)

    def on_client_validation(self, client_id: int, score: float) -> bool:
        """Per-client monitor: step one client up when its local score plateaus."""
        return self.restoration.on_client_validation(client_id, score)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(JSON-able state, tensors) capturing everything needed to resume.

        Masks are shared between clients of a level, so they are stored once each.
        """
        tensors: dict[str, torch.Tensor] = {"params": self.params}
        tensors.update({f"buffers/{k}": v for k, v in self.buffers.items()})
        mask_ids: dict[int, int] = {}

        def mask_key(m: torch.Tensor) -> int:
            if id(m) not in mask_ids:
                mask_ids[id(m)] = len(mask_ids)
                tensors[f"mask/{mask_ids[id(m)]}"] = m
            return mask_ids[id(m)]

        entries = []
        store = [("b", e) for e in self._buffer.values()] + [("p", e) for e in self._pending.values()]
        for where, e in store:
            key = f"entry/{where}/{e.client_id}"
            tensors[f"{key}/values"] = e.values
            tensors.update({f"{key}/buf/{k}": v for k, v in e.buffers.items()})
            entries.append({"where": where, "client": e.client_id, "version": e.version,
                            "num_samples": e.num_samples, "num_processed": e.num_processed,
                            "density": e.density, "mask": mask_key(e.mask)})
        outstanding = [{"client": cid, "version": a.version, "level": a.level, "density": a.density,
                        "mask": mask_key(a.mask), "mask_changed": a.mask_changed}
                       for cid, a in self._outstanding.items()]
        bounds = self.influence.state_dict(outstanding, tensors)  # and the models outstanding jobs were sent
        held = {str(cid): mask_key(m) for cid, m in self._held.items()}
        last_used = [mask_key(m) for m in self._last_used_masks]  # Gamma* until the next aggregation
        pol_state, pol_tensors = self.policy.state_dict()
        tensors.update({f"policy/{k}": v for k, v in pol_tensors.items()})
        window_state = None
        if self.coverage_window is not None:
            window_state, window_tensors = self.coverage_window.state_dict()
            tensors.update({f"coverage_window/{k}": v for k, v in window_tensors.items()})
        state = {
            "version": self.version, "rejected": self.rejected, "arrivals": list(self._arrivals),
            "entries": entries, "outstanding": outstanding, "held": held, "last_used": last_used,
            "last_used_densities": list(self._last_used_densities),
            **self.restoration.state_dict(), "policy": pol_state, "coverage_window": window_state,
            "bounds": bounds,
        }
        for p in self.plugins:
            p.state_dict(state, tensors)
        return state, tensors

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        """Restore from :meth:`state_dict` output (tensors from any device: a checkpoint
        holds CPU tensors; they are moved to this strategy's device)."""
        tensors = {k: v.to(self.device) for k, v in tensors.items()}
        self.params = tensors["params"].clone()
        self.buffers = {k: tensors[f"buffers/{k}"].clone() for k in self.buffers}
        self.version = int(state["version"])
        self.rejected = int(state["rejected"])
        self._arrivals = [int(c) for c in state["arrivals"]]
        self.restoration.load_state_dict(state)
        self.policy.load_state_dict(state["policy"], {k[7:]: v for k, v in tensors.items() if k.startswith("policy/")})
        if self.coverage_window is not None and state.get("coverage_window") is not None:
            self.coverage_window.load_state_dict(state["coverage_window"], {
                k[len("coverage_window/"):]: v for k, v in tensors.items() if k.startswith("coverage_window/")})
        # share mask objects again: the policy's level masks when equal, else one copy each
        level_masks = [self.policy.mask(l) for l in range(len(self.ladder.ladder))]
        masks: dict[int, torch.Tensor] = {}
        for key, t in tensors.items():
            if key.startswith("mask/"):
                same = next((m for m in level_masks if torch.equal(m, t)), None)
                masks[int(key[5:])] = same if same is not None else t.clone()
        self._buffer.clear()
        self._pending.clear()
        for item in state["entries"]:
            key = f"entry/{item['where']}/{item['client']}"
            e = Update(int(item["client"]), int(item["version"]), masks[int(item["mask"])],
                       tensors[f"{key}/values"].clone(), int(item["num_samples"]),
                       {k: tensors[f"{key}/buf/{k}"].clone() for k in self.buffers},
                       int(item["num_processed"]), float(item["density"]))
            (self._buffer if item["where"] == "b" else self._pending)[e.client_id] = e
        self._held = {int(c): masks[int(k)] for c, k in state["held"].items()}
        self._last_used_masks = [masks[int(k)] for k in state.get("last_used", [])]
        self._last_used_densities = [float(d) for d in state.get(
            "last_used_densities", [mask_count(m) / m.numel() for m in self._last_used_masks])]  # older checkpoints
        self.influence.load_state_dict(state.get("bounds"), state["outstanding"], tensors, (self.params, self.buffers))
        for p in self.plugins:
            p.load_state_dict(state, tensors)
        # rebuilt last: the plug-ins shape what travels with each (SCAFFOLD's c, FedMD's consensus)
        self._outstanding = {
            int(o["client"]): self._assignment(int(o["client"]), int(o["version"]), int(o["level"]),
                                               float(o["density"]), masks[int(o["mask"])], bool(o["mask_changed"]))
            for o in state["outstanding"]
        }


def mean_density(densities: list[float]) -> float:
    return math.fsum(densities) / len(densities) if densities else 0.0
