"""The Flower server loop against in-process fake nodes: malformed replies of every kind
are rejected and logged without touching the global model; crashed and silent clients
do not stall the loop. No Flower processes (the loop and payloads import no Flower)."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pytest
import torch
import yaml

from conftest import tiny_config
from fedgmr.algorithm.encoding import (
    HEADER_BYTES,
    decode_mask,
    decode_sparse,
    encode_sparse,
    mask_code_nbytes,
    payload_nbytes,
    sparse_header,
)
from fedgmr.errors import InvalidUpdateError
from fedgmr.experiment.build import build_experiment
from fedgmr.flower.client import load_run_config, train_handler
from fedgmr.flower.faults import MALFORMED, corrupt, fault_mod
from fedgmr.flower.loop import BufferedServerLoop, LoopSettings
from fedgmr.flower.payload import decode_instruction, decode_reply, encode_instruction, encode_reply, reply_limit
from fedgmr.flower.quarantine import QuarantinePolicy


@dataclass
class _Arrived:
    instruction_id: str
    node_id: int
    fields: dict[str, Any]
    error: str | None
    nbytes: int


class FakeLink:
    """Each push trains at once (through the real client handler and fault mod);
    ``faults`` maps node id -> node config ``fedgmr-fault``."""

    def __init__(self, run_config: Mapping[str, Any], faults: dict[int, str] | None = None) -> None:
        self.run_config = run_config
        self.faults = faults or {}
        self.replies: dict[str, _Arrived] = {}
        self.counts: dict[int, int] = {}
        self.pushed = 0

    def push(self, node_id: int, fields: Mapping[str, Any], ttl: float, group: str) -> str:
        msg_id = uuid.uuid4().hex
        self.pushed += 1
        node_cfg = {"partition-id": node_id, "fedgmr-fault": self.faults.get(node_id, "")}
        if node_cfg["fedgmr-fault"] == "hang":
            return msg_id  # never answers
        n = self.counts.get(node_id, 0)
        self.counts[node_id] = n + 1
        try:
            out = fault_mod(train_handler(fields, self.run_config, node_cfg, node_id), node_cfg, n)
            self.replies[msg_id] = _Arrived(msg_id, node_id, out, None, 0)
        except Exception as exc:  # what Flower turns into an error reply
            self.replies[msg_id] = _Arrived(msg_id, node_id, {}, f"ClientApp raised {exc}", 0)
        return msg_id

    def pull(self, ids: list[str]) -> list[_Arrived]:
        return [self.replies.pop(i) for i in ids if i in self.replies]


@pytest.fixture
def run_config(tmp_path: Path) -> dict[str, Any]:
    raw = tiny_config(clients={"num_clients": 4, "heterogeneity": "high"}, run={"max_steps": 6, "eval_every": 2})
    path = tmp_path / "fedgmr.yaml"
    path.write_text(yaml.safe_dump(raw))
    return {"config": str(path)}


def _loop(run_config: dict[str, Any], link: FakeLink, steps: int = 6, **kw: Any) -> BufferedServerLoop:
    cfg = load_run_config(run_config)
    exp = build_experiment(cfg)
    settings = LoopSettings(max_steps=steps, k=kw.pop("k", 2), reply_timeout=kw.pop("reply_timeout", 5.0),
                            step_timeout=kw.pop("step_timeout", 2.0), max_wall=30.0, eval_every=2,
                            check_interval=2, poll_interval=0.01)
    return BufferedServerLoop(exp.strategy, link, list(range(4)), exp.simulator.evaluator, settings,
                              exp.simulator.executor.workload.settings, cfg.seed, quarantine=kw.pop("quarantine", None),
                              **kw)


def test_honest_nodes_train_and_the_model_improves(run_config):
    loop = _loop(run_config, FakeLink(run_config), steps=8)
    records = loop.run()
    assert loop.strategy.version == 8 and loop.strategy.rejected == 0
    assert records[-1]["accuracy"] > records[0]["accuracy"]
    assert all(r["used"] <= 4 for r in records)


@pytest.mark.parametrize("kind", MALFORMED + ("other-client",))
def test_each_malformed_reply_is_rejected_logged_and_never_touches_the_model(run_config, kind, caplog):
    # node 3 is a 0.05-density client under High heterogeneity: its mask leaves room outside
    loop = _loop(run_config, FakeLink(run_config, {3: kind}), steps=4)
    seen: list[torch.Tensor] = []
    orig_receive = loop.strategy.receive

    def receive(reply):  # the strategy never accepts anything from node 3
        ok = orig_receive(reply)
        assert not (ok and reply.client_id == 3)
        return ok

    loop.strategy.receive = receive  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="fedgmr"):
        loop.run()
    assert loop.strategy.version == 4
    assert loop.strategy.rejected >= 1
    assert torch.isfinite(loop.strategy.params).all()
    lines = [r.getMessage() for r in caplog.records if "rejected update from client 3" in r.getMessage()]
    assert lines, f"no rejection logged for {kind}"
    print(f"{kind}: {lines[0]}")


def test_reply_handler_rejects_crafted_messages_without_changing_params(run_config):
    link = FakeLink(run_config)
    loop = _loop(run_config, link, steps=1)
    loop._evaluate()
    loop._dispatch(loop.node_of_slot)
    before = loop.strategy.params.clone()
    arrived = link.pull(list(loop.in_flight))
    by_slot = {loop.in_flight[a.instruction_id].slot: a for a in arrived}
    good = by_slot[3]
    # every malformed variant of slot 3's reply, each against a fresh outstanding job
    flight = type(next(iter(loop.in_flight.values())))
    for kind in MALFORMED:
        a = loop.strategy.assign(3)
        msg_id = uuid.uuid4().hex
        loop.in_flight[msg_id] = flight(3, loop.strategy.version, 0.0, 0, a.mask)
        bad = _Arrived(msg_id, good.node_id, corrupt(good.fields, kind), None, 0)
        assert loop.handle(bad) is False, kind
    # a reply from a node other than the one the job went to
    a = loop.strategy.assign(3)
    msg_id = uuid.uuid4().hex
    loop.in_flight[msg_id] = flight(3, loop.strategy.version, 0.0, 0, a.mask)
    assert loop.handle(_Arrived(msg_id, 99, good.fields, None, 0)) is False
    # values-only reply decoded against a larger assignment: the value count is wrong
    msg_id = uuid.uuid4().hex
    loop.in_flight[msg_id] = flight(3, loop.strategy.version, 0.0, 0, torch.ones_like(a.mask))
    assert loop.handle(_Arrived(msg_id, good.node_id, good.fields, None, 0)) is False
    assert loop.strategy.rejected == len(MALFORMED) + 2
    assert "assigned mask keeps" in loop.stats.log[-1]
    assert loop.strategy.arrivals == []
    assert torch.equal(loop.strategy.params, before)


def test_crashing_and_silent_clients_do_not_stall_the_loop(run_config, caplog):
    link = FakeLink(run_config, {1: "crash", 2: "hang"})
    loop = _loop(run_config, link, steps=5, k=3, reply_timeout=1.0, step_timeout=0.5)
    with caplog.at_level(logging.WARNING, logger="fedgmr"):
        records = loop.run()
    assert loop.strategy.version == 5
    assert loop.stats.errors >= 1 and loop.stats.timeouts >= 1
    msgs = " | ".join(r.getMessage() for r in caplog.records)
    assert "client 1 (node 1) failed" in msgs and "client 2 (node 2) did not reply" in msgs
    assert records[-1]["wall_time"] < 30


class _CountingLink(FakeLink):
    """A FakeLink that remembers which node each instruction went to."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.to: list[int] = []

    def push(self, node_id: int, fields: Mapping[str, Any], ttl: float, group: str) -> str:
        self.to.append(node_id)
        return super().push(node_id, fields, ttl, group)


