"""Online extraction policies beside the nested magnitude masks (docs/methods/epm.md).

Each policy scores every coordinate again at every server step (round) and ranks the
prunable ones with :func:`~fedgmr.algorithm.masks.magnitude_ranking` on that score (the
per-layer floor first, ties by position); level ``l`` takes the always-kept coordinates
plus the first :func:`~fedgmr.algorithm.masks.prefix_length` entries, exactly as many as
the magnitude mask of that density (equal bytes). One ranking per round makes the level
masks of a round nested, so IMS increments and GMR's moves up the ladder keep their
meaning; a client's coordinates change from round to round.

* ``random``: uniform scores from a generator seeded by ``(run seed stream, step)``.
* ``rolling``: per prunable layer a cyclic window whose start advances every round by
  the smallest level's share of the layer - FedRolex's rolling window, but over
  coordinates (unstructured), not over output neurons.
* ``coverage_max``: the least recently covered coordinates first, by the decayed
  coverage ``H_k = λ H_{k-1} + Γ_k`` of the updates aggregated; ties by ``|w|``.

``per_client=True`` (``submodel.per_client``) draws every client its own mask at each
dispatch instead of one nested ranking per round, so that the clients of one round cover
different coordinates (EPM's setting): ``random`` seeds its scores with the client too;
``rolling`` starts client ``i``'s windows ``i/C`` of each layer further on (``C``
clients); ``coverage_max`` counts the masks already dispatched since the last aggregation
as planned coverage, so each client takes what the round has least covered so far. The
masks of one round are then not nested, so IMS cannot multicast them.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any, Callable, Sequence

import numpy as np
import torch

from fedgmr.algorithm.aggregation import coverage_counts
from fedgmr.algorithm.maskinfo import frozen
from fedgmr.algorithm.masks import magnitude_ranking, nested_masks, nested_ranked_masks, ranked_mask
from fedgmr.algorithm.params import ParamSpace
from fedgmr.algorithm.policies import POLICIES, SubmodelPolicy
from fedgmr.errors import ConfigError

#: index of the policy stream among the children of the run's ``SeedSequence(seed)``
#: (the simulator's :class:`~fedgmr.experiment.build.Streams` use children 0-3)
POLICY_STREAM = 4


def policy_seed(seed: int) -> int:
    """The extraction policies' seed: an independent child of the run's seed."""
    child = np.random.SeedSequence(seed).spawn(POLICY_STREAM + 1)[POLICY_STREAM]
    return int(child.generate_state(1, dtype=np.uint32)[0])


def random_scores(numel: int, seed: int, step: int, client: int | None = None) -> torch.Tensor:
    """Uniform ``[0, 1)`` scores of round ``step`` (float64, CPU): the same on every device.
    With ``client``, that client's own scores (an independent stream per client and round)."""
    key = [seed, step] if client is None else [seed, step, client]
    return torch.from_numpy(np.random.default_rng(key).random(numel))


def rolling_offset(step: int, layer_numel: int, first_density: float) -> int:
    """Start of a layer's window at round ``step``: ``step x ceil(ρ_1 x n_p) mod n_p``."""
    return (step * max(1, math.ceil(first_density * layer_numel))) % layer_numel


def rolling_scores(space: ParamSpace, step: int, first_density: float, shift: float = 0.0) -> torch.Tensor:
    """Score ``1 - q/n_p`` of the coordinate ``q`` places after its layer's window start
    (``q = (i - offset_p) mod n_p``): every prefix of the ranking takes about the same
    share of each layer, starting at the window. ``shift`` in ``[0, 1)`` moves every
    window start ``floor(shift x n_p)`` further on (a client's own windows)."""
    if not 0.0 <= shift < 1.0:
        raise ValueError(f"shift must be in [0, 1), got {shift}")
    out = torch.zeros(space.numel, dtype=torch.float64)
    for p in space.prunable_layers:
        offset = (rolling_offset(step, p.numel, first_density) + math.floor(shift * p.numel)) % p.numel
        q = (torch.arange(p.numel, dtype=torch.float64) - offset) % p.numel
        out[p.slice] = 1.0 - q / p.numel
    return out


