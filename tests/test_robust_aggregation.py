"""Robust aggregation rules under masks (coordinate-wise median, trimmed mean, (Multi-)Krum):
hand-computed vectors, the configs that select them, and a run that uses them."""

from __future__ import annotations

import pytest
import torch

from conftest import simulate, tiny_config
from fedgmr.algorithm.aggregation import (RULES, coordinate_median, krum, krum_scores, mask_aware_average,
                                          trimmed_mean)
from fedgmr.errors import ConfigError
from fedgmr.methods import resolve_config

T, F = True, False
PREV = torch.tensor([0.0, 0.0, 0.0, 9.0])
# three clients: one full model, two sub-models covering coordinates {0, 1} and {0, 2}
UPDATES = [(torch.tensor([T, T, T, T]), torch.tensor([1.0, 2.0, 3.0, 4.0])),
           (torch.tensor([T, T, F, F]), torch.tensor([3.0, 10.0])),
           (torch.tensor([T, F, T, F]), torch.tensor([2.0, 5.0]))]


def test_median_is_taken_over_the_clients_covering_each_coordinate():
    # coordinate 0: {1, 3, 2} -> 2; 1: {2, 10} -> 6 (mean of the two middle); 2: {3, 5} -> 4; 3: {4} -> 4
    assert coordinate_median(PREV, UPDATES, [1, 1, 1]).tolist() == [2.0, 6.0, 4.0, 4.0]
    # weights only select: a zero-weight update takes no part (coordinate 1: {2} alone)
    assert coordinate_median(PREV, UPDATES, [1, 0, 1]).tolist() == [1.5, 2.0, 4.0, 4.0]
    # nobody covers coordinate 3 here: it keeps its previous value
    assert coordinate_median(PREV, UPDATES[1:], [1, 1]).tolist() == [2.5, 10.0, 5.0, 9.0]


def test_trimmed_mean_cuts_floor_trim_k_at_each_end_of_the_covering_values():
    five = [(torch.tensor([T, T]), torch.tensor(v)) for v in ([1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 0.0],
                                                               [100.0, 10.0])]
    prev = torch.zeros(2)
    # k = 5, trim 0.2: one cut at each end -> mean(2, 3, 4) = 3 and mean(0, 0, 0) = 0
    assert trimmed_mean(prev, five, [1] * 5, trim=0.2).tolist() == [3.0, 0.0]
    # trim 0.1: floor(0.5) = 0 cut: the plain mean, 22 and 2
    assert trimmed_mean(prev, five, [1] * 5, trim=0.1).tolist() == [22.0, 2.0]
    # under masks: coordinate 0 has k = 3 (cut 1: the middle value 2), coordinate 1 k = 2 (cut 0)
    assert trimmed_mean(PREV, UPDATES, [1, 1, 1], trim=0.34).tolist() == [2.0, 6.0, 4.0, 4.0]
    with pytest.raises(ValueError, match="trim"):
        trimmed_mean(prev, five, [1] * 5, trim=0.5)


def test_krum_scores_and_selection_by_hand():
    full = torch.tensor([T, T])
    ups = [(full, torch.tensor(v)) for v in ([0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [10.0, 10.0])]
    # mean squared distances: ab 0.5, ac 0.5, bc 1, ad 100, bd 90.5, cd 90.5; f = 1: 1 neighbour each
    assert krum_scores(ups, byzantine=1) == [0.5, 0.5, 0.5, 90.5]
    # Multi-Krum keeps n - f = 3 (a, b, c) and averages them; Krum keeps a (ties: the earlier)
    assert krum(torch.zeros(2), ups, [1] * 4, byzantine=1).tolist() == pytest.approx([1 / 3, 1 / 3])
    assert krum(torch.zeros(2), ups, [1] * 4, byzantine=1, select=1).tolist() == [0.0, 0.0]
    # f = 0: two neighbours each: a 1.0, b 1.5, c 1.5, d 181.0 -> keeps all four with n - f = 4
    assert krum_scores(ups, byzantine=0) == [1.0, 1.5, 1.5, 181.0]


def test_krum_distances_use_only_the_coordinates_both_masks_cover():
    a = (torch.tensor([T, T, F]), torch.tensor([1.0, 1.0]))
    b = (torch.tensor([T, F, T]), torch.tensor([3.0, 7.0]))   # shares coordinate 0 with a: (1 - 3)^2 = 4
    c = (torch.tensor([F, F, T]), torch.tensor([7.0]))        # shares nothing with a: infinitely far
    scores = krum_scores([a, b, c], byzantine=0)  # 1 neighbour each (n - f - 2 = 1)
    assert scores == [4.0, 0.0, 0.0]  # b and c agree exactly on coordinate 2
    out = krum(torch.zeros(3), [a, b, c], [1, 1, 1], byzantine=1)  # keeps n - f = 2: b and c
    assert out.tolist() == [3.0, 0.0, 7.0]


def test_an_outlier_moves_ma_but_not_the_robust_rules():
    full = torch.tensor([T, T, T])
    honest = [(full, torch.tensor([1.0, 1.0, 1.0]) + 0.01 * i) for i in range(4)]
    attack = (full, torch.tensor([1e6, -1e6, 1e6]))
    ups, w = honest + [attack], [1.0] * 5
    prev = torch.zeros(3)
    assert mask_aware_average(prev, ups, w).abs().max() > 1e5
    for out in (coordinate_median(prev, ups, w), trimmed_mean(prev, ups, w, trim=0.2),
                krum(prev, ups, w, byzantine=1)):
        assert torch.allclose(out, torch.full((3,), 1.015), atol=0.02), out


def test_configs_select_the_rules_with_their_options():
    assert {"median", "trimmed_mean", "krum"} <= set(RULES.names())
    cfg = resolve_config(tiny_config(aggregation={"rule": "krum", "krum_byzantine": 2, "krum_select": 1}))
    assert cfg.aggregation.krum_byzantine == 2 and cfg.aggregation.krum_select == 1
    for bad in ({"rule": "trimmed_mean", "trim": 0.5}, {"rule": "krum", "krum_byzantine": -1},
                {"rule": "krum", "krum_select": 0}):
        with pytest.raises(ConfigError):
            resolve_config(tiny_config(aggregation=bad))


@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum"])
def test_a_fedgmr_run_aggregates_with_a_robust_rule(rule: str):
    records, exp = simulate(tiny_config(aggregation={"rule": rule, "trim": 0.2},
                                        run={"max_steps": 6, "eval_every": 3}))
    assert exp.strategy.rule.name == rule
    assert records[-1]["step"] == 6 and records[-1]["accuracy"] > records[0]["accuracy"]
    if rule == "trimmed_mean":
        assert exp.strategy.rule.fn.keywords == {"trim": 0.2}
