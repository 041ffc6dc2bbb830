"""A fast-polling SuperNode: Flower's own ``flower-supernode``, run in this process, with the
fixed sleeps of its fleet loop shortened to at most a poll interval.

Flower 1.42's SuperNode (:mod:`flwr.supernode.start_client_internal`) waits at fixed,
hard-coded intervals that no setting changes:

- an idle SuperNode asks the SuperLink for work every 3 s (``time.sleep(3)`` after a pull
  that brought nothing), so a message waits 1.5 s on average, and a synchronous server
  step waits for the last of its nodes, close to the full 3 s;
- after handing a message to its ClientApp, it looks for the reply every 0.5 s
  (``time.sleep(0.5)`` in ``_push_messages``), and for each of the reply's objects the same;
- when it pulls a message's objects from the SuperLink before the ServerApp has pushed them
  all (a node that asks often gets the message as soon as it is pushed), it backs off 1 s,
  then 2 s, up to 10 s (``pull_objects``' defaults ``PULL_INITIAL_BACKOFF``,
  ``PULL_BACKOFF_CAP``).

``fedgmr flower supernode [--poll-interval S] -- ARGS`` runs Flower's ``flower-supernode``
entry point (:func:`flwr.supernode.cli.flower_supernode`) with ``ARGS`` as its command line
in this process, after giving :mod:`flwr.supernode.start_client_internal` a ``time`` of its
own (:class:`CappedTime`) whose ``sleep`` waits at most ``S`` seconds (default
:data:`DEFAULT_POLL_INTERVAL`), and a ``pull_objects`` that backs off at most ``S`` seconds
(:func:`capped_backoff`). Everything else is Flower's: its argument parsing,
connection, authentication, retries, Runtime API, SuperExec and signals. Only that module's
names ``time`` and ``pull_objects`` are replaced (:func:`capped_sleeps`, undone on leaving
it); the ``time`` module, ``time.sleep``, Flower's ``pull_objects`` and Flower's files on disk
are untouched.

The price is the polls: each idle SuperNode asks the SuperLink for work every ``S`` seconds
instead of every 3 s (at 0.2 s, 5 requests a second per node), which a SuperLink serving
thousands of nodes would feel. The SuperNode's Runtime API is also polled by its SuperExec
(``fedgmr flower superexec``: every 0.2 s by default), unchanged here.

This relies on Flower 1.42 internals: that ``start_client_internal`` and ``_push_messages``
sleep through the module's global ``time``, and that ``_pull_and_store_message`` pulls
through its global ``pull_objects``. :func:`check_flower_internals` says clearly when an
installed Flower does not.
"""

from __future__ import annotations

import functools
import logging
import sys
import time as _time
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

#: the longest sleep of the SuperNode's loop, in seconds, unless told otherwise (the warm
#: SuperExec's task poll)
DEFAULT_POLL_INTERVAL = 0.2
MODULE = "flwr.supernode.start_client_internal"
#: the functions of MODULE whose ``time.sleep`` calls are the fixed waits
SLEEPERS = ("start_client_internal", "_push_messages")
#: the function of MODULE that pulls a message's objects through the global ``pull_objects``
PULLER = "_pull_and_store_message"


class CappedTime:
    """Stands in for the ``time`` module in one module's globals: ``sleep(s)`` sleeps
    ``min(s, cap)``; every other attribute is the real module's."""

    def __init__(self, cap: float, real: types.ModuleType = _time) -> None:
        if not cap > 0:
            raise ValueError(f"the poll interval must be positive, got {cap}")
        self.cap = float(cap)
        self._real = real

    def sleep(self, seconds: float) -> None:
        self._real.sleep(min(seconds, self.cap))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __repr__(self) -> str:
        return f"<time with sleep capped at {self.cap} s>"