def test_a_repeat_offender_is_quarantined_logged_and_counted(run_config, caplog):
    link = _CountingLink(run_config, {3: "cycle"})
    loop = _loop(run_config, link, steps=8, quarantine=QuarantinePolicy(after=2, window=60.0, seconds=3600.0))
    with caplog.at_level(logging.WARNING, logger="fedgmr"):
        records = loop.run()
    assert loop.strategy.version == 8
    # its two rejected replies, then nothing: the run outlives neither the window nor the quarantine
    assert link.to.count(3) == 2 and loop.strategy.rejected == 2
    assert loop.quarantine.events == [3] and records[-1]["quarantines"] == 1
    assert records[0]["quarantines"] == 0
    line = "quarantined node 3 (client 3) for 3600 s: 2 invalid replies within 60 s"
    assert line in loop.stats.log
    assert any(r.getMessage() == line for r in caplog.records)
    assert torch.isfinite(loop.strategy.params).all()


def test_a_quarantined_node_gets_work_again_when_its_time_is_up(run_config, caplog):
    # a clock that moves 0.1 s per instruction (and a little per reading): the quarantine
    # of 0.25 s ends a few instructions later, whatever the machine's speed
    now = [0.0]

    def clock() -> float:
        now[0] += 1e-4
        return now[0]

    class Link(_CountingLink):
        def push(self, *a: Any) -> str:
            now[0] += 0.1
            return super().push(*a)

    link = Link(run_config, {3: "cycle"})
    loop = _loop(run_config, link, steps=10, quarantine=QuarantinePolicy(after=1, window=60.0, seconds=0.25),
                 clock=clock)
    with caplog.at_level(logging.WARNING, logger="fedgmr"):
        loop.run()
    assert loop.strategy.version == 10
    released = [r for r in caplog.records if r.getMessage() == "released node 3 (client 3) from quarantine"]
    assert released and link.to.count(3) >= 2
    # one strike quarantines: every reply of node 3 (each one rejected) quarantined it again
    assert loop.quarantine.count == link.to.count(3) == loop.strategy.rejected


