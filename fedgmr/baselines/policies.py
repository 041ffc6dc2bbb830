"""Structured sub-model policies of the baselines, as masks over the flat vector.

They plug into the same strategy, aggregation rules, GMR ladder and simulator as the
magnitude policy: a ladder level is a width rate (HeteroFL, FedRolex, FjORD) or a
parameter fraction (FIARSE).

The ladder densities are the clients' budgets (parameter fractions, docs/reference.md §3.5 and §6.3); a width
policy turns each into the largest width whose sub-model holds at most that fraction,
unless ``submodel.baseline.width_rates`` gives the rates explicitly (e.g. HeteroFL's
levels ``[0.0625, 0.125, 0.25, 0.5, 1]``). :meth:`level_densities` reports the true
parameter fraction of every level.
"""

from __future__ import annotations

from fedgmr.baselines.wire import STRUCTURED_CODE_BYTES

from typing import Any, Sequence

import torch
import torch.nn as nn

from fedgmr.algorithm.params import ParamSpace
from fedgmr.algorithm.policies import POLICIES, SubmodelPolicy
from fedgmr.baselines import fiarse_math
from fedgmr.baselines.structure import Slice, WidthBuilder, WidthStructure, rates_for_fractions
from fedgmr.errors import ConfigError


class WidthPolicy(SubmodelPolicy):
    """HeteroFL: level ``l`` keeps the width-``r_l`` prefix of every hidden dimension.

    A slice travels as a header-only shape description plus its values
    (:mod:`fedgmr.baselines.wire`): no mask bits.

    Prefixes of increasing width are nested, so IMS applies.

    Parameters
    ----------
    space: the full model's parameter layout.
    ladder: the clients' density budgets (one per level).
    model: the full (width 1) model.
    build: ``build(width) -> nn.Module``.
    rates: explicit width rate per level (default: derived from the ladder).
    device: where the level masks (and the server's width sub-models) live: the global
        model's device.
    """

    name = "heterofl"
    nested = True
    needs_width_builder = True

    def code_nbytes(self, mask: torch.Tensor) -> int:
        """A width slice is described by its rates and shift: the structured header's
        fields beyond a plain payload's header (no per-coordinate mask bits)."""
        return STRUCTURED_CODE_BYTES

    def __init__(self, space: ParamSpace, ladder: Sequence[float], model: nn.Module, build: WidthBuilder,
                 rates: Sequence[float] | None = None, device: torch.device | str = "cpu", **_: Any) -> None:
        super().__init__(space, ladder)
        if rates is None:
            rates = rates_for_fractions(build, list(self.ladder), space.numel)
        elif len(rates) != len(self.ladder):
            raise ConfigError(f"submodel.baseline.width_rates has {len(rates)} rates for a ladder of "
                              f"{len(self.ladder)} levels")
        self.rates = tuple(float(r) for r in rates)
        self.structure = WidthStructure(build, model, device)
        self.shift = 0
        self._slices = self._build()
        fr = self.level_densities()
        if any(b <= a for a, b in zip(fr, fr[1:])):
            raise ConfigError(f"width rates {list(self.rates)} give sub-models of equal size "
                              f"(parameter fractions {[round(f, 4) for f in fr]}); use a wider model or "
                              f"fewer ladder levels")

    @classmethod
    def from_config(cls, space: ParamSpace, params: torch.Tensor, model: nn.Module, config: Any,
                    build: WidthBuilder) -> "WidthPolicy":
        b = config.submodel.baseline
        return cls(space, config.submodel.ladder, model, build, b.width_rates, device=params.device,
                   p_values=b.p_values)

    def _build(self) -> list[Slice]:
        return [self.structure.slice(r, self.shift) for r in self.rates]

    def mask(self, level: int) -> torch.Tensor:
        return self._slices[level].mask

    def slice(self, level: int) -> Slice:
        return self._slices[level]

    def level_densities(self) -> list[float]:
        """Parameter fraction of each level's sub-model."""
        return [int(s.mask.sum()) / self.space.numel for s in self._slices]

    def level_sizes(self) -> list[int]:
        return [int(s.mask.sum()) for s in self._slices]


