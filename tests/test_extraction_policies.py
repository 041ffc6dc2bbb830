"""The online extraction policies (``random``, ``rolling``, ``coverage_max``;
docs/methods/epm.md): exact masks on a hand-built model, equal budgets, determinism,
nesting, config and exact resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import simulate, tiny_config
from fedgmr.algorithm.extraction import (CoordinateRollingPolicy, CoverageMaxPolicy, RandomPolicy, policy_seed,
                                         rolling_offset)
from fedgmr.algorithm.masks import nested_masks, magnitude_ranking
from fedgmr.algorithm.params import ParamSpace
from fedgmr.algorithm.policies import POLICIES
from fedgmr.errors import ConfigError
from fedgmr.experiment.runner import run_experiment
from fedgmr.methods import resolve_config

LADDER = (0.25, 0.5, 1.0)


def _space() -> ParamSpace:
    """Prunable: layer A (flat 0-7) and layer B (flat 8-11); the output layer (12-13) is kept."""
    return ParamSpace(nn.Sequential(nn.Linear(4, 2, bias=False), nn.Linear(2, 2, bias=False),
                                    nn.Linear(2, 1, bias=False)))


def _idx(mask: torch.Tensor) -> list[int]:
    return torch.nonzero(mask).squeeze(1).tolist()


def _sets(policy) -> list[list[int]]:
    return [_idx(policy.mask(lv)) for lv in range(len(policy.ladder))]


PARAMS = torch.tensor([0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8, 0.05, 0.9, -0.15, 0.25, 1.0, 1.0])


def test_registered_in_the_policy_registry():
    assert POLICIES.get("random") is RandomPolicy and POLICIES.get("rolling") is CoordinateRollingPolicy
    assert POLICIES.get("coverage_max") is CoverageMaxPolicy


def test_rolling_windows_advance_by_the_smallest_levels_share_each_round():
    space = _space()
    assert space.numel == 14 and space.num_prunable == 12
    pol = CoordinateRollingPolicy(space, LADDER, PARAMS, floor=0.0, basis="prunable")
    # k = 3, 6, 12; step 0: A from 0 and B from 8, merged by the share of the window passed
    assert _sets(pol) == [[0, 1, 8, 12, 13], [0, 1, 2, 3, 8, 9, 12, 13], list(range(14))]
    assert [rolling_offset(s, 8, 0.25) for s in range(5)] == [0, 2, 4, 6, 0]
    assert [rolling_offset(s, 4, 0.25) for s in range(5)] == [0, 1, 2, 3, 0]
    assert pol.refresh(1, PARAMS)
    assert _sets(pol)[:2] == [[2, 3, 9, 12, 13], [2, 3, 4, 5, 9, 10, 12, 13]]
    pol.refresh(3, PARAMS)  # A from 6 (wrapping to 0, 1), B from 11 (wrapping to 8)
    assert _sets(pol)[:2] == [[6, 7, 11, 12, 13], [0, 1, 6, 7, 8, 11, 12, 13]]


def test_coverage_max_takes_the_least_recently_covered_coordinates():
    space = _space()
    pol = CoverageMaxPolicy(space, LADDER, PARAMS, floor=0.0, basis="prunable", decay=0.5)
    # before any coverage: all tie at H = 0, so |w| decides (the magnitude ranking)
    assert pol.ranking.tolist() == magnitude_ranking(PARAMS, space, 0.0).tolist()
    m = lambda *idx: torch.zeros(14, dtype=torch.bool).index_fill_(0, torch.tensor(idx), True)  # noqa: E731
    pol.observe([m(0, 2, 6, 12), m(0, 4, 6, 13)])
    pol.observe([m(2, 6, 7, 9, 10)])
    # H = 0.5 (A + B) + C over the prunable coordinates 0-11
    expected_h = [1.0, 0, 1.5, 0, 0.5, 0, 2.0, 1.0, 0, 1.0, 1.0, 0]
    assert pol.history[:12].tolist() == expected_h
    assert pol.history[12:].tolist() == [0.5, 0.5]
    pol.refresh(1, PARAMS)
    # H = 0: 1 (.2), 3 (.4), 5 (.6), 8 (.05), 11 (.25) -> by |w|: 5, 3, 11, 1, 8; H = 0.5: 4;
    # H = 1: 0 (.1), 7 (.8), 9 (.9), 10 (.15) -> 9, 7, 10, 0; H = 1.5: 2; H = 2: 6
    assert pol.ranking.tolist() == [5, 3, 11, 1, 8, 4, 9, 7, 10, 0, 2, 6]
    assert _sets(pol)[:2] == [[3, 5, 11, 12, 13], [1, 3, 4, 5, 8, 11, 12, 13]]
    pol.observe([])  # an aggregation that used nothing only decays the history
    assert pol.history[:12].tolist() == [h / 2 for h in expected_h]


@pytest.mark.parametrize("cls", [RandomPolicy, CoordinateRollingPolicy, CoverageMaxPolicy])
@pytest.mark.parametrize("basis, floor", [("prunable", 0.0), ("model", 0.3)])
def test_every_round_keeps_each_levels_magnitude_budget_and_nesting(cls, basis: str, floor: float):
    space = _space()
    budget = [int(m.sum()) for m in nested_masks(magnitude_ranking(PARAMS, space, floor), space, LADDER, floor,
                                                 basis)]
    pol = cls(space, LADDER, PARAMS, floor=floor, basis=basis, seed=7)
    seen = set()
    for step in range(6):
        if step:
            pol.observe([pol.mask(0), pol.mask(1)])
            pol.refresh(step, PARAMS)
        masks = [pol.mask(lv) for lv in range(len(LADDER))]
        assert [int(m.sum()) for m in masks] == budget
        assert all(bool((a & ~b).sum() == 0) for a, b in zip(masks, masks[1:]))  # nested
        assert all(bool(m[12:].all()) for m in masks)  # the output layer is always kept
        seen.add(tuple(_idx(masks[0])))
    assert len(seen) > 1  # the coordinates move from round to round


def test_random_masks_are_deterministic_in_the_run_seed():
    space = _space()
    assert policy_seed(0) == policy_seed(0) != policy_seed(1)
    a = RandomPolicy(space, LADDER, PARAMS, floor=0.0, seed=policy_seed(0))
    b = RandomPolicy(space, LADDER, PARAMS, floor=0.0, seed=policy_seed(0))
    c = RandomPolicy(space, LADDER, PARAMS, floor=0.0, seed=policy_seed(1))
    for step in range(1, 4):
        assert a.ranking.tolist() == b.ranking.tolist()
        for p in (a, b, c):
            p.refresh(step, PARAMS)
    assert a.ranking.tolist() == b.ranking.tolist() != c.ranking.tolist()
    a.refresh(1, PARAMS)
    b.refresh(1, PARAMS * 3)  # random scores ignore the weights
    assert a.ranking.tolist() == b.ranking.tolist()


@pytest.mark.parametrize("policy", ["random", "rolling", "coverage_max"])
@pytest.mark.parametrize("trigger", ["fixed_time", "none"])
def test_usable_with_and_without_restoration(policy: str, trigger: str):
    records, exp = simulate(tiny_config(submodel={"policy": policy}, restoration={"trigger": trigger,
                                                                                "horizon": 1e-6},
                                        run={"max_steps": 8, "eval_every": 2}))
    assert exp.strategy.policy.name == policy and exp.strategy.policy.step == 8
    if trigger == "none":
        assert records[-1]["restorations"] == 0
    else:
        assert records[-1]["restorations"] > 0  # GMR moved clients up the (nested) ladder
    sizes = [int(exp.strategy.policy.mask(lv).sum()) for lv in range(len(exp.strategy.ladder.ladder))]
    assert sizes == sorted(sizes) and sizes[-1] == exp.space.numel


@pytest.mark.parametrize("policy", ["random", "rolling", "coverage_max"])
def test_set_policy_from_the_command_line(policy: str):
    from fedgmr.config import apply_overrides

    raw = apply_overrides(tiny_config(), [f"submodel.policy={policy}", "submodel.coverage_decay=0.5"])
    cfg = resolve_config(raw)
    assert cfg.submodel.policy == policy and cfg.submodel.coverage_decay == 0.5


@pytest.mark.parametrize("policy, per_client", [("random", False), ("rolling", False), ("coverage_max", False),
                                                ("random", True), ("coverage_max", True)])
def test_checkpoint_resume_is_exact(tmp_path: Path, policy: str, per_client: bool):
    """Also per client: the planned coverage and the coverage window are in the checkpoint."""
    cfg = resolve_config(tiny_config(submodel={"policy": policy, "coverage_decay": 0.7, "per_client": per_client},
                                     network={"model_size_mb": 2.0, "ims": not per_client},
                                     run={"max_steps": 8, "eval_every": 1, "checkpoint_every": 2,
                                          "coverage_eval_every": 1, "coverage_window": 3}))
    out, ref = tmp_path / "killed", tmp_path / "ref"
    assert run_experiment(cfg, out, stop_after_steps=5)["interrupted"]
    run_experiment(cfg, out, resume=True)
    run_experiment(cfg, ref)
    assert (out / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()


def test_magnitude_only_options_are_refused_in_one_line():
    for extra in ({"cost_weighted": True}, {"layer_costs": [1.0]}):
        with pytest.raises(ConfigError, match="apply to submodel.policy 'magnitude' only, not 'coverage_max'"):
            simulate(tiny_config(submodel={"policy": "coverage_max", **extra}, run={"max_steps": 1}))
    with pytest.raises(Exception, match="coverage_decay"):
        resolve_config(tiny_config(submodel={"coverage_decay": 1.5}))


# ---------------------------------------------------------------- per-client extraction
def test_per_client_rolling_spreads_the_clients_windows_over_each_layer():
    space = _space()
    pol = CoordinateRollingPolicy(space, LADDER, PARAMS, floor=0.0, basis="prunable", per_client=True,
                                  num_clients=2)
    assert not pol.nested
    # client 0: the shared windows (A from 0, B from 8); client 1: half a layer further on
    # (A from 4, B from 10): scores 1 - q/n merge 4 (1.0), 10 (1.0), 5 (0.875)
    assert _idx(pol.client_mask(0, 0, PARAMS)) == [0, 1, 8, 12, 13] == _sets(pol)[0]
    assert _idx(pol.client_mask(1, 0, PARAMS)) == [4, 5, 10, 12, 13]
    assert _idx(pol.client_mask(1, 1, PARAMS)) == [4, 5, 6, 7, 10, 11, 12, 13]
    pol.refresh(1, PARAMS)  # both advance by the smallest level's share: A by 2, B by 1
    assert _idx(pol.client_mask(0, 0, PARAMS)) == [2, 3, 9, 12, 13]
    assert _idx(pol.client_mask(1, 0, PARAMS)) == [6, 7, 11, 12, 13]


def test_per_client_random_masks_are_each_clients_own_draw():
    from fedgmr.algorithm.extraction import random_scores
    from fedgmr.algorithm.masks import mask_from_ranking

    space = _space()
    pol = RandomPolicy(space, LADDER, PARAMS, floor=0.0, basis="prunable", seed=11, per_client=True, num_clients=4)
    pol.refresh(3, PARAMS)
    masks = [pol.client_mask(c, 0, PARAMS) for c in range(4)]
    for c, m in enumerate(masks):
        ranking = magnitude_ranking(random_scores(space.numel, 11, 3, c), space, 0.0)
        assert m.tolist() == mask_from_ranking(ranking, space, 0.25, 0.0, "prunable").tolist()
        assert int(m.sum()) == int(pol.mask(0).sum())  # the level's budget: equal bytes
    assert len({tuple(_idx(m)) for m in masks}) > 1  # one round, different coordinates
    again = RandomPolicy(space, LADDER, PARAMS, floor=0.0, basis="prunable", seed=11, per_client=True,
                         num_clients=4)
    again.refresh(3, PARAMS)
    assert [again.client_mask(c, 0, PARAMS).tolist() for c in range(4)] == [m.tolist() for m in masks]


def test_per_client_coverage_max_plans_with_the_masks_already_dispatched():
    space = _space()
    pol = CoverageMaxPolicy(space, LADDER, PARAMS, floor=0.0, basis="prunable", per_client=True, num_clients=3)
    # H = 0: the first client takes the largest |w| (9: .9, 7: .8, 6: .7); the next ones
    # take what the round has not planned yet, again by |w|
    assert _idx(pol.client_mask(0, 0, PARAMS)) == [6, 7, 9, 12, 13]
    assert _idx(pol.client_mask(1, 0, PARAMS)) == [3, 4, 5, 12, 13]
    assert _idx(pol.client_mask(2, 1, PARAMS)) == [0, 1, 2, 8, 10, 11, 12, 13]
    assert pol.planned[:12].tolist() == [1.0] * 12 and pol.planned[12:].tolist() == [3.0, 3.0]
    pol.refresh(1, PARAMS)  # a new round plans from scratch
    assert not bool(pol.planned.any())
    assert _idx(pol.client_mask(0, 0, PARAMS)) == [6, 7, 9, 12, 13]


@pytest.mark.parametrize("policy", ["random", "rolling", "coverage_max"])
def test_per_client_runs_give_clients_of_one_level_different_masks(policy: str):
    records, exp = simulate(tiny_config(method="fedgmr_wo_gmr", submodel={"policy": policy, "per_client": True},
                                        network={"model_size_mb": 2.0, "ims": False},
                                        run={"max_steps": 6, "eval_every": 2}))
    strat = exp.strategy
    by_level: dict[int, list[torch.Tensor]] = {}
    for c, m in strat._held.items():
        by_level.setdefault(strat.ladder.levels[c], []).append(m)
        assert int(m.sum()) == int(strat.policy.mask(strat.ladder.levels[c]).sum())  # equal bytes
    shared = [ms for ms in by_level.values() if len(ms) > 1]
    assert shared and all(len({tuple(_idx(m)) for m in ms}) == len(ms) for ms in shared)


def test_per_client_is_refused_where_it_cannot_work_in_one_line():
    with pytest.raises(ConfigError, match="IMS cannot multicast .* set network.ims: false"):
        simulate(tiny_config(submodel={"policy": "random", "per_client": True}, run={"max_steps": 1}))
    with pytest.raises(ConfigError, match="policy 'magnitude' does not: use one of coverage_max, random, rolling"):
        simulate(tiny_config(submodel={"per_client": True}, network={"model_size_mb": 2.0, "ims": False},
                             run={"max_steps": 1}))


@pytest.mark.parametrize("floor", [0.0, 0.02, 0.3])
@pytest.mark.parametrize("basis", ["prunable", "model"])
def test_ranked_mask_is_the_rankings_prefix_without_the_full_sort(floor: float, basis: str):
    """Per-client masks select instead of sorting; they equal the ranking's prefix, ties
    (many, with small integer scores) taken in position order."""
    from fedgmr.algorithm.masks import mask_from_ranking, ranked_mask

    space = ParamSpace(nn.Sequential(nn.Linear(30, 20), nn.Linear(20, 20), nn.Linear(20, 5)))
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        score = (torch.randint(0, 4, (space.numel,), generator=gen).double() if trial % 2
                 else torch.rand(space.numel, generator=gen, dtype=torch.float64))
        ranking = magnitude_ranking(score, space, floor)
        for density in (0.01, 0.05, 0.3, 0.77, 1.0):
            assert ranked_mask(score, space, density, floor, basis).tolist() == \
                mask_from_ranking(ranking, space, density, floor, basis).tolist()


def test_top_positions_breaks_ties_by_the_second_key_then_by_position():
    from fedgmr.algorithm.masks import top_positions

    score = torch.tensor([1.0, 3.0, 2.0, 2.0, 2.0, 2.0, 0.0])
    tie = torch.tensor([9.0, 0.0, 0.5, 0.7, 0.5, 0.1, 9.0])
    # 3 first; then among the 2s: 3 (0.7), then 2 and 4 (0.5) by position, then 5 (0.1)
    assert _idx(top_positions(score, 2, tie)) == [1, 3]
    assert _idx(top_positions(score, 3, tie)) == [1, 2, 3]
    assert _idx(top_positions(score, 4, tie)) == [1, 2, 3, 4]
    assert _idx(top_positions(score, 3)) == [1, 2, 3]  # without the key: position only
    assert _idx(top_positions(score, 6, tie)) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("floor", [0.0, 0.02, 0.3])
@pytest.mark.parametrize("basis", ["prunable", "model"])
def test_per_client_coverage_masks_equal_the_coverage_rankings_prefix(floor: float, basis: str):
    """Per-client coverage-max masks order by ``(-(H + P), |w|)`` by selection; they equal
    the prefix of the ranking of :func:`coverage_scores` (which sorts ``H``)."""
    from fedgmr.algorithm.extraction import coverage_scores
    from fedgmr.algorithm.masks import mask_from_ranking

    space = ParamSpace(nn.Sequential(nn.Linear(30, 20), nn.Linear(20, 20), nn.Linear(20, 5)))
    gen = torch.Generator().manual_seed(1)
    for trial in range(10):
        params = torch.randn(space.numel, generator=gen)
        pol = CoverageMaxPolicy(space, LADDER, params, floor=floor, basis=basis, per_client=True, num_clients=4,
                                decay=0.5)
        pol.history = torch.randint(0, 4, (space.numel,), generator=gen).double() * 0.5
        for client in range(4):
            level = client % len(LADDER)
            expected = mask_from_ranking(magnitude_ranking(
                coverage_scores(space, pol.history + pol.planned, params), space, floor), space,
                LADDER[level], floor, basis)
            assert pol.client_mask(client, level, params).tolist() == expected.tolist()


@pytest.mark.parametrize("cls", [RandomPolicy, CoordinateRollingPolicy, CoverageMaxPolicy])
def test_per_client_shared_ranking_is_built_late_from_the_rounds_inputs(cls):
    """With ``per_client`` the round's shared masks are ranked when first asked for, from
    the weights and history of the refresh: later aggregation does not change them."""
    space = _space()
    eager = cls(space, LADDER, PARAMS, floor=0.0, basis="prunable", seed=3)
    lazy = cls(space, LADDER, PARAMS, floor=0.0, basis="prunable", seed=3, per_client=True, num_clients=2)
    covered = [eager.mask(0), eager.mask(1)]
    for pol in (eager, lazy):
        pol.observe(covered)
    params = PARAMS.clone()
    eager.refresh(1, params)
    lazy.refresh(1, params)
    assert lazy._pending is not None  # not ranked yet
    params.mul_(-3).add_(torch.linspace(0, 1, 14))  # the global model moves on in place
    for pol in (eager, lazy):
        pol.observe([covered[1]])
    assert _sets(lazy) == _sets(eager) and lazy._pending is None


@pytest.mark.parametrize("kind", ["rolling", "random", "ties"])
def test_top_positions_is_the_stable_sorts_prefix_on_either_side_of_the_median(kind: str):
    """The threshold is selected from the smaller side (the m largest, or the n - m + 1
    smallest); either way the mask is the first m of a stable descending sort."""
    from fedgmr.algorithm.masks import top_positions

    n = 1000
    gen = torch.Generator().manual_seed(2)
    score = {"rolling": 1.0 - ((torch.arange(n, dtype=torch.float64) - 123) % n) / n,  # near-sorted, as `rolling`
             "random": torch.rand(n, generator=gen, dtype=torch.float64),
             "ties": torch.randint(0, 5, (n,), generator=gen).double()}[kind]
    order = torch.sort(score, descending=True, stable=True).indices
    for m in (1, 7, 499, 500, 501, 502, 800, 999, 1000):
        expected = torch.zeros(n, dtype=torch.bool)
        expected[order[:m]] = True
        assert top_positions(score, m).tolist() == expected.tolist(), m
