"""Client state and values beside the model on the Flower runtime, without Flower processes.

The Flower server loop runs the simulator's strategy objects over an in-process link whose
nodes train through the real ClientApp handler (``train_handler``), each node keeping its
store as the ClientApp keeps it in ``Context.state``. In sync mode both runtimes are
deterministic: after N rounds the loop's model is the simulator's, bit for bit, for
methods with client state (SCAFFOLD, Ditto, FedBN, FedDyn) and values beside the model
(SCAFFOLD's ``c``/``delta_c``, FedNova's ``tau``). Then the payload's encoding of those
values and its rejections, and the node's state store. The same on real SuperLink and
SuperNode processes: ``tests/distributed/test_flower_deployment.py``."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest
import torch
import yaml

from conftest import tiny_config
from fedgmr.algorithm.encoding import HEADER_BYTES, mask_code_nbytes, payload_nbytes
from fedgmr.errors import InvalidUpdateError
from fedgmr.experiment.build import build_experiment
from fedgmr.flower.adapter import Arrived as _Arrived  # the GridLink's reply record
from fedgmr.flower.client import load_run_config, load_state, save_state, train_handler
from fedgmr.flower.loop import BufferedServerLoop, LoopSettings
from fedgmr.flower.payload import (decode_extras, decode_instruction, decode_reply, encode_extras, encode_instruction,
                                   encode_reply)
from fedgmr.strategy.scaffold import ScaffoldControl
from fedgmr.training.extras import extra_names

_CNN = {"model": {"name": "cnn", "options": {}}}
ROUNDS = 3


class StateLink:
    """Each push trains at once through the real client handler; node ``i`` holds
    partition ``i`` and keeps its store between its messages (``Context.state``), unless
    ``forget`` (a node that loses its state after every message). ``mod`` may rewrite a
    reply's fields (a faulty client); ``seen`` keeps the state each job started from."""

    def __init__(self, run_config: Mapping[str, Any], forget: bool = False,
                 mod: Callable[[dict[str, Any], int], dict[str, Any]] | None = None) -> None:
        self.run_config = run_config
        self.forget = forget
        self.mod = mod
        self.stores: dict[int, dict[str, Any]] = {}
        self.seen: dict[int, list[dict[str, torch.Tensor]]] = {}
        self.replies: dict[str, _Arrived] = {}

    def push(self, node_id: int, fields: Mapping[str, Any], ttl: float, group: str) -> str:
        msg_id = uuid.uuid4().hex
        store = {} if self.forget else self.stores.setdefault(node_id, {})
        self.seen.setdefault(node_id, []).append(load_state(store, node_id))
        try:
            out = train_handler(fields, self.run_config, {"partition-id": node_id}, node_id, store)
            if self.mod is not None:
                out = self.mod(out, node_id)
            nbytes = sum(len(v) for v in out.values() if isinstance(v, bytes))
            self.replies[msg_id] = _Arrived(msg_id, node_id, out, None, nbytes)
        except Exception as exc:  # what Flower turns into an error reply
            self.replies[msg_id] = _Arrived(msg_id, node_id, {}, f"ClientApp raised {exc}", 0)
        return msg_id

    def pull(self, ids: list[str]) -> list[_Arrived]:
        return [self.replies.pop(i) for i in ids if i in self.replies]


def _run_config(tmp_path: Path, method: str, **extra: Any) -> dict[str, Any]:
    raw = tiny_config(method=method, clients={"num_clients": 4}, network={"model_size_mb": None},
                      run={"max_steps": ROUNDS, "eval_every": 1}, **extra)
    path = tmp_path / f"{method}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return {"config": str(path)}


def _simulate(run_config: dict[str, Any]) -> Any:
    exp = build_experiment(load_run_config(run_config))
    try:
        exp.simulator.run(ROUNDS)
        exp.simulator.finish()
    finally:
        exp.executor.close()
    return exp


