"""Bounded influence of one client on the server (issue: one bad client cannot hurt the
server): sample counts come from the server's own knowledge or are capped, values are
checked as float32, an update's norm is clipped to a bound, and a persistent adversary
among ten clients drifts the model but can no longer capture it."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch
import torch.nn as nn

from fedgmr.algorithm.aggregation import RULES
from fedgmr.algorithm.params import ParamSpace, get_buffers
from fedgmr.algorithm.policies import FullModelPolicy, MagnitudePolicy
from fedgmr.algorithm.restoration import DensityLadder
from fedgmr.algorithm.staleness import Polynomial
from fedgmr.strategy.influence import NORM_MIN_HISTORY
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.messages import Reply

LADDER = [0.25, 0.5, 1.0]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


def make(rule: str = "ma", densities=(1.0, 1.0, 1.0), use_buffer: bool = True, **bounds) -> MaskedBufferedStrategy:
    torch.manual_seed(0)
    model = _model()
    space = ParamSpace(model)
    params = space.flatten(model)
    policy = MagnitudePolicy(space, LADDER, params, basis="prunable")
    ladder = DensityLadder.from_densities(LADDER, list(densities))
    return MaskedBufferedStrategy(space, params, get_buffers(model), policy, ladder, RULES.get(rule),
                                  Polynomial(0.6), use_buffer=use_buffer, **bounds)


def _values(st: MaskedBufferedStrategy, a, offset: torch.Tensor | float) -> torch.Tensor:
    """The model ``a`` was sent, on its mask, plus ``offset``."""
    return st.params[a.mask] + offset


# ---------------------------------------------------------------------- values as float32
def test_float64_values_beyond_float32_are_rejected():
    st = make()
    a = st.assign(0)
    k = int(a.mask.sum())
    big = torch.ones(k, dtype=torch.float64)
    big[0] = 1e300  # finite in float64, inf as the float32 the model holds
    assert st.receive(Reply(0, 0, big, 10)) is False
    big[0] = 3e38  # the largest float32 is 3.4e38: finite, accepted
    assert st.receive(Reply(0, 0, big, 10)) is True
    assert st.rejected == 1
    assert st._buffer[0].values.dtype == torch.float32


def test_buffers_are_checked_as_the_model_holds_them():
    st = make()
    a = st.assign(0)
    k = int(a.mask.sum())
    ok = {"1.running_mean": torch.zeros(6), "1.running_var": torch.ones(6), "1.num_batches_tracked": torch.tensor(3)}
    for name, bad in (("1.running_mean", torch.full((6,), 1e300, dtype=torch.float64)),
                      ("1.running_var", -torch.ones(6)), ("1.num_batches_tracked", torch.tensor(-1)),
                      ("1.num_batches_tracked", torch.tensor(2.5)), ("1.running_mean", torch.zeros(7))):
        assert st.receive(Reply(0, 0, torch.ones(k), 10, {**ok, name: bad})) is False, name
    assert st.receive(Reply(0, 0, torch.ones(k), 10, {**ok, "2.extra": torch.ones(1)})) is False
    assert st.rejected == 6
    assert st.receive(Reply(0, 0, torch.ones(k), 10, ok)) is True


# ---------------------------------------------------------------------- sample counts
def _capture(st: MaskedBufferedStrategy, claim: int) -> torch.Tensor:
    """Clients 0, 1 honest (100 samples, values 0), client 2 claims ``claim`` samples with
    values 1; returns the aggregate on the coordinates all three cover."""
    a = [st.assign(c) for c in range(3)]
    for c in (0, 1):
        st.receive(Reply(c, 0, torch.zeros(int(a[c].mask.sum())), 100))
    st.receive(Reply(2, 0, torch.ones(int(a[2].mask.sum())), claim))
    st.aggregate()
    return st.params[a[2].mask]


def test_a_claimed_sample_count_cannot_capture_the_aggregate():
    # without any bound the claim of 1e15 samples sets the aggregate to the claimant's values
    assert torch.allclose(_capture(make(), 10 ** 15), torch.ones(1), atol=1e-9)
    # the server's own count is used (the claim ignored): an equal share
    known = make(client_samples=[100, 100, 100])
    assert torch.allclose(_capture(known, 10 ** 15), torch.full((1,), 1 / 3))
    assert known._buffer[2].num_samples == 100 and known.bounds.capped == 1
    # no count known: capped at max_samples
    capped = make(max_samples=200)
    assert torch.allclose(_capture(capped, 10 ** 15), torch.full((1,), 0.5))
    assert capped._buffer[2].num_samples == 200 and capped.bounds.capped == 1


def test_num_processed_is_capped_at_the_work_the_server_asked_for():
    st = make(weighting="processed", max_processed=40)
    a = st.assign(0)
    assert st.receive(Reply(0, 0, torch.ones(int(a.mask.sum())), 10, num_processed=10 ** 12)) is True
    assert st.aggregate().weights == [40]


def test_huge_claims_on_a_large_model_cannot_make_it_infinite():
    """The probe: 2**62 samples with values 1e21 on a model above 2**20 parameters (where
    aggregation accumulates in float32) made the model inf."""
    model = nn.Linear(1024, 1025)  # 1,050,625 parameters
    space = ParamSpace(model)
    assert space.numel > 1 << 20

    def run(**bounds) -> MaskedBufferedStrategy:
        st = MaskedBufferedStrategy(space, space.flatten(model), {}, FullModelPolicy(space),
                                    DensityLadder((1.0,), [0, 0]), RULES.get("ma"), Polynomial(0.6), **bounds)
        st.assign(0), st.assign(1)
        st.receive(Reply(0, 0, torch.zeros(space.numel), 100))
        st.receive(Reply(1, 0, torch.full((space.numel,), 1e21), 2 ** 62))
        st.aggregate()
        return st

    capped = run(max_samples=1000)
    assert bool(torch.isfinite(capped.params).all())
    assert float(capped.params.max()) == pytest.approx(1e21 * 1000 / 1100, rel=1e-3)  # its share, not all
    # without the cap the last-resort guard keeps the model (and drops the step's updates)
    before = space.flatten(model)
    guarded = run()
    assert torch.equal(guarded.params, before) and guarded.rejected == 2


# ---------------------------------------------------------------------- update norm
def test_an_update_above_the_bound_is_clipped_in_its_direction():
    st = make(max_update_norm=0.5)
    a = st.assign(0)
    k = int(a.mask.sum())
    direction = torch.randn(k, generator=torch.Generator().manual_seed(1))
    direction /= direction.norm()
    assert st.receive(Reply(0, 0, _values(st, a, 100.0 * direction), 10)) is True
    delta = st._buffer[0].values.double() - st.params[a.mask].double()
    assert float(delta.norm()) == pytest.approx(0.5, rel=1e-5)
    assert torch.allclose(delta / delta.norm(), direction.double(), atol=1e-5)
    assert st.bounds.clipped == 1
    # an update within the bound is stored exactly as sent
    b = st.assign(1)
    small = _values(st, b, 0.1 * direction)
    assert st.receive(Reply(1, 0, small, 10)) is True
    assert torch.equal(st._buffer[1].values, small) and st.bounds.clipped == 1


def test_buffers_count_in_the_norm_and_are_scaled_with_the_parameters():
    st = make(max_update_norm=1.0)
    a = st.assign(0)
    bufs = {n: v.clone() for n, v in st.buffers.items()}
    bufs["1.running_mean"] = bufs["1.running_mean"] + 1e6  # |change| = 1e6 * sqrt(6)
    bufs["1.running_var"] = bufs["1.running_var"] * 1e6
    assert st.receive(Reply(0, 0, _values(st, a, 0.0), 10, bufs)) is True
    e = st._buffer[0]
    change = torch.cat([(e.buffers[n] - st.buffers[n]).double() for n in ("1.running_mean", "1.running_var")])
    assert float(change.norm()) == pytest.approx(1.0, rel=1e-4)
    assert bool((e.buffers["1.running_var"] >= 0).all())
    assert torch.equal(e.values, st.params[a.mask])  # no parameter change: none made up


def test_a_delta_rule_bounds_the_delta_itself():
    st = make(rule="ga_delta", use_buffer=False, max_update_norm=2.0)
    a = st.assign(0)
    assert a.consumes == "delta"
    assert st.receive(Reply(0, 0, torch.full((int(a.mask.sum()),), 1e6), 10, kind="delta")) is True
    assert float(st._pending[0].values.norm()) == pytest.approx(2.0, rel=1e-5)
    before = st.params.clone()
    st.aggregate()
    assert float((st.params - before).norm()) == pytest.approx(2.0, rel=1e-4)


def test_the_update_is_measured_against_the_model_the_client_was_sent():
    st = make(max_update_norm=0.5)
    a0 = st.assign(0)
    sent = st.params[a0.mask].clone()
    a1 = st.assign(1)
    st.receive(Reply(1, 0, _values(st, a1, 0.4), 10))
    st.aggregate()
    st.receive(Reply(1, 1, _values(st, st.assign(1), 0.4), 10))
    st.aggregate()  # the global model moved since client 0 was dispatched
    assert float((st.params[a0.mask] - sent).norm()) > 0.5
    values = sent + 0.01  # a small change from what client 0 got: not clipped
    assert st.receive(Reply(0, 0, values, 10)) is True
    assert torch.equal(st._buffer[0].values, values) and st.bounds.clipped == 2


def test_the_adaptive_bound_is_a_multiple_of_the_median_accepted_norm():
    st = make(norm_multiple=2.0, densities=(1.0,) * 3)
    k = int(st.assign(0).mask.sum())
    unit = torch.ones(k) / math.sqrt(k)
    # no history yet: at most the norm of the model sent
    a = st.assign(0)
    sent_norm = math.sqrt(float(st.params[a.mask].double().square().sum()))
    assert st.receive(Reply(0, 0, _values(st, a, 1e3 * unit), 10)) is True
    assert st.bounds.clipped == 1
    assert float((st._buffer[0].values - st.params[a.mask]).norm()) == pytest.approx(sent_norm, rel=1e-4)
    assert sent_norm > 2.0
    for norm in (0.5, 1.0, 1.5, 2.0):  # history: [sent_norm, 0.5, 1, 1.5, 2] -> median 1.5
        c = st.assign(1)
        assert st.receive(Reply(1, 0, _values(st, c, norm * unit), 10)) is True
    assert len(st.influence.norms) == NORM_MIN_HISTORY and st.bounds.clipped == 1
    c = st.assign(2)
    assert st.receive(Reply(2, 0, _values(st, c, 100.0 * unit), 10)) is True
    assert float((st._buffer[2].values - st.params[c.mask]).norm()) == pytest.approx(3.0, rel=1e-4)
    assert st.bounds.clipped == 2


def test_bounds_survive_a_checkpoint():
    st = make(norm_multiple=2.0)
    k = int(st.assign(0).mask.sum())
    unit = torch.ones(k) / math.sqrt(k)
    for c, norm in zip((0, 1, 2, 0, 1), (1.0, 2.0, 3.0, 4.0, 5.0)):
        a = st.assign(c)
        st.receive(Reply(c, a.version, _values(st, a, norm * unit), 10))
        st.aggregate()
    a2 = st.assign(2)  # outstanding at the checkpoint
    sent = st.params[a2.mask].clone()
    st.receive(Reply(0, st.version, _values(st, st.assign(0), 0.1 * unit), 10))
    st.aggregate()  # the model moves on after client 2 was dispatched
    state, tensors = st.state_dict()
    fresh = make(norm_multiple=2.0)
    fresh.load_state_dict(json.loads(json.dumps(state)), {k: v.clone() for k, v in tensors.items()})
    assert list(fresh.influence.norms) == list(st.influence.norms) and fresh.bounds == st.bounds
    reply = lambda: Reply(2, a2.version, sent + 100.0 * unit, 10)  # noqa: E731
    assert st.receive(reply()) is True and fresh.receive(reply()) is True
    assert torch.equal(st._buffer[2].values, fresh._buffer[2].values)
    assert st.bounds.clipped == fresh.bounds.clipped


@pytest.mark.parametrize("bad", [dict(max_update_norm=0.0), dict(max_update_norm=float("nan")),
                                 dict(norm_multiple=-1.0), dict(max_samples=0), dict(client_samples=[1, 2])])
def test_bad_bounds_are_refused(bad):
    with pytest.raises(ValueError):
        make(**bad)


# ---------------------------------------------------------------------- one adversary of ten
ADVERSARY = 9  # a 0.05-density client (six of the ten hold that level under High heterogeneity)
STEPS = 80
BOUND = 1.0  # about the honest update norms of this task (their median falls from ~1 to ~0.2)


class AdversarialExecutor:
    """Runs every job honestly, then rewrites client ``ADVERSARY``'s result into the worst
    reply it can make that still passes validation: gradient *ascent* - its own update
    sign-flipped and scaled by 1e6 (the server clips it back to the bound, in that
    direction) - BatchNorm statistics pushed the same way (variances x 1e6), and a
    training-set size of 1e15."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def submit(self, job):
        from fedgmr.algorithm.maskinfo import gather
        from fedgmr.sim.executor import DoneHandle, JobResult

        handle = self.inner.submit(job)
        if job.client_id != ADVERSARY:
            return handle
        r = handle.result()
        start = job.start if job.mask is None else gather(job.start, job.mask)
        values = (start - 1e6 * (r.values - start)).float()
        bufs = {}
        for name, b in r.buffers.items():
            s0 = job.buffers[name]
            if not b.is_floating_point():
                bufs[name] = b
            elif name.endswith("running_var"):
                bufs[name] = s0 * 1e6
            else:
                bufs[name] = s0 - 1e6 * (b - s0)
        return DoneHandle(JobResult(r.client_id, r.version, values, bufs, 10 ** 15, r.loss, r.val_score,
                                    r.num_processed))

    def close(self) -> None:
        self.inner.close()


