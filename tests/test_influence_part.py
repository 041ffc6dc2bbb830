"""The bounds on one client's influence as a part of their own
(fedgmr/strategy/influence.py), on hand-computed cases, and the strategy applying it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fedgmr.algorithm.aggregation import RULES
from fedgmr.algorithm.params import ParamSpace, get_buffers
from fedgmr.algorithm.policies import FullModelPolicy
from fedgmr.algorithm.restoration import DensityLadder
from fedgmr.algorithm.staleness import make_staleness
from fedgmr.strategy.influence import NORM_MIN_HISTORY, InfluenceBounds
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.messages import Reply

T = torch.tensor
ALL = torch.ones(2, dtype=torch.bool)
ZERO = (torch.zeros(2), {})


def test_a_fixed_norm_bound_clips_by_hand():
    """Sent [0, 0]; the client returns [3, 4] (norm 5); bound 2.5: scale 1/2, [1.5, 2]."""
    b = InfluenceBounds(3, max_update_norm=2.5)
    b.dispatched(0, ZERO)
    out = b.bound(0, "model", ALL, T([3.0, 4.0]), {}, set(), 10, 10, (T([9.0, 9.0]), {}))
    assert out.values.tolist() == [1.5, 2.0] and out.values.dtype == torch.float32
    assert b.stats.clipped == 1 and list(b.norms) == [2.5] and b.median_update_norm == 2.5
    # measured from what the job was sent, not from the current model: [1, 1] -> [1, 2] is norm 1
    b.dispatched(1, (T([1.0, 1.0]), {}))
    assert b.bound(1, "model", ALL, T([1.0, 2.0]), {}, set(), 10, 10, ZERO).values.tolist() == [1.0, 2.0]
    assert b.stats.clipped == 1 and list(b.norms) == [2.5, 1.0]
    # a delta is bounded itself: [0, -6] -> [0, -2.5]
    assert b.bound(2, "delta", ALL, T([0.0, -6.0]), {}, set(), 10, 10, ZERO).values.tolist() == [0.0, -2.5]


def test_the_adaptive_bound_and_buffers_by_hand():
    """norm_multiple 2 over five accepted norms of 1: bound 2. The update [0, 3] plus a
    buffer change of 4 has norm 5: everything scales by 2/5."""
    b = InfluenceBounds(1, norm_multiple=2.0)
    b.norms.extend([1.0] * NORM_MIN_HISTORY)
    bufs = {"bn.running_mean": T([4.0])}
    b.dispatched(0, (torch.zeros(2), {"bn.running_mean": T([0.0])}))
    out = b.bound(0, "model", ALL, T([0.0, 3.0]), bufs, {"bn.running_mean"}, 1, 1, ZERO)
    assert torch.allclose(out.values, T([0.0, 1.2])) and torch.allclose(out.buffers["bn.running_mean"], T([1.6]))
    # before enough history, the bound is the norm of what the client was sent
    fresh = InfluenceBounds(1, norm_multiple=10.0)
    fresh.dispatched(0, (T([0.6, 0.8]), {}))
    assert torch.allclose(fresh.bound(0, "model", ALL, T([3.6, 4.8]), {}, set(), 1, 1, ZERO).values,
                          T([1.2, 1.6]))  # update [3, 4] (norm 5) to norm 1


def test_sample_counts_are_the_servers_or_capped():
    b = InfluenceBounds(2, client_samples=[5, 6], max_processed=8)
    out = b.bound(1, "model", ALL, T([0.0, 0.0]), {}, set(), 100, 20, ZERO)
    assert (out.num_samples, out.num_processed, b.stats.capped) == (6, 8, 2)
    capped = InfluenceBounds(2, max_samples=30)
    assert capped.bound(0, "model", ALL, T([0.0, 0.0]), {}, set(), 100, 3, ZERO).num_samples == 30


def test_all_off_the_part_changes_nothing():
    b = InfluenceBounds(1)
    values, bufs = T([3.0, 4.0]), {"b": T([1.0])}
    out = b.bound(0, "model", ALL, values, bufs, {"b"}, 7, 9, ZERO)
    assert out.values is values and out.buffers is bufs and (out.num_samples, out.num_processed) == (7, 9)
    assert not b.norm_on and b.stats.clipped == b.stats.capped == 0 and not b.norms


@pytest.mark.parametrize("bad", [dict(client_samples=[1]), dict(max_samples=0), dict(norm_multiple=float("inf"))])
def test_bad_bounds_are_refused(bad):
    with pytest.raises(ValueError):
        InfluenceBounds(2, **bad)


def test_the_strategy_applies_the_part_to_every_accepted_reply():
    model = nn.Linear(2, 1, bias=False)
    space = ParamSpace(model)
    s = MaskedBufferedStrategy(space, T([0.0, 0.0]), get_buffers(model), FullModelPolicy(space),
                               DensityLadder((1.0,), [0, 0]), RULES.get("ma"), make_staleness("constant"), "samples",
                               False, client_samples=[10, 30], max_update_norm=2.5)
    s.assign(0), s.assign(1)
    assert s.receive(Reply(0, 0, T([3.0, 4.0]), 999)) and s.receive(Reply(1, 0, T([0.0, 1.0]), 30))
    assert s.bounds is s.influence.stats and (s.bounds.clipped, s.bounds.capped) == (1, 1)
    s.aggregate()  # (10 [1.5, 2] + 30 [0, 1]) / 40
    assert torch.allclose(s.params, T([0.375, 1.25]))
    state, tensors = s.state_dict()
    assert state["bounds"] == {"clipped": 1, "capped": 1, "norms": [2.5, 1.0]}


def test_restoration_is_a_part_the_strategy_forwards_to():
    """The trigger fires at its time; the part moves every client one level up, and the
    strategy's on_validation returns the clients it moved (its state keys unchanged)."""
    from fedgmr.algorithm.restoration import FixedTimeTrigger
    from fedgmr.strategy.restoration import Restoration

    ladder = DensityLadder((0.5, 1.0), [0, 0])
    part = Restoration(ladder, FixedTimeTrigger(10.0, (1.0,)), client_patience=1)
    assert part.on_time(5.0) == [] and part.on_time(10.0) == [0, 1] and ladder.levels == [1, 1]
    assert set(part.state_dict()) == {"ladder", "trigger", "client_monitors"}
    model = nn.Linear(2, 1, bias=False)
    space = ParamSpace(model)
    s = MaskedBufferedStrategy(space, T([0.0, 0.0]), get_buffers(model), FullModelPolicy(space),
                               DensityLadder((0.5, 1.0), [0, 0]), RULES.get("ma"), make_staleness("constant"),
                               "samples", False, trigger=FixedTimeTrigger(1.0, (1.0,)))
    assert s.trigger is s.restoration.trigger and s.on_time(2.0) == [0, 1] and s.ladder.levels == [1, 1]
