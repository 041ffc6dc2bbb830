"""MaskedBufferedStrategy: update buffer, staleness weights, rejection of bad replies,
GA / FedAsync arrivals-only, checkpoint round trip (docs/reference.md §4, §6)."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn as nn

from fedgmr.algorithm.aggregation import RULES, mask_aware_average
from fedgmr.algorithm.params import ParamSpace, get_buffers
from fedgmr.algorithm.policies import MagnitudePolicy
from fedgmr.algorithm.restoration import DensityLadder
from fedgmr.algorithm.staleness import Polynomial
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.messages import Reply

LADDER = [0.25, 0.5, 1.0]
A = 0.6
LOGGER = "fedgmr.strategy.masked_buffered"


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


def make(rule: str = "ma", use_buffer: bool = True, max_staleness: int | None = None,
         densities=(1.0, 0.5, 0.25), seed: int = 0, weighting: str = "samples") -> MaskedBufferedStrategy:
    torch.manual_seed(seed)
    model = _model()
    space = ParamSpace(model)
    params = space.flatten(model)
    policy = MagnitudePolicy(space, LADDER, params, basis="prunable")  # a 39-weight model: count prunable ones
    ladder = DensityLadder.from_densities(LADDER, list(densities))
    return MaskedBufferedStrategy(space, params, get_buffers(model), policy, ladder, RULES.get(rule),
                                  Polynomial(A), weighting=weighting, use_buffer=use_buffer,
                                  max_staleness=max_staleness)


def reply_for(a, value: float, n: int, kind: str | None = None, buffers=None) -> Reply:
    values = torch.full((int(a.mask.sum()),), float(value))
    return Reply(a.client_id, a.version, values, n, buffers or {}, kind or a.consumes)


def s(tau: int) -> float:
    return (1.0 + tau) ** -A


def by_client(report) -> dict[int, tuple[int, float]]:
    return {c: (t, w) for c, t, w in zip(report.used, report.staleness, report.weights)}


# ---------------------------------------------------------------------------- setup sanity

def test_setup_masks_are_nested_and_distinct():
    st = make()
    m0, m1, m2 = (st.assign(c).mask for c in range(3))
    assert bool(m0.all())  # client 0 is at 1.0
    assert int(m2.sum()) < int(m1.sum()) < int(m0.sum())
    assert not bool((m2 & ~m1).any())
    assert st.densities() == [1.0, 0.5, 0.25]


# ---------------------------------------------------------------------------- (a) buffer mode

def test_buffer_keeps_latest_update_and_reuses_it_with_decaying_weight():
    st = make()
    assert st.use_buffer
    a0, a1 = st.assign(0), st.assign(1)
    m1 = a1.mask
    assert st.receive(reply_for(a0, 1.0, 10))
    assert st.receive(reply_for(a1, 3.0, 30))
    assert st.arrivals == [0, 1]

    r1 = st.aggregate()
    assert r1.step == 1 and st.version == 1
    assert by_client(r1) == {0: (0, 10.0), 1: (0, 30.0)}
    expected = torch.where(m1, torch.tensor(2.5), torch.tensor(1.0))  # (10*1 + 30*3) / 40
    assert torch.equal(st.params, expected)
    assert st.arrivals == []
    assert st.min_coverage() == 1

    # client 0 replaces its buffered update; client 1's old one is reused with tau = 1
    a0 = st.assign(0)
    assert a0.version == 1
    assert st.receive(reply_for(a0, 5.0, 10))
    r2 = st.aggregate()
    w = by_client(r2)
    assert set(w) == {0, 1}
    assert w[0] == (0, pytest.approx(10.0))
    assert w[1][0] == 1
    assert w[1][1] == pytest.approx(30 * 2 ** -0.6, rel=1e-12)
    w1 = 30 * s(1)
    exp_block = (10 * 5.0 + w1 * 3.0) / (10 + w1)
    assert torch.allclose(st.params[m1], torch.full((int(m1.sum()),), exp_block), rtol=0, atol=1e-6)
    assert torch.equal(st.params[~m1], torch.full((int((~m1).sum()),), 5.0))

    # no arrivals: both buffered updates are used again, both one step staler
    r3 = st.aggregate()
    w = by_client(r3)
    assert w[0][0] == 1 and w[0][1] == pytest.approx(10 * s(1), rel=1e-12)
    assert w[1][0] == 2 and w[1][1] == pytest.approx(30 * s(2), rel=1e-12)
    assert w[1][1] < 30 * s(1) < 30
    # the buffered values are re-averaged (MA is idempotent on the same buffer contents
    # up to the new weights)
    exp_block = (10 * s(1) * 5.0 + 30 * s(2) * 3.0) / (10 * s(1) + 30 * s(2))
    assert torch.allclose(st.params[m1], torch.full((int(m1.sum()),), exp_block), rtol=0, atol=1e-6)


def test_buffer_aggregation_equals_ma_of_buffered_entries():
    st = make()
    a = [st.assign(c) for c in range(3)]
    for c, v, n in [(0, 1.0, 10), (1, 2.0, 20), (2, 4.0, 40)]:
        assert st.receive(reply_for(a[c], v, n))
    prev = st.params.clone()
    st.aggregate()
    ref = mask_aware_average(prev, [(a[c].mask, torch.full((int(a[c].mask.sum()),), v)) for c, v in
                                    [(0, 1.0), (1, 2.0), (2, 4.0)]], [10.0, 20.0, 40.0])
    assert torch.equal(st.params, ref)


def test_equal_weighting_uses_staleness_only():
    st = make(weighting="equal")
    a0, a1 = st.assign(0), st.assign(1)
    st.receive(reply_for(a0, 1.0, 10))
    st.receive(reply_for(a1, 3.0, 30))
    st.aggregate()
    r = st.aggregate()
    assert by_client(r) == {0: (1, pytest.approx(s(1))), 1: (1, pytest.approx(s(1)))}


# ---------------------------------------------------------------------------- (b) arrivals only

def test_arrivals_only_uses_only_new_arrivals():
    st = make(use_buffer=False)
    a0, a1 = st.assign(0), st.assign(1)
    st.receive(reply_for(a0, 1.0, 10))
    st.receive(reply_for(a1, 3.0, 30))
    r1 = st.aggregate()
    assert by_client(r1) == {0: (0, 10.0), 1: (0, 30.0)}

    a0 = st.assign(0)
    st.receive(reply_for(a0, 5.0, 10))
    r2 = st.aggregate()
    assert r2.used == [0] and r2.staleness == [0] and r2.weights == [10.0]
    assert torch.equal(st.params, torch.full_like(st.params, 5.0))  # client 0 holds the full model

    before = st.params.clone()
    r3 = st.aggregate()
    assert r3.used == [] and r3.weights == [] and st.min_coverage() == 0
    assert torch.equal(st.params, before)


def test_arrivals_only_stale_arrival_weighted_by_its_staleness():
    st = make(use_buffer=False)
    a1 = st.assign(1)  # at version 0
    st.aggregate()
    st.aggregate()
    assert st.receive(reply_for(a1, 3.0, 30))
    r = st.aggregate()
    assert r.used == [1] and r.staleness == [2]
    assert r.weights[0] == pytest.approx(30 * s(2), rel=1e-12)


# ---------------------------------------------------------------------------- (c) max staleness

def test_max_staleness_drops_old_entries():
    st = make(max_staleness=1)
    a0, a1 = st.assign(0), st.assign(1)
    st.receive(reply_for(a0, 1.0, 10))
    st.receive(reply_for(a1, 3.0, 30))
    assert set(st.aggregate().used) == {0, 1}        # taus 0, 0
    st.receive(reply_for(st.assign(0), 1.0, 10))
    r2 = st.aggregate()                              # taus 0, 1
    assert by_client(r2)[1][0] == 1
    st.receive(reply_for(st.assign(0), 1.0, 10))
    r3 = st.aggregate()                              # client 1 at tau 2 > 1: dropped
    assert r3.used == [0]
    r4 = st.aggregate()                              # stays dropped; client 0 at tau 1
    assert r4.used == [0] and r4.staleness == [1]
    r5 = st.aggregate()                              # client 0 at tau 2: dropped too
    assert r5.used == []


# ---------------------------------------------------------------------------- (d) rejection

def _bad_values_length(st):
    a = st.assign(1)
    return Reply(1, a.version, torch.ones(int(a.mask.sum()) + 1), 10)


def _nan_values(st):
    a = st.assign(1)
    v = torch.ones(int(a.mask.sum()))
    v[3] = float("nan")
    return Reply(1, a.version, v, 10)


def _inf_values(st):
    a = st.assign(0)
    v = torch.ones(int(a.mask.sum()))
    v[-1] = float("-inf")
    return Reply(0, a.version, v, 10)


def _mask_outside_assigned(st):
    a = st.assign(2)  # density 0.25
    full = torch.ones_like(a.mask)
    return Reply(2, a.version, torch.ones(int(full.sum())), 10, mask=full)


def _future_version(st):
    a = st.assign(0)
    return Reply(0, a.version + 3, torch.ones(int(a.mask.sum())), 10)


def _version_mismatch(st):
    a = st.assign(0)  # version 0
    st.aggregate()
    st.aggregate()    # server at 2
    return Reply(0, 1, torch.ones(int(a.mask.sum())), 10)


def _unknown_client(st):
    a = st.assign(0)
    return Reply(99, a.version, torch.ones(int(a.mask.sum())), 10)


def _negative_client(st):
    a = st.assign(0)
    return Reply(-1, a.version, torch.ones(int(a.mask.sum())), 10)


def _no_outstanding_job(st):
    mask = st.policy.mask(st.ladder.levels[1])
    return Reply(1, 0, torch.ones(int(mask.sum())), 10)


def _bad_buffer_shape(st):
    a = st.assign(0)
    return Reply(0, a.version, torch.ones(int(a.mask.sum())), 10, buffers={"1.running_mean": torch.zeros(7)})


def _nonfinite_buffer(st):
    a = st.assign(0)
    return Reply(0, a.version, torch.ones(int(a.mask.sum())), 10,
                 buffers={"1.running_var": torch.full((6,), float("nan"))})


def _wrong_kind(st):
    a = st.assign(0)
    return Reply(0, a.version, torch.ones(int(a.mask.sum())), 10, kind="delta")


def _zero_samples(st):
    a = st.assign(0)
    return Reply(0, a.version, torch.ones(int(a.mask.sum())), 0)


def _nan_samples(st):
    a = st.assign(0)
    return Reply(0, a.version, torch.ones(int(a.mask.sum())), float("nan"))


def _infinite_samples(st):
    # e.g. a corrupt num_samples field from the wire: must be rejected, not crash receive()
    a = st.assign(0)
    return Reply(0, a.version, torch.ones(int(a.mask.sum())), float("inf"))


def _two_dim_values(st):
    a = st.assign(0)
    return Reply(0, a.version, torch.ones(1, int(a.mask.sum())), 10)


def _float_mask(st):
    a = st.assign(0)
    return Reply(0, a.version, torch.ones(int(a.mask.sum())), 10, mask=a.mask.float())


BAD = [_bad_values_length, _nan_values, _inf_values, _mask_outside_assigned, _future_version,
       _version_mismatch, _unknown_client, _negative_client, _no_outstanding_job, _bad_buffer_shape,
       _nonfinite_buffer, _wrong_kind, _zero_samples, _nan_samples, _infinite_samples, _two_dim_values,
       _float_mask]


@pytest.mark.parametrize("craft", BAD, ids=[f.__name__.strip("_") for f in BAD])
def test_invalid_reply_is_rejected_and_never_touches_the_model(craft, caplog):
    st = make()
    bad = craft(st)
    params_before = st.params.clone()
    buffers_before = {k: v.clone() for k, v in st.buffers.items()}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert st.receive(bad) is False
    assert st.rejected == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == LOGGER]
    assert len(warnings) == 1
    assert "rejected" in warnings[0].getMessage()
    assert st.arrivals == []
    report = st.aggregate()
    assert report.used == []
    assert report.rejected_total == 1
    assert torch.equal(st.params, params_before)
    for k, v in buffers_before.items():
        assert torch.equal(st.buffers[k], v)


def test_rejection_keeps_the_job_outstanding_for_a_valid_retry():
    st = make()
    a = st.assign(1)
    v = torch.ones(int(a.mask.sum()))
    v[0] = float("nan")
    assert st.receive(Reply(1, a.version, v, 10)) is False
    assert st.receive(reply_for(a, 2.0, 10)) is True
    # a duplicate of an accepted reply has no outstanding job any more
    assert st.receive(reply_for(a, 2.0, 10)) is False
    assert st.rejected == 2
    assert st.aggregate().used == [1]


def test_smaller_reported_mask_is_accepted():
    st = make()
    a = st.assign(0)  # full
    small = st.policy.mask(0)
    assert st.receive(Reply(0, a.version, torch.full((int(small.sum()),), 7.0), 10, mask=small.clone()))
    prev = st.params.clone()
    st.aggregate()
    assert torch.equal(st.params[small], torch.full((int(small.sum()),), 7.0))
    assert torch.equal(st.params[~small], prev[~small])


# ---------------------------------------------------------------------------- (e) GA / FedAsync

def test_ga_delta_is_arrivals_only_and_refuses_the_buffer():
    with pytest.raises(ValueError, match="cannot use the buffer"):
        make("ga_delta", use_buffer=True)
    st = make("ga_delta", use_buffer=False)
    a0, a1 = st.assign(0), st.assign(1)
    assert a0.consumes == "delta"
    m1 = a1.mask
    prev = st.params.clone()
    assert st.receive(reply_for(a0, 1.0, 10))
    assert st.receive(reply_for(a1, 3.0, 30))
    r = st.aggregate()
    assert by_client(r) == {0: (0, 10.0), 1: (0, 30.0)}
    # W + (10*1*m0 + 30*3*m1) / 40: +2.5 on m1, +0.25 elsewhere (diluted)
    expected = (prev.double() + torch.where(m1, 2.5, 0.25).double()).float()
    assert torch.equal(st.params, expected)
    # the deltas are consumed once: a step without arrivals changes nothing
    after = st.params.clone()
    r2 = st.aggregate()
    assert r2.used == []
    assert torch.equal(st.params, after)


def test_ga_runs_under_the_same_buffer_as_ma():
    """Table 3 changes only the rule: GA keeps the buffer and reuses buffered models."""
    st = make("ga", use_buffer=True)
    assert st.use_buffer is True
    a0, a1 = st.assign(0), st.assign(1)
    assert a0.consumes == "model"
    m1 = a1.mask
    prev = st.params.clone().double()
    assert st.receive(reply_for(a0, 1.0, 10))
    assert st.receive(reply_for(a1, 3.0, 30))
    st.aggregate()
    # W + (10 (1 - W) + 30 (3 - W) m1) / 40
    step1 = prev + (10 * (1 - prev) + 30 * (3 - prev) * m1) / 40
    assert torch.allclose(st.params.double(), step1, rtol=0, atol=1e-6)
    # no arrivals: the buffered models are used again with tau = 1, not applied twice
    r2 = st.aggregate()
    assert sorted(r2.used) == [0, 1] and r2.staleness == [1, 1]
    w0, w1 = 10 * s(1), 30 * s(1)
    w = st.params.double()
    step2 = step1 + (w0 * (1 - step1) + w1 * (3 - step1) * m1) / (w0 + w1)
    assert torch.allclose(w, step2, rtol=0, atol=1e-6)


def test_ga_rejects_delta_replies():
    st = make("ga")
    a = st.assign(0)
    assert st.receive(reply_for(a, 1.0, 10, kind="delta")) is False


def test_fedasync_is_arrivals_only_with_alpha_times_staleness():
    with pytest.raises(ValueError, match="cannot use the buffer"):
        make("fedasync", use_buffer=True)
    st = make("fedasync", use_buffer=False)
    a0 = st.assign(0)
    st.aggregate()
    st.aggregate()
    st.aggregate()  # tau = 3
    prev = st.params.clone()
    st.receive(reply_for(a0, 2.0, 10))
    r = st.aggregate()
    alpha_t = 0.6 * 4 ** -A
    assert r.used == [0] and r.staleness == [3]
    assert r.weights[0] == pytest.approx(alpha_t, rel=1e-12)
    assert torch.allclose(st.params, (1 - alpha_t) * prev + alpha_t * 2.0, rtol=0, atol=1e-6)
    assert st.aggregate().used == []


def test_fedasync_mixes_each_arrival_in_its_own_step_with_its_own_tau():
    """Two arrivals waiting together are two server steps, the second with tau + 1."""
    st = make("fedasync", use_buffer=False, densities=(1.0, 1.0, 1.0))
    a0, a1 = st.assign(0), st.assign(1)
    st.aggregate()  # both now have tau = 1
    st.receive(reply_for(a0, 2.0, 10))
    st.receive(reply_for(a1, 5.0, 10))
    p0 = st.params.clone()
    r1 = st.aggregate()
    assert r1.used == [0] and r1.staleness == [1]
    assert st.arrivals == [1]  # client 1 waits for the next step
    p1 = st.params.clone()
    assert torch.allclose(p1, (1 - 0.6 * s(1)) * p0 + 0.6 * s(1) * 2.0, rtol=0, atol=1e-6)
    r2 = st.aggregate()
    assert r2.used == [1] and r2.staleness == [2]
    assert torch.allclose(st.params, (1 - 0.6 * s(2)) * p1 + 0.6 * s(2) * 5.0, rtol=0, atol=1e-6)
    assert st.arrivals == [] and st.aggregate().used == []


# ---------------------------------------------------------------------------- weighting, BN, masks sent

def test_samples_weighting_uses_the_training_set_size_and_processed_is_an_option():
    for weighting, expected in (("samples", {0: 100, 1: 300}), ("processed", {0: 40, 1: 40}),
                                ("equal", {0: 1.0, 1: 1.0})):
        st = make(weighting=weighting)
        a0, a1 = st.assign(0), st.assign(1)
        st.receive(Reply(0, 0, torch.ones(int(a0.mask.sum())), 100, num_processed=40))
        st.receive(Reply(1, 0, torch.ones(int(a1.mask.sum())), 300, num_processed=40))
        r = st.aggregate()
        assert dict(zip(r.used, r.weights)) == expected, weighting
    with pytest.raises(ValueError, match="weighting"):
        make(weighting="bogus")


def test_num_processed_must_be_a_positive_integer_when_given():
    st = make()
    a = st.assign(0)
    assert st.receive(Reply(0, 0, torch.ones(int(a.mask.sum())), 100, num_processed=0)) is False
    assert st.receive(Reply(0, 0, torch.ones(int(a.mask.sum())), 100, num_processed=2.5)) is False
    assert st.rejected == 2


def _bn_make(bn_rule: str) -> MaskedBufferedStrategy:
    torch.manual_seed(0)
    model = _model()
    space = ParamSpace(model)
    params = space.flatten(model)
    ladder = DensityLadder.from_densities(LADDER, [1.0, 0.25, 0.25])
    return MaskedBufferedStrategy(space, params, get_buffers(model), MagnitudePolicy(space, LADDER, params,
                                                                                     basis="prunable"), ladder,
                                  RULES.get("ma"), Polynomial(A), use_buffer=False, bn_rule=bn_rule)


def _bn_reply(a, mean: float) -> Reply:
    bufs = {"1.running_mean": torch.full((6,), mean), "1.running_var": torch.ones(6),
            "1.num_batches_tracked": torch.tensor(7)}
    return Reply(a.client_id, a.version, torch.ones(int(a.mask.sum())), 10, bufs)


@pytest.mark.parametrize("rule,expected", [("all", (1 * 1 + 10 * 2) / 3), ("full", 1.0),
                                           ("density", (1 * 1 + 10 * 0.25 * 2) / 1.5)])
def test_bn_statistics_rules(rule, expected):
    st = _bn_make(rule)
    a = [st.assign(c) for c in range(3)]
    st.receive(_bn_reply(a[0], 1.0))   # the full-density client
    st.receive(_bn_reply(a[1], 10.0))  # two 25 %-density clients
    st.receive(_bn_reply(a[2], 10.0))
    st.aggregate()
    assert torch.allclose(st.buffers["1.running_mean"], torch.full((6,), expected, dtype=torch.float32))
    assert int(st.buffers["1.num_batches_tracked"]) == 7


def test_bn_full_rule_keeps_statistics_when_no_full_client_was_aggregated():
    st = _bn_make("full")
    before = {k: v.clone() for k, v in st.buffers.items()}
    a1 = st.assign(1)
    st.receive(_bn_reply(a1, 10.0))
    st.aggregate()
    assert all(torch.equal(before[k], st.buffers[k]) for k in before)


def test_mask_is_marked_changed_only_when_it_differs_from_what_the_client_holds():
    st = make()
    assert st.assign(1).mask_changed  # first contact
    assert not st.assign(1).mask_changed  # same level, same mask: values only
    st.ladder.step_up(1)
    assert st.assign(1).mask_changed  # restored: a new mask
    assert not st.assign(1).mask_changed
    # a refresh that rebuilds equal masks as new objects changes nothing on the wire
    st.policy._rebuild(st.params.clone())
    assert not st.assign(1).mask_changed


# ---------------------------------------------------------------------------- (f) checkpoints

def _bn_buffers(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"1.running_mean": torch.randn(6, generator=g), "1.running_var": torch.rand(6, generator=g) + 0.5,
            "1.num_batches_tracked": torch.tensor(seed, dtype=torch.long)}


def _drive(st: MaskedBufferedStrategy) -> None:
    """A few steps leaving buffered / pending entries, an outstanding job and a rejection."""
    a = [st.assign(c) for c in range(3)]
    st.receive(reply_for(a[0], 1.0, 10, buffers=_bn_buffers(1)))
    st.receive(reply_for(a[1], 3.0, 30, buffers=_bn_buffers(2)))
    st.aggregate()
    st.receive(reply_for(st.assign(0), 4.0, 10, buffers=_bn_buffers(3)))
    st.receive(Reply(1, 0, torch.ones(3), 10))  # no outstanding job: rejected
    # client 2 is still outstanding (dispatched at version 0); client 0's latest is unaggregated


@pytest.mark.parametrize("use_buffer", [True, False])
def test_state_dict_round_trip_into_fresh_strategy(use_buffer):
    st = make(use_buffer=use_buffer, seed=0)
    _drive(st)
    state, tensors = st.state_dict()
    state = json.loads(json.dumps(state))  # JSON-able
    tensors = {k: v.clone() for k, v in tensors.items()}

    fresh = make(use_buffer=use_buffer, seed=123)  # different initial weights and ranking
    assert not torch.equal(fresh.params, st.params)
    fresh.load_state_dict(state, tensors)
    assert torch.equal(fresh.params, st.params)
    for k in st.buffers:
        assert torch.equal(fresh.buffers[k], st.buffers[k])
    assert fresh.version == st.version and fresh.rejected == st.rejected
    assert fresh.arrivals == st.arrivals
    assert fresh.densities() == st.densities()
    for level in range(len(LADDER)):
        assert torch.equal(fresh.policy.mask(level), st.policy.mask(level))

    # the outstanding job of client 2 survives: both accept the same (stale) reply
    mask2 = st.policy.mask(st.ladder.levels[2])
    r = Reply(2, 0, torch.full((int(mask2.sum()),), 6.0), 40, _bn_buffers(4))
    assert st.receive(r) is True
    assert fresh.receive(Reply(2, 0, r.values.clone(), 40, _bn_buffers(4))) is True

    rep_a, rep_b = st.aggregate(), fresh.aggregate()
    assert rep_a == rep_b
    assert torch.equal(fresh.params, st.params)
    for k in st.buffers:
        assert torch.equal(fresh.buffers[k], st.buffers[k])
    # and the step after that (buffer reuse / nothing) matches as well
    rep_a, rep_b = st.aggregate(), fresh.aggregate()
    assert rep_a == rep_b
    assert torch.equal(fresh.params, st.params)
