"""The per-layer cost rule of the mask ranking, taken from the authors' code:
importance = |w| / c_l with c_l = comm + T * comp_l (seconds per parameter), each prunable
layer's top 2 % first. On Conv-2 it decides how many coordinates each layer keeps."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_config
from fedgmr.algorithm.masks import (FEMNIST_CONV2_COSTS, explicit_costs, layer_costs, magnitude_ranking,
                                    nested_masks)
from fedgmr.algorithm.params import ParamSpace
from fedgmr.errors import ConfigError
from fedgmr.experiment.build import build_experiment, mask_costs
from fedgmr.methods import resolve_config
from fedgmr.models import build_model

LADDER = [0.05, 0.1, 0.2, 0.5, 1.0]


@pytest.fixture(scope="module")
def conv2():
    torch.manual_seed(0)  # the mnist preset's Conv-2 (16/32 channels, FC 512) on 28x28 inputs
    model = build_model("conv2", 10, (1, 28, 28), channels=[16, 32], hidden=512)
    space = ParamSpace(model)
    return space, space.flatten(model)


def kept_per_layer(space, flat, costs, basis):
    masks = nested_masks(magnitude_ranking(flat, space, 0.02, costs), space, LADDER, 0.02, basis)
    return [[int(m[p.slice].sum()) for p in space.prunable_layers] for m in masks]


def test_conv2_layers_kept_per_level_with_the_authors_costs(conv2):
    space, flat = conv2
    assert [p.numel for p in space.prunable_layers] == [400, 12800, 802816]  # conv1, conv2, fc1
    costs = explicit_costs(space, list(FEMNIST_CONV2_COSTS))
    # conv2 costs 6.3x fc1 per parameter: it stays at its 2 % floor (256) below the full
    # model; conv1 (comm only, large |w|) keeps ~91 %; fc1 takes the rest
    assert kept_per_layer(space, flat, costs, "prunable") == [
        [364, 256, 40181], [364, 256, 80982], [367, 256, 162580], [375, 256, 407377], [400, 12800, 802816]]
    assert kept_per_layer(space, flat, costs, "model") == [
        [363, 256, 34776], [364, 256, 75861], [366, 256, 158029], [375, 256, 404532], [400, 12800, 802816]]


def test_conv2_layers_kept_per_level_with_plain_magnitudes(conv2):
    space, flat = conv2
    # plain |w|: conv2's larger initial weights (fan-in 400 vs 1568) win half its layer
    assert kept_per_layer(space, flat, None, "prunable") == [
        [357, 6542, 33902], [359, 6881, 74362], [364, 7509, 155330], [373, 9485, 398150], [400, 12800, 802816]]


def test_constant_compute_makes_the_derived_costs_uniform():
    """In this simulator's default time model a job's compute time does not depend on
    its sub-model, so every layer costs the same per parameter: the ranking is |w|."""
    cfg = resolve_config(tiny_config(model={"name": "cnn", "options": {"channels": [8, 16]}},
                                     submodel={"cost_weighted": True}))
    exp = build_experiment(cfg)
    model = build_model("cnn", 10, tuple(exp.data.input_shape), channels=[8, 16])
    costs = mask_costs(cfg, exp.space, model, exp.data.train.x[:1])
    assert len(set(costs.values())) == 1
    flat = exp.strategy.params
    assert torch.equal(magnitude_ranking(flat, exp.space, 0.02, costs), magnitude_ranking(flat, exp.space, 0.02))


def test_flops_compute_makes_conv_layers_dearer():
    cfg = resolve_config(tiny_config(model={"name": "cnn", "options": {"channels": [8, 16]}},
                                     submodel={"cost_weighted": True},
                                     network={"compute": {"kind": "flops"}}))
    exp = build_experiment(cfg)
    model = build_model("cnn", 10, tuple(exp.data.input_shape), channels=[8, 16])
    costs = mask_costs(cfg, exp.space, model, exp.data.train.x[:1])
    names = [p.name for p in exp.space.prunable_layers]
    assert set(costs) == set(names) and len(names) == 2  # the two convs (the classifier is never pruned)
    comm = 4 * 1.0 * (2.0e6 / (4 * exp.space.numel + 14)) / 5e6  # 4 B x model_size scale / 5 MB/s
    # conv1 runs at 8x8 output positions, conv2 after pooling at 4x4: 4x the MACs per weight
    extra = {n: c - comm for n, c in costs.items()}
    assert extra[names[0]] == pytest.approx(4 * extra[names[1]]) and extra[names[1]] > 0


def test_explicit_costs_must_match_the_prunable_layers(conv2):
    space, _ = conv2
    with pytest.raises(ValueError, match="3 prunable layers"):
        explicit_costs(space, [1.0, 2.0])
    with pytest.raises(ValueError, match="missing"):
        explicit_costs(space, {"features.0.weight": 1.0})
    by_name = explicit_costs(space, {p.name: float(i + 1) for i, p in enumerate(space.prunable_layers)})
    assert list(by_name.values()) == [1.0, 2.0, 3.0]
    assert layer_costs(space, 1.0, {"features.3.weight": 5.0})["features.3.weight"] == 6.0
    with pytest.raises(ConfigError, match="layer_costs"):
        build_experiment(resolve_config(tiny_config(submodel={"cost_weighted": True, "layer_costs": [1.0, 2.0]})))
