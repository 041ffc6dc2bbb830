"""The mask refresh by selection (``nested_ranked_masks``) gives, bit for bit, the masks of
the full ranking it replaced: ``nested_masks(magnitude_ranking(...))``, whose code is kept
here as the reference (a full stable sort of every coordinate, ties by flat position)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from fedgmr.algorithm import masks as masks_module
from fedgmr.algorithm.extraction import CoordinateRollingPolicy, CoverageMaxPolicy, RandomPolicy
from fedgmr.algorithm.masks import floor_count, magnitude_ranking, nested_masks, nested_ranked_masks, prefix_length
from fedgmr.algorithm.params import ParamSpace
from fedgmr.algorithm.policies import MagnitudePolicy


def reference_ranking(flat: torch.Tensor, space: ParamSpace, floor: float = 0.02,
                      costs: dict[str, float] | None = None) -> torch.Tensor:
    """``magnitude_ranking`` as it was before the selection path (a full sort per layer,
    then a merge by score and flat index): the specification the new masks must meet."""
    head_idx, head_score, tail_idx, tail_score = [], [], [], []
    for p in space.prunable_layers:
        score = flat[p.slice].abs().double()
        if costs is not None:
            score = score / costs[p.name]
        order = torch.sort(score, descending=True, stable=True).indices
        n_floor = min(p.numel, max(1, math.ceil(floor * p.numel))) if floor > 0 else 0
        idx = order + p.offset
        head_idx.append(idx[:n_floor])
        head_score.append(score[order[:n_floor]])
        tail_idx.append(idx[n_floor:])
        tail_score.append(score[order[n_floor:]])
    if not head_idx:
        return torch.zeros(0, dtype=torch.long)

    def _merge(idx: list[torch.Tensor], sc: list[torch.Tensor]) -> torch.Tensor:
        all_idx, all_sc = torch.cat(idx), torch.cat(sc)
        by_index = torch.argsort(all_idx, stable=True)
        all_idx, all_sc = all_idx[by_index], all_sc[by_index]
        return all_idx[torch.sort(all_sc, descending=True, stable=True).indices]

    return torch.cat([_merge(head_idx, head_score), _merge(tail_idx, tail_score)])


def reference_masks(flat, space, densities, floor=0.02, basis="model", costs=None) -> list[torch.Tensor]:
    ranking = reference_ranking(flat, space, floor, costs)
    out = []
    for d in densities:
        mask = space.always_kept.clone()
        mask[ranking[:prefix_length(space, d, floor, basis)]] = True
        out.append(mask)
    return out


class Net(nn.Module):
    """Layers of very different sizes, a BatchNorm and an always-kept output layer."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, width, 3)
        self.fc1 = nn.Linear(width * 4, 3 * width)
        self.tiny = nn.Linear(3 * width, 2)  # 2 x 48 weights: its floor is a single coordinate
        self.out = nn.Linear(2, 10)


LADDERS = [[0.05, 0.1, 0.2, 0.5, 1.0], [0.01, 0.3, 0.31, 0.9], [0.5], [0.7, 0.7, 1.0], [0.001, 0.002]]


def _tied_params(space: ParamSpace, gen: torch.Generator, levels: int) -> torch.Tensor:
    """Random weights drawn from a few magnitudes (both signs, zeros included): most
    coordinates tie with many others, inside a layer and across layers."""
    values = torch.randint(-levels, levels + 1, (space.numel,), generator=gen).float() / 7
    return values


@pytest.mark.parametrize("seed", range(12))
def test_selection_masks_equal_the_full_ranking_on_ties(seed: int):
    gen = torch.Generator().manual_seed(seed)
    space = ParamSpace(Net(width=8 + seed))
    flat = _tied_params(space, gen, levels=[1, 2, 3, 50][seed % 4])
    costs = None
    if seed % 3 == 1:  # per-layer costs (equal |w| in different layers: different scores)
        costs = {p.name: float(c) for p, c in zip(space.prunable_layers, [1.0, 3.0, 0.5, 7.0])}
    elif seed % 3 == 2:  # equal costs: ties across layers stay ties
        costs = {p.name: 2.0 for p in space.prunable_layers}
    for ladder in LADDERS:
        for floor in (0.0, 0.02, 0.3, 1.0):
            for basis in ("prunable", "model"):
                new = nested_ranked_masks(flat, space, ladder, floor, basis, costs)
                old = reference_masks(flat, space, ladder, floor, basis, costs)
                assert len(new) == len(old)
                for a, b in zip(new, old):
                    assert a.dtype == torch.bool and torch.equal(a, b), (ladder, floor, basis)


