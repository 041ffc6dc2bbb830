"""Gradual Model Restoration rules (docs/reference.md §5): plateau detection, triggers, density ladder."""

from __future__ import annotations

import json
import math

import pytest

from fedgmr.algorithm.restoration import (
    DeadlineTrigger,
    DensityLadder,
    EarlyStopping,
    EarlyStoppingTrigger,
    FixedTimeTrigger,
    NoTrigger,
)

LADDER = [0.05, 0.1, 0.2, 0.5, 1.0]
HIGH = [1.0, 0.5, 0.2, 0.1] + [0.05] * 6


def _fires(monitor, scores) -> list[int]:
    return [i for i, s in enumerate(scores) if monitor.update(s)]


# ---------------------------------------------------------------------------- EarlyStopping

def test_patience_two_no_delta():
    # i: 0 1 2 3 4 5 6 7
    # best 1 2 2 2 2 3 3 3; bad 0 0 1 2* 1 0 1 2*
    es = EarlyStopping(patience=2)
    assert _fires(es, [1, 2, 2, 2, 2, 3, 3, 3]) == [3, 7]
    assert es.best == 3


def test_patience_one_every_non_improvement_fires():
    es = EarlyStopping(patience=1)
    assert _fires(es, [0.5, 0.6, 0.6, 0.7, 0.65, 0.8]) == [2, 4]


def test_min_delta_requires_strict_improvement_beyond_delta():
    # best=1.0; 1.3 is not > 1.5 -> bad (fires); 1.6 > 1.5 -> best 1.6; 2.2 > 2.1 -> best 2.2;
    # 2.25 not > 2.7 -> fires
    es = EarlyStopping(patience=1, min_delta=0.5)
    assert _fires(es, [1.0, 1.3, 1.6, 2.2, 2.25]) == [1, 4]
    assert es.best == 2.2


def test_equal_score_is_not_an_improvement():
    es = EarlyStopping(patience=3)
    assert _fires(es, [0.4] * 8) == [3, 6]


def test_cooldown_ignores_checks_after_firing():
    # patience 1, cooldown 2, constant score:
    # 0 improve (from -inf); 1 fire; 2,3 cool-down; 4 fire; 5,6 cool-down; 7 fire
    es = EarlyStopping(patience=1, cooldown=2)
    assert _fires(es, [5.0] * 8) == [1, 4, 7]


def test_cooldown_with_patience_two():
    # 0 best; 1 bad1; 2 bad2 fire; 3,4 cooldown; 5 bad1; 6 bad2 fire
    es = EarlyStopping(patience=2, cooldown=2)
    assert _fires(es, [1.0] * 7) == [2, 6]


def test_improvement_during_cooldown_updates_best_but_counts_nothing():
    es = EarlyStopping(patience=1, cooldown=1)
    # 0 best 1; 1 fire; 2 cool-down (best -> 5); 3: 5 is not > 5 -> fire
    assert _fires(es, [1.0, 1.0, 5.0, 5.0]) == [1, 3]
    assert es.best == 5.0


def test_patience_must_be_positive():
    with pytest.raises(ValueError):
        EarlyStopping(patience=0)


def test_early_stopping_state_dict_round_trip():
    scores = [1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4]
    ref = EarlyStopping(patience=2, min_delta=0.1, cooldown=1)
    ref_fires = _fires(ref, scores)

    es = EarlyStopping(patience=2, min_delta=0.1, cooldown=1)
    first = _fires(es, scores[:5])
    state = json.loads(json.dumps(es.state_dict()))  # JSON-able
    resumed = EarlyStopping(patience=2, min_delta=0.1, cooldown=1)
    resumed.load_state_dict(state)
    assert (resumed.best, resumed.bad_checks, resumed.cooldown_left) == (es.best, es.bad_checks, es.cooldown_left)
    later = [i + 5 for i in _fires(resumed, scores[5:])]
    assert first + later == ref_fires


def test_early_stopping_state_dict_fresh_best_is_none():
    es = EarlyStopping(patience=1)
    state = es.state_dict()
    assert state["best"] is None
    json.dumps(state)
    other = EarlyStopping(patience=1)
    other.load_state_dict(state)
    assert other.best == -math.inf


# ---------------------------------------------------------------------------- triggers

