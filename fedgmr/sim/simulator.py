"""The virtual-clock simulator (SPEC 6).

An event queue drives every client through download -> train -> upload. Times come
from the network model and the encoded payload sizes, never from wall-clock time, so a
run is deterministic for a seed whichever executor trains the clients. The simulator
knows nothing about the algorithm: it asks the strategy what to send
(:meth:`~MaskedBufferedStrategy.assign`), hands it what comes back
(:meth:`~MaskedBufferedStrategy.receive`) and tells it when to aggregate.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np
import torch

from fedgmr.algorithm.encoding import encoded_nbytes
from fedgmr.algorithm.maskinfo import mask_count
from fedgmr.algorithm.params import ParamSpace
from fedgmr.sim.executor import Executor, JobHandle, JobResult, TrainJob, job_seed
from fedgmr.sim.network import Network
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy, mean_density
from fedgmr.strategy.messages import Reply

log = logging.getLogger(__name__)

Evaluator = Callable[[torch.Tensor, dict[str, torch.Tensor], str], tuple[float, float]]


@dataclass
class Coordination:
    """When the server aggregates and whom it dispatches (SPEC 6.4).

    mode: ``semi_async`` (aggregate after ``k`` arrivals or at a deadline) or ``sync``
        (wait for every dispatched client).
    trigger: ``k`` or ``deadline`` (semi-async only); the deadline is the expected
        arrival of the fastest in-flight client at the highest density, plus ``slack``.
    concurrency: clients training at once (None: all). Sync mode samples this many per round.
    server_time: seconds one aggregation takes before the new model is dispatched.
    ims: incremental model splitting with multicast of shared blocks.
    """

    mode: Literal["semi_async", "sync"] = "semi_async"
    trigger: Literal["k", "deadline"] = "k"
    k: int = 3
    slack: float = 0.5
    concurrency: int | None = None
    server_time: float = 0.5
    ims: bool = True


@dataclass
class ComputeModel:
    """Training time of one local round: a constant, or proportional to the sub-model's
    FLOPs (relative to the full model) divided by a per-client speed."""

    kind: Literal["constant", "flops"] = "constant"
    seconds: float = 0.5
    speeds: Sequence[float] | None = None
    flops_fraction: Callable[[torch.Tensor], float] | None = None

    def time(self, client: int, mask: torch.Tensor | None) -> float:
        if self.kind == "constant":
            return self.seconds
        frac = 1.0 if mask is None or self.flops_fraction is None else self.flops_fraction(mask)
        speed = 1.0 if self.speeds is None else float(self.speeds[client])
        return self.seconds * frac / speed


@dataclass
class _InFlight:
    client: int
    version: int
    handle: JobHandle
    up_bytes: float
    expected_arrival: float
    full: bool


@dataclass(order=True)
class _Event:
    time: float
    seq: int
    kind: str = field(compare=False)
    client: int = field(compare=False, default=-1)
    data: float = field(compare=False, default=0.0)


class Simulator:
    """Runs a strategy against simulated clients on a virtual clock.

    Parameters
    ----------
    strategy: the server strategy.
    space: the model's parameter layout (for payload sizes).
    executor: runs client training jobs.
    network: client and server links.
    coordination, compute: see :class:`Coordination` and :class:`ComputeModel`.
    evaluator: ``evaluator(params, buffers, split)`` -> (accuracy, loss) for split
        ``"test"`` or ``"val"``.
    seed: root seed (job seeds derive from it); ``sampling_rng`` picks clients.
    eval_every: evaluate on the test split every that many server steps.
    check_interval: evaluate on the validation split for GMR every that many steps.
    byte_scale: multiplies every payload size (replays a paper model size).
    client_validation: ask clients to score their local model (per-client monitors).
    on_record: called with each metrics record.
    """

    def __init__(self, strategy: MaskedBufferedStrategy, space: ParamSpace, executor: Executor,
                 network: Network, coordination: Coordination, compute: ComputeModel,
                 evaluator: Evaluator, seed: int, sampling_rng: np.random.Generator,
                 eval_every: int = 5, check_interval: int = 5, byte_scale: float = 1.0,
                 client_validation: bool = False, on_record: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.strategy = strategy
        self.space = space
        self.executor = executor
        self.network = network
        self.coord = coordination
        self.compute = compute
        self.evaluator = evaluator
        self.seed = seed
        self.rng = sampling_rng
        self.eval_every = eval_every
        self.check_interval = check_interval
        self.byte_scale = byte_scale
        self.client_validation = client_validation
        self.on_record = on_record or (lambda rec: None)
        n = strategy.num_clients
        if coordination.k < 1:
            raise ValueError("coordination k must be >= 1")
        self.concurrency = min(coordination.concurrency or n, n)
        self.now = 0.0
        self.events: list[_Event] = []
        self._seq = 0
        self.in_flight: dict[int, _InFlight] = {}
        self.results: dict[int, JobResult] = {}  # arrived, not yet handed to the strategy
        self.dispatches = [0] * n
        self.bytes_up = 0.0
        self.bytes_down = 0.0
        self.server_busy = False
        self.deadline_epoch = 0
        self.deadline_passed = False
        self.wave: set[int] = set()
        self.records = 0
        self.started = False
        self._last_eval_step = -1
        self.last_step_stats: dict[str, float] = {"staleness_mean": 0.0, "used": 0}

    # ------------------------------------------------------------------ helpers
    def _push(self, time: float, kind: str, client: int = -1, data: float = 0.0) -> None:
        self._seq += 1
        heapq.heappush(self.events, _Event(time, self._seq, kind, client, data))

    def _payload(self, kept: int) -> float:
        return self.strategy.policy.payload_nbytes(kept) * self.byte_scale

    @property
    def step(self) -> int:
        return self.strategy.version

    # ------------------------------------------------------------------ dispatch
    def _dispatch(self, clients: Sequence[int]) -> None:
        if not clients:
            return
        clients = sorted(clients)
        assignments = [self.strategy.assign(c) for c in clients]
        start = self.strategy.params  # replaced by each aggregation, never mutated: no copy
        buffers = self.strategy.buffers
        # payload blocks: with IMS, level blocks shared by the wave; else one per client
        blocks: list[list[int]] = []
        block_bytes: list[float] = []
        if self.coord.ims and self.strategy.policy.nested:
            incs = self.strategy.policy.increments()
            block_bytes = [self._payload(mask_count(b)) for b in incs]
            blocks = [list(range(a.level + 1)) for a in assignments]
        else:
            for a in assignments:
                blocks.append([len(block_bytes)])
                block_bytes.append(self._payload(mask_count(a.mask)))
        self.bytes_down += sum(block_bytes[b] for b in sorted({b for bl in blocks for b in bl}))
        finish = self.network.download_wave(self.now, clients, blocks, block_bytes)
        top = max(a.density for a in assignments)
        for a in assignments:
            c = a.client_id
            full_mask = mask_count(a.mask) == a.mask.numel()
            job = TrainJob(c, a.version, job_seed(self.seed, c, self.dispatches[c]), start, buffers,
                           None if full_mask else a.mask, a.consumes, self.client_validation)
            self.dispatches[c] += 1
            handle = self.executor.submit(job)
            up_bytes = self._payload(mask_count(a.mask))
            train_done = finish[c] + self.compute.time(c, None if full_mask else a.mask)
            expected = train_done + up_bytes / self.network.up[c]
            self.in_flight[c] = _InFlight(c, a.version, handle, up_bytes, expected, a.density >= top)
            self._push(train_done, "upload", c)
        if self.coord.mode == "semi_async" and self.coord.trigger == "deadline":
            self._arm_deadline()

    def _arm_deadline(self) -> None:
        if not self.in_flight:
            return
        top = max(self.strategy.ladder.ladder[self.strategy.ladder.levels[c]] for c in self.in_flight)
        cands = [f.expected_arrival for c, f in self.in_flight.items()
                 if self.strategy.ladder.ladder[self.strategy.ladder.levels[c]] >= top] or \
                [f.expected_arrival for f in self.in_flight.values()]
        self.deadline_epoch += 1
        self.deadline_passed = False
        self._push(min(cands) + self.coord.slack, "deadline", data=self.deadline_epoch)

    def _idle_clients(self) -> list[int]:
        busy = set(self.in_flight) | set(self.strategy.arrivals)
        return [c for c in range(self.strategy.num_clients) if c not in busy]

    def _refill(self) -> None:
        """Dispatch idle clients up to the concurrency limit (semi-async)."""
        idle = self._idle_clients()
        need = self.concurrency - len(self.in_flight)
        if need <= 0 or not idle:
            return
        if need >= len(idle):
            chosen = idle
        else:
            chosen = sorted(self.rng.choice(idle, size=need, replace=False).tolist())
        self._dispatch(chosen)

    def _new_wave(self) -> None:
        """Sync mode: sample the next round's clients and dispatch them."""
        n = self.strategy.num_clients
        if self.concurrency >= n:
            chosen = list(range(n))
        else:
            chosen = sorted(self.rng.choice(n, size=self.concurrency, replace=False).tolist())
        self.wave = set(chosen)
        self._dispatch(chosen)

    # ------------------------------------------------------------------ events
    def _on_upload(self, c: int) -> None:
        f = self.in_flight[c]
        seconds = self.network.upload_time(c, f.up_bytes)
        self._push(self.network.upload(self.now, seconds, f.up_bytes), "arrival", c)

    def _on_arrival(self, c: int) -> None:
        f = self.in_flight.pop(c)
        res = f.handle.result()
        self.bytes_up += f.up_bytes
        reply = Reply(c, res.version, res.values, res.num_samples, res.buffers,
                      self.strategy.rule.consumes, None, res.loss, res.val_score)
        accepted = self.strategy.receive(reply)
        if accepted and res.val_score is not None:
            self.strategy.on_client_validation(c, res.val_score)
        if self.coord.mode == "sync":
            self.wave.discard(c)

    def _should_aggregate(self) -> bool:
        if self.server_busy:
            return False
        n_new = len(self.strategy.arrivals)
        if self.coord.mode == "sync":
            return not self.wave and not self.in_flight
        if n_new == 0:
            return False
        if self.coord.trigger == "deadline":
            return self.deadline_passed or n_new >= self.concurrency
        return n_new >= min(self.coord.k, self.concurrency)

    def _aggregate(self) -> None:
        report = self.strategy.aggregate()
        self.server_busy = True
        self.deadline_passed = False
        self._push(self.now + self.coord.server_time, "server_free")
        self.last_step_stats = {
            "staleness_mean": sum(report.staleness) / len(report.staleness) if report.staleness else 0.0,
            "used": len(report.used),
        }

    def _on_server_free(self) -> None:
        self.server_busy = False
        self.now_step_done()
        if self.coord.mode == "sync":
            self._new_wave()
        else:
            self._refill()

    def now_step_done(self) -> None:
        """After a server step: restoration hooks and evaluation at the current time."""
        step = self.step
        val_score = None
        moved: list[int] = []
        if self.strategy.trigger.needs_validation and step % self.check_interval == 0:
            val_score, _ = self.evaluator(self.strategy.params, self.strategy.buffers, "val")
            moved += self.strategy.on_validation(val_score)
        moved += self.strategy.on_time(self.now)
        if step % self.eval_every == 0:
            self._evaluate(val_score, moved)
        elif moved:
            log.info("step %d: restored clients %s", step, moved)

    def _evaluate(self, val_score: float | None = None, moved: Sequence[int] = ()) -> dict[str, Any]:
        acc, loss = self.evaluator(self.strategy.params, self.strategy.buffers, "test")
        dens = self.strategy.densities()
        rec = {
            "time": self.now, "step": self.step, "accuracy": acc, "loss": loss,
            "avg_density": mean_density(dens), "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
            "densities": dens, "val_accuracy": val_score, "restored": list(moved),
            "restorations": self.strategy.ladder.restorations,
            "staleness_mean": self.last_step_stats["staleness_mean"],
            "min_coverage": self.strategy.min_coverage(),
            "rejected": self.strategy.rejected,
        }
        self.records += 1
        self._last_eval_step = self.step
        self.on_record(rec)
        return rec

    # ------------------------------------------------------------------ main loop
    def start(self) -> None:
        """Evaluate the initial model and dispatch the first clients."""
        self.started = True
        self._evaluate()
        if self.coord.mode == "sync":
            self._new_wave()
        else:
            self._refill()

    def run(self, max_steps: int | None = None, max_time: float | None = None,
            should_stop: Callable[[], bool] | None = None,
            on_step: Callable[["Simulator"], None] | None = None) -> None:
        """Advance until ``max_steps`` server steps or virtual time ``max_time``.

        ``on_step`` is called after every server step (progress, checkpoints).
        """
        if max_steps is None and max_time is None:
            raise ValueError("give max_steps or max_time")
        if not self.started:
            self.start()

        def done() -> bool:
            return ((max_steps is not None and self.step >= max_steps and not self.server_busy)
                    or (max_time is not None and self.now >= max_time))

        while True:
            if self._should_aggregate() and (max_steps is None or self.step < max_steps):
                self._aggregate()
            if done() or (should_stop and should_stop()):
                break
            if not self.events:
                log.warning("no more events: every client is idle")
                break
            ev = heapq.heappop(self.events)
            if max_time is not None and ev.time > max_time:
                heapq.heappush(self.events, ev)
                self.now = max_time
                break
            self.now = ev.time
            if ev.kind == "upload":
                self._on_upload(ev.client)
            elif ev.kind == "arrival":
                self._on_arrival(ev.client)
            elif ev.kind == "deadline":
                if int(ev.data) == self.deadline_epoch:
                    self.deadline_passed = True
            elif ev.kind == "server_free":
                self._on_server_free()
                if on_step:
                    on_step(self)

    def finish(self) -> dict[str, Any] | None:
        """Evaluate the final model unless the last step was just evaluated."""
        if self._last_eval_step != self.step:
            return self._evaluate()
        return None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Everything except the strategy, executor and evaluator (saved separately).
        In-flight jobs are awaited, so their results are part of the state."""
        tensors: dict[str, torch.Tensor] = {}
        flights = []
        for c, f in sorted(self.in_flight.items()):
            r = f.handle.result()
            tensors[f"flight/{c}/values"] = r.values
            tensors.update({f"flight/{c}/buf/{k}": v for k, v in r.buffers.items()})
            flights.append({"client": c, "version": f.version, "up_bytes": f.up_bytes,
                            "expected": f.expected_arrival, "full": f.full, "num_samples": r.num_samples,
                            "loss": r.loss, "val_score": r.val_score})
        state = {
            "now": self.now, "seq": self._seq, "events": [[e.time, e.seq, e.kind, e.client, e.data] for e in self.events],
            "flights": flights, "dispatches": self.dispatches, "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down, "server_busy": self.server_busy, "deadline_epoch": self.deadline_epoch,
            "deadline_passed": self.deadline_passed, "wave": sorted(self.wave), "records": self.records,
            "started": self.started, "last_eval_step": self._last_eval_step, "last_step_stats": self.last_step_stats,
            "network": self.network.state_dict(), "rng": self.rng.bit_generator.state,
        }
        return state, tensors

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        from fedgmr.sim.executor import DoneHandle

        self.now = float(state["now"])
        self._seq = int(state["seq"])
        self.events = [_Event(float(t), int(s), k, int(c), float(d)) for t, s, k, c, d in state["events"]]
        heapq.heapify(self.events)
        self.in_flight = {}
        buf_names = list(self.strategy.buffers)
        for f in state["flights"]:
            c = int(f["client"])
            res = JobResult(c, int(f["version"]), tensors[f"flight/{c}/values"].clone(),
                            {k: tensors[f"flight/{c}/buf/{k}"].clone() for k in buf_names},
                            int(f["num_samples"]), float(f["loss"]),
                            None if f["val_score"] is None else float(f["val_score"]))
            self.in_flight[c] = _InFlight(c, int(f["version"]), DoneHandle(res), float(f["up_bytes"]),
                                          float(f["expected"]), bool(f["full"]))
        self.dispatches = [int(v) for v in state["dispatches"]]
        self.bytes_up = float(state["bytes_up"])
        self.bytes_down = float(state["bytes_down"])
        self.server_busy = bool(state["server_busy"])
        self.deadline_epoch = int(state["deadline_epoch"])
        self.deadline_passed = bool(state["deadline_passed"])
        self.wave = set(int(c) for c in state["wave"])
        self.records = int(state["records"])
        self.started = bool(state["started"])
        self._last_eval_step = int(state["last_eval_step"])
        self.last_step_stats = dict(state["last_step_stats"])
        self.network.load_state_dict(state["network"])
        self.rng.bit_generator.state = state["rng"]
