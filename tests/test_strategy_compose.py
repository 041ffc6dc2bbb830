"""A server strategy composed from declared parts (fedgmr.strategy.compose): at most one
part brings a class, arguments merge, and a clash is one line naming both parts - never
"the last assignment wins"."""

from __future__ import annotations

import pytest

from fedgmr.errors import ConfigError
from fedgmr.strategy.compose import ServerPart, compose_strategy
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy


class _A(MaskedBufferedStrategy):
    pass


class _B(MaskedBufferedStrategy):
    pass


def test_no_part_brings_a_class_gives_fedgmrs_strategy_with_every_argument():
    cls, kw = compose_strategy([ServerPart("a", None, {"x": 1}), ServerPart("b", MaskedBufferedStrategy, {"y": 2})])
    assert cls is MaskedBufferedStrategy and kw == {"x": 1, "y": 2}


def test_the_one_part_that_brings_a_class_wins_whatever_its_position():
    for parts in ([ServerPart("a", _A, {"x": 1}), ServerPart("b", None, {"y": 2})],
                  [ServerPart("b", None, {"y": 2}), ServerPart("a", _A, {"x": 1})]):
        assert compose_strategy(parts) == (_A, {"x": 1, "y": 2})


def test_two_classes_are_refused_naming_both_parts():
    with pytest.raises(ConfigError, match=r"local.algorithm 'x' and distill.server \(FedDF\) each bring their own "
                                          r"server strategy \(_A, _B\): they cannot be combined"):
        compose_strategy([ServerPart("local.algorithm 'x'", _A), ServerPart("distill.server (FedDF)", _B)])


def test_one_argument_set_twice_is_refused_unless_it_is_the_same_object():
    shared = object()
    assert compose_strategy([ServerPart("a", None, {"k": shared}), ServerPart("b", None, {"k": shared})])[1] == \
        {"k": shared}
    with pytest.raises(ConfigError, match="a and b both set the server's 'k'"):
        compose_strategy([ServerPart("a", None, {"k": 1.5}), ServerPart("b", None, {"k": 2.5})])


def test_build_composes_the_parts_a_config_declares():
    """The builder asks each part of the config (the client method's server half here)
    and builds the class it brings - SCAFFOLD's server - with its arguments."""
    from conftest import tiny_config
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config
    from fedgmr.strategy.scaffold import ScaffoldControl

    exp = build_experiment(resolve_config(tiny_config(method="scaffold", local={"server_lr": 0.5})))
    try:
        assert type(exp.strategy) is MaskedBufferedStrategy and exp.strategy.plugin(ScaffoldControl).server_lr == 0.5
    finally:
        exp.executor.close()
