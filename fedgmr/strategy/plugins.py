"""Server plug-ins: what a method adds to FedGMR's one server strategy.

A method whose server does more than FedGMR's (SCAFFOLD's control variate, FedNova's
normalised step, FedDyn's state ``h``, FedDF's distillation, FedMD's consensus,
HeteroFL's label split, cluster routing) brings a :class:`ServerPlugin` instead of a subclass of
:class:`~fedgmr.strategy.masked_buffered.MaskedBufferedStrategy`. The strategy calls
each hook of every plug-in, in the order they were given, at one point of its step:

========================  ==================================================================
hook                      when
========================  ==================================================================
``wire(a)``               a job is assigned (also rebuilt from a checkpoint): what travels
``on_assign(a)``          a job was assigned (not when rebuilt from a checkpoint)
``prepare(reply)``        a reply arrives, before validation (HeteroFL restricts its mask)
``check_extras(c, x)``    the reply's declared extras passed the schema (a server-only bound)
``on_accept(update)``     the reply was accepted into the buffer
``server_step(old, new)`` the rule's result becomes the new model (*one plug-in at most*)
``fuse(p, b, used)``      the aggregate is post-processed from the updates used (*at most one*)
``step_models(used, w)``  replaces the one-model step: the plug-in folds the updates into
                          models of its own and returns the global one (*at most one*;
                          no ``fuse`` beside it); cluster routing
``client_models(v)``      each client's own model at version ``v`` (None: the global one)
``after_aggregate(r)``    the step is done (its report may be amended)
``record_keys(v)``        the metrics record of model version ``v``
``state_dict`` / ``load_state_dict``  checkpoints (each plug-in its own keys)
========================  ==================================================================

A plug-in reads the strategy it is bound to through its public surface (``params``,
``version``, ``full_values``, ``held_masks``, ``incoming``, ``job``, ...), never its private state.
``server_step``, ``fuse`` and ``step_models`` each replace what the server computes: two
plug-ins that both implement one (or one ``step_models`` and another ``fuse``, which its
step would skip) are refused in one line (:func:`plugin_conflict`), never chained silently.
A plug-in with models of its own aggregates each through the strategy's
``aggregate_model`` (the rule, the server step, the BatchNorm fold, the finiteness check).
A plug-in's ``reply_extras`` join the strategy's reply schema.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import torch

from fedgmr.strategy.messages import Assignment, Reply, StepReport
from fedgmr.strategy.update import Update
from fedgmr.training.extras import ExtrasSchema

#: hooks whose result replaces the server's own: at most one plug-in may implement each
EXCLUSIVE_HOOKS: tuple[str, ...] = ("server_step", "fuse", "step_models")


class ServerPlugin:
    """A part of the server step (see the module). Every hook does nothing by default."""

    #: the plug-in's name, in messages and in :meth:`MaskedBufferedStrategy.plugin`
    name: ClassVar[str] = "plug-in"
    #: what it expects replies to carry beside their values (the client method's declaration)
    reply_extras: ClassVar[ExtrasSchema] = ()

    #: the :class:`~fedgmr.strategy.masked_buffered.MaskedBufferedStrategy` it is bound to
    strategy: Any

    def bind(self, strategy: Any) -> None:
        """Attach to ``strategy`` (once, at the end of its construction)."""
        self.strategy = strategy

    def wire(self, a: Assignment) -> Assignment:
        """The assignment as it goes out (what travels with it, :class:`~fedgmr.strategy.messages.Wire`)."""
        return a

    def on_assign(self, a: Assignment) -> None:
        """A job was assigned (:meth:`wire` shaped it; not called for jobs rebuilt from a checkpoint)."""

    def prepare(self, reply: Reply) -> Reply:
        """A reply before validation."""
        return reply

    def check_extras(self, client_id: int, extras: dict[str, torch.Tensor]) -> None:
        """Raise :class:`~fedgmr.errors.InvalidUpdateError` for extras only the server can judge."""

    def on_accept(self, update: Update) -> None:
        """An accepted update (its checked extras in ``update.extras``)."""

    def server_step(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """The new global model from the rule's result ``new`` (a new tensor)."""
        return new

    def fuse(self, params: torch.Tensor, buffers: dict[str, torch.Tensor],
             used: list[Update]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The aggregated model after server-side work on the updates used."""
        return params, buffers

    def step_models(self, used: list[Update],
                    weights: list[float]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Replace the one-model step: fold ``used`` (weights ``weights``, the strategy's
        beta) into the plug-in's own models (``strategy.aggregate_model`` each) and return
        the (finite) model that becomes the global one."""
        raise NotImplementedError

    def client_models(self, version: int) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]] | None:
        """Each client's own model at model ``version`` (None: the global one)."""
        return None

    def after_aggregate(self, report: StepReport) -> StepReport:
        """The finished step's report (amended or as it is)."""
        return report

    def record_keys(self, version: int) -> dict[str, Any]:
        """Extra keys for the metrics record of model ``version``."""
        return {}

    def state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        """Add this plug-in's checkpoint to ``state`` (JSON-able) and ``tensors``."""

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        """Restore from :meth:`state_dict`'s keys (tensors already on the strategy's device);
        the strategy's own state is loaded first."""


def implements(plugin: ServerPlugin, hook: str) -> bool:
    """Whether ``plugin`` overrides ``hook``."""
    return getattr(type(plugin), hook) is not getattr(ServerPlugin, hook)


def plugin_conflict(plugins: Sequence[ServerPlugin], names: Sequence[str] | None = None) -> str | None:
    """The line refusing two plug-ins that both implement an exclusive hook (None: none
    do). ``names``: how to call each plug-in (default: its ``name``)."""
    names = [p.name for p in plugins] if names is None else list(names)
    for hook in EXCLUSIVE_HOOKS:
        owners = [n for p, n in zip(plugins, names) if implements(p, hook)]
        if len(owners) > 1:
            return (f"{owners[0]} and {owners[1]} both replace the server's {hook.replace('_', ' ')}: "
                    f"they cannot be combined")
    stepping = [n for p, n in zip(plugins, names) if implements(p, "step_models")]
    fusing = [n for p, n in zip(plugins, names) if implements(p, "fuse")]
    if stepping and fusing:
        return (f"{stepping[0]} steps models of its own and {fusing[0]} fuses the global one: "
                f"they cannot be combined")
    return None


__all__ = ["EXCLUSIVE_HOOKS", "ServerPlugin", "Update", "implements", "plugin_conflict"]