def test_no_quarantine_by_default_in_the_loop(run_config):
    link = _CountingLink(run_config, {3: "cycle"})
    loop = _loop(run_config, link, steps=6)
    loop.run()
    assert loop.quarantine.count == 0 and link.to.count(3) >= 3


def test_a_node_still_silent_at_the_end_is_counted_and_logged(run_config, caplog):
    # a reply timeout longer than the run: the silent node is never expired, only reported
    loop = _loop(run_config, FakeLink(run_config, {2: "hang"}), steps=3, k=2, reply_timeout=60.0,
                 step_timeout=60.0)
    with caplog.at_level(logging.WARNING, logger="fedgmr"):
        loop.run()
    assert loop.strategy.version == 3 and loop.stats.timeouts == 0
    assert loop.stats.unanswered == 1
    assert any("client 2 (node 2) never replied" in r.getMessage() for r in caplog.records)


def _exp(run_config):
    cfg = load_run_config(run_config)
    exp = build_experiment(cfg)
    return exp, exp.strategy, exp.simulator.executor.workload.settings


def test_payload_round_trip_is_exact_and_never_pickled(run_config):
    exp, s, settings = _exp(run_config)
    a = s.assign(3)
    fields = encode_instruction(3, a.version, 7, a.consumes, a.mask, s.params, s.buffers, settings)
    assert all(isinstance(v, (int, float, str, bytes, bool, list)) for v in fields.values())
    assert all(not (isinstance(v, bytes) and v[:1] == b"\x80") for v in fields.values())  # no pickle header
    ins = decode_instruction(fields, settings, s.space.numel, s.buffers)
    assert torch.equal(ins.mask, a.mask) and torch.equal(ins.start, s.params * a.mask)
    mask, vals = decode_sparse(fields["model"])
    assert torch.equal(vals, s.params[a.mask])
    reply = encode_reply(3, 0, a.mask, s.params[a.mask], s.buffers, 10, 0.5)
    assert decode_sparse(reply["payload"], mask=a.mask)[1].numel() == int(a.mask.sum())
    assert encode_sparse(mask, vals) == fields["model"]


