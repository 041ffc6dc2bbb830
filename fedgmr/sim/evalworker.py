"""Test evaluation off the training path: published models evaluated in a worker process.

A grid evaluation of an asynchronous run sees a new model at almost every grid point, and
evaluating the test split costs more than the training between two points. The
simulator hands each published model (a snapshot: aggregation replaces the global vector,
it never mutates it) to :class:`EvalWorker`, a forked child that holds the
evaluation model and the test split, and goes on training; the records wait, in order,
for their scores (:meth:`~fedgmr.sim.simulator.Simulator.run` returns, and a checkpoint
is taken, only once every record has its score).

The child runs the very evaluation function the simulator would have called, with the
same number of torch threads, on the same CPU: the scores are bit-identical to an
evaluation in the simulator's process. Several children (``FEDGMR_TEST_WORKER=N``) take
the snapshots in turn, each evaluating a snapshot whole, so N does not change a score.
Only on the CPU with the ``fork`` start method (the function and the test split reach the
child by ``fork``, not by pickling); the worker dies with its parent and ignores Ctrl-C
(the parent closes it).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
import traceback
import weakref
from typing import Any, Callable

import numpy as np
import torch

log = logging.getLogger(__name__)

#: ``evaluate(params, buffers) -> (accuracy, loss)`` of the test split
TestFn = Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[float, float]]


def available() -> bool:
    """Whether this platform can fork a worker (the evaluation function is not pickled)."""
    return "fork" in mp.get_all_start_methods()


def _pack(t: torch.Tensor) -> np.ndarray | torch.Tensor:
    """A tensor as it crosses the pipe: a numpy array (pickled by value), or the tensor
    itself for a dtype numpy lacks (torch's pickler moves it to shared memory)."""
    t = t.detach().to("cpu")
    try:
        return t.contiguous().numpy()
    except TypeError:  # e.g. bfloat16
        return t.clone()


def _unpack(a: np.ndarray | torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(a) if isinstance(a, np.ndarray) else a


def _serve(conn: Any, evaluate: TestFn, threads: int, parent_pid: int) -> None:
    """The child: a reader thread takes snapshots off the pipe as they come (so that the
    parent's send never waits for an evaluation), the main thread evaluates them in order."""
    from fedgmr.sim.executors import die_with_parent

    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    inbox: queue.Queue = queue.Queue()

    def read() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = None
            inbox.put(msg)
            if msg is None:
                return

    threading.Thread(target=read, name="fedgmr-eval-reader", daemon=True).start()
    while True:
        msg = inbox.get()
        if msg is None:
            break
        seq, flat, bufs = msg
        try:
            acc, loss = evaluate(_unpack(flat), {k: _unpack(v) for k, v in bufs.items()})
            reply = (seq, True, (float(acc), float(loss)))
        except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
            reply = (seq, False, traceback.format_exc())
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            break
    conn.close()


class EvalHandle:
    """One submitted evaluation: :meth:`done` without waiting, :meth:`result` waits."""

    def __init__(self, worker: "EvalWorker", seq: int) -> None:
        self.worker = worker
        self.seq = seq
        self._value: tuple[float, float] | None = None

    def done(self) -> bool:
        return self._value is not None or self.worker._done(self.seq)

    def result(self) -> tuple[float, float]:
        if self._value is None:
            self._value = self.worker._result(self.seq)
        return self._value


class EvalWorker:
    """Evaluates snapshots with ``evaluate`` in ``processes`` forked child processes, which
    take the snapshots in turn (each snapshot is evaluated whole by one of them, so its
    score does not depend on how many there are); scores come back in submission order.

    ``max_pending`` bounds the snapshots sent and not yet scored, per process (memory:
    one copy of the model each); :meth:`submit` waits for the oldest at the bound.
    """

    def __init__(self, evaluate: TestFn, threads: int = 1, max_pending: int = 4, processes: int = 1) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        ctx = mp.get_context("fork")
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        for i in range(processes):
            conn, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, evaluate, threads, os.getpid()),
                               name=f"fedgmr-test-eval-{i}", daemon=True)
            proc.start()
            child.close()
            self._conns.append(conn)
            self._procs.append(proc)
        self.max_pending = max_pending * processes
        self._sent = 0
        self._next_unreceived = 0  # collected in submission order (each process answers in order)
        self._scores: dict[int, tuple[float, float]] = {}
        self._closed = False
        self._finalizer = weakref.finalize(self, EvalWorker._shutdown, list(self._conns), list(self._procs))

    @property
    def pid(self) -> int | None:
        return self._procs[0].pid

    @property
    def pids(self) -> list[int | None]:
        return [p.pid for p in self._procs]

    def submit(self, params: torch.Tensor, buffers: dict[str, torch.Tensor]) -> EvalHandle:
        if self._closed:
            raise RuntimeError("the test evaluation worker is closed")
        while self._sent - self._next_unreceived >= self.max_pending:
            self._receive()
        seq = self._sent
        self._conns[seq % len(self._conns)].send((seq, _pack(params), {k: _pack(v) for k, v in buffers.items()}))
        self._sent += 1
        return EvalHandle(self, seq)

    def _receive(self) -> None:
        """Collect the score of the oldest snapshot not collected yet (waits for it)."""
        i = self._next_unreceived % len(self._conns)
        try:
            seq, ok, payload = self._conns[i].recv()
        except (EOFError, OSError):
            proc = self._procs[i]
            raise RuntimeError(f"the test evaluation worker (pid {proc.pid}) died "
                               f"(exit code {proc.exitcode})") from None
        if not ok:
            raise RuntimeError(f"test evaluation failed in the worker process:\n{payload}")
        assert seq == self._next_unreceived, (seq, self._next_unreceived)
        self._scores[seq] = payload
        self._next_unreceived = seq + 1

    def _done(self, seq: int) -> bool:
        while (seq not in self._scores and self._next_unreceived < self._sent
               and self._conns[self._next_unreceived % len(self._conns)].poll()):
            self._receive()
        return seq in self._scores

    def _result(self, seq: int) -> tuple[float, float]:
        while seq not in self._scores:
            self._receive()
        return self._scores.pop(seq)

    def close(self) -> None:
        """Stop the workers; evaluations not collected yet are abandoned."""
        self._closed = True
        if self._sent > self._next_unreceived:
            for proc in self._procs:
                if proc.is_alive():
                    proc.terminate()  # nobody waits for those scores
        self._finalizer()

    @staticmethod
    def _shutdown(conns: list[Any], procs: list[Any]) -> None:
        for conn in conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for conn, proc in zip(conns, procs):
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
            conn.close()