def test_early_stopping_trigger_default_cooldown_is_patience():
    trig = EarlyStoppingTrigger(patience=2)
    assert trig.needs_validation
    assert trig.monitor.cooldown == 2
    # 0 best; 1 bad1; 2 bad2 fire; 3,4 cool-down; 5 bad1; 6 bad2 fire
    fired = [i for i, s in enumerate([0.3] * 7) if trig.on_validation(i, s)]
    assert fired == [2, 6]
    assert trig.on_time(1e9) == 0


def test_early_stopping_trigger_explicit_cooldown_and_state():
    trig = EarlyStoppingTrigger(patience=1, min_delta=0.0, cooldown=0)
    fired = [i for i, s in enumerate([0.1, 0.2, 0.2, 0.2, 0.3]) if trig.on_validation(i, s)]
    assert fired == [2, 3]
    state = trig.state_dict()
    other = EarlyStoppingTrigger(patience=1, cooldown=0)
    other.load_state_dict(state)
    assert other.monitor.best == pytest.approx(0.3)
    assert other.on_validation(5, 0.3) is True


def test_fixed_time_trigger_fires_at_fifths_of_the_horizon():
    trig = FixedTimeTrigger(horizon=100)
    assert not trig.needs_validation
    assert trig.on_validation(0, 0.0) is False
    assert trig.on_time(0.0) == 0
    assert trig.on_time(19.999) == 0
    assert trig.on_time(20.0) == 1
    assert trig.on_time(20.0) == 0  # not twice
    assert trig.on_time(39.0) == 0
    assert trig.on_time(40.0) == 1
    assert trig.on_time(60.0) == 1
    assert trig.on_time(80.0) == 1
    assert trig.on_time(99.0) == 0
    assert trig.on_time(100.0) == 1
    assert trig.on_time(1000.0) == 0


def test_fixed_time_trigger_returns_counts_when_several_are_due():
    trig = FixedTimeTrigger(horizon=100)
    assert trig.on_time(45.0) == 2  # 20 and 40
    assert trig.on_time(45.0) == 0
    assert trig.on_time(250.0) == 3  # 60, 80, 100
    assert trig.on_time(300.0) == 0


def test_fixed_time_trigger_state_and_validation():
    trig = FixedTimeTrigger(horizon=100)
    trig.on_time(50.0)
    other = FixedTimeTrigger(horizon=100)
    other.load_state_dict(json.loads(json.dumps(trig.state_dict())))
    assert other.on_time(50.0) == 0
    assert other.on_time(61.0) == 1
    with pytest.raises(ValueError):
        FixedTimeTrigger(horizon=0)


def test_deadline_trigger_fires_at_each_deadline_when_no_plateau_comes():
    trig = DeadlineTrigger(patience=3, horizon=100)
    assert trig.needs_validation
    for i in range(10):  # steadily improving: never a plateau
        assert trig.on_validation(i, float(i)) is False
    assert trig.on_time(19.0) == 0
    assert trig.on_time(20.0) == 1
    assert trig.on_time(20.0) == 0
    assert trig.on_time(65.0) == 2  # 40 and 60, both overdue
    assert trig.on_time(1000.0) == 2  # 80 and 100; no more after the last fraction
    assert trig.on_time(2000.0) == 0


def test_deadline_trigger_plateau_before_a_deadline_takes_its_place():
    trig = DeadlineTrigger(patience=1, horizon=100, cooldown=0)
    assert trig.on_validation(0, 0.5) is False
    assert trig.on_validation(1, 0.5) is True  # plateau at t < 20: restoration 1, early
    assert trig.on_time(20.0) == 0  # the first deadline is already met
    assert trig.on_validation(2, 0.5) is True  # a second plateau: restoration 2
    assert trig.on_validation(3, 0.5) is True  # and a third, ahead of every deadline
    assert trig.on_time(40.0) == 0 and trig.on_time(60.0) == 0  # deadlines 2 and 3 met by plateaus
    assert trig.on_time(80.0) == 1  # restoration 4 was still owed at 80
    assert trig.fired == 4


def test_deadline_restoration_restarts_the_plateau_detector():
    trig = DeadlineTrigger(patience=2, horizon=100, cooldown=1)
    assert trig.on_validation(0, 1.0) is False
    assert trig.on_validation(1, 1.0) is False  # one bad check
    assert trig.on_time(20.0) == 1  # deadline: counter reset, cool-down started
    assert trig.on_validation(2, 1.0) is False  # cool-down check
    assert trig.on_validation(3, 1.0) is False  # first bad check again, not the second
    assert trig.on_validation(4, 1.0) is True


