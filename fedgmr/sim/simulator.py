"""The virtual-clock simulator (docs/reference.md §6).

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
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np
import torch

from fedgmr.algorithm.encoding import payload_nbytes
from fedgmr.algorithm.maskinfo import mask_count
from fedgmr.algorithm.params import ParamSpace
from fedgmr.sim.executor import Executor, JobHandle, JobResult, TrainJob, job_seed
from fedgmr.sim.network import Network
from fedgmr.strategy.coordination import (Coordination, Decision, StepTrigger, after_step, base_record, eval_due,
                                          step_stats)
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.messages import Reply
from fedgmr.strategy.wire import download_wave, upload_bytes

log = logging.getLogger(__name__)

Evaluator = Callable[[torch.Tensor, dict[str, torch.Tensor], str], tuple[float, float]]


@dataclass
class ComputeModel:
    """Training time of one local round: a constant, or proportional to the sub-model's
    FLOPs (relative to the full model) divided by a per-client speed. ``client_work``:
    each client's job FLOPs relative to the full model, where a client method trains
    more than the global model (FedMRL: G, F_i and P_i); it replaces the mask's fraction."""

    kind: Literal["constant", "flops"] = "constant"
    seconds: float = 0.5
    speeds: Sequence[float] | None = None
    flops_fraction: Callable[[torch.Tensor], float] | None = None
    client_work: Sequence[float] | None = None

    def time(self, client: int, mask: torch.Tensor | None) -> float:
        if self.kind == "constant":
            return self.seconds
        if self.client_work is not None:
            frac = float(self.client_work[client])
        else:
            frac = 1.0 if mask is None or self.flops_fraction is None else self.flops_fraction(mask)
        speed = 1.0 if self.speeds is None else float(self.speeds[client])
        return self.seconds * frac / speed