#: environment switch: ``1`` evaluates the test split in a worker process where the run
#: allows it (:func:`test_worker_for`), ``N`` in N worker processes that take the published
#: models in turn (for machines with cores to spare); unset or ``0``: in the simulator's process
ENV_SWITCH = "FEDGMR_TEST_WORKER"


def test_worker_for(cfg: Any, device: torch.device, evaluate: TestFn) -> EvalWorker | None:
    """A test worker for a run built from ``cfg``, when ``FEDGMR_TEST_WORKER`` is ``1`` (or
    ``N``: that many processes, at most 64) and the run allows it: on the CPU, with
    ``fork``, not inside a daemonic process, not on Ray (the driver's threads do not
    survive ``fork``), and not for FedMD, whose evaluation reads the clients' models from
    the simulator as it goes."""
    value = os.environ.get(ENV_SWITCH, "0").strip().lower()
    processes = 1 if value in ("true", "yes", "on") else min(int(value), 64) if value.isdigit() else 0
    if processes < 1:
        return None
    reason = None
    if torch.device(device).type != "cpu":
        reason = f"run.device is {device}"
    elif not available():
        reason = "this platform has no fork"
    elif mp.current_process().daemon:
        reason = "this is a daemonic process"
    elif cfg.run.executor == "ray":
        reason = "the ray executor"
    elif cfg.local.algorithm == "fedmd":
        reason = "FedMD evaluates the clients' models"
    if reason is not None:
        log.info("%s=%s ignored (%s): the test split is evaluated in the simulator's process", ENV_SWITCH, value,
                 reason)
        return None
    # the run's thread count, set when it was built
    return EvalWorker(evaluate, threads=torch.get_num_threads(), processes=processes)
