"""The server half of each client method (``local.algorithm``), by name: what the
strategy needs besides FedGMR's defaults. ``half(cfg, model, space)`` returns the
strategy class (None: :class:`MaskedBufferedStrategy`) and extra constructor arguments,
among them ``plugins``, what the method adds to the server step
(:mod:`fedgmr.strategy.plugins`).

* ``scaffold``: the :class:`~fedgmr.strategy.scaffold.ScaffoldControl` plug-in (server
  control variate, ``local.server_lr``);
* ``fedbn``: BatchNorm parameters are local coordinates (never uploaded or aggregated);
* ``local_sgd``: the :class:`~fedgmr.strategy.local_only.LocalOnly` plug-in (nothing uploaded or aggregated);
* ``standalone``: every coordinate is local (nothing is uploaded or aggregated);
* the others (``sgd``, ``fedprox``, ``ditto``, ``fedmrl``): nothing - their server is FedAvg's / FedGMR's.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.nn as nn

from fedgmr.algorithm.local_rules import batch_norm_coordinates
from fedgmr.algorithm.params import ParamSpace
from fedgmr.errors import ConfigError
from fedgmr.registry import Registry
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy

ServerHalf = Callable[[Any, nn.Module, ParamSpace], tuple["type[MaskedBufferedStrategy] | None", dict[str, Any]]]

#: server halves by client-method name; a name not registered needs nothing on the server
SERVER_HALVES: Registry[ServerHalf] = Registry("server half")


def _scaffold(cfg: Any, model: nn.Module, space: ParamSpace) -> tuple[None, dict[str, Any]]:
    from fedgmr.strategy.scaffold import ScaffoldControl

    return None, {"plugins": (ScaffoldControl(cfg.local.server_lr),)}


def _fedbn(cfg: Any, model: nn.Module, space: ParamSpace) -> tuple[None, dict[str, Any]]:
    local, _ = batch_norm_coordinates(model, space)
    if not bool(local.any()) and not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise ConfigError(f"local.algorithm 'fedbn' keeps BatchNorm layers local, but the model {cfg.model.name!r} "
                          f"has none")
    return None, {"local_coords": local}


def _standalone(cfg: Any, model: nn.Module, space: ParamSpace) -> tuple[None, dict[str, Any]]:
    from fedgmr.strategy.local_only import LocalOnly

    return None, {"plugins": (LocalOnly(),)}  # nothing is sent or averaged (each client trains its own F_i)


def _local(cfg: Any, model: nn.Module, space: ParamSpace) -> tuple[None, dict[str, Any]]:
    from fedgmr.strategy.local_only import LocalOnly

    return None, {"plugins": (LocalOnly(),)}


SERVER_HALVES.register("scaffold", _scaffold)
SERVER_HALVES.register("fedbn", _fedbn)
SERVER_HALVES.register("local_sgd", _local)
SERVER_HALVES.register("standalone", _standalone)


def server_half(cfg: Any, model: nn.Module, space: ParamSpace) -> tuple[type[MaskedBufferedStrategy] | None,
                                                                        dict[str, Any]]:
    """The strategy class and arguments the configured client method needs."""
    name = cfg.local.algorithm
    if name not in SERVER_HALVES:
        return None, {}
    return SERVER_HALVES.get(name)(cfg, model, space)


__all__ = ["SERVER_HALVES", "server_half"]