@pytest.mark.parametrize("seed", range(4))
def test_selection_masks_equal_the_full_ranking_on_continuous_weights(seed: int):
    torch.manual_seed(seed)
    net = Net(width=32)
    space = ParamSpace(net)
    flat = space.flatten(net)
    flat[::5] = 0.0  # a block of exact zeros (a pruned model) ties at the bottom
    for ladder in LADDERS:
        new = nested_ranked_masks(flat, space, ladder, 0.02, "model")
        assert all(torch.equal(a, b) for a, b in zip(new, reference_masks(flat, space, ladder, 0.02, "model")))
        # and the library's own ranking path still gives the same
        assert all(torch.equal(a, b) for a, b in
                   zip(new, nested_masks(magnitude_ranking(flat, space, 0.02), space, ladder, 0.02, "model")))
    assert torch.equal(magnitude_ranking(flat, space, 0.02), reference_ranking(flat, space, 0.02))


def test_non_finite_weights_take_the_ranking_path():
    torch.manual_seed(0)
    space = ParamSpace(Net())
    flat = torch.randn(space.numel)
    flat[space.prunable_layers[1].offset + 3] = float("nan")
    flat[space.prunable_layers[2].offset + 5] = float("inf")
    new = nested_ranked_masks(flat, space, LADDERS[0])
    assert all(torch.equal(a, b) for a, b in zip(new, reference_masks(flat, space, LADDERS[0])))
    costs = {p.name: -1.0 for p in space.prunable_layers}  # negative scores
    new = nested_ranked_masks(torch.randn(space.numel), space, LADDERS[0], costs=costs)
    assert all(int(m.sum()) > 0 for m in new)


def test_selection_masks_refuse_what_the_ranking_refuses():
    space = ParamSpace(Net())
    flat = torch.randn(space.numel)
    with pytest.raises(ValueError, match="increasing"):
        nested_ranked_masks(flat, space, [0.5, 0.1])
    with pytest.raises(ValueError, match="floor"):
        nested_ranked_masks(flat, space, [0.5], floor=1.5)
    with pytest.raises(ValueError, match="density"):
        nested_ranked_masks(flat, space, [0.0, 0.5])


def test_masks_keep_the_floor_and_nest():
    torch.manual_seed(3)
    space = ParamSpace(Net(width=24))
    masks = nested_ranked_masks(torch.randn(space.numel), space, LADDERS[0], 0.02, "prunable")
    for lo, hi in zip(masks, masks[1:]):
        assert not bool((lo & ~hi).any())
    assert int((masks[0] & ~space.always_kept).sum()) == max(floor_count(space, 0.02),
                                                             round(0.05 * space.num_prunable))


def test_magnitude_policy_refresh_equals_the_reference():
    torch.manual_seed(1)
    net = Net(width=20)
    space = ParamSpace(net)
    ladder = LADDERS[0]
    costs = {p.name: float(i + 1) for i, p in enumerate(space.prunable_layers)}
    policy = MagnitudePolicy(space, ladder, space.flatten(net), costs=costs, refresh_every=1, basis="prunable")
    gen = torch.Generator().manual_seed(5)
    for step in range(1, 4):
        params = _tied_params(space, gen, levels=3)
        given = params.clone()
        assert policy.refresh(step, params)
        params.add_(1.0)  # the strategy may change its vector afterwards: the policy kept its own
        ref = reference_masks(given, space, ladder, 0.02, "prunable", costs)
        assert all(torch.equal(policy.mask(l), ref[l]) for l in range(len(ladder)))
        assert torch.equal(policy.ranking, reference_ranking(given, space, 0.02, costs))
    state, tensors = policy.state_dict()
    other = MagnitudePolicy(space, ladder, torch.randn(space.numel), costs=costs, basis="prunable")
    other.load_state_dict(state, {k: v.clone() for k, v in tensors.items()})
    assert all(torch.equal(other.mask(l), policy.mask(l)) for l in range(len(ladder)))
    assert torch.equal(other.ranking, policy.ranking)
    # a checkpoint written before (its ranking itself) still loads
    old = MagnitudePolicy(space, ladder, torch.randn(space.numel), costs=costs, basis="prunable")
    old.load_state_dict({}, {"ranking": policy.ranking.clone()})
    assert all(torch.equal(old.mask(l), policy.mask(l)) for l in range(len(ladder)))


@pytest.mark.parametrize("cls", [RandomPolicy, CoordinateRollingPolicy, CoverageMaxPolicy])
def test_extraction_policies_refresh_equals_the_reference(cls):
    torch.manual_seed(2)
    net = Net(width=12)
    space = ParamSpace(net)
    ladder = LADDERS[0]
    params = space.flatten(net)
    pol = cls(space, ladder, params, floor=0.02, basis="model", seed=3)
    for step in range(1, 5):
        pol.observe([pol.mask(0), pol.mask(2)])
        pol.refresh(step, params)
        ranking = pol.ranking
        for level in range(len(ladder)):
            mask = space.always_kept.clone()
            mask[ranking[:prefix_length(space, ladder[level], 0.02, "model")]] = True
            assert torch.equal(pol.mask(level), mask)


