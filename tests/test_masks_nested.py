"""Nested magnitude masks on a real conv + BatchNorm + linear model (docs/reference.md
§3.1-3.3, and the nested-mask, restoration and IMS vectors of its Appendix A)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from fedgmr.algorithm.masks import (
    flops_per_weight,
    floor_count,
    ims_increments,
    compute_costs,
    layer_costs,
    magnitude_ranking,
    mask_from_ranking,
    nested_masks,
)
from fedgmr.algorithm.params import ParamSpace
from fedgmr.algorithm.policies import MagnitudePolicy
from fedgmr.algorithm.restoration import DensityLadder

LADDER = [0.05, 0.1, 0.2, 0.5, 1.0]


class SmallNet(nn.Module):
    """conv(1->8) - BN - pool - conv(8->16) - BN - pool - fc(64->32) - fc_out(32->10)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc1 = nn.Linear(64, 32)
        self.fc_out = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc_out(torch.relu(self.fc1(x.flatten(1))))


PRUNABLE = {"conv1.weight", "conv2.weight", "fc1.weight"}


@pytest.fixture
def net() -> SmallNet:
    torch.manual_seed(0)
    return SmallNet()


@pytest.fixture
def space(net) -> ParamSpace:
    return ParamSpace(net)


def _is_subset(a: torch.Tensor, b: torch.Tensor) -> bool:
    return not bool((a & ~b).any())


# ---------------------------------------------------------------------------- ParamSpace

def test_paramspace_prunable_and_always_kept(net, space):
    assert space.output_layer == "fc_out"
    flags = {p.name: p.prunable for p in space.params}
    assert {n for n, f in flags.items() if f} == PRUNABLE
    for name in ("fc_out.weight", "fc_out.bias", "conv1.bias", "conv2.bias", "fc1.bias",
                 "bn1.weight", "bn1.bias", "bn2.weight", "bn2.bias"):
        assert flags[name] is False, name
    # always_kept is exactly the union of the non-prunable slices
    expected = torch.zeros(space.numel, dtype=torch.bool)
    for p in space.params:
        if not p.prunable:
            expected[p.slice] = True
    assert torch.equal(space.always_kept, expected)
    assert space.num_prunable == 72 + 1152 + 2048


def test_batchnorm_running_stats_are_not_in_the_param_space(net, space):
    names = {p.name for p in space.params}
    assert not any("running" in n or "num_batches" in n for n in names)
    assert space.numel == sum(p.numel() for p in net.parameters())
    for bn in ("bn1", "bn2"):
        for buf in ("running_mean", "running_var", "num_batches_tracked"):
            assert f"{bn}.{buf}" in space.buffer_names


def test_flatten_load_round_trip(net, space):
    flat = space.flatten(net)
    assert flat.shape == (space.numel,)
    other = SmallNet()
    space.load(other, flat)
    assert torch.equal(space.flatten(other), flat)


# ---------------------------------------------------------------------------- ranking

def test_ranking_is_a_deterministic_permutation_of_prunable_coordinates(net, space):
    flat = space.flatten(net)
    r1 = magnitude_ranking(flat, space)
    r2 = magnitude_ranking(flat.clone(), space)
    assert torch.equal(r1, r2)
    prunable_idx = torch.nonzero(~space.always_kept).flatten()
    assert torch.equal(torch.sort(r1).values, prunable_idx)


def test_ranking_ties_broken_by_position(space):
    flat = torch.ones(space.numel)
    r = magnitude_ranking(flat, space, floor=0.02)
    head = floor_count(space, 0.02)
    # all scores equal: the floors come first (by flat index), then the rest by flat index
    assert torch.equal(r[:head], torch.sort(r[:head]).values)
    assert torch.equal(r[head:], torch.sort(r[head:]).values)
    assert torch.equal(r, magnitude_ranking(flat.clone(), space, floor=0.02))


def test_ranking_orders_by_magnitude_after_floor(space):
    flat = torch.zeros(space.numel)
    # one big weight in fc1 beats everything else outside the floors
    fc1 = next(p for p in space.params if p.name == "fc1.weight")
    flat[fc1.offset + 100] = 5.0
    r = magnitude_ranking(flat, space, floor=0.0)
    assert int(r[0]) == fc1.offset + 100


# ---------------------------------------------------------------------------- nested masks

def test_nested_masks_sizes_floors_and_nesting(net, space):
    flat = space.flatten(net)
    ranking = magnitude_ranking(flat, space, floor=0.02)
    masks = nested_masks(ranking, space, LADDER, floor=0.02, basis="prunable")  # densities over prunable weights
    n_layers = len(space.prunable_layers)
    P = space.num_prunable
    for lo, hi in zip(masks, masks[1:]):
        assert _is_subset(lo, hi)
    for rho, m in zip(LADDER, masks):
        # always-kept coordinates are in every mask
        assert bool(m[space.always_kept].all())
        k = int((m & ~space.always_kept).sum())
        assert abs(k - round(rho * P)) <= n_layers, (rho, k, rho * P)
        assert space.density(m) == pytest.approx(rho, abs=n_layers / P)
        for layer in space.prunable_layers:
            kept = int(m[layer.slice].sum())
            assert kept >= math.ceil(0.02 * layer.numel), (rho, layer.name, kept)
    assert bool(masks[-1].all())


def test_mask_below_floor_total_yields_the_floor(space):
    ranking = magnitude_ranking(torch.randn(space.numel), space, floor=0.02)
    m = mask_from_ranking(ranking, space, 0.001, floor=0.02)
    assert int((m & ~space.always_kept).sum()) == floor_count(space, 0.02)
    for layer in space.prunable_layers:
        assert int(m[layer.slice].sum()) == math.ceil(0.02 * layer.numel)


