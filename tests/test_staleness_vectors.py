"""Staleness factors s(tau) (docs/reference.md §4.3) on hand-computed vectors (Appendix A)."""

from __future__ import annotations

import math

import pytest

from fedgmr.algorithm.staleness import Constant, FedBuff, Hinge, Polynomial, fedasync_alpha, make_staleness
from fedgmr.errors import ConfigError


def test_polynomial_default_a_is_0_6():
    assert Polynomial().a == 0.6


def test_polynomial_vectors():
    s = Polynomial(0.6)
    assert s(0) == 1.0
    assert s(1) == pytest.approx(2 ** -0.6, rel=1e-12)
    assert s(1) == pytest.approx(0.6598, abs=5e-5)
    assert s(3) == pytest.approx(4 ** -0.6, rel=1e-12)
    assert s(3) == pytest.approx(0.4353, abs=5e-5)


def test_polynomial_is_decreasing():
    s = Polynomial(0.6)
    vals = [s(t) for t in range(20)]
    assert all(a > b for a, b in zip(vals, vals[1:]))


def test_hinge_vectors():
    s = Hinge(a=10.0, b=4.0)
    assert s(6) == pytest.approx(1.0 / 21.0, rel=1e-12)  # 1 / (10*2 + 1)
    for tau in range(0, 5):  # tau <= b
        assert s(tau) == 1.0
    assert s(5) == pytest.approx(1.0 / 11.0, rel=1e-12)


def test_fedbuff_vectors():
    s = FedBuff()
    assert s(0) == 1.0
    assert s(3) == 0.5


def test_constant():
    s = Constant()
    assert [s(t) for t in (0, 1, 7, 1000)] == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("fn", [Constant(), Polynomial(0.6), Hinge(10.0, 4.0), FedBuff()])
def test_negative_staleness_raises(fn):
    with pytest.raises(ValueError):
        fn(-1)


def test_make_staleness_by_name():
    assert isinstance(make_staleness("constant"), Constant)
    p = make_staleness("polynomial")
    assert isinstance(p, Polynomial) and p.a == 0.6
    p5 = make_staleness("polynomial", a=0.5)
    assert p5(3) == pytest.approx(0.5, rel=1e-12)
    h = make_staleness("hinge", a=10, b=4)
    assert isinstance(h, Hinge)
    assert h(6) == pytest.approx(1 / 21, rel=1e-12)
    h_default = make_staleness("hinge")
    assert h_default(6) == pytest.approx(1 / 21, rel=1e-12)
    assert make_staleness("fedbuff")(3) == 0.5


def test_make_staleness_unknown_name_raises_config_error():
    with pytest.raises(ConfigError) as info:
        make_staleness("exponential")
    assert "exponential" in str(info.value)


def test_fedasync_alpha_not_cumulative():
    s = Polynomial(0.5)
    assert fedasync_alpha(0.6, s, 3) == pytest.approx(0.3, abs=1e-15)
    # repeated calls give the same value (no state carried across steps)
    assert fedasync_alpha(0.6, s, 3) == fedasync_alpha(0.6, s, 3)
    assert math.isclose(fedasync_alpha(0.6, s, 0), 0.6)
