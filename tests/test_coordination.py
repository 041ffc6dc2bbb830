"""The coordination core (fedgmr.strategy.coordination): when the server steps, what
follows a step and what a record holds - the rules the simulator and the Flower loop
share. Unit vectors for each rule, then the simulator's deadline trigger checked against
the rule on a whole run (every step's time re-derived from its arrivals)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from conftest import tiny_config
from fedgmr.strategy.coordination import (Coordination, Decision, StepTrigger, after_step, base_record, eval_due,
                                          step_stats)


def _trigger(**kw: Any) -> StepTrigger:
    clients = kw.pop("clients", 4)
    return StepTrigger(Coordination(**kw), clients)


# ------------------------------------------------------------------ the k trigger
def test_k_trigger_waits_for_k_arrivals_capped_by_the_clients_at_work():
    t = _trigger(trigger="k", k=3)
    assert [t.decide(n, True, 0.0) for n in range(5)] == [Decision.WAIT] * 3 + [Decision.AGGREGATE] * 2
    assert t.step_cap() == 3
    # two clients at work: k=3 could never be reached, two arrivals make a step
    small = _trigger(trigger="k", k=3, concurrency=2)
    assert small.active == 2 and small.decide(2, True, 0.0) is Decision.AGGREGATE
    assert small.decide(1, True, 0.0) is Decision.WAIT


def test_k_trigger_never_arms_a_deadline():
    t = _trigger(trigger="k", k=2)
    assert t.on_reply(1.0, [0.5], now=3.0) is None and t.deadline_at is None


# ------------------------------------------------------------------ the deadline trigger
def test_deadline_is_armed_by_the_first_reply_at_the_top_density_in_play():
    t = _trigger(trigger="deadline", slack=0.5)
    assert t.on_reply(0.25, [0.5, 1.0], now=1.0) is None  # a denser client is still out
    assert t.decide(1, True, 1.2) is Decision.WAIT
    assert t.on_reply(1.0, [0.25, 0.5], now=2.0) == 2.5  # the densest in play
    assert t.on_reply(1.0, [], now=2.1) is None and t.deadline_at == 2.5  # armed once per step
    assert t.decide(2, True, 2.4999) is Decision.WAIT
    assert t.decide(2, True, 2.5) is Decision.AGGREGATE  # at the deadline itself
    t.stepped()
    assert t.deadline_at is None and t.decide(1, True, 100.0) is Decision.WAIT  # void after the step


def test_a_tie_with_the_densest_in_flight_arms_and_every_arrival_steps_at_once():
    t = _trigger(trigger="deadline", slack=1.0, clients=3)
    assert t.on_reply(0.5, [0.5], now=4.0) == 5.0
    t.stepped()
    # all three clients at work have replied: no need to wait for the deadline
    assert t.decide(3, False, 0.0) is Decision.AGGREGATE and t.decide(2, True, 0.0) is Decision.WAIT
    assert t.step_cap() == 3


def test_no_arrival_no_step_even_past_the_deadline():
    t = _trigger(trigger="deadline", slack=0.0)
    t.on_reply(1.0, [], now=1.0)
    assert t.decide(0, True, 9.0) is Decision.WAIT


# ------------------------------------------------------------------ sync rounds
def test_sync_round_steps_when_nobody_of_it_is_out_and_flags_an_empty_round():
    t = _trigger(mode="sync", k=1)
    assert t.decide(3, True, 0.0) is Decision.WAIT  # someone of the round is still out
    assert t.decide(3, False, 0.0) is Decision.AGGREGATE
    assert t.decide(0, False, 0.0) is Decision.EMPTY_ROUND  # every reply failed or was rejected
    assert t.on_reply(1.0, [], now=0.0) is None  # no deadline in sync mode
    assert t.step_cap() == 4


def test_trigger_state_round_trips_and_bad_coordination_is_refused():
    t = _trigger(trigger="deadline", slack=0.25)
    t.on_reply(1.0, [], now=2.0)
    u = _trigger(trigger="deadline", slack=0.25)
    u.load_state_dict(t.state_dict())
    assert u.deadline_at == 2.25 and u.decide(1, True, 2.25) is Decision.AGGREGATE
    with pytest.raises(ValueError, match="unknown coordination"):
        Coordination(mode="async")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be >= 1"):
        Coordination(k=0)


# ------------------------------------------------------------------ after a step, records
class _Strategy:
    """What after_step and base_record read from a strategy."""

    def __init__(self, version: int, needs_validation: bool) -> None:
        self.version = version
        self.trigger = SimpleNamespace(needs_validation=needs_validation)
        self.ladder = SimpleNamespace(restorations=2)
        self.rejected = 1
        self.calls: list[tuple[str, float]] = []

    def on_validation(self, score: float) -> list[int]:
        self.calls.append(("val", score))
        return [3]

    def on_time(self, now: float) -> list[int]:
        self.calls.append(("time", now))
        return [5] if now > 10 else []

    def densities(self) -> list[float]:
        return [0.5, 1.0]

    def min_coverage(self) -> float:
        return 0.75


def test_after_step_validates_on_the_check_interval_then_applies_time_restorations():
    s = _Strategy(version=4, needs_validation=True)
    assert after_step(s, 12.0, 2, lambda: 0.9) == (0.9, [3, 5])  # type: ignore[arg-type]
    assert s.calls == [("val", 0.9), ("time", 12.0)]
    s = _Strategy(version=5, needs_validation=True)
    assert after_step(s, 1.0, 2, lambda: pytest.fail("validated off the interval")) == (None, [])  # type: ignore
    s = _Strategy(version=4, needs_validation=False)
    assert after_step(s, 11.0, 2, lambda: pytest.fail("validated without GMR")) == (None, [5])  # type: ignore
    assert [eval_due(k, 3) for k in range(7)] == [True, False, False, True, False, False, True]
    assert not eval_due(3, None)


def test_base_record_holds_the_common_keys_in_order():
    rec = base_record(_Strategy(4, False), time=1.5, step=4, accuracy=0.5, loss=1.0, bytes_up=10.0,  # type: ignore
                      bytes_down=20.0, uploads=3, downloads=4, client_uploads=[1, 2], val_score=None, moved=(1,),
                      stats=step_stats([1, 2, 6], ["a", "b", "c"]))
    assert list(rec) == ["time", "step", "accuracy", "loss", "avg_density", "bytes_up", "bytes_down", "uploads",
                         "downloads", "client_uploads", "densities", "val_accuracy", "restored", "restorations",
                         "staleness_mean", "min_coverage", "rejected"]
    assert rec["avg_density"] == 0.75 and rec["staleness_mean"] == 3.0 and rec["restored"] == [1]
    assert rec["restorations"] == 2 and rec["rejected"] == 1 and rec["min_coverage"] == 0.75
    assert step_stats([], []) == {"staleness_mean": 0.0, "used": 0}


# ------------------------------------------------------------------ the simulator's deadline trigger
def test_the_simulators_deadline_steps_follow_the_rule_on_a_whole_run():
    """Every step of a deadline-trigger run happens when the rule says: at the later of the
    server becoming free and the earlier of (the first top-density arrival + slack, the
    arrival that completes the clients at work) - re-derived here from the arrivals."""
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    slack = 0.7
    cfg = resolve_config(tiny_config(coordination={"trigger": "deadline", "deadline_slack": slack},
                                     clients={"num_clients": 8, "concurrency": 5},
                                     run={"max_steps": 14, "eval_every": 7}))
    exp = build_experiment(cfg)
    sim = exp.simulator
    arrivals: list[tuple[float, float, float]] = []  # (time, density, densest still in flight)
    steps: list[tuple[float, int]] = []  # (time, arrivals aggregated)
    free: list[float] = [0.0]
    on_reply, aggregate, server_free = sim.trigger.on_reply, sim.strategy.aggregate, sim._on_server_free

    def spy_reply(density, in_flight, now):
        in_flight = list(in_flight)
        arrivals.append((now, density, max(in_flight, default=0.0)))
        return on_reply(density, in_flight, now)

    def spy_aggregate():
        steps.append((sim.now, len(sim.strategy.arrivals)))
        return aggregate()

    def spy_free():
        free.append(sim.now)
        return server_free()

    sim.trigger.on_reply, sim.strategy.aggregate, sim._on_server_free = spy_reply, spy_aggregate, spy_free
    try:
        sim.run(cfg.run.max_steps)
    finally:
        exp.executor.close()
    assert len(steps) == 14
    by_deadline = by_count = 0
    prev = -1.0
    for i, (t, used) in enumerate(steps):
        mine = [a for a in arrivals if prev < a[0] <= t]  # the arrivals since the last step
        assert used == len(mine) and used >= 1
        armed = next((a[0] + slack for a in mine if a[1] >= a[2]), None)
        full = mine[4][0] if len(mine) >= 5 else None  # the 5th arrival completes the clients at work
        due = min(x for x in (armed, full) if x is not None)
        assert t == pytest.approx(max(free[i], due), abs=1e-9), (i, t, mine)
        by_deadline += armed is not None and (full is None or armed < full)
        by_count += full is not None and (armed is None or full <= armed)
        prev = t
    assert by_deadline >= 3 and by_count >= 1  # both branches of the rule were exercised


def test_a_checkpoint_of_the_epoch_numbered_deadline_loads_into_the_core():
    """Checkpoints written before the core kept the deadline as flags and an epoch carried
    by its event: an armed one loads as the time of that event, a passed one as now."""
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    cfg = resolve_config(tiny_config(coordination={"trigger": "deadline"}, run={"max_steps": 3}))
    exp = build_experiment(cfg)
    try:
        exp.simulator.run(3)
        state, tensors = exp.simulator.state_dict()
    finally:
        exp.executor.close()
    assert set(state["trigger"]) == {"deadline_at"}
    old = {k: v for k, v in state.items() if k != "trigger"}
    old["events"] = [*old["events"], [old["now"] + 0.25, 10_000, "deadline", -1, 7.0],
                     [old["now"] + 0.5, 10_001, "deadline", -1, 6.0]]  # a stale one of epoch 6
    fresh = build_experiment(cfg)
    try:
        fresh.simulator.load_state_dict({**old, "deadline_epoch": 7, "deadline_armed": True,
                                         "deadline_passed": False}, tensors)
        assert fresh.simulator.trigger.deadline_at == old["now"] + 0.25
        fresh.simulator.load_state_dict({**old, "deadline_epoch": 7, "deadline_armed": True,
                                         "deadline_passed": True}, tensors)
        assert fresh.simulator.trigger.deadline_at == old["now"]
        fresh.simulator.load_state_dict({**old, "deadline_epoch": 7, "deadline_armed": False,
                                         "deadline_passed": False}, tensors)
        assert fresh.simulator.trigger.deadline_at is None
    finally:
        fresh.executor.close()