def test_mask_density_out_of_range_raises(space):
    ranking = magnitude_ranking(torch.randn(space.numel), space)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            mask_from_ranking(ranking, space, bad)
    with pytest.raises(ValueError):
        nested_masks(ranking, space, [0.5, 0.1])


def test_ims_increments_disjoint_with_union_top(net, space):
    policy = MagnitudePolicy(space, LADDER, space.flatten(net))
    blocks = policy.increments()
    assert len(blocks) == len(LADDER)
    for i in range(len(blocks)):
        for j in range(i + 1, len(blocks)):
            assert not bool((blocks[i] & blocks[j]).any()), (i, j)
    union = torch.zeros(space.numel, dtype=torch.bool)
    for b in blocks:
        union |= b
    assert torch.equal(union, policy.mask(len(LADDER) - 1))
    # the prefix unions rebuild every level
    acc = torch.zeros(space.numel, dtype=torch.bool)
    for level, b in enumerate(blocks):
        acc |= b
        assert torch.equal(acc, policy.mask(level))
    # same via the free function
    direct = ims_increments([policy.mask(l) for l in range(len(LADDER))])
    assert all(torch.equal(a, b) for a, b in zip(direct, blocks))


def test_nested_with_layer_costs(net, space):
    comp = compute_costs(space, flops_per_weight(net, space, torch.randn(2, 1, 8, 8)), seconds=0.5)
    costs = layer_costs(space, 1e-6, comp)
    assert set(costs) == PRUNABLE
    assert all(costs[n] == 1e-6 + comp[n] for n in PRUNABLE)
    policy = MagnitudePolicy(space, LADDER, space.flatten(net), costs=costs)
    masks = [policy.mask(l) for l in range(len(LADDER))]
    for lo, hi in zip(masks, masks[1:]):
        assert _is_subset(lo, hi)
    for layer in space.prunable_layers:
        assert int(masks[0][layer.slice].sum()) >= math.ceil(0.02 * layer.numel)


# ---------------------------------------------------------------------------- restoration

def test_restoring_a_client_never_removes_coordinates(net, space):
    policy = MagnitudePolicy(space, LADDER, space.flatten(net))
    ladder = DensityLadder.from_densities(LADDER, [0.1, 1.0])
    assert ladder.density(0) == 0.1
    before = policy.mask(ladder.levels[0]).clone()
    moved = ladder.restore()
    assert moved == [0]
    assert ladder.density(0) == 0.2
    after = policy.mask(ladder.levels[0])
    assert _is_subset(before, after)
    assert int(after.sum()) > int(before.sum())
    # a later server step without refresh leaves the masks as they were
    changed = space.flatten(net) * 3.0 + torch.randn(space.numel)
    assert policy.refresh(5, changed) is False
    assert torch.equal(policy.mask(ladder.levels[0]), after)
    # every further step up keeps everything too
    prev = after.clone()
    while ladder.restore():
        cur = policy.mask(ladder.levels[0])
        assert _is_subset(prev, cur)
        prev = cur.clone()
    assert ladder.density(0) == 1.0


def test_refresh_keeps_levels_nested(net, space):
    policy = MagnitudePolicy(space, LADDER, space.flatten(net), refresh_every=2, basis="prunable")
    old = [policy.mask(l).clone() for l in range(len(LADDER))]
    torch.manual_seed(1)
    new_params = torch.randn(space.numel)
    assert policy.refresh(1, new_params) is False
    assert all(torch.equal(policy.mask(l), old[l]) for l in range(len(LADDER)))
    assert policy.refresh(2, new_params) is True
    new = [policy.mask(l) for l in range(len(LADDER))]
    assert any(not torch.equal(a, b) for a, b in zip(old, new))
    for lo, hi in zip(new, new[1:]):
        assert _is_subset(lo, hi)
    for rho, m in zip(LADDER, new):
        k = int((m & ~space.always_kept).sum())
        assert abs(k - round(rho * space.num_prunable)) <= len(space.prunable_layers)
        assert bool(m[space.always_kept].all())
    # the refreshed masks follow the new magnitudes
    assert torch.equal(policy.ranking, magnitude_ranking(new_params, space, 0.02))


def test_policy_state_dict_round_trip(net, space):
    policy = MagnitudePolicy(space, LADDER, space.flatten(net))
    state, tensors = policy.state_dict()
    other = MagnitudePolicy(space, LADDER, torch.randn(space.numel))
    other.load_state_dict(state, {k: v.clone() for k, v in tensors.items()})
    for l in range(len(LADDER)):
        assert torch.equal(other.mask(l), policy.mask(l))


def test_one_default_density_basis_everywhere():
    """The config, the magnitude policy and the pure mask functions count a density the
    same way unless told otherwise (they used to disagree: 'model' vs 'prunable')."""
    import inspect

    from fedgmr.algorithm import masks
    from fedgmr.algorithm.policies import MagnitudePolicy
    from fedgmr.config import SubmodelConfig

    default = SubmodelConfig().density_basis
    assert default == "model"
    assert inspect.signature(MagnitudePolicy).parameters["basis"].default == default
    for fn in (masks.prefix_length, masks.mask_from_ranking, masks.nested_masks, masks.nested_ranked_masks,
               masks.ranked_mask):
        assert inspect.signature(fn).parameters["basis"].default == default, fn.__name__
