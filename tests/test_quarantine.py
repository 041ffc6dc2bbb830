"""The quarantine policy of a Flower deployment (fedgmr.flower.quarantine): pure
bookkeeping, every time passed in."""

from __future__ import annotations

import pytest

from fedgmr.errors import ConfigError
from fedgmr.flower.quarantine import DEFAULTS, Quarantine, QuarantinePolicy


def test_the_nth_strike_within_the_window_quarantines_for_the_set_time():
    q = Quarantine(QuarantinePolicy(after=3, window=10.0, seconds=100.0))
    assert [q.strike(7, t) for t in (0.0, 4.0)] == [False, False]
    assert not q.blocked(7, 5.0)
    assert q.strike(7, 9.0) is True
    assert q.blocked(7, 9.0) and q.blocked(7, 108.999) and not q.blocked(7, 109.0)
    assert q.events == [7] and q.count == 1
    assert not q.blocked(8, 9.0)  # other nodes are not affected


def test_strikes_older_than_the_window_do_not_count():
    q = Quarantine(QuarantinePolicy(after=3, window=10.0, seconds=100.0))
    assert not q.strike(1, 0.0)
    assert not q.strike(1, 5.0)
    assert not q.strike(1, 10.5)  # the strike at 0 is 10.5 s old: out of the window
    assert q.strike(1, 14.0)  # 5, 10.5, 14: three within 10 s
    # a strike exactly `window` old still counts
    q2 = Quarantine(QuarantinePolicy(after=2, window=10.0, seconds=1.0))
    assert not q2.strike(1, 0.0) and q2.strike(1, 10.0)


def test_release_reports_each_node_once_and_it_starts_with_a_clean_record():
    q = Quarantine(QuarantinePolicy(after=2, window=100.0, seconds=50.0))
    q.strike(1, 0.0), q.strike(1, 1.0)
    q.strike(2, 10.0), q.strike(2, 20.0)
    assert q.release(50.999) == []
    assert q.release(51.0) == [1]
    assert q.release(70.0) == [2] and q.release(200.0) == []
    assert not q.strike(1, 60.0)  # the strikes before the quarantine were cleared
    assert q.strike(1, 61.0) and q.events == [1, 2, 1]


def test_strikes_while_quarantined_do_not_extend_it():
    q = Quarantine(QuarantinePolicy(after=1, window=10.0, seconds=5.0))
    assert q.strike(3, 0.0)
    assert not q.strike(3, 1.0)  # a late reply of an instruction sent before the quarantine
    assert q.until[3] == 5.0 and q.count == 1


def test_after_zero_turns_it_off():
    q = Quarantine(QuarantinePolicy(after=0))
    assert not any(q.strike(1, float(t)) for t in range(100))
    assert q.count == 0 and not q.blocked(1, 50.0)


def test_run_config_keys_defaults_and_strings():
    assert QuarantinePolicy.from_run_config({}) == QuarantinePolicy(**{
        "after": DEFAULTS["quarantine-after"], "window": DEFAULTS["quarantine-window"],
        "seconds": DEFAULTS["quarantine-seconds"]})
    p = QuarantinePolicy.from_run_config({"quarantine-after": 2, "quarantine-window": "30",
                                          "quarantine-seconds": 12.5})
    assert p == QuarantinePolicy(after=2, window=30.0, seconds=12.5)
    assert QuarantinePolicy.from_run_config({"quarantine-after": 4.0}).after == 4
    assert not QuarantinePolicy.from_run_config({"quarantine-after": 0}).enabled


@pytest.mark.parametrize("key,value", [
    ("quarantine-after", -1), ("quarantine-after", 2.5), ("quarantine-after", True), ("quarantine-after", "x"),
    ("quarantine-window", 0), ("quarantine-window", -3.0), ("quarantine-window", float("inf")),
    ("quarantine-seconds", 0.0), ("quarantine-seconds", float("nan")), ("quarantine-seconds", False),
])
def test_bad_values_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        QuarantinePolicy.from_run_config({key: value})


def test_the_server_app_refuses_a_bad_key_before_building_anything():
    pytest.importorskip("flwr")
    from fedgmr.flower.server_app import serve

    class NoLink:  # touching the link would fail the test differently
        def __getattr__(self, name):
            raise AssertionError(f"the link was used ({name}) before the run config was checked")

    with pytest.raises(ConfigError, match="quarantine-seconds"):
        serve(NoLink(), {"quarantine-seconds": -5})  # type: ignore[arg-type]
