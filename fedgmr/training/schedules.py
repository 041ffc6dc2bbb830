"""Learning-rate schedules for the clients' local SGD (``training.lr_schedule``).

The schedule advances with the server's model versions: a job trains with the rate of
the version of the global model it was sent (the round in synchronous FL, the server step
in semi-asynchronous FL), so every client at one version uses one rate, whatever its
speed. Pure functions of (base rate, version).
"""

from __future__ import annotations

import math


def lr_at(kind: str, base: float, version: int, step_every: int = 100, gamma: float = 0.5,
          total_steps: int | None = None, min_lr: float = 0.0) -> float:
    """The local learning rate at model ``version``.

    ``constant``: ``base``. ``step``: ``base * gamma ** (version // step_every)``.
    ``cosine``: ``min_lr + (base - min_lr) (1 + cos(pi t / T)) / 2`` with ``t`` the version
    capped at ``T = total_steps`` (then it stays at ``min_lr``)."""
    if version < 0:
        raise ValueError(f"a model version is >= 0, got {version}")
    if kind == "constant":
        return base
    if kind == "step":
        return base * gamma ** (version // step_every)
    if kind == "cosine":
        if not total_steps:
            raise ValueError("a cosine schedule needs total_steps")
        t = min(version, total_steps)
        return min_lr + (base - min_lr) * (1.0 + math.cos(math.pi * t / total_steps)) / 2.0
    raise ValueError(f"unknown learning-rate schedule {kind!r} (constant, step, cosine)")