def capped_backoff(pull: Callable[..., Any], cap: float) -> Callable[..., Any]:
    """``pull`` (Flower's ``pull_objects`` or ``pull_and_inflate_object_from_tree``) with
    its back-off after an object that is not there yet starting at ``min(its default, cap)``
    and never above ``cap`` (Flower's defaults: 1 s, doubling up to 10 s). Flower also
    gives up on an object after 500 tries (``PULL_MAX_TRIES_PER_OBJECT``), which at its
    back-off is over an hour but at 0.2 s would be under two minutes - too soon for an
    upload over a slow link - so the number of tries is left unbounded and Flower's time
    bound (``max_time``, ``PULL_MAX_TIME``: 2 h) alone ends the wait. Explicit arguments win."""
    defaults = pull.__kwdefaults__ or {}
    initial = min(float(defaults.get("initial_backoff", cap)), cap)
    bounds_tries = "max_tries_per_object" in defaults

    @functools.wraps(pull)
    def capped(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("initial_backoff", initial)
        kwargs.setdefault("backoff_cap", cap)
        if bounds_tries:
            kwargs.setdefault("max_tries_per_object", None)  # Flower's max_time bounds the wait
        return pull(*args, **kwargs)

    capped.__wrapped_pull__ = pull  # type: ignore[attr-defined]
    return capped


def _uses_time_sleep(code: types.CodeType) -> bool:
    """Whether ``code`` (or a function nested in it) looks up ``time`` and its ``sleep``."""
    return _uses(code, "time", "sleep")


def _uses(code: types.CodeType, *names: str) -> bool:
    """Whether ``code`` (or a function nested in it) looks up all of ``names``."""
    if all(n in code.co_names for n in names):
        return True
    return any(_uses(c, *names) for c in code.co_consts if isinstance(c, types.CodeType))


def check_flower_internals() -> types.ModuleType:
    """Return Flower's ``start_client_internal`` module; raise ``RuntimeError`` naming what
    is missing when the installed Flower does not sleep where the fast-polling SuperNode
    shortens the sleeps (Flower 1.42's internals)."""
    try:
        import flwr
        import flwr.supernode.start_client_internal as sic
        from flwr.supernode.cli import flower_supernode  # noqa: F401
    except ImportError as err:
        raise RuntimeError(f"the fast-polling SuperNode needs Flower 1.42's SuperNode internals ({err}); use "
                           "flower-supernode with this Flower") from err
    version = getattr(flwr, "__version__", "?")
    if not isinstance(sic.__dict__.get("time"), (types.ModuleType, CappedTime)):
        raise RuntimeError(f"Flower {version}'s {MODULE} has no module-level `time`: the fast-polling SuperNode "
                           "supports Flower 1.42; use flower-supernode with this Flower")
    for name in SLEEPERS:
        fn = getattr(sic, name, None)
        if fn is None or not hasattr(fn, "__code__") or not _uses_time_sleep(fn.__code__):
            what = "has no" if fn is None else "does not call time.sleep in"
            raise RuntimeError(f"Flower {version}'s {MODULE} {what} {name}: the fast-polling SuperNode supports "
                               "Flower 1.42; use flower-supernode with this Flower")
    puller = getattr(sic, PULLER, None)
    if (puller is None or not hasattr(puller, "__code__") or not _uses(puller.__code__, "pull_objects")
            or not callable(sic.__dict__.get("pull_objects"))):
        raise RuntimeError(f"Flower {version}'s {MODULE} does not pull a message's objects through pull_objects in "
                           f"{PULLER}: the fast-polling SuperNode supports Flower 1.42; use flower-supernode with "
                           "this Flower")
    return sic


@contextmanager
def capped_sleeps(cap: float = DEFAULT_POLL_INTERVAL, module: types.ModuleType | None = None) -> Iterator[CappedTime]:
    """Within the block, ``module`` (Flower's ``start_client_internal``) sleeps at most
    ``cap`` seconds at a time, and backs off at most ``cap`` seconds when it pulls a
    message's objects; its own ``time`` and ``pull_objects`` are put back on leaving, even
    on errors."""
    sic = module if module is not None else check_flower_internals()
    original_time, original_pull = sic.__dict__["time"], sic.__dict__["pull_objects"]
    capped = CappedTime(cap, original_time if isinstance(original_time, types.ModuleType) else _time)
    sic.time = capped
    sic.pull_objects = capped_backoff(getattr(original_pull, "__wrapped_pull__", original_pull), cap)
    try:
        yield capped
    finally:
        sic.time, sic.pull_objects = original_time, original_pull


def run_fast_supernode(argv: Sequence[str], poll_interval: float | None = None) -> None:
    """Run Flower's ``flower-supernode`` with ``argv`` as its arguments, its fixed sleeps
    capped at ``poll_interval`` (default :data:`DEFAULT_POLL_INTERVAL`). Blocks until the
    SuperNode stops; Flower ends it with ``sys.exit`` as the entry point would."""
    cap = DEFAULT_POLL_INTERVAL if poll_interval is None else poll_interval
    if not cap > 0:
        raise ValueError(f"--poll-interval must be positive, got {cap}")
    sic = check_flower_internals()
    from flwr.supernode.cli import flower_supernode

    from flwr.supercore import log

    saved = sys.argv
    sys.argv = ["flower-supernode", *argv]
    try:
        with capped_sleeps(cap, sic):
            log(logging.INFO, "fedgmr flower supernode: Flower %s's flower-supernode, its waits capped at %g s",
                getattr(sys.modules.get("flwr"), "__version__", "?"), cap)
            flower_supernode()
    finally:
        sys.argv = saved