def _arrays(n: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    rnd = torch.rand(n, generator=gen, dtype=torch.float64)
    stride = n // (masks_module._SAMPLED_SELECTION_MIN // 2)
    periodic = torch.zeros(n, dtype=torch.float64)
    periodic[::stride] = 1.0  # every sampled entry large, every other one 0: the sample misleads
    ties = torch.randint(0, 4, (n,), generator=gen).double()
    with_inf = rnd.clone()
    with_inf[: n // 3] = -math.inf  # the selection's masked head
    return {"random": rnd, "ascending": torch.sort(rnd).values, "descending": torch.sort(rnd, descending=True).values,
            "periodic": periodic, "ties": ties, "with_inf": with_inf, "float32": rnd.float(),
            "constant": torch.full((n,), 0.25, dtype=torch.float64)}


@pytest.mark.parametrize("kind", ["random", "ascending", "descending", "periodic", "ties", "with_inf", "float32",
                                  "constant"])
def test_sampled_selection_finds_the_exact_mth_largest(kind: str):
    n = 3 * masks_module._SAMPLED_SELECTION_MIN + 17
    score = _arrays(n)[kind]
    for m in (1, 2, 63, n // 100, n // 3, n // 3 + 1, n // 2, n - n // 10, n - 1, n):
        want = masks_module._select_mth_largest(score, m)
        got = masks_module.mth_largest(score, m)
        assert got.dtype == score.dtype and float(got) == float(want), (kind, m)
        # and the positions: those of a stable descending sort
        order = torch.sort(score, descending=True, stable=True).indices[:m]
        expected = torch.zeros(n, dtype=torch.bool)
        expected[order] = True
        assert torch.equal(masks_module.top_positions(score, m), expected), (kind, m)


def test_sampled_selection_with_nan_matches_topk():
    n = 2 * masks_module._SAMPLED_SELECTION_MIN
    score = torch.rand(n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    score[::1000] = float("nan")
    for m in (1, 50, n // 2):
        a, b = masks_module.mth_largest(score, m), masks_module._select_mth_largest(score, m)
        assert (math.isnan(float(a)) and math.isnan(float(b))) or float(a) == float(b)


@pytest.mark.parametrize("levels", [2, 9, 1000])
def test_selection_masks_equal_the_full_ranking_on_a_large_model(levels: int):
    """Layers above the sampled selection's size (fc1: 76,800 weights), ties included."""
    space = ParamSpace(Net(width=80))
    assert max(p.numel for p in space.prunable_layers) > masks_module._SAMPLED_SELECTION_MIN
    flat = _tied_params(space, torch.Generator().manual_seed(levels), levels)
    for ladder in LADDERS:
        for floor, basis in ((0.02, "model"), (0.0, "prunable"), (0.3, "prunable")):
            new = nested_ranked_masks(flat, space, ladder, floor, basis)
            old = reference_masks(flat, space, ladder, floor, basis)
            assert all(torch.equal(a, b) for a, b in zip(new, old)), (ladder, floor, basis)


@pytest.mark.parametrize("old_format", [False, True])
def test_a_fedgmr_run_resumes_exactly_from_either_checkpoint_format(tmp_path, old_format: bool):
    """The checkpoint holds the weights the masks were selected from; one written before
    (the ranking itself) resumes to the same metrics."""
    from conftest import tiny_config
    from fedgmr.experiment.checkpoint import load_checkpoint, save_checkpoint
    from fedgmr.experiment.runner import run_experiment
    from fedgmr.methods import resolve_config

    raw = tiny_config(model={"name": "cnn", "options": {"channels": [8, 16]}},
                      restoration={"check_interval": 3, "patience": 1},
                      run={"max_time": 90.0, "max_steps": None, "eval_every": None, "eval_interval": 3.0,
                           "checkpoint_every": 10})
    cfg = resolve_config(raw)
    run_experiment(cfg, tmp_path / "ref")
    assert run_experiment(cfg, tmp_path / "cut", stop_after_steps=25) == {"interrupted": True, "steps": 25}
    state, tensors = load_checkpoint(tmp_path / "cut")
    key = "strategy/policy/ranking_weights"
    assert key in tensors and "strategy/policy/ranking" not in tensors
    if old_format:
        from fedgmr.experiment.build import build_experiment

        exp = build_experiment(cfg)
        try:
            pol = exp.strategy.policy
            tensors["strategy/policy/ranking"] = magnitude_ranking(tensors.pop(key), pol.space, pol.floor,
                                                                  pol.costs)
        finally:
            exp.executor.close()
        save_checkpoint(tmp_path / "cut", state, tensors)
    run_experiment(cfg, tmp_path / "cut", resume=True)
    assert (tmp_path / "cut" / "metrics.jsonl").read_bytes() == (tmp_path / "ref" / "metrics.jsonl").read_bytes()
