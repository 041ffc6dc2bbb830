"""Reply extras declared by the client method (fedgmr/training/extras.py): the schema's
checks and messages, its merge, and one rejection reaching the same line on both runtimes
(the simulator and the Flower loop call the same strategy validation)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import yaml

from conftest import tiny_config
from fedgmr.algorithm.aggregation import RULES
from fedgmr.algorithm.params import ParamSpace, get_buffers
from fedgmr.algorithm.policies import FullModelPolicy
from fedgmr.algorithm.restoration import DensityLadder
from fedgmr.algorithm.staleness import make_staleness
from fedgmr.baselines.fednova import FedNovaClient
from fedgmr.errors import ConfigError, InvalidUpdateError
from fedgmr.strategy.compose import ServerPart, compose_strategy
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.messages import Reply
from fedgmr.training.client_methods import ScaffoldClient
from fedgmr.training.extras import ExtraSpec, extra_names, merge_schemas, validate_extras
from fedgmr.training.fedmd import FedMDClient

T = torch.tensor
DC = ScaffoldClient.reply_extras


def test_the_schema_checks_length_dtype_and_finiteness_with_the_specs_messages():
    ok = validate_extras(DC, {"delta_c": T([1.0, 2.0], dtype=torch.float64)}, 2, 0)
    assert ok["delta_c"].dtype == torch.float32 and ok["delta_c"].tolist() == [1.0, 2.0]
    needs = "a SCAFFOLD reply needs delta_c: one float per coordinate of its values (2)"
    for bad in ({}, {"delta_c": T([1.0])}, {"delta_c": T([1, 2])}, {"delta_c": T([[1.0, 2.0]])}, "no dict"):
        with pytest.raises(InvalidUpdateError, match=f"^{needs.replace('(', '[(]').replace(')', '[)]')}$"):
            validate_extras(DC, bad, 2, 0)
    with pytest.raises(InvalidUpdateError, match="^delta_c contains NaN or Inf$"):
        validate_extras(DC, {"delta_c": T([1.0, float("nan")])}, 2, 0)
    # checked as the server keeps it: 1e300 is finite in float64, Inf in float32
    with pytest.raises(InvalidUpdateError, match="NaN or Inf"):
        validate_extras(DC, {"delta_c": T([1.0, 1e300], dtype=torch.float64)}, 2, 0)
    # a "whole" extra takes its length from the assignment's reply_plain
    logits = FedMDClient.reply_extras
    assert validate_extras(logits, {"logits": torch.zeros(6)}, 99, 6)["logits"].shape == (6,)
    with pytest.raises(InvalidUpdateError, match="^a FedMD reply needs 6 finite logits$"):
        validate_extras(logits, {"logits": torch.zeros(5)}, 99, 6)
    # FedNova's tau: any shape holding one value; the range is the server's own check
    tau = FedNovaClient.reply_extras
    assert validate_extras(tau, {"tau": T([[3.0]])}, 9, 1)["tau"].item() == 3.0
    # names the schema does not declare are ignored (the Flower decoder refuses them on the wire)
    assert validate_extras((), {"anything": T([1.0])}, 1, 0) == {}


def test_a_spec_check_and_keeping_the_sent_dtype():
    def positive(t: torch.Tensor) -> str | None:
        return None if bool((t > 0).all()) else "w must be positive ({n} values)"

    spec = (ExtraSpec("w", "values", "a reply needs w ({n})", dtype=None, check=positive),)
    assert validate_extras(spec, {"w": T([1.0], dtype=torch.float64)}, 1, 0)["w"].dtype == torch.float64
    with pytest.raises(InvalidUpdateError, match=r"^w must be positive \(1 values\)$"):
        validate_extras(spec, {"w": T([-1.0])}, 1, 0)


def test_schemas_merge_once_and_refuse_two_different_declarations():
    assert merge_schemas(DC, DC, FedMDClient.reply_extras) == DC + FedMDClient.reply_extras
    assert extra_names(merge_schemas(DC, FedNovaClient.reply_extras)) == ("delta_c", "tau")
    other = (dataclasses.replace(DC[0], needs="another message"),)
    with pytest.raises(ValueError, match="two declarations of the reply extra 'delta_c' differ"):
        merge_schemas(DC, other)
    with pytest.raises(ValueError, match="at most one may be"):
        merge_schemas(FedMDClient.reply_extras, FedNovaClient.reply_extras)
    # composed from the parts that declare them; a clash is one line naming the parts
    cls, kwargs = compose_strategy([ServerPart("local.algorithm 'scaffold'", reply_extras=DC)])
    assert cls is MaskedBufferedStrategy and kwargs == {"reply_extras": DC}
    with pytest.raises(ConfigError, match="^local.algorithm 'a', clustering.kind 'b': two declarations"):
        compose_strategy([ServerPart("local.algorithm 'a'", reply_extras=DC),
                          ServerPart("clustering.kind 'b'", reply_extras=other)])


def _plain(schema, n: int = 2) -> MaskedBufferedStrategy:
    model = nn.Linear(2, 1, bias=False)
    space = ParamSpace(model)
    return MaskedBufferedStrategy(space, T([1.0, 1.0]), get_buffers(model), FullModelPolicy(space),
                                  DensityLadder((1.0,), [0] * n), RULES.get("ma"), make_staleness("constant"),
                                  "samples", False, reply_extras=schema)


def test_the_base_strategy_rejects_a_reply_that_breaks_its_schema(caplog):
    s = _plain(DC)
    s.assign(0), s.assign(1)
    with caplog.at_level(logging.WARNING, logger="fedgmr.strategy.masked_buffered"):
        assert not s.receive(Reply(0, 0, T([2.0, 2.0]), 10, extras={"delta_c": T([1.0])}))
    assert s.rejected == 1 and caplog.messages == [
        "rejected update from client 0: a SCAFFOLD reply needs delta_c: one float per coordinate of its values (2)"]
    assert s.receive(Reply(1, 0, T([2.0, 2.0]), 10, extras={"delta_c": T([1.0, 1.0])}))
    assert s._incoming[1].extras["delta_c"].tolist() == [1.0, 1.0]
    # a strategy with no schema ignores extras, as before
    free = _plain(())
    free.assign(0)
    assert free.receive(Reply(0, 0, T([2.0, 2.0]), 10, extras={"delta_c": T([1.0])}))


# ---------------------------------------------------------------------- both runtimes
def _zero_tau_for_client_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """Client 1's FedNova replies report tau = 0 (a float the wire carries, outside the range)."""
    train = FedNovaClient.train

    def bad(self: FedNovaClient, workload: Any, job: Any, *args: Any) -> Any:
        res = train(self, workload, job, *args)
        return dataclasses.replace(res, raw_extras={"tau": T([0.0])}) if job.client_id == 1 else res

    monkeypatch.setattr(FedNovaClient, "train", bad)