def test_download_carries_the_mask_code_and_upload_only_the_values(run_config):
    exp, s, settings = _exp(run_config)
    a = s.assign(3)  # a 0.05-density client under High heterogeneity
    k = int(a.mask.sum())
    assert 0 < k < a.mask.numel()
    fields = encode_instruction(3, a.version, 7, a.consumes, a.mask, s.params, s.buffers, settings)
    assert len(fields["model"]) == payload_nbytes(k, mask_code_nbytes(a.mask))
    assert sparse_header(fields["model"]) == (a.mask.numel(), k, True)
    assert mask_code_nbytes(a.mask) < a.mask.numel() / 8  # near its entropy, below a bitmap
    reply = encode_reply(3, a.version, a.mask, torch.randn(k), s.buffers, 10, 0.5)
    assert len(reply["payload"]) == HEADER_BYTES + 4 * k
    assert sparse_header(reply["payload"]) == (a.mask.numel(), k, False)


def test_values_only_reply_round_trips_against_the_assigned_mask(run_config):
    exp, s, settings = _exp(run_config)
    a = s.assign(3)
    k = int(a.mask.sum())
    values = torch.randn(k)
    fields = encode_reply(3, a.version, a.mask, values, s.buffers, 10, 0.5, val_score=0.25, num_processed=40)
    reply = decode_reply(fields, s.space.numel, a.consumes, s.buffers, assigned=a.mask)
    assert reply.mask is None  # the assignment
    assert torch.equal(reply.values, values)
    assert (reply.client_id, reply.version, reply.num_samples, reply.num_processed) == (3, a.version, 10, 40)
    assert reply.loss == 0.5 and reply.val_score == 0.25
    assert s.receive(reply) is True
    assert s.arrivals == [3]


def test_values_only_reply_with_the_wrong_mask_count_is_rejected(run_config):
    exp, s, settings = _exp(run_config)
    a = s.assign(3)
    k = int(a.mask.sum())
    fields = encode_reply(3, a.version, a.mask, torch.randn(k), s.buffers, 10, 0.5)
    other = a.mask.clone()
    other[torch.nonzero(other)[0]] = False  # one coordinate fewer
    with pytest.raises(InvalidUpdateError, match="assigned mask keeps"):
        decode_reply(fields, s.space.numel, a.consumes, s.buffers, assigned=other)
    with pytest.raises(InvalidUpdateError, match="no assigned mask"):
        decode_reply(fields, s.space.numel, a.consumes, s.buffers)
    with pytest.raises(InvalidUpdateError, match="coordinates"):
        decode_reply(fields, s.space.numel, a.consumes, s.buffers, assigned=torch.cat([a.mask, a.mask[:1]]))


def test_a_client_may_report_a_smaller_mask_explicitly(run_config):
    exp, s, settings = _exp(run_config)
    a = s.assign(3)
    smaller = a.mask.clone()
    smaller[torch.nonzero(smaller)[:5, 0]] = False
    k = int(smaller.sum())
    values = torch.randn(k)
    fields = encode_reply(3, a.version, smaller, values, s.buffers, 10, 0.5, send_mask=True)
    assert len(fields["payload"]) == payload_nbytes(k, mask_code_nbytes(smaller))
    reply = decode_reply(fields, s.space.numel, a.consumes, s.buffers, assigned=a.mask)
    assert torch.equal(reply.mask, smaller) and torch.equal(reply.values, values)
    assert s.receive(reply) is True


