"""FedGMR's semi-asynchronous buffered server loop over a message transport.

The loop drives an unchanged :class:`~fedgmr.strategy.masked_buffered.MaskedBufferedStrategy`
exactly as the virtual-clock simulator does - ``assign`` a sub-model to each idle client,
``receive`` replies as they arrive, ``aggregate`` once ``K`` have arrived, feed GMR its
validation score - but on the wall clock, over a :class:`Link` (Flower's Grid in
:mod:`fedgmr.flower.server_app`, an in-process fake in tests). It imports nothing from
Flower.

Robustness: every instruction carries a TTL and a reply deadline; a client that crashes
(an error reply) or never answers is dropped from the current step and re-dispatched
after the next aggregation, and a step waits at most ``step_timeout`` seconds for ``K``
replies before aggregating the ones it has. Malformed replies are rejected and logged
(here for undecodable fields and identity mismatches, by the strategy for the rest),
counted in ``rejected`` and never reach the global model: nothing a client sends can
raise out of :meth:`BufferedServerLoop.handle`. A node whose replies keep being rejected
is quarantined (:mod:`fedgmr.flower.quarantine`): it gets no instruction for a while.

Replies carry values only: each in-flight instruction remembers the mask it assigned (the
coordinates the reply carries: ``Assignment.reply_mask``), and the reply is decoded
against it (a value count other than the mask's is rejected).

Values beside the model travel as the simulator sends them (the assignment's
:class:`~fedgmr.strategy.messages.Wire`): its ``beside`` vectors (SCAFFOLD's ``c``) go
down at its mask, the reply brings back its ``reply_beside`` vectors (``delta_c``) at its
values' coordinates and the client method's other extras (FedNova's ``tau``:
``reply_plain`` values in all); each is decoded and checked like the values
(:func:`~fedgmr.flower.payload.decode_extras`). ``bytes_down`` / ``bytes_up`` count the
encoded fields as they are (the model, buffers, mask codes, extras at 4 bytes a value):
what the simulator's byte rule (:mod:`fedgmr.strategy.wire`) counts, plus what a real
message carries beside it. Client state never reaches the server: it stays on the node
(:mod:`fedgmr.flower.client`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping, Protocol

import torch

from fedgmr.errors import InvalidUpdateError
from fedgmr.flower.payload import decode_reply, encode_instruction
from fedgmr.flower.quarantine import Quarantine, QuarantinePolicy
from fedgmr.sim.executor import job_seed
from fedgmr.strategy.coordination import (Coordination, Decision, StepTrigger, after_step, base_record, eval_due,
                                          step_stats)
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.messages import Assignment
from fedgmr.training.local import TrainSettings

log = logging.getLogger(__name__)
Evaluator = Callable[[torch.Tensor, dict[str, torch.Tensor], str], tuple[float, float]]


class ArrivedReply(Protocol):
    instruction_id: str
    node_id: int
    fields: dict[str, Any]
    error: str | None
    nbytes: int


class Link(Protocol):
    """What the loop needs of a transport."""

    def push(self, node_id: int, fields: Mapping[str, Any], ttl: float, group: str) -> str: ...

    def pull(self, instruction_ids: Iterable[str]) -> list[Any]: ...


@dataclass
class LoopSettings:
    """Coordination of the loop (wall-clock seconds).

    max_steps: server steps (aggregations) to run.
    mode: ``semi_async`` (aggregate on ``trigger``) or ``sync`` (a step waits for every
        client it dispatched: each replies, fails or times out; the config's
        ``coordination.mode``, so FedAvg-style methods run synchronously here as in the
        simulator).
    trigger: ``k`` (aggregate once ``k`` new replies arrived, at most ``k`` per step) or
        ``deadline`` (``slack`` seconds after the first reply, since the last step, from a
        client at the highest density in flight; or once every client replied).
    k: see ``trigger``.
    slack: see ``trigger`` (wall-clock seconds).
    reply_timeout: a dispatched client not heard from after this long is dropped from
        the step (the messages' TTL is a little longer).
    step_timeout: aggregate with fewer than ``k`` replies after this long, if any arrived.
    max_wall: stop after this long whatever the step (None: no bound).
    eval_every, check_interval: test evaluation / GMR validation every that many steps.
    poll_interval: sleep between pulls when nothing happened.
    """

    max_steps: int
    k: int = 3
    mode: Literal["semi_async", "sync"] = "semi_async"
    trigger: Literal["k", "deadline"] = "k"
    slack: float = 0.5
    reply_timeout: float = 60.0
    #: a client whose instruction failed (an error reply, no reply within
    #: ``reply_timeout``, an instruction the link refused) n times in a row rests for
    #: ``min(2**(n-1), max_rest_steps)`` server steps before it is sent work again (0: no
    #: rest); a reply ends the rest. When nobody else is at work, it is sent work anyway
    max_rest_steps: int = 16
    step_timeout: float = 30.0
    max_wall: float | None = None
    eval_every: int = 5
    check_interval: int = 5
    poll_interval: float = 0.05
    #: a link call (push or pull) that takes longer than this many seconds is logged
    slow_call: float = 5.0


@dataclass
class _Flight:
    slot: int
    version: int
    sent: float
    nbytes: int
    mask: torch.Tensor | None = None  # the reply's coordinates assigned: a values-only reply is decoded against it
    density: float = 1.0  # the assignment's density (the deadline trigger compares them)
    reply_beside: tuple[str, ...] = ()  # vectors the reply carries beside its values, one value per value
    reply_plain: int = 0  # values the reply's other extras hold in all (FedNova's tau: 1)
    sent_epoch: float = 0.0  # time.time() right after the push returned (matched against link counters)


@dataclass
class LoopStats:
    timeouts: int = 0
    errors: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    replies: int = 0
    #: instructions the link accepted (the simulator's ``downloads``)
    downloads: int = 0
    #: clients that never replied in the whole run and were still awaited at its end
    unanswered: int = 0
    #: clients that had replied before but were still awaited when the run ended (e.g. a
    #: node killed after replying, within the reply timeout)
    awaited: int = 0
    log: list[str] = field(default_factory=list)
    #: per node id: ``sent`` (instructions), ``replies``, ``errors`` (error replies),
    #: ``timeouts``, ``skipped`` (dispatches left out while it rested after failures) and,
    #: at the end, ``awaited_at_end`` (an instruction still in flight: seconds since sent)
    nodes: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: per link call (``push``, ``pull``): ``calls``, ``seconds`` in all and the longest
    #: ``max_s`` (monotonic wall time, whatever clock the loop runs on): where a blocked
    #: transport shows (a call over ``LoopSettings.slow_call`` is also logged)
    link_calls: dict[str, dict[str, float]] = field(default_factory=dict)
    #: one record per instruction that ended (a reply, an error reply, a timeout):
    #: ``instruction``, ``node``, ``client``, ``step`` (the model version sent), ``sent`` and
    #: ``replied`` (epoch seconds: push returned, the reply was pulled complete),
    #: ``round_trip`` (their difference), ``bytes_down`` / ``bytes_up`` (the fields' payload
    #: bytes), ``compute_s`` (the training time the client reported, or None) and
    #: ``outcome`` (``reply``, ``error``, ``timeout``)
    messages: list[dict[str, Any]] = field(default_factory=list)

    def node(self, node_id: int) -> dict[str, Any]:
        return self.nodes.setdefault(node_id, {"sent": 0, "replies": 0, "errors": 0, "timeouts": 0, "skipped": 0})


class BufferedServerLoop:
    """Runs a strategy over a link until ``settings.max_steps`` steps.

    Parameters
    ----------
    strategy: the FedGMR server strategy (unchanged).
    link: transport with ``push`` and ``pull``.
    nodes: node ids to use; node ``nodes[i]`` is the strategy's client ``i``.
    evaluator: ``evaluator(params, buffers, split)`` -> (accuracy, loss).
    settings: see :class:`LoopSettings`.
    train: local training settings sent with every instruction.
    seed: root seed of the per-job training seeds.
    client_validation: ask clients for their local validation score (per-client GMR).
    on_record: called with each metrics record.
    quarantine: when a node's rejected replies quarantine it (default: never).
    client_extras: the names of what the client method sends beside its values
        (the names of its ``reply_extras``); those an assignment does not ask for at the values'
        coordinates (``Wire.reply_beside``) hold its ``Wire.reply_plain`` values in all.
    """

    def __init__(self, strategy: MaskedBufferedStrategy, link: Link, nodes: list[int], evaluator: Evaluator,
                 settings: LoopSettings, train: TrainSettings, seed: int = 0, client_validation: bool = False,
                 on_record: Callable[[dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, quarantine: QuarantinePolicy | None = None,
                 client_extras: tuple[str, ...] = ()) -> None:
        if not nodes:
            raise ValueError("no nodes to train on")
        self.strategy = strategy
        self.link = link
        self.node_of_slot = {i: n for i, n in enumerate(nodes[: strategy.num_clients])}
        self.evaluator = evaluator
        self.settings = settings
        self.train = train
        self.seed = seed
        self.client_validation = client_validation
        self.client_extras = tuple(client_extras)
        self.on_record = on_record or (lambda rec: None)
        self.clock = clock
        self.in_flight: dict[str, _Flight] = {}
        self._replied: set[int] = set()  # slots that have replied at least once
        self.waiting: set[int] = set()  # heard from (or given up on) since the last step
        self.quarantine = Quarantine(quarantine or QuarantinePolicy(after=0))
        self.benched: set[int] = set()  # slots whose node is quarantined: no work until released
        self.failures: dict[int, int] = {}  # slot -> instructions failed in a row (error, timeout, refused)
        self.rest_until: dict[int, int] = {}  # slot -> the server step before which it gets no work
        self.queue: list[Any] = []
        self.dispatches = [0] * strategy.num_clients
        self.stats = LoopStats()
        for node in self.node_of_slot.values():
            self.stats.node(node)
        self.records: list[dict[str, Any]] = []
        self.client_uploads = [0] * strategy.num_clients  # replies per client (the simulator's count)
        #: when the server steps: the coordination core the simulator uses, on the wall clock
        self.trigger = self._new_trigger()
        self.t0 = clock()
        self.step_started = self.t0
        self._last_eval = -1
        self._last_stats: dict[str, float] = {"staleness_mean": 0.0, "used": 0}

    def _new_trigger(self) -> StepTrigger:
        s = self.settings
        return StepTrigger(Coordination(mode=s.mode, trigger=s.trigger, k=s.k, slack=s.slack), len(self.node_of_slot))

    # ------------------------------------------------------------------ dispatch
    def _resting(self, slot: int) -> bool:
        return self.rest_until.get(slot, 0) > self.strategy.version

    def _failed(self, slot: int) -> None:
        """An instruction of ``slot`` failed: it rests for a while (see ``max_rest_steps``)."""
        n = self.failures.get(slot, 0) + 1
        self.failures[slot] = n
        rest = min(2 ** (n - 1), self.settings.max_rest_steps)
        if rest > 0:
            self.rest_until[slot] = self.strategy.version + rest
            if n > 1:
                log.warning("client %d (node %d) failed %d times in a row: no work for it for %d server steps",
                            slot, self.node_of_slot[slot], n, rest)

    def _dispatch(self, slots: Iterable[int]) -> None:
        busy = {f.slot for f in self.in_flight.values()}
        todo = sorted(set(slots) - busy)
        # a client resting after failed instructions is passed over, unless nobody could work otherwise
        if self.in_flight or any(not self._resting(s) for s in todo):
            for slot in [s for s in todo if self._resting(s)]:
                self.stats.node(self.node_of_slot[slot])["skipped"] += 1
                todo.remove(slot)  # stays in self.waiting: offered work again after the next step
        for slot in todo:
            if self.quarantine.blocked(self.node_of_slot[slot], self.clock()):
                self.waiting.discard(slot)
                self.benched.add(slot)
                continue
            a = self.strategy.assign(slot)
            _check_carried(a)
            seed = job_seed(self.seed, slot, self.dispatches[slot])
            fields = encode_instruction(slot, a.version, seed, a.consumes, a.mask, self.strategy.params,
                                        self.strategy.buffers, self.train, self.client_validation, a.wire.beside,
                                        a.wire.reply_coords)
            nbytes = sum(len(v) for v in fields.values() if isinstance(v, bytes))
            # the TTL outlives our own deadline, so a silent client is dropped by the loop
            # (a timeout); the TTL then lets the SuperLink discard the message
            ttl = self.settings.reply_timeout + max(5.0, 0.2 * self.settings.reply_timeout)
            msg_id = self._timed("push", self.link.push, self.node_of_slot[slot], fields, ttl, str(a.version))
            self.dispatches[slot] += 1
            if not msg_id:
                log.warning("client %d (node %d): instruction was not accepted; retrying after the next step",
                            slot, self.node_of_slot[slot])
                self.waiting.add(slot)
                self._failed(slot)
                continue
            self.stats.node(self.node_of_slot[slot])["sent"] += 1
            self.stats.bytes_down += nbytes
            self.stats.downloads += 1
            self.in_flight[msg_id] = _Flight(slot, a.version, self.clock(), nbytes, a.reply_mask, a.density,
                                             tuple(a.wire.reply_beside), int(a.wire.reply_plain), time.time())
            self.waiting.discard(slot)

    def _timed(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, its wall time counted in ``stats.link_calls[what]`` (a call over
        ``settings.slow_call`` seconds is logged: a transport that blocks the loop shows)."""
        t0 = time.monotonic()
        try:
            return call(*args)
        finally:
            dt = time.monotonic() - t0
            book = self.stats.link_calls.setdefault(what, {"calls": 0, "seconds": 0.0, "max_s": 0.0})
            book["calls"] += 1
            book["seconds"] += dt
            book["max_s"] = max(book["max_s"], dt)
            if dt > self.settings.slow_call:
                line = (f"link {what} took {dt:.1f} s (step {self.strategy.version}, {len(self.in_flight)} "
                        f"instruction(s) in flight): the transport blocked the server loop")
                self.stats.log.append(line)
                log.warning(line)

    # ------------------------------------------------------------------ replies
    def _message_record(self, msg_id: str, flight: _Flight, outcome: str, arrived: Any = None) -> None:
        """Keep the record of one finished instruction (``stats.messages``)."""
        received = getattr(arrived, "received", None) if arrived is not None else None
        replied = float(received) if received is not None else time.time()
        compute = arrived.fields.get("compute_s") if arrived is not None and isinstance(arrived.fields, dict) else None
        try:  # a client's claim, not yet validated: kept only when it is a sane number
            ok = isinstance(compute, (int, float)) and not isinstance(compute, bool) and 0 <= float(compute) <= 1e6
        except OverflowError:
            ok = False
        self.stats.messages.append({
            "instruction": msg_id, "node": self.node_of_slot[flight.slot], "client": flight.slot,
            "step": flight.version, "sent": round(flight.sent_epoch, 4), "replied": round(replied, 4),
            "round_trip": round(replied - flight.sent_epoch, 4), "bytes_down": flight.nbytes,
            "bytes_up": int(arrived.nbytes) if arrived is not None else 0,
            "compute_s": float(compute) if ok else None, "outcome": outcome})

    def _reject(self, slot: int, reason: str) -> None:
        self.strategy.rejected += 1
        line = f"rejected update from client {slot}: {reason}"
        self.stats.log.append(line)
        log.warning(line)
        self._strike(slot)

    def _strike(self, slot: int) -> None:
        """Count an invalid reply against the slot's node; quarantine it on the N-th."""
        node = self.node_of_slot[slot]
        if self.quarantine.strike(node, self.clock()):
            p = self.quarantine.policy
            line = (f"quarantined node {node} (client {slot}) for {p.seconds:g} s: {p.after} invalid replies "
                    f"within {p.window:g} s")
            self.stats.log.append(line)
            log.warning(line)

    def _release(self) -> None:
        """Let quarantined nodes whose time is up back in: they get work like a returning client."""
        for node in self.quarantine.release(self.clock()):
            for slot in [s for s in self.benched if self.node_of_slot[s] == node]:
                self.benched.discard(slot)
                self.waiting.add(slot)
                log.warning("released node %d (client %d) from quarantine", node, slot)

    def handle(self, arrived: Any) -> bool:
        """Validate one reply and hand it to the strategy; True when accepted."""
        flight = self.in_flight.pop(arrived.instruction_id, None)
        if flight is None:
            log.warning("reply to an unknown or expired instruction %s from node %s ignored",
                        arrived.instruction_id, arrived.node_id)
            return False
        slot = flight.slot
        self._message_record(arrived.instruction_id, flight, "error" if arrived.error is not None else "reply",
                             arrived)
        self._replied.add(slot)
        self.waiting.add(slot)
        self.stats.replies += 1
        self.stats.bytes_up += arrived.nbytes
        node = self.stats.node(self.node_of_slot[slot])
        node["replies"] += 1
        node["last_reply_s"] = round(self.clock() - self.t0, 3)
        if arrived.error is not None:
            self.stats.errors += 1
            node["errors"] += 1
            log.warning("client %d (node %d) failed: %s; going on without it", slot, self.node_of_slot[slot],
                        arrived.error)
            self._failed(slot)
            return False
        self.client_uploads[slot] += 1
        self.failures.pop(slot, None)  # it answered: any rest ends
        self.rest_until.pop(slot, None)
        if arrived.node_id != self.node_of_slot[slot]:
            self._reject(slot, f"reply came from node {arrived.node_id!r}, not node {self.node_of_slot[slot]}")
            return False
        try:
            rejected = self.strategy.rejected
            accepted = self._accept(slot, flight, arrived.fields)
            if not accepted and self.strategy.rejected > rejected:  # the strategy rejected it
                self._strike(slot)
            return accepted
        except InvalidUpdateError as exc:
            self._reject(slot, str(exc))
            return False
        except Exception as exc:  # noqa: BLE001 - last resort: nothing a client sends may stop the server
            # every malformed field is meant to raise InvalidUpdateError in decode_reply or
            # the strategy; reaching this line is a decoder bug, so keep the traceback
            log.debug("unexpected error while handling a reply from client %d", slot, exc_info=True)
            self._reject(slot, f"unhandled {type(exc).__name__} while decoding: {exc}"[:300])
            return False

    def _accept(self, slot: int, flight: _Flight, fields: Any) -> bool:
        """Decode ``fields`` (InvalidUpdateError when malformed) and offer them to the strategy."""
        loose = tuple(n for n in self.client_extras if n not in flight.reply_beside)
        reply = decode_reply(fields, self.strategy.space.numel, self.strategy.rule.consumes,
                             self.strategy.buffers, assigned=flight.mask, extras=flight.reply_beside,
                             loose=loose, loose_total=flight.reply_plain)
        if reply.client_id != slot:
            known = 0 <= reply.client_id < self.strategy.num_clients
            raise InvalidUpdateError(f"claims to be client {reply.client_id}" if known
                                     else f"unknown client id {reply.client_id!r}")
        accepted = self.strategy.receive(reply)  # the strategy logs (and we collect) its rejections
        if accepted:  # the deadline trigger (the core's rule; the run loop polls the clock)
            self.trigger.on_reply(flight.density, (f.density for f in self.in_flight.values()), self.clock())
        if accepted and reply.val_score is not None:
            self.strategy.on_client_validation(slot, reply.val_score)
        return accepted

    def _expire(self) -> None:
        now = self.clock()
        for msg_id, f in list(self.in_flight.items()):
            if now - f.sent > self.settings.reply_timeout:
                del self.in_flight[msg_id]
                self._message_record(msg_id, f, "timeout")
                self.waiting.add(f.slot)
                self.stats.timeouts += 1
                self.stats.node(self.node_of_slot[f.slot])["timeouts"] += 1
                self._failed(f.slot)
                log.warning("client %d (node %d) did not reply within %.1f s; going on without it",
                            f.slot, self.node_of_slot[f.slot], self.settings.reply_timeout)

    # ------------------------------------------------------------------ steps
    def _step_cap(self) -> int:
        """At most this many new replies enter one step (the rest wait in the queue)."""
        return self.trigger.step_cap()

    def _should_aggregate(self) -> bool:
        decision = self.trigger.decide(len(self.strategy.arrivals), bool(self.in_flight or self.queue), self.clock())
        if decision is Decision.AGGREGATE:
            return True
        if decision is Decision.EMPTY_ROUND:  # the run loop sends the model again to those it gave up on
            return False
        # a deployment's own bound: a step waits at most step_timeout for its trigger
        return bool(self.strategy.arrivals) and self.clock() - self.step_started > self.settings.step_timeout

    def _aggregate(self) -> None:
        report = self.strategy.aggregate()
        self._last_stats = step_stats(report.staleness, report.used)
        self.step_started = self.clock()
        self.trigger.stepped()  # a deadline armed before this step is void
        step = self.strategy.version
        val_score, moved = after_step(self.strategy, self.clock() - self.t0, self.settings.check_interval,
                                      lambda: self.evaluator(self.strategy.params, self.strategy.buffers, "val")[0])
        if eval_due(step, self.settings.eval_every):
            self._evaluate(val_score, moved)
        # every client heard from since the last step gets the new model at once
        if step < self.settings.max_steps:
            self._dispatch(sorted(self.waiting))

    def _evaluate(self, val_score: float | None = None, moved: list[int] | tuple = ()) -> dict[str, Any]:
        acc, loss = self.evaluator(self.strategy.params, self.strategy.buffers, "test")
        wall = self.clock() - self.t0
        # the simulator's record (the coordination core's), with ``time`` on the wall clock
        # (seconds since the loop started; also kept as ``wall_time``), then the fields
        # only a deployment has
        rec = base_record(self.strategy, time=wall, step=self.strategy.version, accuracy=acc, loss=loss,
                          bytes_up=self.stats.bytes_up, bytes_down=self.stats.bytes_down,
                          uploads=self.stats.replies - self.stats.errors, downloads=self.stats.downloads,
                          client_uploads=self.client_uploads, val_score=val_score, moved=moved,
                          stats=self._last_stats)
        rec |= {
            "wall_time": wall, "used": self._last_stats["used"], "clipped": self.strategy.bounds.clipped,
            "capped": self.strategy.bounds.capped, "update_norm_median": self.strategy.median_update_norm,
            "timeouts": self.stats.timeouts, "errors": self.stats.errors, "quarantines": self.quarantine.count,
        }
        self._last_eval = self.strategy.version
        self.records.append(rec)
        self.on_record(rec)
        return rec

    # ------------------------------------------------------------------ main loop
    def run(self) -> list[dict[str, Any]]:
        """Run to ``max_steps`` (or ``max_wall``); returns the metrics records."""
        collect = _Collect(self.stats.log)
        strategy_log = logging.getLogger(type(self.strategy).__module__)
        strategy_log.addHandler(collect)
        try:
            return self._run()
        finally:
            strategy_log.removeHandler(collect)

    def _run(self) -> list[dict[str, Any]]:
        s = self.settings
        self.trigger = self._new_trigger()  # the settings as the run starts
        self._evaluate()
        self._dispatch(self.node_of_slot)
        self.step_started = self.clock()
        while self.strategy.version < s.max_steps:
            if s.max_wall is not None and self.clock() - self.t0 > s.max_wall:
                log.warning("stopping at step %d: wall-clock bound of %.0f s reached", self.strategy.version,
                            s.max_wall)
                break
            progressed = False
            self._release()
            queued = {a.instruction_id for a in self.queue}
            pending = [i for i in self.in_flight if i not in queued]
            if pending:  # a reply is pulled once: Flower deletes it on delivery
                self.queue.extend(self._timed("pull", self.link.pull, pending))
            # at most K new replies per step (trigger k): the rest wait in the queue for the next one
            while self.queue and len(self.strategy.arrivals) < self._step_cap():
                self.handle(self.queue.pop(0))
                progressed = True
            self._expire()
            if self._should_aggregate():
                self._aggregate()
                progressed = True
            elif not self.in_flight and not self.queue and self.waiting:
                # nobody left to wait for: send the current model to those we gave up on
                if self.clock() - self.step_started > min(s.step_timeout, s.reply_timeout) or \
                        not self.strategy.arrivals:
                    self._dispatch(sorted(self.waiting))
                    progressed = True
            if not progressed:
                time.sleep(s.poll_interval)
        if self._last_eval != self.strategy.version:
            self._evaluate()
        now = self.clock()
        for f in self.in_flight.values():
            node = self.node_of_slot[f.slot]
            self.stats.node(node)["awaited_at_end"] = round(now - f.sent, 3)
            if f.slot not in self._replied:  # in flight since the start: a silent node
                self.stats.unanswered += 1
                log.warning("client %d (node %d) never replied: its instruction was %.0f s in flight when the run "
                            "ended", f.slot, node, now - f.sent)
            else:  # it replied before, then went quiet (e.g. killed) within the reply timeout
                self.stats.awaited += 1
                log.warning("client %d (node %d) had not replied when the run ended: its instruction was %.0f s in "
                            "flight (its last reply came %.0f s after the start)", f.slot, node, now - f.sent,
                            self.stats.node(node).get("last_reply_s", 0.0))
        return self.records


def _check_carried(a: Assignment) -> None:
    """Refuse (a bug: the runtime table refuses these configs first) what the payload
    does not carry: models other than the global one, vectors sent whole."""
    w = a.wire
    if w.models:
        raise NotImplementedError("the Flower payload carries the global model only (no cluster models); "
                                  "fedgmr.runtime_support refuses clustering on Flower")
    if w.plain or (w.models == () and (w.beside or w.reply_beside or w.reply_plain)):
        raise NotImplementedError("the Flower payload carries no plain vectors in place of the model (FedMD's "
                                  "logits); fedgmr.runtime_support refuses it on Flower")


#: the wire's default update-norm bound: this multiple of the median accepted update norm
DEFAULT_NORM_MULTIPLE = 3.0


def bound_influence(strategy: MaskedBufferedStrategy, partition_sizes: list[int],
                    run_config: Mapping[str, Any] | Any) -> None:
    """Set the bounds on one client's influence for a deployment, where replies come
    from devices the server does not control.

    * samples: the server cannot tell which partition a node holds, so a claimed
      ``num_samples`` is capped at ``max-samples`` (default: the config's
      ``aggregation.max_samples``, else the largest partition the config makes);
    * update norm: ``max-update-norm`` (default ``aggregation.max_update_norm``) and
      ``update-norm-multiple`` (default ``aggregation.update_norm_multiple``; when neither
      bound is set, :data:`DEFAULT_NORM_MULTIPLE`). A value of 0 turns that bound off.

    ``run_config`` is the run config (validated here: a bad value is a
    :class:`~fedgmr.errors.ConfigError` naming the key) or a
    :class:`~fedgmr.flower.run_config.DeploymentConfig` already parsed."""
    from fedgmr.flower.run_config import DeploymentConfig, parse_run_config

    rc = run_config if isinstance(run_config, DeploymentConfig) else parse_run_config(run_config)
    bounds = strategy.influence
    bounds.client_samples = None
    bounds.max_samples = rc.max_samples or bounds.max_samples or max(partition_sizes)
    fixed = bounds.max_update_norm if rc.max_update_norm is None else rc.max_update_norm
    multiple = bounds.norm_multiple if rc.update_norm_multiple is None else rc.update_norm_multiple
    if fixed is None and multiple is None:
        multiple = DEFAULT_NORM_MULTIPLE
    bounds.max_update_norm = fixed or None
    bounds.norm_multiple = multiple or None
    log.info("bounds: samples capped at %d, update norm %s", bounds.max_samples,
             " and ".join(([f"<= {fixed:g}"] if fixed else []) + ([f"<= {multiple:g} x median"] if multiple else []))
             or "unbounded")


class _Collect(logging.Handler):
    """Keeps the strategy's rejection lines for the run's summary."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("rejected update"):
            self.lines.append(msg)


def summary(records: list[dict[str, Any]], stats: LoopStats, nodes: int, *, name: str | None = None,
            method: str | None = None, seed: int | None = None, t_star: float | None = None) -> dict[str, Any]:
    """The run's summary (JSON-able): the simulator's keys (:func:`fedgmr.experiment.runner.finalize`)
    on the wall clock (``clock: wall``; ``time`` and ``t_star`` in wall-clock seconds since
    the start), then the counts only a deployment has."""
    from fedgmr.experiment.metrics import acc_at_t

    last = records[-1]
    out: dict[str, Any] = {
        "name": name, "method": method, "seed": seed, "status": "completed", "runtime": "flower", "clock": "wall",
        "final_accuracy": last["accuracy"], "best_accuracy": max(r["accuracy"] for r in records),
        "time": last["time"], "steps": last["step"], "final_avg_density": last["avg_density"],
        "restorations": last["restorations"], "bytes_up": stats.bytes_up, "bytes_down": stats.bytes_down,
        "uploads": stats.replies - stats.errors, "downloads": stats.downloads,
        "rejected_updates": last["rejected"], "wall_time_s": round(last["wall_time"], 3),
        "evaluations": len(records), "eval_interval": None,  # a step cadence: no virtual-time grid
        "nodes": nodes, "clipped_updates": last.get("clipped", 0), "capped_sample_counts": last.get("capped", 0),
        "timeouts": stats.timeouts, "unanswered": stats.unanswered, "awaited_at_end": stats.awaited,
        "client_errors": stats.errors,
        "replies": stats.replies, "final_loss": None if math.isnan(last["loss"]) else last["loss"],
        "quarantines": last.get("quarantines", 0),
        # per node: instructions sent, replies, errors, timeouts, dispatches skipped while it
        # rested after failures, and the seconds an instruction was in flight at the end
        "per_node": {str(node): dict(counts) for node, counts in sorted(stats.nodes.items())},
        # wall seconds the loop spent in the transport's calls (a blocked push or pull shows here)
        "link_calls": {what: {"calls": int(b["calls"]), "seconds": round(b["seconds"], 3),
                              "max_s": round(b["max_s"], 3)} for what, b in sorted(stats.link_calls.items())},
    }
    if t_star is not None:
        mean, std = acc_at_t([r["time"] for r in records], [r["accuracy"] for r in records], t_star)
        out["t_star"] = t_star
        out["acc_at_t_star"] = None if math.isnan(mean) else mean
        out["acc_at_t_star_std"] = None if math.isnan(std) else std
    return out
