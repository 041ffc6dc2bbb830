"""Hand-computed vectors of the baselines (docs/reference.md §7 and Appendix A), asserted
exactly."""

from __future__ import annotations

import torch
import torch.nn as nn

from fedgmr.algorithm.aggregation import RULES, mask_aware_average, nonzero_delta_average
from fedgmr.algorithm.params import ParamSpace
from fedgmr.baselines import fiarse_math
from fedgmr.baselines.policies import allowed_widths
from fedgmr.baselines.server import label_keep_masks
from fedgmr.baselines.structure import window


def _block(rows: int, cols: int, n: int = 4) -> torch.Tensor:
    m = torch.zeros(n, n, dtype=torch.bool)
    m[:rows, :cols] = True
    return m.reshape(-1)


class _Head(nn.Module):
    """Output layer 4 classes x 4 hidden, no bias (the vector's layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(4, 4, bias=False)


def test_heterofl_label_split_vector():
    space = ParamSpace(_Head())
    keep = label_keep_masks(space, [torch.tensor([0, 1]), torch.tensor([1, 2, 3])], 4)
    old = 7.0
    prev = torch.full((16,), old)
    a_mask = torch.ones(16, dtype=torch.bool) & keep[0]  # full width, labels {0, 1}
    b_mask = _block(4, 2) & keep[1]  # width 0.5: all classes, first 2 hidden; labels {1, 2, 3}
    updates = [(a_mask, torch.full((int(a_mask.sum()),), 2.0)), (b_mask, torch.full((int(b_mask.sum()),), 4.0))]
    out = mask_aware_average(prev, updates, [1.0, 1.0]).view(4, 4)  # count-averaged
    assert out[0].tolist() == [2, 2, 2, 2]
    assert out[1].tolist() == [3, 3, 2, 2]
    assert out[2].tolist() == [4, 4, old, old] and out[3].tolist() == [4, 4, old, old]


def test_fjord_sample_weighted_vector():
    a = (torch.ones(16, dtype=torch.bool), torch.ones(16))  # p_max 1, n = 10
    b = (_block(2, 2), torch.full((4,), 5.0))  # p_max 0.5, n = 30
    out = RULES.get("ma")(torch.zeros(16), [a, b], [10.0, 30.0]).view(4, 4)
    assert out[:2, :2].eq(4.0).all()
    rest = torch.ones(4, 4, dtype=torch.bool)
    rest[:2, :2] = False
    assert out[rest].eq(1.0).all()


def test_fjord_allowed_widths_no_float_keys():
    assert allowed_widths([0.2, 0.4, 0.6, 0.8, 1.0], 0.6000000000000001) == [0.2, 0.4, 0.6000000000000001]
    assert allowed_widths([0.2, 0.4, 0.6, 0.8, 1.0], 1.0) == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert allowed_widths([0.2, 0.4], 0.1) == [0.1]


def test_fedrolex_windows_vector():
    got = [window(8, 2, r).tolist() for r in range(5)]
    assert got == [[0, 1], [7, 0], [6, 7], [5, 6], [4, 5]]
    counts = torch.zeros(8, dtype=torch.long)
    for r in range(8):
        counts[window(8, 2, r)] += 1
    assert counts.eq(2).all()


def test_fiarse_threshold_and_mask_vector():
    w = torch.tensor([0.1, -0.5, 0.3, 2.0])
    assert fiarse_math.threshold(w.abs(), 0.5) == 0.5
    mask = fiarse_math.level_mask(w, torch.zeros(4, dtype=torch.long), 0.5)
    assert mask.tolist() == [False, True, False, True]


def test_fiarse_gradient_multiplier_vector():
    m = fiarse_math.multiplier(torch.tensor([0.5, -2.0]), 0.5)
    assert m[0].item() == 1.5
    assert abs(m[1].item() - 1.32) < 1e-6


def test_fiarse_multiplier_is_its_limit_where_the_ratio_is_undefined():
    # |w| = theta = 0 (a full sub-model whose smallest kept weight is exactly 0) and
    # theta = inf (a group with nothing kept) give 0/0 and inf/inf; the limit is 1.
    w = torch.tensor([0.0, 0.0, 0.5, 0.0])
    theta = torch.tensor([0.0, float("inf"), 0.0, 0.5])
    assert fiarse_math.multiplier(w, theta).tolist() == [1.0, 1.0, 1.0, 1.0]
    assert fiarse_math.multiplier(torch.tensor([0.0, 3.0]), 0.0).tolist() == [1.0, 1.0]


def test_fiarse_ties_keep_more_and_size_floor():
    w = torch.tensor([1.0, 1.0, 1.0, 0.5])
    assert fiarse_math.level_mask(w, torch.zeros(4, dtype=torch.long), 0.25).tolist() == [True, True, True, False]
    assert fiarse_math.threshold(w, 0.1) == float("inf")  # floor(0.4) = 0 kept


def test_fiarse_nonzero_delta_average():
    prev = torch.tensor([1.0, 1.0, 1.0, 1.0])
    full = torch.ones(4, dtype=torch.bool)
    a = (full, torch.tensor([0.2, 0.0, 0.4, 0.0]))
    b = (torch.tensor([True, True, False, False]), torch.tensor([0.4, 0.6]))
    out = nonzero_delta_average(prev, [a, b], [1.0, 1.0])
    assert torch.allclose(out, torch.tensor([1.3, 1.6, 1.4, 1.0]))
    out2 = nonzero_delta_average(prev, [a, b], [1.0, 1.0], server_lr=0.5)
    assert torch.allclose(out2, torch.tensor([1.15, 1.3, 1.2, 1.0]))
