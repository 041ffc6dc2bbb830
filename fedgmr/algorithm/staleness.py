"""Staleness weighting functions s(tau) (docs/reference.md §4.3)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from fedgmr.registry import Registry


class StalenessFn(Protocol):
    def __call__(self, tau: int) -> float: ...


@dataclass(frozen=True)
class Constant:
    """s(tau) = 1."""

    def __call__(self, tau: int) -> float:
        _check(tau)
        return 1.0


@dataclass(frozen=True)
class Polynomial:
    """s(tau) = (1 + tau) ** -a."""

    a: float = 0.6

    def __call__(self, tau: int) -> float:
        _check(tau)
        return (1.0 + tau) ** (-self.a)


@dataclass(frozen=True)
class Hinge:
    """s(tau) = 1 if tau <= b else 1 / (a (tau - b) + 1)."""

    a: float = 10.0
    b: float = 4.0

    def __call__(self, tau: int) -> float:
        _check(tau)
        return 1.0 if tau <= self.b else 1.0 / (self.a * (tau - self.b) + 1.0)


@dataclass(frozen=True)
class FedBuff:
    """s(tau) = 1 / sqrt(1 + tau) (FedBuff's weighting)."""

    def __call__(self, tau: int) -> float:
        _check(tau)
        return 1.0 / math.sqrt(1.0 + tau)


def _check(tau: int) -> None:
    if tau < 0:
        raise ValueError(f"staleness must be >= 0, got {tau}")


STALENESS: Registry = Registry("staleness function")
STALENESS.register("constant", lambda a=None, b=None: Constant())
STALENESS.register("polynomial", lambda a=0.6, b=None: Polynomial(a))
STALENESS.register("hinge", lambda a=10.0, b=4.0: Hinge(a, b))
STALENESS.register("fedbuff", lambda a=None, b=None: FedBuff())


def make_staleness(kind: str, a: float | None = None, b: float | None = None) -> StalenessFn:
    """Build a staleness function by name (``constant``, ``polynomial``, ``hinge``, ``fedbuff``)."""
    kwargs = {k: v for k, v in (("a", a), ("b", b)) if v is not None}
    return STALENESS.get(kind)(**kwargs)


def fedasync_alpha(alpha: float, s: StalenessFn, tau: int) -> float:
    """FedAsync's mixing weight alpha_t = alpha * s(tau), never cumulative across steps."""
    return alpha * s(tau)