@pytest.mark.parametrize("bad", [0, -3, 2.5, "7", True])
def test_bad_num_processed_is_rejected(run_config, bad):
    exp, s, settings = _exp(run_config)
    a = s.assign(3)
    fields = encode_reply(3, a.version, a.mask, torch.randn(int(a.mask.sum())), s.buffers, 10, 0.5)
    assert "num_processed" not in fields
    fields["num_processed"] = bad
    with pytest.raises(InvalidUpdateError, match="num_processed"):
        decode_reply(fields, s.space.numel, a.consumes, s.buffers, assigned=a.mask)


def test_client_handler_replies_values_only_with_num_processed(run_config):
    exp, s, settings = _exp(run_config)
    a = s.assign(3)
    fields = encode_instruction(3, a.version, 7, a.consumes, a.mask, s.params, s.buffers, settings)
    out = train_handler(fields, run_config, {"partition-id": 3}, 3)
    k = int(a.mask.sum())
    assert len(out["payload"]) == HEADER_BYTES + 4 * k
    reply = decode_reply(out, s.space.numel, a.consumes, s.buffers, assigned=a.mask)
    assert reply.num_samples > 0
    assert reply.num_processed is None or reply.num_processed > 0
    assert s.receive(reply) is True


def test_oversized_fault_exceeds_the_reply_limit(run_config):
    exp, s, settings = _exp(run_config)
    a = s.assign(3)
    fields = encode_reply(3, a.version, a.mask, torch.randn(int(a.mask.sum())), s.buffers, 10, 0.5)
    bad = corrupt(fields, "oversized")
    assert len(bad["payload"]) > reply_limit(s.space.numel, s.buffers)
    with pytest.raises(InvalidUpdateError, match="exceeds the limit"):
        decode_reply(bad, s.space.numel, a.consumes, s.buffers, assigned=a.mask)
    # the outside-mask fault claims every coordinate with an explicit mask code
    wide = corrupt(fields, "outside-mask")
    reply = decode_reply(wide, s.space.numel, a.consumes, s.buffers, assigned=a.mask)
    assert bool(decode_mask(wide["payload"][HEADER_BYTES:-4 * s.space.numel]).all())
    assert reply.mask is not None and bool(reply.mask.all())
    assert s.receive(reply) is False


def _arrivals_per_step(loop: BufferedServerLoop) -> list[int]:
    """Record how many new replies each aggregation takes in."""
    seen: list[int] = []
    orig = loop.strategy.aggregate

    def aggregate(*a, **kw):
        seen.append(len(loop.strategy.arrivals))
        return orig(*a, **kw)

    loop.strategy.aggregate = aggregate  # type: ignore[method-assign]
    return seen


def test_sync_mode_waits_for_every_dispatched_client(run_config):
    """coordination.mode sync (FedAvg, HeteroFL, ...): each step aggregates every client it
    dispatched, whatever k says - as the simulator's sync rounds do."""
    link = FakeLink(run_config)
    loop = _loop(run_config, link, steps=3, k=2)
    loop.settings.mode = "sync"
    per_step = _arrivals_per_step(loop)
    loop.run()
    assert loop.strategy.version == 3 and per_step == [4, 4, 4]
    assert link.pushed == 4 * 3  # 4 per round, none after the last step
    # the same loop in the default semi-async mode takes k = 2 replies per step
    semi = _loop(run_config, FakeLink(run_config), steps=3, k=2)
    semi_steps = _arrivals_per_step(semi)
    semi.run()
    assert semi_steps == [2, 2, 2]


def test_sync_mode_goes_on_without_a_silent_client(run_config):
    loop = _loop(run_config, FakeLink(run_config, {2: "hang"}), steps=2, k=2, reply_timeout=0.5)
    loop.settings.mode = "sync"
    per_step = _arrivals_per_step(loop)
    loop.run()
    assert loop.strategy.version == 2 and loop.stats.timeouts >= 1
    assert per_step == [3, 3]


