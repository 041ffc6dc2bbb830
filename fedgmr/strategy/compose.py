"""A server strategy composed from declared parts.

Each part of a configuration that needs something of the server - a width baseline
(``submodel.policy``), a client method's server half (``local.algorithm``), federated
distillation (``distill``), clustering (``clustering.kind``) - declares a
:class:`ServerPart`: the strategy class it brings (None: FedGMR's own
:class:`~fedgmr.strategy.masked_buffered.MaskedBufferedStrategy` suffices), the
constructor arguments it adds - among them ``plugins``, what it adds to the server step
(:mod:`fedgmr.strategy.plugins`) - and what it expects replies to carry beside their
values (the client method's declared ``reply_extras``). :func:`compose_strategy` takes
them together: at most one part may bring a class (two are refused in one line naming
both, never "the last one wins"), two parts may not set the same argument differently,
the parts' plug-ins add up in the parts' order (two that replace one hook are refused in
one line naming both parts), and their reply extras are merged into the strategy's
``reply_extras`` argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from fedgmr.errors import ConfigError
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.plugins import ServerPlugin, plugin_conflict
from fedgmr.training.extras import ExtrasSchema, merge_schemas


@dataclass(frozen=True)
class ServerPart:
    """What one part of a configuration asks of the server.

    source: the config's words for the part (``"local.algorithm 'scaffold'"``).
    strategy_cls: the strategy class it brings (None or ``MaskedBufferedStrategy``: none of its own).
    kwargs: constructor arguments it adds.
    reply_extras: what it expects a reply to carry beside its values
        (:class:`~fedgmr.training.extras.ExtraSpec`; the client method's declaration).
    """

    source: str
    strategy_cls: type[MaskedBufferedStrategy] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    reply_extras: ExtrasSchema = ()

    @property
    def brings_class(self) -> bool:
        return self.strategy_cls is not None and self.strategy_cls is not MaskedBufferedStrategy


def compose_strategy(parts: Sequence[ServerPart]) -> tuple[type[MaskedBufferedStrategy], dict[str, Any]]:
    """The strategy class and constructor arguments of ``parts`` taken together
    (``ConfigError``, one line, when two parts each bring a class or set one argument
    to different values)."""
    own = [p for p in parts if p.brings_class]
    if len(own) > 1:
        a, b = own[0], own[1]
        raise ConfigError(f"{a.source} and {b.source} each bring their own server strategy "
                          f"({a.strategy_cls.__name__}, {b.strategy_cls.__name__}): they cannot be combined")
    kwargs: dict[str, Any] = {}
    owner: dict[str, str] = {}
    plugins: list[ServerPlugin] = []
    sources: list[str] = []
    for p in parts:
        for plugin in p.kwargs.get("plugins", ()):  # plug-ins add up; two replacing one hook are refused
            plugins.append(plugin)
            sources.append(f"{p.source} ({plugin.name})")
        for key, value in p.kwargs.items():
            if key == "plugins":
                continue
            if key in kwargs and kwargs[key] is not value:
                raise ConfigError(f"{owner[key]} and {p.source} both set the server's {key!r}: they cannot be "
                                  f"combined")
            kwargs[key] = value
            owner[key] = p.source
    conflict = plugin_conflict(plugins, sources)
    if conflict is not None:
        raise ConfigError(conflict)
    if plugins:
        kwargs["plugins"] = tuple(plugins)
    cls = own[0].strategy_cls if own else MaskedBufferedStrategy
    assert cls is not None
    declared = [p for p in parts if p.reply_extras]
    if declared:
        try:
            kwargs["reply_extras"] = merge_schemas(*(p.reply_extras for p in declared))
        except ValueError as exc:
            raise ConfigError(f"{', '.join(p.source for p in declared)}: {exc}") from None
    return cls, kwargs


__all__ = ["ServerPart", "compose_strategy"]