class RollingPolicy(WidthPolicy):
    """FedRolex: every level's window rolls by one index per server step (round ``t``:
    start ``-t mod K`` in every layer), the same shift for every layer. Windows of
    different widths are not nested, so sub-models are sent whole (no IMS)."""

    name = "fedrolex"
    nested = False

    def refresh(self, step: int, params: torch.Tensor) -> bool:
        self.shift = int(step)
        self._slices = self._build()
        return True

    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        return {"shift": self.shift}, {}

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        self.shift = int(state.get("shift", 0))
        self._slices = self._build()


class OrderedDropoutPolicy(WidthPolicy):
    """FjORD: level ``l`` is a client tier with ``p_max = r_l``; the client samples one
    ``p`` per batch from :meth:`allowed` (the ``p_values`` below ``p_max``, and ``p_max``)."""

    name = "fjord"

    def __init__(self, space: ParamSpace, ladder: Sequence[float], model: nn.Module, build: WidthBuilder,
                 rates: Sequence[float] | None = None, p_values: Sequence[float] = (0.2, 0.4, 0.6, 0.8, 1.0),
                 **kw: Any) -> None:
        super().__init__(space, ladder, model, build, rates, **kw)
        self.p_values = tuple(sorted(float(p) for p in p_values))

    def allowed(self, level: int) -> list[float]:
        return allowed_widths(self.p_values, self.rates[level])


def allowed_widths(p_values: Sequence[float], p_max: float) -> list[float]:
    """The widths a FjORD tier samples from: every ``p < p_max`` and ``p_max`` itself,
    compared with a tolerance (no float keys: 0.6000000000000001 == 0.6 here)."""
    return [p for p in sorted(p_values) if p < p_max - 1e-9] + [p_max]


class FiarsePolicy(SubmodelPolicy):
    """FIARSE: level ``l`` keeps, per threshold group, the coordinates with
    ``|w| >= theta`` (``theta`` = the ``floor(n * size_l)``-th largest |w|), recomputed
    from the global model after every server step. Norm parameters are always kept.
    Masks of larger sizes contain smaller ones (lower thresholds), so IMS applies."""

    name = "fiarse"
    nested = True

    def __init__(self, space: ParamSpace, ladder: Sequence[float], params: torch.Tensor, model: nn.Module,
                 scope: str = "global", **_: Any) -> None:
        super().__init__(space, ladder)
        self.scope = scope
        self.groups = fiarse_math.score_groups(model, space, scope).to(params.device)  # with the model
        self._rebuild(params)
        self._fractions = [int(m.sum()) / space.numel for m in self._masks]

    @classmethod
    def from_config(cls, space: ParamSpace, params: torch.Tensor, model: nn.Module, config: Any,
                    build: WidthBuilder | None = None) -> "FiarsePolicy":
        return cls(space, config.submodel.ladder, params, model, config.submodel.baseline.threshold_scope)

    def _rebuild(self, params: torch.Tensor) -> None:
        self._masks = fiarse_math.level_masks(params, self.groups, self.ladder)

    def mask(self, level: int) -> torch.Tensor:
        return self._masks[level]

    def refresh(self, step: int, params: torch.Tensor) -> bool:
        self._rebuild(params)
        return True

    def level_densities(self) -> list[float]:
        """Parameter fraction of each level at construction (sizes are fractions)."""
        return list(self._fractions)

    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        return {}, {f"mask{l}": m for l, m in enumerate(self._masks)}

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        self._masks = [tensors[f"mask{l}"].to(self.groups.device, copy=True) for l in range(len(self.ladder))]


for _cls in (WidthPolicy, RollingPolicy, OrderedDropoutPolicy, FiarsePolicy):
    if _cls.name not in POLICIES:
        POLICIES.register(_cls.name, _cls)