def _digits_run(adversary: bool, bounded: bool, steps: int = STEPS,
                seed: int = 0) -> tuple[float, MaskedBufferedStrategy]:
    """The quickstart task (digits, CNN, 10 clients, High heterogeneity, Dirichlet 0.5,
    K = 3) with 16/32 channels, ``steps`` server steps; final test accuracy."""
    from importlib.resources import files

    import yaml

    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    raw = yaml.safe_load((files("fedgmr.presets") / "quickstart.yaml").read_text())
    raw["model"]["options"]["channels"] = [16, 32]
    raw["run"] = {"max_steps": steps, "eval_every": steps}
    raw["seed"] = seed
    if bounded:
        raw["aggregation"] = {"max_update_norm": BOUND}
    records: list[dict] = []
    exp = build_experiment(resolve_config(raw), on_record=records.append)
    if not bounded:  # no sample knowledge or cap either: the claim is trusted
        exp.strategy.client_samples = None
    if adversary:
        exp.simulator.executor = AdversarialExecutor(exp.simulator.executor)
    exp.simulator.run(steps)
    exp.simulator.finish()
    return records[-1]["accuracy"], exp.strategy


SEEDS = (0, 1, 2)


@pytest.mark.slow
def test_with_the_bounds_a_persistent_adversary_drifts_the_model_but_cannot_capture_it(capsys):
    """Over three seeds, one adversary of ten reporting at every turn: its claims are
    overridden and each of its updates clipped, the model stays finite and keeps most of
    what it learnt (unbounded, the same adversary leaves chance level: the next test).
    Norm bounds do *not* keep the final accuracy where the honest run puts it: the drift
    depends on the seed (measured -0 to -30 points; docs/distributed.md), so no band
    around the honest accuracy is asserted - one seed's luck once passed for one."""
    honest, attacked = [], []
    for seed in SEEDS:
        h, _ = _digits_run(adversary=False, bounded=True, seed=seed)
        a, st = _digits_run(adversary=True, bounded=True, seed=seed)
        honest.append(h), attacked.append(a)
        assert st.bounds.capped >= 10  # the adversary reported often, and its claims were ignored
        assert st.bounds.clipped >= st.bounds.capped  # each of its updates was clipped to the bound
        assert bool(torch.isfinite(st.params).all())
    with capsys.disabled():
        print(f"\nfinal accuracy, max_update_norm={BOUND}, seeds {SEEDS}: honest "
              f"{[round(100 * h, 2) for h in honest]}, one adversary (client {ADVERSARY}) "
              f"{[round(100 * a, 2) for a in attacked]}")
    assert min(honest) > 0.8  # a model worth protecting
    assert statistics.mean(attacked) >= 0.6  # far above the 10 % the unbounded adversary leaves
    assert min(attacked) >= 0.4


@pytest.mark.slow
def test_without_the_bounds_the_same_adversary_wrecks_the_model(capsys):
    """The control: no norm bound and a trusted sample count. The adversary captures the
    aggregate at its first report; ten steps later the model is useless, where the bounded
    run stays near the honest one."""
    _, honest = _digits_run(adversary=False, bounded=False, steps=10)
    acc_unbounded, unbounded = _digits_run(adversary=True, bounded=False, steps=10)
    acc_bounded, bounded = _digits_run(adversary=True, bounded=True, steps=10)

    def distance(st: MaskedBufferedStrategy) -> float:
        return float((st.params.double() - honest.params.double()).norm())

    with capsys.disabled():
        print(f"\nafter 10 steps, distance from the honest model: unbounded adversary {distance(unbounded):.3g} "
              f"(accuracy {100 * acc_unbounded:.2f}%), bounded adversary {distance(bounded):.3g} "
              f"(accuracy {100 * acc_bounded:.2f}%)")
    assert unbounded.bounds.clipped == 0 and bounded.bounds.clipped >= 1
    assert acc_unbounded <= 0.15  # chance level on ten classes
    assert not distance(unbounded) < 1e3  # (NaN counts as moved)
    assert distance(bounded) < 5.0
