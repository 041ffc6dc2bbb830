"""Sub-models: the policy and density ladder (``submodel``) and the model-heterogeneous
baselines' options (``submodel.baseline``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from fedgmr.config.base import Section


class BaselineConfig(Section):
    """Options of the model-heterogeneous baselines (HeteroFL, FedRolex, FjORD, FIARSE).

    width_rates: width rate per ladder level (HeteroFL/FedRolex/FjORD); None picks, per
        level, the largest width whose sub-model holds at most the level's density.
    scaler: HeteroFL/FedRolex scaler (activations / r in training, identity in eval).
    static_bn: no BatchNorm statistics from clients; the server re-estimates them on its
        validation split after every aggregation (every width for FjORD).
    label_split: HeteroFL/FedRolex output-layer label split (clients train and upload only
        the classifier rows of classes in their data).
    p_values: FjORD's width grid; a tier samples the values below its p_max, and p_max.
    distill: FjORD self-distillation from p_max.
    threshold_scope: FIARSE thresholds: one ``global`` or one per top-level ``stage``.
    server_lr: FIARSE server learning rate.
    """

    width_rates: list[float] | None = None
    scaler: bool = True
    static_bn: bool = True
    label_split: bool = True
    p_values: list[float] = Field(default_factory=lambda: [0.2, 0.4, 0.6, 0.8, 1.0])
    distill: bool = False
    threshold_scope: Literal["global", "stage"] = "global"
    server_lr: float = Field(1.0, gt=0)

    @field_validator("width_rates", "p_values")
    @classmethod
    def _rates(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (not v or any(not 0 < r <= 1 for r in v) or v != sorted(set(v))):
            raise ValueError("must be strictly increasing rates in (0, 1]")
        return v


class SubmodelConfig(Section):
    """Sub-model policy and density ladder (docs/reference.md §3).

    density_basis: what a density counts. ``model``: a level-ρ mask holds ρ of all the
        model's coordinates, the always-kept ones (output layer, biases, norms) included,
        so its payload weighs ρ x the full model as in the paper's Table 12. ``prunable``:
        ρ of the prunable weights, the always-kept ones on top (the authors' mask count).
    cost_weighted: rank coordinates by ``|w| / c_l`` with the authors' per-layer cost
        ``c_l = comm + T comp_l`` (seconds per parameter; docs/methods.md).
    layer_costs: explicit ``c_l`` per prunable layer (a list in layer order, or a mapping
        by parameter name); None derives them from the simulator's time model.
    refresh_every: recompute the ranking every that many server steps;
        ``check_interval`` (the authors' cadence) follows ``restoration.check_interval``;
        null never refreshes. Magnitude masks only: the extraction policies (``random``,
        ``rolling``, ``coverage_max``) extract again at every server step.
    coverage_decay: ``coverage_max``'s ``λ`` in the recent coverage ``H_k = λ H_{k-1} + Γ_k``
        (docs/methods/epm.md).
    prune_output: the mask policies only: rank the output layer's weight with the other
        prunable weights instead of always keeping it (reference §3.3 keeps it). An option
        of this library, not the paper's: where the output layer is a large share of the
        model (Shakespeare's character LSTM: 15 %), always keeping it makes a density-0.05
        sub-model carry 20 % of the model's bytes, four times what the baselines' 0.05
        sub-models carry; with it on, a level-ρ payload weighs about ρ x the full model.
    per_client: the extraction policies only: draw every client its own mask at each
        dispatch (EPM's setting: the clients of one round cover different coordinates)
        instead of one nested ranking per round that clients of a level share. Needs
        ``network.ims: false`` (IMS multicasts nested level blocks).
    """

    policy: str = "magnitude"
    ladder: list[float] = Field(default_factory=lambda: [0.05, 0.1, 0.2, 0.5, 1.0])
    density_basis: Literal["model", "prunable"] = "model"
    layer_floor: float = Field(0.02, ge=0, le=1)
    cost_weighted: bool = False
    layer_costs: list[float] | dict[str, float] | None = None
    refresh_every: int | Literal["check_interval"] | None = "check_interval"
    coverage_decay: float = Field(0.9, ge=0, le=1)
    prune_output: bool = False
    per_client: bool = False
    baseline: BaselineConfig = Field(default_factory=BaselineConfig)

    @field_validator("refresh_every")
    @classmethod
    def _refresh(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1, 'check_interval' or null")
        return v

    @field_validator("layer_costs")
    @classmethod
    def _costs(cls, v: list[float] | dict[str, float] | None) -> list[float] | dict[str, float] | None:
        values = list(v.values()) if isinstance(v, dict) else v
        if values is not None and (not values or any(not c > 0 for c in values)):
            raise ValueError("must be positive costs, one per prunable layer")
        return v

    @field_validator("ladder")
    @classmethod
    def _ladder(cls, v: list[float]) -> list[float]:
        if not v or any(not 0 < r <= 1 for r in v) or v != sorted(set(v)):
            raise ValueError("must be strictly increasing densities in (0, 1]")
        return v
