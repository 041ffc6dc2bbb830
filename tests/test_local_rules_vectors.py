"""Hand-derived exact vectors for the data-heterogeneity methods' update rules
(fedgmr.algorithm.local_rules; docs/methods/fedprox.md, scaffold.md, ditto.md, fedbn.md)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from fedgmr.algorithm.local_rules import (batch_norm_coordinates, personal_summary, proximal_gradient,
                                          scaffold_control_update, scaffold_corrected_gradient,
                                          scaffold_server_control, seed_new_coordinates, straggler_steps)
from fedgmr.algorithm.params import ParamSpace

T = torch.tensor
M = lambda *bits: torch.tensor([bool(b) for b in bits])  # noqa: E731


def test_proximal_gradient_is_masked_and_uses_the_squared_norm():
    # g + mu (w - anchor) = [1 + .5, 2 - .5, 3 + 0, 4 + .5]; the third coordinate is pruned
    out = proximal_gradient(T([1., 2., 3., 4.]), T([1., 1., 0., 2.]), T([0., 2., 5., 1.]), 0.5, M(1, 1, 0, 1))
    assert torch.equal(out, T([1.5, 1.5, 0., 4.5]))
    # no mask: the pruned coordinate's pull 0.5 * (0 - 5) = -2.5 would move it
    assert torch.equal(proximal_gradient(T([0.]), T([0.]), T([5.]), 0.5), T([-2.5]))


def test_scaffold_corrected_gradient():
    # g - c_i + c = [1 - .5 + 1, 2 - 0 + 1, 3 - 1 + 1] = [1.5, 3, 3]; the middle one is pruned
    assert torch.equal(scaffold_corrected_gradient(T([1., 2., 3.]), T([.5, 0., 1.]), T([1., 1., 1.]), M(1, 0, 1)),
                       T([1.5, 0., 3.]))


def test_scaffold_option_two_control_update():
    # K = 2, lr = .25: (x - y) / (K lr) = [.5, 0, 1] / .5 = [1, 0, 2]
    # c_i+ = c_i - c + that = [.5 - 1 + 1, 0 - 1 + 0, 1 - 1 + 2] = [.5, -1, 2], masked [.5, 0, 2]
    c_new, delta = scaffold_control_update(T([.5, 0., 1.]), T([1., 1., 1.]), T([1., 2., 3.]), T([.5, 2., 2.]),
                                           2, 0.25, M(1, 0, 1))
    assert torch.equal(c_new, T([.5, 0., 2.]))
    assert torch.equal(delta, T([0., 0., 1.]))
    with pytest.raises(ValueError):
        scaffold_control_update(T([0.]), T([0.]), T([0.]), T([0.]), 0, 0.1)


def test_scaffold_server_control_divides_by_all_clients_not_the_sampled_ones():
    # full model, N = 4 clients, two replied: c + (4 + 0) / 4, c + (8 + 4) / 4
    out = scaffold_server_control(T([0., 0.]), [(M(1, 1), T([4., 8.])), (M(1, 1), T([0., 4.]))], T([4, 4]))
    assert torch.equal(out, T([1., 3.]))


def test_scaffold_server_control_normalises_by_each_coordinates_coverage():
    # totals [2 + 1, 4, 3, 0]; coverage (clients holding each coordinate) [2, 1, 2, 3]
    # -> c + [1.5, 4, 1.5, 0]; the last coordinate no update covers keeps its value
    out = scaffold_server_control(T([0., 0., 0., 1.]), [(M(1, 1, 0, 0), T([2., 4.])), (M(1, 0, 1, 0), T([1., 3.]))],
                                  T([2, 1, 2, 3]))
    assert torch.equal(out, T([1.5, 4., 1.5, 1.]))
    with pytest.raises(ValueError, match="no client holds"):
        scaffold_server_control(T([0.]), [(M(1), T([1.]))], T([0]))


def test_seed_new_coordinates_keeps_held_seeds_new_and_drops_left():
    # held [T, T, F, F], new mask [T, F, T, F]: keep 1, drop 2 (left the mask), seed 9, stay 0
    out = seed_new_coordinates(T([1., 2., 3., 4.]), M(1, 1, 0, 0), M(1, 0, 1, 0), T([9., 9., 9., 9.]))
    assert torch.equal(out, T([1., 0., 9., 0.]))
    # first contact: the source on the mask
    assert torch.equal(seed_new_coordinates(None, None, M(0, 1), T([5., 6.])), T([0., 6.]))


def test_straggler_steps():
    assert all(straggler_steps(s, 0.0, 5) == 5 for s in range(50))
    steps = [straggler_steps(s, 1.0, 5) for s in range(400)]
    assert set(steps) == {1, 2, 3, 4}  # uniform in [1, E), E never
    assert all(straggler_steps(s, 1.0, 1) == 1 for s in range(20))
    assert [straggler_steps(s, 0.9, 5) for s in range(50)] == [straggler_steps(s, 0.9, 5) for s in range(50)]
    share = sum(straggler_steps(s, 0.5, 5) < 5 for s in range(4000)) / 4000
    assert 0.46 < share < 0.54


def test_batch_norm_coordinates_are_selected_by_module_type_not_name():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn_like = nn.Linear(2, 3)  # named like BN, is not
            self.layer = nn.BatchNorm1d(3)  # named like nothing, is BN
            self.norm = nn.LayerNorm(3)  # a norm, not BatchNorm: shared

    net = Net()
    space = ParamSpace(net)
    local, buffers = batch_norm_coordinates(net, space)
    # layout: bn_like.weight 6, bn_like.bias 3, layer.weight 3, layer.bias 3, norm.weight 3, norm.bias 3
    assert local.tolist() == [False] * 9 + [True] * 6 + [False] * 6
    assert buffers == ("layer.running_mean", "layer.running_var", "layer.num_batches_tracked")


def test_personal_summary():
    out = personal_summary([0.8, 0.2, 0.6, 0.4])
    assert out["personal_accuracy"] == 0.5
    assert math.isclose(out["personal_std"], math.sqrt(0.05), rel_tol=0, abs_tol=1e-15)
    assert out["personal_worst10"] == 0.2  # ceil(10 % of 4) = 1 client
    # 11 clients: the worst ceil(1.1) = 2 are averaged
    assert personal_summary([1.0] * 9 + [0.1, 0.3])["personal_worst10"] == 0.2
