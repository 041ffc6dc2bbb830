"""Hand-computed aggregation vectors (docs/reference.md §4 and Appendix A: MA, FA, GA,
coverage, FedAsync).

Updates use the ``(mask, values-at-mask)`` format of :mod:`fedgmr.algorithm.aggregation`.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedgmr.algorithm.aggregation import (
    RULES,
    average_buffers,
    coverage_counts,
    dense,
    fedasync_mix,
    delta_average,
    gradient_average,
    mask_aware_average,
    floored_ma_rule,
    zero_padded_average,
)
from fedgmr.algorithm.masks import coverage
from fedgmr.algorithm.staleness import Polynomial, fedasync_alpha


def _full_4x4() -> torch.Tensor:
    return torch.ones(16, dtype=torch.bool)


def _block_4x4() -> torch.Tensor:
    """Width 0.5 of a 4x4 layer: the block [:2, :2], flattened row-major."""
    m = torch.zeros(4, 4, dtype=torch.bool)
    m[:2, :2] = True
    return m.reshape(-1)


def _update(mask: torch.Tensor, value: float) -> tuple[torch.Tensor, torch.Tensor]:
    return mask, torch.full((int(mask.sum()),), value, dtype=torch.float32)


def _ab_updates():
    """Client A (full) returns 2s, client B (block [:2,:2]) returns 4s."""
    return [_update(_full_4x4(), 2.0), _update(_block_4x4(), 4.0)]


# ---------------------------------------------------------------------------- MA

def test_ma_equal_weights_vector():
    prev = torch.zeros(16)
    out = mask_aware_average(prev, _ab_updates(), [1.0, 1.0]).view(4, 4)
    expected = torch.full((4, 4), 2.0)
    expected[:2, :2] = 3.0
    assert torch.equal(out, expected)


def test_ma_weighted_vector():
    prev = torch.zeros(16)
    out = mask_aware_average(prev, _ab_updates(), [1.0, 3.0]).view(4, 4)
    expected = torch.full((4, 4), 2.0)
    expected[:2, :2] = 3.5  # (1*2 + 3*4) / 4
    assert torch.equal(out, expected)


def test_ma_uncovered_element_keeps_previous_value():
    prev = torch.arange(16, dtype=torch.float32) - 7.5  # nonzero everywhere
    # only client B (block [:2,:2]) reports
    out = mask_aware_average(prev, [_update(_block_4x4(), 4.0)], [1.0])
    block = _block_4x4()
    assert torch.equal(out[block], torch.full((4,), 4.0))
    assert torch.equal(out[~block], prev[~block])
    assert bool(torch.isfinite(out).all())
    # the input is not modified in place
    assert torch.equal(prev, torch.arange(16, dtype=torch.float32) - 7.5)


def test_ma_no_updates_keeps_everything():
    prev = torch.randn(16)
    out = mask_aware_average(prev, [], [])
    assert torch.equal(out, prev)


def test_ma_zero_weight_client_counts_as_uncovered():
    prev = torch.full((16,), -1.0)
    out = mask_aware_average(prev, [_update(_block_4x4(), 4.0)], [0.0])
    assert torch.equal(out, prev)


def test_ma_rule_registered():
    rule = RULES.get("ma")
    assert rule.consumes == "model"
    assert not rule.sequential
    out = rule(torch.zeros(16), _ab_updates(), [1.0, 1.0]).view(4, 4)
    assert out[0, 0] == 3.0 and out[3, 3] == 2.0


# ---------------------------------------------------------------------------- FA

def test_fa_zero_padded_vector():
    prev = torch.full((16,), 123.0)  # FA ignores the previous model entirely
    out = zero_padded_average(prev, _ab_updates(), [1.0, 1.0]).view(4, 4)
    expected = torch.full((4, 4), 1.0)  # (2 + 0) / 2
    expected[:2, :2] = 3.0  # (2 + 4) / 2
    assert torch.equal(out, expected)
    assert RULES.get("fa").consumes == "model"


# ---------------------------------------------------------------------------- GA

def test_ga_delta_equal_weights_is_mean_of_masked_deltas_diluted():
    prev = torch.arange(16, dtype=torch.float32)
    # A's delta is +1 everywhere, B's delta is +3 on the block only
    deltas = [_update(_full_4x4(), 1.0), _update(_block_4x4(), 3.0)]
    out = delta_average(prev, deltas, [1.0, 1.0])
    block = _block_4x4()
    expected = prev.clone()
    expected[block] += (1.0 + 3.0) / 2  # 2
    expected[~block] += (1.0 + 0.0) / 2  # 0.5: B's sparse delta dilutes (not MA)
    assert torch.equal(out, expected)
    # by definition: W + (1/C) sum_i dense(delta_i)
    by_def = prev + (dense(*deltas[0]) + dense(*deltas[1])) / 2
    assert torch.allclose(out, by_def, rtol=0, atol=0)
    assert RULES.get("ga_delta").consumes == "delta"


def test_ga_delta_weighted():
    prev = torch.zeros(16)
    deltas = [_update(_full_4x4(), 1.0), _update(_block_4x4(), 3.0)]
    out = delta_average(prev, deltas, [1.0, 3.0]).view(4, 4)
    expected = torch.full((4, 4), 0.25)  # (1*1 + 3*0) / 4
    expected[:2, :2] = 2.5  # (1*1 + 3*3) / 4
    assert torch.equal(out, expected)


def test_ga_on_fresh_models_equals_ga_on_their_deltas():
    # clients downloaded W = prev: their models are prev + delta on their masks
    prev = torch.arange(16, dtype=torch.float32)
    full, block = _full_4x4(), _block_4x4()
    models = [(full, prev[full] + 1.0), (block, prev[block] + 3.0)]
    deltas = [_update(full, 1.0), _update(block, 3.0)]
    for w in ([1.0, 1.0], [1.0, 3.0]):
        assert torch.equal(gradient_average(prev, models, w), delta_average(prev, deltas, w))
    assert RULES.get("ga").consumes == "model"


def test_ga_vector_on_the_ma_case():
    # the hand-computed MA case (docs/reference.md Appendix A; global zeros; A full returns 2s, B block returns 4s), under GA:
    # W + (1/2)[(2 - 0) + (4 - 0) m_B] -> block (2 + 4) / 2 = 3, elsewhere 2 / 2 = 1
    out = gradient_average(torch.zeros(16), _ab_updates(), [1.0, 1.0]).view(4, 4)
    expected = torch.full((4, 4), 1.0)
    expected[:2, :2] = 3.0
    assert torch.equal(out, expected)
    # a stale buffered model used again pulls W toward it, never past it: W = 1 where
    # only A (2s) and B (outside its block) cover -> 1 + (1/2)(2 - 1) = 1.5
    again = gradient_average(out.view(-1), _ab_updates(), [1.0, 1.0]).view(4, 4)
    assert again[3, 3] == 1.5 and again[0, 0] == 3.0


def test_ga_no_updates_is_identity():
    prev = torch.randn(16)
    assert torch.equal(gradient_average(prev, [], []), prev)
    assert torch.equal(delta_average(prev, [], []), prev)


# ---------------------------------------------------------------------------- FedAsync

def test_fedasync_alpha_vector():
    # alpha = 0.6, polynomial a = 0.5, tau = 3: 0.6 * 4^-0.5 = 0.3
    assert fedasync_alpha(0.6, Polynomial(0.5), 3) == pytest.approx(0.3, abs=1e-15)
    assert fedasync_alpha(0.6, Polynomial(0.5), 0) == pytest.approx(0.6, abs=1e-15)


def test_fedasync_mix_vector():
    a = fedasync_alpha(0.6, Polynomial(0.5), 3)  # 0.3
    prev = torch.full((16,), 1.0, dtype=torch.float64)
    out = fedasync_mix(prev, [(_full_4x4(), torch.full((16,), 3.0, dtype=torch.float64))], [a])
    # (1 - 0.3) * 1 + 0.3 * 3 = 1.6
    assert torch.allclose(out, torch.full((16,), 1.6, dtype=torch.float64), rtol=0, atol=1e-12)


def test_fedasync_mix_partial_mask_moves_only_masked_coordinates():
    prev = torch.full((16,), 1.0)
    block = _block_4x4()
    out = fedasync_mix(prev, [_update(block, 3.0)], [0.5])
    assert torch.equal(out[block], torch.full((4,), 2.0))
    assert torch.equal(out[~block], torch.full((12,), 1.0))


def test_fedasync_mix_sequential_in_order():
    prev = torch.zeros(16)
    ups = [_update(_full_4x4(), 4.0), _update(_full_4x4(), 8.0)]
    out = fedasync_mix(prev, ups, [0.5, 0.25])
    # first: 0.5*0 + 0.5*4 = 2; then 0.75*2 + 0.25*8 = 3.5
    assert torch.equal(out, torch.full((16,), 3.5))
    assert RULES.get("fedasync").sequential


def test_fedasync_mix_rejects_rate_outside_unit_interval():
    with pytest.raises(ValueError):
        fedasync_mix(torch.zeros(16), [_update(_full_4x4(), 1.0)], [1.5])


# ---------------------------------------------------------------------------- coverage

def _coverage_masks():
    rows = [[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    return [torch.tensor(r, dtype=torch.bool) for r in rows]


def test_coverage_vector():
    masks = _coverage_masks()
    gamma = coverage_counts(masks)
    assert gamma.tolist() == [3, 2, 1, 1, 0, 0]
    assert int(gamma.min()) == 0  # Gamma* = 0
    assert coverage(masks).tolist() == [3, 2, 1, 1, 0, 0]


def test_ma_leaves_uncovered_coverage_coordinates_unchanged():
    masks = _coverage_masks()
    prev = torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    updates = [(m, torch.full((int(m.sum()),), float(i + 1))) for i, m in enumerate(masks)]
    out = mask_aware_average(prev, updates, [1.0, 1.0, 1.0])
    # coord 0: (1+2+3)/3 = 2; coord 1: (1+2)/2 = 1.5; coords 2,3: 1; coords 4,5 untouched
    assert out.tolist() == [2.0, 1.5, 1.0, 1.0, 50.0, 60.0]


# ---------------------------------------------------------------------------- validation

def test_rules_reject_malformed_updates():
    prev = torch.zeros(16)
    bad_len = (_block_4x4(), torch.ones(5))
    bad_shape = (torch.ones(15, dtype=torch.bool), torch.ones(15))
    for fn in (mask_aware_average, gradient_average, zero_padded_average, fedasync_mix):
        with pytest.raises(ValueError):
            fn(prev, [bad_len], [1.0])
        with pytest.raises(ValueError):
            fn(prev, [bad_shape], [1.0])
        with pytest.raises(ValueError):
            fn(prev, [_update(_block_4x4(), 1.0)], [1.0, 1.0])
    with pytest.raises(ValueError):
        mask_aware_average(prev, [_update(_block_4x4(), 1.0)], [-1.0])


# ---------------------------------------------------------------------------- buffers

def test_average_buffers_float_weighted_int_max():
    prev = {"bn.running_mean": torch.zeros(3), "bn.running_var": torch.ones(3),
            "bn.num_batches_tracked": torch.tensor(0, dtype=torch.long)}
    b1 = {"bn.running_mean": torch.tensor([1.0, 2.0, 3.0]), "bn.running_var": torch.tensor([2.0, 2.0, 2.0]),
          "bn.num_batches_tracked": torch.tensor(5, dtype=torch.long)}
    b2 = {"bn.running_mean": torch.tensor([5.0, 6.0, 7.0]), "bn.running_var": torch.tensor([4.0, 6.0, 10.0]),
          "bn.num_batches_tracked": torch.tensor(9, dtype=torch.long)}
    out = average_buffers([b1, b2], [1.0, 3.0], prev)
    assert torch.equal(out["bn.running_mean"], torch.tensor([4.0, 5.0, 6.0]))  # (1*b1 + 3*b2) / 4
    assert torch.equal(out["bn.running_var"], torch.tensor([3.5, 5.0, 8.0]))
    assert out["bn.num_batches_tracked"].dtype == torch.long
    assert int(out["bn.num_batches_tracked"]) == 9
    assert out["bn.running_mean"].dtype == torch.float32


def test_average_buffers_empty_and_zero_weights_keep_previous():
    prev = {"m": torch.tensor([1.0, 2.0]), "n": torch.tensor(3, dtype=torch.long)}
    out = average_buffers([], [], prev)
    assert torch.equal(out["m"], prev["m"]) and out["m"] is not prev["m"]
    out0 = average_buffers([{"m": torch.tensor([9.0, 9.0]), "n": torch.tensor(4)}], [0.0], prev)
    assert torch.equal(out0["m"], prev["m"])
    assert not any(math.isnan(v) for v in out0["m"].tolist())


def _floor_case():
    """Client A (full mask, weight 1) returns [1, 2, 3, 4, 5]; client B (coordinates 0-1,
    weight 3) returns [3, 6]; coordinate 4 is nobody's (A's mask leaves it out)."""
    a = torch.tensor([True, True, True, True, False])
    b = torch.tensor([True, True, False, False, False])
    return torch.full((5,), 9.0), [(a, torch.tensor([1.0, 2.0, 3.0, 4.0])), (b, torch.tensor([3.0, 6.0]))], [1.0, 3.0]


@pytest.mark.parametrize("floor,expected", [
    (0.0, [2.5, 5.0, 3.0, 4.0, 9.0]),    # MA: (1 + 9) / 4, (2 + 18) / 4, 3 / 1, 4 / 1, uncovered kept
    (0.5, [2.5, 5.0, 1.5, 2.0, 9.0]),    # coordinates 2-3 (weight 1 of 4 < 0.5): 3 / 2, 4 / 2
    (1.0, [2.5, 5.0, 0.75, 1.0, 9.0]),   # FA on the covered coordinates: 3 / 4, 4 / 4
])
def test_floored_ma_vector(floor, expected):
    prev, updates, weights = _floor_case()
    out = mask_aware_average(prev, updates, weights, floor=floor)
    assert torch.equal(out, torch.tensor(expected))
    rule = floored_ma_rule(floor)
    assert rule.consumes == "model" and torch.equal(rule(prev, updates, weights), out)


def test_floored_ma_ends_at_ma_and_fa():
    prev, updates, weights = _floor_case()
    assert torch.equal(mask_aware_average(prev, updates, weights, floor=0.0),
                       mask_aware_average(prev, updates, weights))
    fa = zero_padded_average(prev, updates, weights)
    assert torch.equal(mask_aware_average(prev, updates, weights, floor=1.0)[:4], fa[:4])
    assert fa[4] == 0.0  # FA zeroes the uncovered coordinate; the floor keeps it, as MA does
    full = torch.ones(5, dtype=torch.bool)  # every client on the full model: MA whatever the floor
    dense = [(full, torch.arange(5.0)), (full, torch.arange(5.0) * 3)]
    assert torch.equal(mask_aware_average(prev, dense, [1.0, 2.0], floor=1.0),
                       mask_aware_average(prev, dense, [1.0, 2.0]))


@pytest.mark.parametrize("floor", [-0.1, 1.5])
def test_floored_ma_refuses_a_floor_outside_0_1(floor):
    with pytest.raises(ValueError, match="coverage floor must be in"):
        floored_ma_rule(floor)