def test_deadline_trigger_state_round_trip():
    trig = DeadlineTrigger(patience=1, horizon=100, cooldown=0)
    trig.on_validation(0, 0.5)
    trig.on_validation(1, 0.5)  # a plateau
    trig.on_time(45.0)  # deadline 2 due -> fires one
    other = DeadlineTrigger(patience=1, horizon=100, cooldown=0)
    other.load_state_dict(json.loads(json.dumps(trig.state_dict())))
    assert other.fired == trig.fired == 2
    assert other.on_time(45.0) == 0
    assert other.on_time(60.0) == 1
    with pytest.raises(ValueError):
        DeadlineTrigger(patience=1, horizon=0)


def test_no_trigger_never_fires():
    trig = NoTrigger()
    assert not any(trig.on_validation(i, 0.0) for i in range(10))
    assert trig.on_time(1e12) == 0


# ---------------------------------------------------------------------------- DensityLadder

def test_from_densities_places_clients_on_rungs():
    ladder = DensityLadder.from_densities(LADDER, HIGH)
    assert ladder.levels == [4, 3, 2, 1, 0, 0, 0, 0, 0, 0]
    assert ladder.densities() == HIGH
    assert ladder.top == 4
    # nearest rung for off-ladder densities
    assert DensityLadder.from_densities(LADDER, [0.06, 0.4, 0.9]).levels == [0, 3, 4]


def test_restore_high_heterogeneity_pattern_floor_semantics():
    ladder = DensityLadder.from_densities(LADDER, HIGH)
    small = [4, 5, 6, 7, 8, 9]

    # 1st: only the 0.05 clients move (to 0.1); the 0.2 / 0.5 / 1.0 clients wait
    assert ladder.restore() == small
    assert ladder.densities() == [1.0, 0.5, 0.2, 0.1] + [0.1] * 6
    # 2nd: every 0.1 client (client 3 and the former 0.05 ones) moves to 0.2
    assert ladder.restore() == [3] + small
    assert ladder.densities() == [1.0, 0.5, 0.2, 0.2] + [0.2] * 6
    # 3rd: every 0.2 client moves to 0.5
    assert ladder.restore() == [2, 3] + small
    assert ladder.densities() == [1.0, 0.5, 0.5, 0.5] + [0.5] * 6
    # 4th: everybody below 1.0 moves to 1.0
    assert ladder.restore() == [1, 2, 3] + small
    assert ladder.densities() == [1.0] * 10
    assert ladder.restorations == 4
    # nothing left to restore
    assert ladder.restore() == []
    assert ladder.restore() == []
    assert ladder.densities() == [1.0] * 10


def test_restore_never_moves_a_client_down_or_by_more_than_one_level():
    ladder = DensityLadder.from_densities(LADDER, HIGH)
    prev = list(ladder.levels)
    while True:
        moved = ladder.restore()
        if not moved:
            break
        for i, (a, b) in enumerate(zip(prev, ladder.levels)):
            assert b - a == (1 if i in moved else 0)
        prev = list(ladder.levels)


def test_step_up_single_client():
    ladder = DensityLadder.from_densities(LADDER, HIGH)
    assert ladder.step_up(9) is True
    assert ladder.density(9) == 0.1
    assert ladder.densities()[:9] == HIGH[:9]
    assert ladder.step_up(0) is False  # already at 1.0
    assert ladder.density(0) == 1.0
    for _ in range(3):
        assert ladder.step_up(9) is True
    assert ladder.density(9) == 1.0
    assert ladder.step_up(9) is False
    # a global restoration still moves the remaining 0.05 clients first
    assert ladder.restore() == [4, 5, 6, 7, 8]


def test_ladder_state_dict_round_trip():
    ladder = DensityLadder.from_densities(LADDER, HIGH)
    ladder.restore()
    ladder.step_up(0)
    state = json.loads(json.dumps(ladder.state_dict()))
    other = DensityLadder.from_densities(LADDER, HIGH)
    other.load_state_dict(state)
    assert other.levels == ladder.levels
    assert other.floor == ladder.floor
    assert other.restorations == ladder.restorations
    assert other.restore() == ladder.restore()


def test_ladder_must_be_strictly_increasing():
    with pytest.raises(ValueError):
        DensityLadder((0.1, 0.05, 1.0), [0])
    with pytest.raises(ValueError):
        DensityLadder((0.1, 0.1, 1.0), [0])