def test_deadline_trigger_aggregates_slack_after_the_densest_reply(run_config):
    """trigger deadline: armed by the first reply of a client at the highest density in
    flight, it fires `slack` seconds later (a fake clock here), not at k."""
    now = [0.0]
    link = FakeLink(run_config)
    loop = _loop(run_config, link, steps=1, k=1, clock=lambda: now[0])
    loop.settings.trigger, loop.settings.slack, loop.settings.step_timeout = "deadline", 3.0, 100.0
    loop.trigger = loop._new_trigger()  # (run() reads the settings as it starts; this test drives the steps)
    loop._dispatch(loop.node_of_slot)
    dens = {f.slot: f.density for f in loop.in_flight.values()}
    by_slot = {loop.in_flight[a.instruction_id].slot: a for a in link.pull(list(loop.in_flight))}
    low = min(dens, key=dens.get)
    top = max(dens, key=dens.get)
    assert dens[low] < dens[top]
    assert loop.handle(by_slot[low]) and loop.trigger.deadline_at is None  # a sparser client does not arm it
    assert not loop._should_aggregate()  # k = 1 does not apply under the deadline trigger
    now[0] = 10.0
    assert loop.handle(by_slot[top]) and loop.trigger.deadline_at == 13.0
    now[0] = 12.9
    assert not loop._should_aggregate()
    now[0] = 13.0
    assert loop._should_aggregate()
    per_step = _arrivals_per_step(loop)
    loop._aggregate()
    assert loop.trigger.deadline_at is None and per_step == [2]


def test_server_app_refuses_client_sampling():
    from fedgmr.errors import ConfigError
    from fedgmr.flower.server_app import refuse_client_state
    from fedgmr.methods import resolve_config

    with pytest.raises(ConfigError, match="clients.concurrency 2 samples clients per round"):
        refuse_client_state(resolve_config(tiny_config(clients={"num_clients": 4, "concurrency": 2})))
    refuse_client_state(resolve_config(tiny_config(clients={"num_clients": 4, "concurrency": 4})))


# ---------------------------------------------------------------------------- per-node bookkeeping (issue 42, item 10)
class _KilledAfterReplying(_CountingLink):
    """Node ``victim`` answers its first instruction, then is killed: later ones go unanswered."""

    victim = 2

    def push(self, node_id: int, fields: Mapping[str, Any], ttl: float, group: str) -> str:
        if node_id == self.victim and self.to.count(node_id) >= 1:
            self.to.append(node_id)
            self.pushed += 1
            return uuid.uuid4().hex  # never answered
        return super().push(node_id, fields, ttl, group)


def test_a_node_killed_after_replying_is_in_the_summary_when_the_run_ends_within_the_reply_timeout(run_config,
                                                                                                   caplog):
    from fedgmr.flower.loop import summary

    link = _KilledAfterReplying(run_config)
    loop = _loop(run_config, link, steps=4, k=2, reply_timeout=60.0, step_timeout=60.0)
    with caplog.at_level(logging.WARNING, logger="fedgmr"):
        records = loop.run()
    assert loop.strategy.version == 4 and loop.stats.timeouts == 0 and loop.stats.unanswered == 0
    out = summary(records, loop.stats, 4)
    node = out["per_node"]["2"]
    assert node["replies"] == 1 and node["sent"] == 2 and node["awaited_at_end"] >= 0
    # every client with an instruction in flight at the end is counted (honest ones whose
    # reply had not been pulled yet too): the killed node is among them, by its id
    awaited = [n for n, counts in out["per_node"].items() if "awaited_at_end" in counts]
    assert "2" in awaited and out["awaited_at_end"] == len(awaited)
    assert sum(n["sent"] for n in out["per_node"].values()) == out["downloads"]
    assert sum(n["replies"] for n in out["per_node"].values()) == out["replies"]
    assert any("client 2 (node 2) had not replied when the run ended" in r.getMessage() for r in caplog.records)
    json.dumps(out)  # the summary stays JSON