def _flower(run_config: dict[str, Any], link: StateLink) -> tuple[BufferedServerLoop, Any]:
    cfg = load_run_config(run_config)
    exp = build_experiment(cfg)
    exp.executor.close()
    c = cfg.coordination
    settings = LoopSettings(max_steps=ROUNDS, mode=c.mode, trigger=c.trigger, k=c.k, slack=c.deadline_slack,
                            reply_timeout=600.0, step_timeout=600.0, eval_every=1,
                            check_interval=cfg.restoration.check_interval, poll_interval=0.001)
    workload = exp.simulator.executor.workload
    method = workload.client_method
    loop = BufferedServerLoop(exp.strategy, link, list(range(cfg.clients.num_clients)), exp.simulator.evaluator,
                              settings, workload.settings, cfg.seed,
                              client_extras=extra_names(getattr(method, "reply_extras", ())))
    loop.run()
    return loop, exp


@pytest.mark.parametrize("method, extra", [("fedavg", {}), ("scaffold", {}), ("ditto", {}), ("fedbn", _CNN),
                                           ("feddyn", {}), ("fednova", {}), ("heterofl", {}), ("fedrolex", {}),
                                           ("fjord", {}), ("fiarse", {})])
def test_sync_flower_rounds_equal_the_simulators_with_client_state_and_extras(tmp_path, method, extra):
    run_config = _run_config(tmp_path, method, **extra)
    cfg = load_run_config(run_config)
    assert cfg.coordination.mode == "sync"
    sim = _simulate(run_config)
    link = StateLink(run_config)
    loop, exp = _flower(run_config, link)
    assert exp.strategy.version == sim.strategy.version == ROUNDS
    assert exp.strategy.rejected == 0 and loop.stats.errors == 0, loop.stats.log
    assert torch.equal(exp.strategy.params, sim.strategy.params)
    assert exp.strategy.buffers.keys() == sim.strategy.buffers.keys()
    assert all(torch.equal(v, sim.strategy.buffers[k]) for k, v in exp.strategy.buffers.items())
    # every node's store holds exactly the state the simulator kept for that client
    states = sim.simulator.client_states
    for node in range(4):
        held = load_state(link.stores[node], node)
        assert held.keys() == states.get(node, {}).keys()
        assert all(torch.equal(v, states[node][k]) for k, v in held.items()), (method, node)
        assert all(not k.startswith("state.") or k.startswith(f"state.{node}.") for k in link.stores[node])
    if not sim.strategy.buffers:  # no buffers on the wire: the uplink is the simulator's bytes exactly
        assert loop.stats.bytes_up == sim.simulator.bytes_up
    if method == "scaffold":
        c = exp.strategy.plugin(ScaffoldControl).c
        assert torch.equal(c, sim.strategy.plugin(ScaffoldControl).c) and bool(c.abs().sum() > 0)


def test_scaffold_state_persists_between_a_clients_jobs_and_the_extras_arrive(tmp_path):
    run_config = _run_config(tmp_path, "scaffold")
    link = StateLink(run_config)
    loop, exp = _flower(run_config, link)
    numel = exp.strategy.space.numel
    for node, starts in link.seen.items():
        assert len(starts) == ROUNDS and starts[0] == {}  # first contact: no state yet
        # from its second job on, the client starts from the c_i its previous job left
        assert all(s["c_i"].abs().sum() > 0 and s["held"].all() for s in starts[1:]), node
        assert not torch.equal(starts[1]["c_i"], starts[2]["c_i"])
    assert bool(exp.strategy.plugin(ScaffoldControl).c.abs().sum() > 0)  # the replies' delta_c moved the server's c
    # c went down beside the model, delta_c came back beside the values: 4 bytes a value each way
    replies = loop.stats.replies
    assert loop.stats.bytes_up == replies * (HEADER_BYTES + 2 * 4 * numel) == replies * payload_nbytes(2 * numel)
    # (the download always carries the mask code: the simulator's count of a download whose mask changed)
    code = mask_code_nbytes(torch.ones(numel, dtype=torch.bool))
    assert loop.stats.bytes_down == loop.stats.downloads * payload_nbytes(2 * numel, code)
    # a node that forgets its state between messages (no Context.state) trains another model
    forgetful = StateLink(run_config, forget=True)
    _, other = _flower(run_config, forgetful)
    assert not torch.equal(other.strategy.params, exp.strategy.params)