@dataclass
class _InFlight:
    client: int
    version: int
    handle: JobHandle
    up_bytes: float
    density: float


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
    eval_interval: evaluate on the test split on a virtual-time grid, every that many
        seconds (docs/reference.md §9.1): the model evaluated at grid time ``t`` is the newest one whose
        aggregation finished by ``t``; a model already evaluated is not evaluated again.
    eval_every: instead, evaluate every that many server steps (the authors' cadence);
        used only when ``eval_interval`` is None.
    check_interval: evaluate on the validation split for GMR every that many steps.
    byte_scale: multiplies every payload size (replays a paper model size).
    client_validation: ask clients to score their local model (per-client monitors).
    on_record: called with each metrics record.
    diagnostics: ``diagnostics(index, version, params, buffers)`` -> extra record keys for
        the ``index``-th test evaluation (per-level and per-client accuracy, at their own
        cadence; see :class:`fedgmr.experiment.diagnostics.Diagnostics`).
    eval_from: on the time grid, no test evaluation (and no record) at grid points before
        this virtual time. Evaluation never changes training, so every record from then on
        is the one a run evaluating the whole grid writes.
    """

    def __init__(self, strategy: MaskedBufferedStrategy, space: ParamSpace, executor: Executor,
                 network: Network, coordination: Coordination, compute: ComputeModel,
                 evaluator: Evaluator, seed: int, sampling_rng: np.random.Generator,
                 eval_every: int | None = 5, check_interval: int = 5, byte_scale: float = 1.0,
                 client_validation: bool = False, on_record: Callable[[dict[str, Any]], None] | None = None,
                 eval_interval: float | None = None,
                 diagnostics: Callable[[int, int, torch.Tensor, dict[str, torch.Tensor]], dict[str, Any]] | None = None,
                 eval_from: float = 0.0) -> None:
        self.strategy = strategy
        self.diagnostics = diagnostics
        self.space = space
        self.executor = executor
        self.network = network
        self.coord = coordination
        self.compute = compute
        self.evaluator = evaluator
        self.seed = seed
        self.rng = sampling_rng
        if eval_interval is None and eval_every is None:
            raise ValueError("give eval_interval (virtual seconds) or eval_every (server steps)")
        if eval_interval is not None and not eval_interval > 0:
            raise ValueError(f"eval_interval must be > 0, got {eval_interval}")
        self.eval_interval = eval_interval
        self.eval_from = eval_from
        self.eval_every = eval_every
        self.check_interval = check_interval
        self.byte_scale = byte_scale
        self.client_validation = client_validation
        self.on_record = on_record or (lambda rec: None)
        n = strategy.num_clients
        #: when the server steps (the coordination core, shared with the Flower runtime)
        self.trigger = StepTrigger(coordination, n)
        self.concurrency = self.trigger.active
        self.now = 0.0
        self.events: list[_Event] = []
        self._seq = 0
        self.in_flight: dict[int, _InFlight] = {}
        self.results: dict[int, JobResult] = {}  # arrived, not yet handed to the strategy
        self.dispatches = [0] * n
        self.bytes_up = 0.0
        self.bytes_down = 0.0
        self.uploads = 0  # replies that reached the server
        self.client_uploads = [0] * n  # the same, per client
        self.downloads = 0  # sub-models sent to clients
        self.server_busy = False
        self.wave: set[int] = set()
        self.records = 0
        self.started = False
        self.rejected_streak = 0  # client replies rejected since the last accepted one
        #: what each client keeps between its jobs (SCAFFOLD's c_i, Ditto's v, FedBN's
        #: BatchNorm): opaque tensors the client method defines, updated when a reply
        #: arrives, handed to the client's next job, saved in checkpoints
        self.client_states: dict[int, dict[str, torch.Tensor]] = {}
        self.client_state_epoch = 0  # bumped whenever some client's state changes
        self.stalled = False  # the last run() ended with no event left: every client idle
        self._last_eval_step = -1
        self.last_step_stats: dict[str, float] = {"staleness_mean": 0.0, "used": 0}
        # the newest model whose aggregation has finished (what a grid evaluation sees)
        self._published: tuple[int, torch.Tensor, dict[str, torch.Tensor]] = (0, strategy.params, {})
        self._publish()
        self._eval_cache: tuple[int, float, float] | None = None  # (version, accuracy, loss)
        #: evaluates the published models on the test split in another process while the
        #: simulation goes on (:class:`~fedgmr.sim.evalworker.EvalWorker`); None: here
        self.test_worker: Any = None
        self._eval_handle: tuple[int, Any] | None = None  # (version, handle) of the newest submitted
        self._unscored: deque[tuple[dict[str, Any], Any]] = deque()  # records waiting, in order
        self.next_grid = 0.0 if eval_interval is not None else math.inf
        self._grid_index = 0
        self._since_record: dict[str, Any] = {"restored": [], "val": None}

    # ------------------------------------------------------------------ helpers
    def _push(self, time: float, kind: str, client: int = -1, data: float = 0.0) -> None:
        if time < self.now:  # the clock never runs backwards (a bug, not a user error)
            raise RuntimeError(f"{kind} event scheduled at t={time!r}, before the current time {self.now!r}")
        self._seq += 1
        heapq.heappush(self.events, _Event(time, self._seq, kind, client, data))

    def _payload(self, kept: int, mask: torch.Tensor | None = None) -> float:
        """Bytes of a payload of ``kept`` values, carrying ``mask``'s code when given
        (docs/reference.md §6.1: values only upstream; the mask downstream only when it changed)."""
        code = 0 if mask is None else self.strategy.policy.code_nbytes(mask)
        return payload_nbytes(kept, code) * self.byte_scale

    @property
    def step(self) -> int:
        return self.strategy.version

    @property
    def published_version(self) -> int:
        """The version of the model grid evaluations see (the newest finished aggregation)."""
        return self._published[0]

    # ------------------------------------------------------------------ dispatch
    def _dispatch(self, clients: Sequence[int]) -> None:
        if not clients:
            return
        clients = sorted(clients)
        assignments = [self.strategy.assign(c) for c in clients]
        start = self.strategy.params  # replaced by each aggregation, never mutated: no copy
        buffers = self.strategy.buffers
        # with IMS, level blocks shared by the wave; else one payload per client (fedgmr.strategy.wire)
        policy = self.strategy.policy
        shared_levels = policy.increments if self.coord.ims and policy.nested else None
        wave = download_wave(assignments, self._payload, shared_levels)
        self.bytes_down += wave.total
        self.downloads += len(assignments)
        finish = self.network.download_wave(self.now, clients, wave.blocks, wave.block_bytes)
        for a in assignments:
            c = a.client_id
            full_mask = mask_count(a.mask) == a.mask.numel()
            models = a.wire.models or ((start, buffers),)  # none sent: the job starts from the global model
            job = TrainJob(c, a.version, job_seed(self.seed, c, self.dispatches[c]), models[0][0], models[0][1],
                           None if full_mask else a.mask, kind=a.consumes, validate=self.client_validation,
                           upload_mask=a.wire.reply_coords, extras=a.wire.vectors,
                           state=self.client_states.get(c, {}), alternatives=tuple(models[1:]))
            self.dispatches[c] += 1
            handle = self.executor.submit(job)
            train_done = finish[c] + self.compute.time(c, None if full_mask else a.mask)
            self.in_flight[c] = _InFlight(c, a.version, handle, upload_bytes(a, self._payload), a.density)
            self._push(train_done, "upload", c)

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
        self.uploads += 1
        self.client_uploads[c] += 1
        reply = Reply(c, res.version, res.values, res.num_samples, res.buffers,
                      self.strategy.rule.consumes, None, res.loss, res.val_score, res.num_processed, dict(res.extras))
        if res.state is not None:  # the client's own: kept whether or not the server accepts the reply
            self.client_states[c] = res.state
            self.client_state_epoch += 1
        accepted = self.strategy.receive(reply)
        self.rejected_streak = 0 if accepted else self.rejected_streak + 1
        if accepted:  # the deadline trigger (a rejected reply is no arrival); the event only wakes the loop
            at = self.trigger.on_reply(f.density, (g.density for g in self.in_flight.values()), self.now)
            if at is not None:
                self._push(at, "deadline")
        if accepted and res.val_score is not None:
            self.strategy.on_client_validation(c, res.val_score)
        if self.coord.mode == "sync":
            self.wave.discard(c)

    def _should_aggregate(self) -> bool:
        if self.server_busy:
            return False
        # a synchronous round with nothing to aggregate closes with an empty step: time moves on
        decision = self.trigger.decide(len(self.strategy.arrivals), bool(self.wave or self.in_flight), self.now)
        return decision is not Decision.WAIT

    def _aggregate(self) -> None:
        report = self.strategy.aggregate()
        self.server_busy = True
        self.trigger.stepped()  # a deadline armed before this aggregation is void
        self._push(self.now + self.coord.server_time + report.server_seconds, "server_free")
        self.last_step_stats = step_stats(report.staleness, report.used)

    def _on_server_free(self) -> None:
        self.server_busy = False
        self._publish()
        self.now_step_done()
        if self.coord.mode == "sync":
            self._new_wave()
        else:
            self._refill()

    def now_step_done(self) -> None:
        """After a server step: restoration hooks and evaluation at the current time."""
        step = self.step
        val_score, moved = after_step(self.strategy, self.now, self.check_interval,
                                      lambda: self.evaluator(self.strategy.params, self.strategy.buffers, "val")[0])
        if moved:
            log.info("step %d: restored clients %s", step, moved)
        if self.eval_interval is None:
            if eval_due(step, self.eval_every):
                self._evaluate(val_score, moved)
        else:
            self._since_record["restored"] += moved
            if val_score is not None:
                self._since_record["val"] = val_score

    def _publish(self) -> None:
        """The strategy's current model becomes the one grid evaluations see (with the
        clients' states of that moment: FedMD's accuracy is its client models')."""
        self._published = (self.strategy.version, self.strategy.params, self.strategy.buffers)
        self.published_states = dict(self.client_states)

    def _test_score(self) -> tuple[float, float]:
        """Accuracy and loss of the published model, evaluated once per model version."""
        version, params, buffers = self._published
        if self._eval_cache is None or self._eval_cache[0] != version:
            acc, loss = self.evaluator(params, buffers, "test")
            self._eval_cache = (version, acc, loss)
        return self._eval_cache[1], self._eval_cache[2]

    def _test_handle(self) -> Any:
        """The test score of the published model, or with a test worker a handle to it
        (one evaluation per model version either way)."""
        version, params, buffers = self._published
        if self.test_worker is None or (self._eval_cache is not None and self._eval_cache[0] == version):
            return None
        if self._eval_handle is None or self._eval_handle[0] != version:
            self._eval_handle = (version, self.test_worker.submit(params, buffers))
        return self._eval_handle[1]

    def _emit_scored(self, wait: bool) -> None:
        """Hand the records whose test score has come back to ``on_record``, in order
        (``wait``: all of them, waiting for the worker)."""
        while self._unscored:
            rec, handle = self._unscored[0]
            if handle is not None:
                if not wait and not handle.done():
                    return
                rec["accuracy"], rec["loss"] = handle.result()
                if self._eval_handle is not None and self._eval_handle[1] is handle:
                    self._eval_cache = (self._eval_handle[0], rec["accuracy"], rec["loss"])
                    self._eval_handle = None
            self._unscored.popleft()
            self.on_record(rec)

    def flush_records(self) -> None:
        """Wait for the test scores still being computed and hand their records out."""
        self._emit_scored(wait=True)

    def close_test_worker(self) -> None:
        """Hand out the pending records and stop the test worker (evaluation goes on here)."""
        if self.test_worker is not None:
            try:
                self.flush_records()
            finally:
                self.test_worker.close()
                self.test_worker = None
                self._eval_handle = None

    def _evaluate(self, val_score: float | None = None, moved: Sequence[int] = (),
                  at: float | None = None) -> dict[str, Any]:
        if self.eval_interval is None:  # step cadence: the model just aggregated, now
            self._publish()
        handle = self._test_handle()
        acc, loss = (None, None) if handle is not None else self._test_score()
        rec = base_record(self.strategy, time=self.now if at is None else at, step=self._published[0], accuracy=acc,
                          loss=loss, bytes_up=self.bytes_up, bytes_down=self.bytes_down, uploads=self.uploads,
                          downloads=self.downloads, client_uploads=self.client_uploads, val_score=val_score,
                          moved=moved, stats=self.last_step_stats)
        rec.update(self.strategy.record_keys(self._published[0]))  # e.g. cluster assignments
        if self.diagnostics is not None:
            rec.update(self.diagnostics(self.records, *self._published))
        self.records += 1
        self._last_eval_step = self._published[0]
        if handle is None and not self._unscored:
            self.on_record(rec)
        else:  # after the records still waiting for their scores
            self._unscored.append((rec, handle))
            self._emit_scored(wait=False)
        return rec

    def _evaluate_grid(self, until: float, inclusive: bool) -> None:
        """Evaluate every grid point before ``until`` (or at it, when ``inclusive``)."""
        while self.next_grid < until or (inclusive and self.next_grid <= until):
            since = self._since_record
            if self.next_grid >= self.eval_from:
                self._evaluate(since["val"], since["restored"], at=self.next_grid)
            self._since_record = {"restored": [], "val": None}
            self._grid_index += 1
            assert self.eval_interval is not None
            self.next_grid = self._grid_index * self.eval_interval

    # ------------------------------------------------------------------ main loop
    def start(self) -> None:
        """Evaluate the initial model and dispatch the first clients."""
        self.started = True
        if self.eval_interval is None:
            self._evaluate()
        else:
            self._evaluate_grid(self.now, inclusive=True)
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
        self.stalled = False

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
                self.stalled = True
                break
            ev = heapq.heappop(self.events)
            if max_time is not None and ev.time > max_time:
                heapq.heappush(self.events, ev)
                self._evaluate_grid(max_time, inclusive=True)
                self.now = max_time
                break
            self._evaluate_grid(ev.time, inclusive=False)  # events at a grid time come first
            self.now = ev.time
            if ev.kind == "upload":
                self._on_upload(ev.client)
            elif ev.kind == "arrival":
                self._on_arrival(ev.client)
            elif ev.kind == "deadline":
                pass  # the trigger reads the clock: the event only wakes the loop at its time
            elif ev.kind == "server_free":
                self._on_server_free()
                if on_step:
                    on_step(self)
        self.flush_records()  # every record of the run so far is out when it returns

    def finish(self) -> dict[str, Any] | None:
        """Evaluate the final model unless it was just evaluated (on the time grid: the
        grid points up to now, then the newest model at now if none of them saw it)."""
        if self.eval_interval is not None:
            self._evaluate_grid(self.now, inclusive=True)
            rec = self._evaluate(at=self.now) if self._last_eval_step != self._published[0] else None
        else:
            rec = self._evaluate() if self._last_eval_step != self.step else None
        self.close_test_worker()  # the last records are out; later evaluations run here
        return rec

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Everything except the strategy, executor and evaluator (saved separately).
        In-flight jobs are awaited, so their results are part of the state, and so are
        the test scores of the records written so far (they reach ``on_record`` first)."""
        self.flush_records()
        tensors: dict[str, torch.Tensor] = {}
        flights = []
        for c, f in sorted(self.in_flight.items()):
            r = f.handle.result()
            tensors[f"flight/{c}/values"] = r.values
            tensors.update({f"flight/{c}/buf/{k}": v for k, v in r.buffers.items()})
            tensors.update({f"flight/{c}/extra/{k}": v for k, v in r.extras.items()})
            if r.state is not None:
                tensors.update({f"flight/{c}/state/{k}": v for k, v in r.state.items()})
            flights.append({"client": c, "version": f.version, "up_bytes": f.up_bytes, "density": f.density,
                            "num_samples": r.num_samples, "num_processed": r.num_processed,
                            "loss": r.loss, "val_score": r.val_score, "buffers": sorted(r.buffers),
                            "extras": sorted(r.extras), "state": None if r.state is None else sorted(r.state)})
        for c, st in sorted(self.client_states.items()):
            tensors.update({f"client/{c}/{k}": v for k, v in st.items()})
        state = {
            "now": self.now, "seq": self._seq, "events": [[e.time, e.seq, e.kind, e.client, e.data] for e in self.events],
            "flights": flights, "dispatches": self.dispatches, "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down, "uploads": self.uploads, "downloads": self.downloads,
            "client_uploads": list(self.client_uploads), "server_busy": self.server_busy, "trigger": self.trigger.state_dict(),
            "next_grid": self.next_grid if math.isfinite(self.next_grid) else None, "grid_index": self._grid_index,
            "since_record": self._since_record, "wave": sorted(self.wave), "records": self.records,
            "started": self.started, "last_eval_step": self._last_eval_step, "last_step_stats": self.last_step_stats,
            "rejected_streak": self.rejected_streak,
            "client_states": {str(c): sorted(st) for c, st in sorted(self.client_states.items())},
            "client_state_epoch": self.client_state_epoch,
            "network": self.network.state_dict(), "rng": self.rng.bit_generator.state,
            "published_version": self._published[0],
        }
        version, params, buffers = self._published
        if version != self.strategy.version:  # the server is still aggregating (a run's end at max_time)
            tensors["published/params"] = params
            tensors.update({f"published/buf/{k}": v for k, v in buffers.items()})
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
            names = f.get("buffers", buf_names)  # a reply may leave buffers out (FedBN)
            state_names = f.get("state")
            res = JobResult(c, int(f["version"]), tensors[f"flight/{c}/values"].clone(),
                            {k: tensors[f"flight/{c}/buf/{k}"].clone() for k in names},
                            int(f["num_samples"]), float(f["loss"]),
                            None if f["val_score"] is None else float(f["val_score"]),
                            None if f["num_processed"] is None else int(f["num_processed"]),
                            None if state_names is None else {k: tensors[f"flight/{c}/state/{k}"].clone()
                                                              for k in state_names},
                            {k: tensors[f"flight/{c}/extra/{k}"].clone() for k in f.get("extras", [])})
            self.in_flight[c] = _InFlight(c, int(f["version"]), DoneHandle(res), float(f["up_bytes"]),
                                          float(f["density"]))
        self.dispatches = [int(v) for v in state["dispatches"]]
        self.bytes_up = float(state["bytes_up"])
        self.bytes_down = float(state["bytes_down"])
        self.uploads = int(state["uploads"])
        if "client_uploads" in state:  # (a checkpoint written before the counts were kept: from zero)
            self.client_uploads = [int(v) for v in state["client_uploads"]]
        self.downloads = int(state["downloads"])
        self.server_busy = bool(state["server_busy"])
        if "trigger" in state:
            self.trigger.load_state_dict(state["trigger"])
        else:  # a checkpoint of the epoch-numbered deadline events (before the coordination core)
            at = None
            if state.get("deadline_passed"):
                at = self.now
            elif state.get("deadline_armed"):
                epoch = float(state["deadline_epoch"])
                at = min((e.time for e in self.events if e.kind == "deadline" and e.data == epoch), default=None)
            self.trigger.load_state_dict({"deadline_at": at})
        self.next_grid = math.inf if state["next_grid"] is None else float(state["next_grid"])
        self._grid_index = int(state["grid_index"])
        self._since_record = {"restored": list(state["since_record"]["restored"]),
                              "val": state["since_record"]["val"]}
        self.wave = set(int(c) for c in state["wave"])
        self.records = int(state["records"])
        self.started = bool(state["started"])
        self._last_eval_step = int(state["last_eval_step"])
        self.last_step_stats = dict(state["last_step_stats"])
        self.rejected_streak = int(state.get("rejected_streak", 0))
        self.client_states = {int(c): {k: tensors[f"client/{c}/{k}"].clone() for k in names}
                              for c, names in state.get("client_states", {}).items()}
        self.client_state_epoch = int(state.get("client_state_epoch", 0))
        self.network.load_state_dict(state["network"])
        self.rng.bit_generator.state = state["rng"]
        # periodic checkpoints are written right after a step finished: the strategy's model is
        # the published one. The final one may be written while the server is still
        # aggregating: the model the run's records saw is then saved beside it.
        self._publish()
        if "published/params" in tensors:
            self._published = (int(state["published_version"]), tensors["published/params"].clone(),
                               {k[len("published/buf/"):]: v.clone() for k, v in tensors.items()
                                if k.startswith("published/buf/")})