def coverage_scores(space: ParamSpace, history: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Scores ordering the prunable coordinates by (recent coverage ascending, ``|w|``
    descending): ``(R - 1 - rank(H)) + |w| / (2 max|w|)`` with ``rank`` the dense rank of
    ``H`` among the prunable coordinates (``R`` distinct values). Float64."""
    out = torch.zeros(space.numel, dtype=torch.float64, device=history.device)
    layers = space.prunable_layers
    if not layers:
        return out
    h = torch.cat([history[p.slice].double() for p in layers])
    w = torch.cat([params[p.slice].double().abs() for p in layers]).to(h.device)
    values, rank = torch.unique(h, sorted=True, return_inverse=True)
    top = float(w.max()) if w.numel() else 0.0
    frac = w / (2.0 * top) if top > 0 else torch.zeros_like(w)
    score = (values.numel() - 1 - rank).double() + frac
    start = 0
    for p in layers:
        out[p.slice] = score[start:start + p.numel]
        start += p.numel
    return out


class ExtractionPolicy(SubmodelPolicy):
    """Nested level masks from a per-round score (see the module docstring).

    Parameters
    ----------
    space, ladder, params: layout, densities and the initial global model.
    floor: each prunable layer's share that comes first in every ranking.
    basis: what a density counts (``model`` or ``prunable``), as for the magnitude masks.
    seed: the policy's seed (:func:`policy_seed` of the run's seed).
    per_client: draw every client its own mask at each dispatch (:meth:`client_mask`);
        the level masks (:meth:`mask`) stay the round's shared ranking, which the
        diagnostics evaluate.
    num_clients: how many clients share a round (``rolling`` spreads their windows).
    """

    nested = True
    #: can draw every client its own mask (``submodel.per_client``)
    supports_per_client = True
    #: the scores depend on the step only (not on the model or any history)
    step_scores = False

    def __init__(self, space: ParamSpace, ladder: Sequence[float], params: torch.Tensor, floor: float = 0.02,
                 basis: str = "model", seed: int = 0, per_client: bool = False, num_clients: int = 1) -> None:
        super().__init__(space, ladder)
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        self.floor = floor
        self.basis = basis
        self.seed = int(seed)
        self.per_client = bool(per_client)
        self.nested = not self.per_client  # one round's per-client masks are not nested: no IMS
        self.num_clients = int(num_clients)
        self.step = 0
        self._pending: Callable[[], torch.Tensor] | None = None  # the scores of a ranking not built yet
        self._rebuild(params)

    @abstractmethod
    def scores(self, step: int, params: torch.Tensor) -> torch.Tensor:
        """Non-negative scores over all coordinates (higher: kept first)."""

    def client_scores(self, step: int, params: torch.Tensor, client_id: int) -> torch.Tensor:
        """Client ``client_id``'s own scores at round ``step`` (``per_client``)."""
        return self.scores(step, params)

    def client_keys(self, step: int, params: torch.Tensor,
                    client_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The keys ordering client ``client_id``'s coordinates at round ``step``: its
        scores and an optional second key for equal scores (see :func:`ranked_mask`)."""
        return self.client_scores(step, params, client_id), None

    def client_mask(self, client_id: int, level: int, params: torch.Tensor) -> torch.Tensor:
        """The level's shared mask, or with ``per_client`` the client's own mask of the
        level's density (the same number of coordinates: equal bytes)."""
        if not self.per_client:
            return self.mask(level)
        score, tie = self.client_keys(self.step, params, client_id)
        mask = frozen(ranked_mask(score.to(params.device), self.space, self.ladder[level], self.floor, self.basis,
                                  tie))
        self.dispatched(mask)
        return mask

    def dispatched(self, mask: torch.Tensor) -> None:
        """Called with every per-client mask handed out (``coverage_max`` plans with it)."""

    def _rebuild(self, params: torch.Tensor) -> None:
        self._rank(self.scores(self.step, params).to(params.device))

    def _rank(self, score: torch.Tensor) -> None:
        # the level masks by one selection per level (those of the full ranking, bit for
        # bit); the ranking itself is built only when asked for
        self._scored = score.clone()
        self._ranking: torch.Tensor | None = None
        self._masks = [frozen(m) for m in nested_ranked_masks(self._scored, self.space, self.ladder, self.floor,
                                                              self.basis)]

    @property
    def ranking(self) -> torch.Tensor:
        """The round's ranking of the prunable coordinates (the level masks are its
        prefixes), built on first use."""
        if self._pending is not None:
            self.mask(0)
        if self._ranking is None:
            self._ranking = magnitude_ranking(self._scored, self.space, self.floor)
        return self._ranking

    def _deferred_scores(self, step: int, params: torch.Tensor) -> Callable[[], torch.Tensor]:
        """The scores of round ``step``, to compute later: what they read is copied now."""
        if not self.step_scores:
            params = params.clone()
        return lambda: self.scores(step, params).to(params.device)

    def _set_masks(self) -> None:
        assert self._ranking is not None
        self._masks = [frozen(m) for m in nested_masks(self._ranking, self.space, self.ladder, self.floor,
                                                       self.basis)]

    def mask(self, level: int) -> torch.Tensor:
        if self._pending is not None:  # a per-client policy ranks the shared masks when asked
            scores, self._pending = self._pending, None
            self._rank(scores())
        return self._masks[level]

    def refresh(self, step: int, params: torch.Tensor) -> bool:
        """Extract again at every server step (with ``per_client`` the shared ranking is
        built when first asked for, from the round's scores as they were: dispatches do
        not read it)."""
        self.step = int(step)
        if self.per_client:
            self._pending = self._deferred_scores(self.step, params)
        else:
            self._rebuild(params)
        return True

    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        self.mask(0)  # the scores of the current step
        if self._scored is None:  # loaded from an older checkpoint: the ranking is the state
            return {"step": self.step}, {"ranking": self.ranking}
        return {"step": self.step}, {"ranking_scores": self._scored}  # the masks are rebuilt from them

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        self._pending = None
        self.step = int(state["step"])
        device = self._masks[0].device  # a checkpoint's tensors are on the CPU
        if "ranking_scores" in tensors:
            self._rank(tensors["ranking_scores"].to(device))
            return
        # an older checkpoint holds the ranking itself
        self._scored = None
        self._ranking = tensors["ranking"].to(device, copy=True)
        self._set_masks()

    @classmethod
    def config_kwargs(cls, cfg: Any) -> dict[str, Any]:
        """Extra constructor arguments read from the config."""
        return {}

    @classmethod
    def from_config(cls, space: ParamSpace, params: torch.Tensor, model: Any, cfg: Any,
                    width_builder: Any = None) -> "ExtractionPolicy":
        """Build from an :class:`~fedgmr.config.ExperimentConfig` (refusing the
        magnitude-only options)."""
        sub = cfg.submodel
        if sub.cost_weighted or sub.layer_costs is not None:
            raise ConfigError(f"submodel.cost_weighted and submodel.layer_costs rank by |w| / cost and apply to "
                              f"submodel.policy 'magnitude' only, not {cls.name!r}")
        if sub.per_client and cfg.network.ims:
            raise ConfigError(f"submodel.per_client gives every client its own {cls.name!r} mask, which IMS cannot "
                              f"multicast as nested level blocks: set network.ims: false")
        return cls(space, sub.ladder, params, sub.layer_floor, sub.density_basis, policy_seed(cfg.seed),
                   sub.per_client, cfg.clients.num_clients, **cls.config_kwargs(cfg))


class RandomPolicy(ExtractionPolicy):
    """A fresh uniform ranking every round (deterministic in the run's seed)."""

    name = "random"
    step_scores = True

    def scores(self, step: int, params: torch.Tensor) -> torch.Tensor:
        return random_scores(self.space.numel, self.seed, step)

    def client_scores(self, step: int, params: torch.Tensor, client_id: int) -> torch.Tensor:
        return random_scores(self.space.numel, self.seed, step, client_id)


class CoordinateRollingPolicy(ExtractionPolicy):
    """Coordinate-level rolling windows, one per prunable layer."""

    name = "rolling"
    step_scores = True

    def scores(self, step: int, params: torch.Tensor) -> torch.Tensor:
        return rolling_scores(self.space, step, self.ladder[0])

    def client_scores(self, step: int, params: torch.Tensor, client_id: int) -> torch.Tensor:
        return rolling_scores(self.space, step, self.ladder[0], (client_id % self.num_clients) / self.num_clients)


class CoverageMaxPolicy(ExtractionPolicy):
    """The least recently covered coordinates first.

    decay: ``λ`` of the recent coverage ``H_k = λ H_{k-1} + Γ_k`` (0: the last aggregation
    only; 1: every aggregation so far counts the same).

    With ``per_client``, client masks are ranked on ``H_k + P`` where ``P`` counts the
    masks dispatched since the last server step (planned coverage), so each client takes
    the coordinates the round has least covered so far.
    """

    name = "coverage_max"

    def __init__(self, space: ParamSpace, ladder: Sequence[float], params: torch.Tensor, floor: float = 0.02,
                 basis: str = "model", seed: int = 0, per_client: bool = False, num_clients: int = 1,
                 decay: float = 0.9) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        self.decay = float(decay)
        self.history = torch.zeros(space.numel, dtype=torch.float64, device=params.device)
        self.planned = torch.zeros(space.numel, dtype=torch.float64, device=params.device)
        super().__init__(space, ladder, params, floor, basis, seed, per_client, num_clients)

    def scores(self, step: int, params: torch.Tensor) -> torch.Tensor:
        return coverage_scores(self.space, self.history, params)

    def client_scores(self, step: int, params: torch.Tensor, client_id: int) -> torch.Tensor:
        return coverage_scores(self.space, self.history + self.planned, params)

    def client_keys(self, step: int, params: torch.Tensor,
                    client_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`client_scores`' order without ranking ``H + P``: ``-(H + P)``, then
        ``|w|`` for equal coverage (linear; :func:`coverage_scores` sorts)."""
        keys = -(self.history + self.planned)
        return keys, params.detach().abs().to(keys.device, torch.float64)

    def _deferred_scores(self, step: int, params: torch.Tensor) -> Callable[[], torch.Tensor]:
        history, params = self.history.clone(), params.clone()
        return lambda: coverage_scores(self.space, history, params)

    def dispatched(self, mask: torch.Tensor) -> None:
        self.planned += mask.to(self.planned.device, torch.float64)

    def refresh(self, step: int, params: torch.Tensor) -> bool:
        self.planned.zero_()
        return super().refresh(step, params)

    def observe(self, masks: Sequence[torch.Tensor]) -> None:
        """``H <- λ H + Γ`` with ``Γ`` the coverage of the masks aggregated."""
        self.history = self.history * self.decay
        if masks:
            self.history = self.history + coverage_counts(masks).to(self.history.device, torch.float64)

    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        state, tensors = super().state_dict()
        return state, {**tensors, "history": self.history, "planned": self.planned}

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state, tensors)
        self.history = tensors["history"].to(self.history.device, torch.float64, copy=True)
        if "planned" in tensors:  # older checkpoints: per-client masks did not exist
            self.planned = tensors["planned"].to(self.planned.device, torch.float64, copy=True)
        else:
            self.planned.zero_()

    @classmethod
    def config_kwargs(cls, cfg: Any) -> dict[str, Any]:
        return {"decay": cfg.submodel.coverage_decay}


POLICIES.register("random", RandomPolicy)
POLICIES.register("rolling", CoordinateRollingPolicy)
POLICIES.register("coverage_max", CoverageMaxPolicy)