WORDS = "rejected update from client 1: tau must be a whole number of local steps in [1, 2], got 0.0"


def test_a_bad_extra_is_rejected_with_the_same_line_in_the_simulator(monkeypatch, caplog):
    from conftest import simulate

    _zero_tau_for_client_1(monkeypatch)
    raw = tiny_config(method="fednova", clients={"num_clients": 4}, run={"max_steps": 2, "eval_every": 1})
    with caplog.at_level(logging.WARNING, logger="fedgmr.strategy.masked_buffered"):
        _, exp = simulate(raw)
    assert exp.strategy.version == 2 and exp.strategy.rejected == 2
    assert [m for m in caplog.messages if m.startswith("rejected")] == [WORDS, WORDS]


def test_a_bad_extra_is_rejected_with_the_same_line_in_the_flower_loop(monkeypatch, tmp_path: Path):
    from distributed.test_flower_client_state import StateLink, _flower

    import distributed.test_flower_client_state as flower_state

    _zero_tau_for_client_1(monkeypatch)
    monkeypatch.setattr(flower_state, "ROUNDS", 2)
    raw = tiny_config(method="fednova", clients={"num_clients": 4}, run={"max_steps": 2, "eval_every": 1})
    path = tmp_path / "fednova.yaml"
    path.write_text(yaml.safe_dump(raw))
    run_config = {"config": str(path)}
    loop, exp = _flower(run_config, StateLink(run_config))
    assert exp.strategy.version == 2 and exp.strategy.rejected == 2
    assert [line for line in loop.stats.log if line.startswith("rejected")] == [WORDS, WORDS]
