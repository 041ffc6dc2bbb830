"""The Flower server loop against in-process fake nodes: malformed replies of every kind
are rejected and logged without touching the global model; crashed and silent clients
do not stall the loop. No Flower processes (the loop and payloads import no Flower)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pytest
import torch
import yaml

from conftest import tiny_config
from fedgmr.algorithm.encoding import decode_sparse, encode_sparse
from fedgmr.experiment.build import build_experiment
from fedgmr.flower.client import load_run_config, train_handler
from fedgmr.flower.faults import MALFORMED, corrupt, fault_mod
from fedgmr.flower.loop import BufferedServerLoop, LoopSettings
from fedgmr.flower.payload import decode_instruction, encode_instruction, encode_reply


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
                              exp.simulator.executor.workload.settings, cfg.seed)


def test_honest_nodes_train_and_the_model_improves(run_config):
    loop = _loop(run_config, FakeLink(run_config), steps=8)
    records = loop.run()
    assert loop.strategy.version == 8 and loop.strategy.rejected == 0
    assert records[-1]["accuracy"] > records[0]["accuracy"]
    assert all(r["used"] <= 4 for r in records)


@pytest.mark.parametrize("kind", MALFORMED)
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
    for kind in MALFORMED:
        loop.strategy.assign(3)
        msg_id = uuid.uuid4().hex
        loop.in_flight[msg_id] = type(next(iter(loop.in_flight.values())))(3, loop.strategy.version, 0.0, 0)
        bad = _Arrived(msg_id, good.node_id, corrupt(good.fields, kind), None, 0)
        assert loop.handle(bad) is False, kind
    # a reply from a node other than the one the job went to
    msg_id = uuid.uuid4().hex
    loop.in_flight[msg_id] = type(next(iter(loop.in_flight.values())))(3, loop.strategy.version, 0.0, 0)
    assert loop.handle(_Arrived(msg_id, 99, good.fields, None, 0)) is False
    assert loop.strategy.rejected == len(MALFORMED) + 1
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


def test_payload_round_trip_is_exact_and_never_pickled(run_config):
    cfg = load_run_config(run_config)
    exp = build_experiment(cfg)
    s = exp.strategy
    a = s.assign(3)
    fields = encode_instruction(3, a.version, 7, a.consumes, a.mask, s.params, s.buffers,
                                exp.simulator.executor.workload.settings)
    assert all(isinstance(v, (int, float, str, bytes, bool, list)) for v in fields.values())
    assert all(not (isinstance(v, bytes) and v[:1] == b"\x80") for v in fields.values())  # no pickle header
    ins = decode_instruction(fields, exp.simulator.executor.workload.settings)
    assert torch.equal(ins.mask, a.mask) and torch.equal(ins.start, s.params * a.mask)
    mask, vals = decode_sparse(fields["model"])
    assert torch.equal(vals, s.params[a.mask])
    reply = encode_reply(3, 0, a.mask, s.params[a.mask], s.buffers, 10, 0.5)
    assert decode_sparse(reply["payload"])[1].numel() == int(a.mask.sum())
    assert encode_sparse(mask, vals) == fields["model"]
