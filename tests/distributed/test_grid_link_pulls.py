"""GridLink never lets one slow reply block the server loop (issue 43's FedAsync stall):
Flower's ``pull_messages`` waits while a reply's objects are still uploading, so each
awaited instruction is pulled on its own thread and ``pull`` returns what has finished."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install 'fedgmr[flower]'")

from fedgmr.flower.adapter import Arrived, GridLink  # noqa: E402


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Uploads:
    """``pull_now`` as Flower's: an instruction in ``slow`` blocks until its upload is
    released; the others' replies are there at once; ``calls`` counts pulls per id."""

    def __init__(self, slow: set[str]) -> None:
        self.released = {i: threading.Event() for i in slow}
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, ids: list[str]) -> list[Arrived]:
        (i,) = ids  # pulled one instruction at a time
        with self.lock:
            self.calls[i] = self.calls.get(i, 0) + 1
        if i in self.released:
            assert self.released[i].wait(60), "the test never released the slow upload"
        return [Arrived(i, int(i[-1]), {"i": i}, None, 1)]


def _poll(link: GridLink, ids: list[str], want: set[str], clock: _Clock) -> set[str]:
    """Pull until the replies in ``want`` have come (polling, generous deadline)."""
    got: set[str] = set()
    deadline = time.monotonic() + 60
    while not want <= got:
        assert time.monotonic() < deadline, f"replies {want - got} never came"
        clock.t += 1.0  # every id may be pulled again
        got |= {a.instruction_id for a in link.pull([i for i in ids if i not in got])}
        time.sleep(0.005)
    return got


def test_a_slow_upload_does_not_hold_back_the_other_replies():
    clock = _Clock()
    link = GridLink(grid=None, pull_workers=4, clock=clock)
    uploads = _Uploads(slow={"m0"})
    link.pull_now = uploads  # type: ignore[method-assign]
    try:
        got = _poll(link, ["m0", "m1", "m2"], {"m1", "m2"}, clock)
        assert got == {"m1", "m2"} and "m0" in link._pulls  # still uploading, still awaited
        uploads.released["m0"].set()
        assert _poll(link, ["m0"], {"m0"}, clock) == {"m0"}
        assert uploads.calls == {"m0": 1, "m1": 1, "m2": 1}  # one pull each: none repeated while it ran
        assert link._started == {}  # answered instructions are forgotten
    finally:
        link.close()


def test_an_empty_pull_is_repeated_at_most_every_repoll_seconds():
    clock = _Clock()
    link = GridLink(grid=None, pull_workers=2, repoll=0.25, clock=clock)
    calls: list[str] = []
    link.pull_now = lambda ids: calls.extend(ids) or []  # type: ignore[method-assign]
    try:
        for step in range(40):  # 40 polls 0.05 s apart: 2 s of loop time
            clock.t = 0.05 * step
            link.pull(["m7"])
            deadline = time.monotonic() + 30
            while not all(f.done() for f in link._pulls.values()) and time.monotonic() < deadline:  # let it finish
                time.sleep(0.001)
        assert 7 <= len(calls) <= 9  # about every 0.25 s, not at each of the 40 polls
    finally:
        link.close()


def test_a_pull_error_reaches_the_caller_and_workers_0_pulls_in_place():
    clock = _Clock()
    link = GridLink(grid=None, pull_workers=2, clock=clock)

    def broken(ids):
        raise RuntimeError("SuperLink gone")

    link.pull_now = broken  # type: ignore[method-assign]
    try:
        link.pull(["m1"])
        with pytest.raises(RuntimeError, match="SuperLink gone"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                link.pull([])
                time.sleep(0.005)
    finally:
        link.close()
    inline = GridLink(grid=None, pull_workers=0)
    inline.pull_now = lambda ids: [Arrived(i, 0, {}, None, 0) for i in ids]  # type: ignore[method-assign]
    assert [a.instruction_id for a in inline.pull(["a", "", "b"])] == ["a", "b"]
