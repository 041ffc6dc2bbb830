"""Ctrl-C that cannot be lost.

Python turns SIGINT into a ``KeyboardInterrupt`` raised wherever the main thread happens to
be. When that is a finaliser (``__del__``, a weakref or garbage-collector callback), Python
prints "Exception ignored" and carries on: the run goes on as if nothing was pressed. The
latch remembers the signal, so the run's loop raises it again at its next check.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator


class InterruptLatch:
    """Remembers a SIGINT; :meth:`check` raises ``KeyboardInterrupt`` once one arrived."""

    def __init__(self) -> None:
        self.pending = False

    def handle(self, signum: int, frame: Any) -> None:
        self.pending = True
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.pending:
            raise KeyboardInterrupt


@contextmanager
def sigint_latch() -> Iterator[InterruptLatch]:
    """Install an :class:`InterruptLatch` for SIGINT while the block runs.

    Only from the main thread, and only over Python's default handler: a handler the caller
    installed, or SIGINT ignored (a background job), is left as it is (the latch then never
    fires)."""
    latch = InterruptLatch()
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield latch
        return
    previous = signal.signal(signal.SIGINT, latch.handle)
    try:
        yield latch
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM (``kill``, SLURM's ``scancel``) raises
    ``KeyboardInterrupt`` as Ctrl-C does, so the caller's Ctrl-C path (a sweep stopping its
    cells and recording them as pending) runs instead of the process dying at once. Main
    thread only; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["InterruptLatch", "sigint_latch", "sigterm_as_interrupt"]