def test_a_dead_node_is_not_sent_work_every_step(run_config, caplog):
    link = _CountingLink(run_config, {1: "crash"})
    loop = _loop(run_config, link, steps=12, k=2)
    with caplog.at_level(logging.WARNING, logger="fedgmr"):
        loop.run()
    assert loop.strategy.version == 12
    # failures in a row rest it 1, 2, 4, 8 steps: 4 instructions in 12 steps, not one per step
    assert link.to.count(1) <= 5 < min(link.to.count(n) for n in (0, 2, 3))
    assert loop.stats.nodes[1]["errors"] == link.to.count(1) and loop.stats.nodes[1]["skipped"] > 0
    assert any("client 1 (node 1) failed 2 times in a row: no work for it for 2 server steps" in r.getMessage()
               for r in caplog.records)


def test_a_node_that_comes_back_gets_work_every_step_again(run_config):
    class Flaky(_CountingLink):
        """Node 1 fails its first two instructions, then works."""

        def push(self, node_id: int, fields: Mapping[str, Any], ttl: float, group: str) -> str:
            if node_id == 1 and self.to.count(1) < 2:
                self.to.append(node_id)
                msg_id = uuid.uuid4().hex
                self.replies[msg_id] = _Arrived(msg_id, node_id, {}, "ClientApp raised: node restarting", 0)
                return msg_id
            return super().push(node_id, fields, ttl, group)

    link = Flaky(run_config)
    loop = _loop(run_config, link, steps=14, k=2)
    loop.run()
    assert loop.strategy.version == 14
    assert loop.stats.nodes[1]["errors"] == 2 and loop.stats.nodes[1]["replies"] > 4
    assert 1 not in loop.failures and 1 not in loop.rest_until  # the rest ended with its first reply


def test_resting_never_stalls_a_run_whose_every_node_fails(run_config):
    link = _CountingLink(run_config, {n: "crash" for n in range(4)})
    loop = _loop(run_config, link, steps=3, k=2)
    loop.settings.max_wall = 3.0
    loop.run()  # no update can be aggregated: it ends at max_wall, sending work to resting nodes meanwhile
    assert loop.strategy.version == 0 and loop.stats.errors >= 8


# ---------------------------------------------------------------------------- a transport that blocks (issue 43)
class _SlowPush(FakeLink):
    """The third push blocks for ``pause`` seconds (a SuperLink that does not answer)."""

    pause = 0.3

    def push(self, node_id: int, fields: Mapping[str, Any], ttl: float, group: str) -> str:
        if self.pushed == 2:
            import time

            time.sleep(self.pause)
        return super().push(node_id, fields, ttl, group)


def test_a_blocking_link_call_is_timed_logged_and_summarised(run_config, caplog):
    from fedgmr.flower.loop import summary

    link = _SlowPush(run_config)
    loop = _loop(run_config, link, steps=2)
    loop.settings.slow_call = 0.2
    with caplog.at_level(logging.WARNING, logger="fedgmr.flower.loop"):
        records = loop.run()
    calls = loop.stats.link_calls
    assert calls["push"]["calls"] == link.pushed and calls["push"]["max_s"] >= _SlowPush.pause
    assert calls["pull"]["calls"] >= 1 and calls["pull"]["max_s"] < _SlowPush.pause  # only the push blocked
    blocked = [line for line in loop.stats.log if line.startswith("link push took")]
    assert len(blocked) == 1 and "the transport blocked the server loop" in blocked[0]
    assert any(r.getMessage() == blocked[0] for r in caplog.records)
    out = summary(records, loop.stats, 4)
    assert out["link_calls"]["push"]["calls"] == link.pushed and out["link_calls"]["push"]["max_s"] >= 0.3