def test_a_stateful_method_without_a_store_is_an_error_reply(tmp_path):
    run_config = _run_config(tmp_path, "ditto")
    exp = build_experiment(load_run_config(run_config))
    exp.executor.close()
    s = exp.strategy
    a = s.assign(0)
    fields = encode_instruction(0, a.version, 7, a.consumes, a.mask, s.params, s.buffers,
                                exp.simulator.executor.workload.settings)
    with pytest.raises(ValueError, match="keeps client state between jobs: train_handler needs a store"):
        train_handler(fields, run_config, {"partition-id": 0}, 0)


@pytest.mark.parametrize("fault, words", [
    ("nan", "'extra.delta_c' contains NaN or Inf"),
    ("short", "'extra.delta_c' holds"),
    ("missing", "'extra.delta_c' is missing"),
    ("unknown", "unexpected field 'extra.sneaky'"),
])
def test_a_scaffold_reply_with_bad_extras_is_rejected_and_never_moves_c(tmp_path, fault, words):
    def corrupt(fields: dict[str, Any], node: int) -> dict[str, Any]:
        if node != 1:
            return fields
        out = dict(fields)
        dc = out["extra.delta_c"]
        if fault == "nan":
            out["extra.delta_c"] = encode_extras({"x": torch.full((len(dc) // 4,), float("nan"))})["extra.x"]
        elif fault == "short":
            out["extra.delta_c"] = dc[:-4]
        elif fault == "missing":
            del out["extra.delta_c"]
        else:
            out["extra.sneaky"] = dc
        return out

    run_config = _run_config(tmp_path, "scaffold")
    loop, exp = _flower(run_config, StateLink(run_config, mod=corrupt))
    assert exp.strategy.rejected == ROUNDS  # node 1's every reply
    assert len(loop.stats.log) >= ROUNDS and all(words in line for line in loop.stats.log if "client 1" in line)
    assert all("client 1" in line for line in loop.stats.log if line.startswith("rejected"))
    assert bool(torch.isfinite(exp.strategy.plugin(ScaffoldControl).c).all()) and exp.strategy.version == ROUNDS


# ---------------------------------------------------------------------- the payload
@pytest.fixture
def scaffold(tmp_path):
    run_config = _run_config(tmp_path, "scaffold")
    exp = build_experiment(load_run_config(run_config))
    exp.executor.close()
    return exp.strategy, exp.simulator.executor.workload.settings


def _half(mask: torch.Tensor) -> torch.Tensor:
    out = mask.clone()
    out[::2] = False
    return out


def test_instruction_extras_travel_at_the_mask_and_round_trip_exactly(scaffold):
    s, settings = scaffold
    c = torch.randn(s.space.numel)
    mask = _half(torch.ones(s.space.numel, dtype=torch.bool))
    k = int(mask.sum())
    fields = encode_instruction(2, 0, 7, "model", mask, s.params, s.buffers, settings, extras={"c": c})
    assert len(fields["extra.c"]) == 4 * k  # the values at the mask, no header: 4 bytes a value
    ins = decode_instruction(fields, settings, s.space.numel, s.buffers, extras=("c",))
    assert torch.equal(ins.extras["c"][mask], c[mask]) and not ins.extras["c"][~mask].any()
    assert ins.upload_mask is None
    # a client method that reads no extras refuses one it was not built for, and one it needs must be there
    with pytest.raises(InvalidUpdateError, match="unexpected field 'extra.c'"):
        decode_instruction(fields, settings, s.space.numel, s.buffers)
    del fields["extra.c"]
    with pytest.raises(InvalidUpdateError, match="'extra.c' is missing"):
        decode_instruction(fields, settings, s.space.numel, s.buffers, extras=("c",))


@pytest.mark.parametrize("bad, words", [
    (lambda b: b[:-4], "holds"),  # one value short: the wrong shape
    (lambda b: b + bytes(4), "holds"),  # one too many
    (lambda b: b[:-1], "bytes of float32"),  # not whole values
    (lambda b: encode_extras({"c": torch.tensor([float("nan")] * (len(b) // 4))})["extra.c"], "NaN or Inf"),
    (lambda b: encode_extras({"c": torch.tensor([float("inf")] * (len(b) // 4))})["extra.c"], "NaN or Inf"),
    (lambda b: list(b[:8]), "bytes of float32"),
    (lambda b: None, "bytes of float32"),
])
def test_instruction_extras_that_are_malformed_are_rejected(scaffold, bad, words):
    s, settings = scaffold
    mask = torch.ones(s.space.numel, dtype=torch.bool)
    fields = encode_instruction(2, 0, 7, "model", mask, s.params, s.buffers, settings,
                                extras={"c": torch.randn(s.space.numel)})
    fields["extra.c"] = bad(fields["extra.c"])
    with pytest.raises(InvalidUpdateError, match=words):
        decode_instruction(fields, settings, s.space.numel, s.buffers, extras=("c",))


def test_an_upload_mask_travels_and_must_lie_inside_the_mask(scaffold):
    s, settings = scaffold
    mask = _half(torch.ones(s.space.numel, dtype=torch.bool))
    up = mask.clone()
    up[torch.nonzero(up)[:3, 0]] = False
    fields = encode_instruction(2, 0, 7, "model", mask, s.params, s.buffers, settings, upload_mask=up)
    assert torch.equal(decode_instruction(fields, settings, s.space.numel, s.buffers).upload_mask, up)
    outside = encode_instruction(2, 0, 7, "model", mask, s.params, s.buffers, settings, upload_mask=~mask)
    with pytest.raises(InvalidUpdateError, match="outside the mask"):
        decode_instruction(outside, settings, s.space.numel, s.buffers)


def test_reply_extras_round_trip_at_the_values_and_beside_them(scaffold):
    s, settings = scaffold
    mask = _half(torch.ones(s.space.numel, dtype=torch.bool))
    k = int(mask.sum())
    values, dc, tau = torch.randn(k), torch.randn(k), torch.tensor([7.0])
    fields = encode_reply(2, 0, mask, values, s.buffers, 10, 0.5, extras={"delta_c": dc, "tau": tau})
    assert len(fields["extra.delta_c"]) == 4 * k and len(fields["extra.tau"]) == 4
    reply = decode_reply(fields, s.space.numel, "model", s.buffers, assigned=mask, extras=("delta_c",),
                         loose=("tau",), loose_total=1)
    assert torch.equal(reply.values, values) and torch.equal(reply.extras["delta_c"], dc)
    assert torch.equal(reply.extras["tau"], tau)
    # the server declares what comes back: anything else is a rejection
    with pytest.raises(InvalidUpdateError, match="unexpected field 'extra.tau'"):
        decode_reply(fields, s.space.numel, "model", s.buffers, assigned=mask, extras=("delta_c",))
    with pytest.raises(InvalidUpdateError, match="declared 2"):
        decode_reply(fields, s.space.numel, "model", s.buffers, assigned=mask, extras=("delta_c",),
                     loose=("tau",), loose_total=2)
    plain = encode_reply(2, 0, mask, values, s.buffers, 10, 0.5)
    with pytest.raises(InvalidUpdateError, match="'extra.delta_c' is missing"):
        decode_reply(plain, s.space.numel, "model", s.buffers, assigned=mask, extras=("delta_c",))
    with pytest.raises(InvalidUpdateError, match="declared 1"):  # a declared scalar left out
        decode_reply(plain, s.space.numel, "model", s.buffers, assigned=mask, loose=("tau",), loose_total=1)


@pytest.mark.parametrize("bad, words", [
    ("wrong shape", "holds"), ("nan", "NaN or Inf"), ("inf", "NaN or Inf"), ("not bytes", "bytes of float32"),
])
def test_reply_extras_that_are_malformed_are_rejected(scaffold, bad, words):
    s, settings = scaffold
    mask = torch.ones(s.space.numel, dtype=torch.bool)
    k = s.space.numel
    dc = {"wrong shape": torch.randn(k - 1), "nan": torch.full((k,), float("nan")),
          "inf": torch.full((k,), float("-inf")), "not bytes": torch.randn(k)}[bad]
    fields = encode_reply(2, 0, mask, torch.randn(k), s.buffers, 10, 0.5, extras={"delta_c": dc})
    if bad == "not bytes":
        fields["extra.delta_c"] = "delta"
    with pytest.raises(InvalidUpdateError, match=words):
        decode_reply(fields, s.space.numel, "model", s.buffers, assigned=mask, extras=("delta_c",))


def test_decode_extras_checks_counts_before_it_allocates():
    big = {"extra.x": bytes(4 * 10)}
    with pytest.raises(InvalidUpdateError, match="declared 3"):
        decode_extras(big, {}, "the server", loose=("x",), loose_total=3)
    assert decode_extras({}, {}, "the server") == {}


# ---------------------------------------------------------------------- the node's store
def test_the_store_keeps_each_partitions_state_apart_and_exact():
    store: dict[str, Any] = {}
    a = {"c_i": torch.randn(5), "held": torch.tensor([True, False, True, True, False]),
         "buf/bn.num_batches_tracked": torch.tensor(3), "v": torch.randn(2, 3, dtype=torch.float64)}
    b = {"h_i": torch.randn(4)}
    save_state(store, 0, a)
    save_state(store, 1, b)
    assert all(isinstance(v, (bytes, str, list)) for v in store.values())  # what a ConfigRecord holds
    got = load_state(store, 0)
    assert got.keys() == a.keys() and all(torch.equal(got[k], v) and got[k].dtype == v.dtype for k, v in a.items())
    assert load_state(store, 1).keys() == {"h_i"} and load_state(store, 2) == {}
    save_state(store, 0, {"c_i": torch.zeros(5)})  # a new state replaces the old one whole
    assert load_state(store, 0).keys() == {"c_i"} and load_state(store, 1).keys() == {"h_i"}


def test_the_client_app_keeps_the_store_in_context_state_and_only_after_a_job_finished(monkeypatch):
    """The ClientApp's glue (fedgmr.flower.adapter): the handler's store lives in
    ``Context.state`` between messages (what the SuperNode keeps and hands to each ClientApp
    process: tests/distributed/test_flower_deployment.py runs it across processes), and a
    message whose handler raises leaves it as it was."""
    pytest.importorskip("flwr", reason="Flower is not installed: pip install 'fedgmr[flower]'")
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedgmr.flower.adapter import STATE_RECORD, content_of, fields_of, make_client_app

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # what a ClientApp process sets
        monkeypatch.setattr(TaskIdentity, name, value)

    def train(fields: Mapping[str, Any], run_config: Any, node_config: Any, node_id: int,
              store: dict[str, Any]) -> dict[str, Any]:
        store["jobs"] = store.get("jobs", 0) + 1
        if fields.get("fail"):
            store["half-written"] = b"x"
            raise RuntimeError("the job failed")
        return {"jobs": store["jobs"]}

    app = make_client_app(train)
    context = Context(run_id=1, node_id=5, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    seen = []
    for fields in ({}, {}, {"fail": True}, {}):
        try:
            seen.append(fields_of(app(Message(content_of(fields), dst_node_id=5, message_type="train"), context)))
        except RuntimeError:
            seen.append("raised")
        held = context.state[STATE_RECORD]
        assert isinstance(held, ConfigRecord) and "half-written" not in held
    assert seen == [{"jobs": 1}, {"jobs": 2}, "raised", {"jobs": 3}]
