"""The experiment trackers' registry (``run.loggers``), below the config schema: the
trackers themselves live in :mod:`fedgmr.experiment.loggers` and register here when it
is imported; a plugin's tracker registers the same way. A foundation module (it imports
only the registry), so checking a config's logger names loads neither the trackers nor
the experiment tooling."""

from __future__ import annotations

from typing import Any

from fedgmr.registry import Registry

#: the trackers fedgmr ships (fedgmr.experiment.loggers registers each; a test holds them equal)
BUILTIN_LOGGERS: tuple[str, ...] = ("mlflow", "tensorboard", "wandb")

#: logger classes by name (``@LOGGERS.register("name")`` on a ``RunLogger`` subclass)
LOGGERS: Registry[Any] = Registry("logger")


def known_loggers() -> list[str]:
    """Every logger name a config may use: the shipped ones and those registered so far."""
    return sorted(set(BUILTIN_LOGGERS) | set(LOGGERS.names()))


__all__ = ["BUILTIN_LOGGERS", "LOGGERS", "known_loggers"]
