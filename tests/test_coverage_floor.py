"""``aggregation.coverage_floor`` (method ``fedgmr_floor``), a rule of this library: MA whose
denominator is floored at a share of the buffer's weight, so the coordinates few clients
cover shrink as under FA. Run end to end on tiny digits configs."""

from __future__ import annotations

import pytest

from conftest import simulate, tiny_config
from fedgmr.errors import ConfigError
from fedgmr.methods import resolve_config


def _run(method: str, **sections):
    raw = tiny_config(method=method, restoration={"trigger": "none"},
                      run={"max_steps": 24, "eval_every": 4, "coverage_eval_every": 1, "device": "cpu"}, **sections)
    records, _ = simulate(raw)
    return records


def test_the_floor_shrinks_the_coordinates_only_large_clients_train():
    """With static masks, the weights outside the smallest level's mask (those the larger
    clients alone train) keep far less energy under the floor than under MA, while the
    weights inside it are trained as under MA."""
    ma, floor = _run("fedgmr_ma"), _run("fedgmr_floor")
    assert [r["step"] for r in ma] == [r["step"] for r in floor]
    e_ma, e_floor = ([r for r in rs if "pruned_energy" in r][-1]["pruned_energy"] for rs in (ma, floor))
    assert len(e_ma) > 1 and e_ma[-1] == e_floor[-1] == 0.0  # nothing lies outside the full model's mask
    assert e_floor[0] < 0.5 * e_ma[0], (e_floor, e_ma)  # outside the smallest mask
    assert ma[-1]["accuracy"] != floor[-1]["accuracy"]


def test_with_every_client_on_the_full_model_the_floor_is_ma_bit_for_bit():
    ma = _run("fedgmr_ma", clients={"num_clients": 10, "heterogeneity": "none"})
    floor = _run("fedgmr_floor", clients={"num_clients": 10, "heterogeneity": "none"})
    keys = ("accuracy", "loss", "bytes_up")
    assert [[r[k] for k in keys] for r in ma] == [[r[k] for k in keys] for r in floor]


def test_the_floor_needs_mask_aware_aggregation_and_a_share_in_0_1():
    cfg = resolve_config(tiny_config(method="fedgmr_floor"))
    assert cfg.aggregation.rule == "ma" and cfg.aggregation.coverage_floor == 0.5
    with pytest.raises(ConfigError, match="coverage_floor .* needs aggregation.rule 'ma', got 'ga'"):
        resolve_config(tiny_config(method="fedgmr_ga", aggregation={"coverage_floor": 0.5}))
    with pytest.raises(ConfigError, match="coverage_floor"):
        resolve_config(tiny_config(aggregation={"coverage_floor": 1.5}))


def test_a_width_baseline_takes_the_floor_and_fiarses_own_rule_refuses_it():
    """The floor reaches every policy that aggregates with MA (HeteroFL's widths included);
    FIARSE's server rule is not MA, so asking for both is refused, never silently overridden."""
    from fedgmr.experiment.build import build_experiment

    cfg = resolve_config(tiny_config(method="heterofl", aggregation={"coverage_floor": 0.5}))
    rule = build_experiment(cfg).strategy.rule
    assert rule.name == "ma_floor" and rule.fn.keywords == {"floor": 0.5}
    with pytest.raises(ConfigError, match="needs aggregation.rule 'ma', got 'fiarse'"):
        resolve_config(tiny_config(method="fiarse", aggregation={"coverage_floor": 0.5}))
