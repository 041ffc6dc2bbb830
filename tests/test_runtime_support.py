"""The one runtime table (fedgmr.runtime_support): each row refuses the configurations it
names on the runtimes it names, in one line; the simulator runs every method; the docs
list every row; the Flower ServerApp refuses through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import tiny_config
from fedgmr.errors import ConfigError
from fedgmr.methods import METHODS, resolve_config
from fedgmr.runtime_support import RUNTIME_RULES, check_runtime, refusal

DOCS = Path(__file__).resolve().parents[1] / "docs" / "distributed.md"

_RN = {"model": {"name": "rep_cnn", "options": {"channels": [4, 8], "hidden": 16}}}
_PROXY = {"distill": {"proxy": {"name": "digits"}}}
#: what each method needs besides the tiny config to resolve
_EXTRA = {"fedbn": {"model": {"name": "cnn", "options": {}}}, "fedmrl": _RN, "standalone": _RN,
          "feddf": _PROXY, "fedgmr_df": _PROXY, "fedmd": _PROXY,
          **{m: {"run": {"max_time": 300.0, "eval_every": 2}} for m in
             ("fedgmr_deadline", "fedgmr_floor_deadline", "fedgmr_fixed_time")}}


def _cfg(method: str, **extra):
    return resolve_config(tiny_config(method=method, **{**_EXTRA.get(method, {}), **extra}))


@pytest.mark.parametrize("method, rule, words", [
    ("ifca", "clustering", "clustering.kind 'ifca' sends per-cluster models"),
    ("cfl", "clustering", "clustering.kind 'cfl' sends per-cluster models"),
    ("fedmd", "client models only", "local.algorithm 'fedmd' trains no global model"),
    ("local_only", "client models only", "local.algorithm 'local_sgd' trains no global model"),
    ("standalone", "client models only", "local.algorithm 'standalone' trains no global model"),
])
def test_each_row_refuses_what_it_names_on_flower_only(method: str, rule: str, words: str):
    cfg = _cfg(method)
    why = refusal(cfg, "flower")
    assert why is not None and why.startswith(words) and "\n" not in why
    assert why.endswith("run it in the simulator (fedgmr run)")
    assert refusal(cfg, "simulator") is None
    with pytest.raises(ConfigError, match=words):
        check_runtime(cfg, "flower")


def test_client_sampling_is_refused_and_every_client_at_work_is_not():
    assert "clients.concurrency 2 samples clients per round" in refusal(
        _cfg("fedgmr", clients={"num_clients": 4, "concurrency": 2}), "flower")
    assert refusal(_cfg("fedgmr", clients={"num_clients": 4, "concurrency": 4}), "flower") is None


def test_the_simulator_runs_every_method_and_flower_runs_fedgmr_the_baselines_and_client_state():
    refused = {m: refusal(_cfg(m), "flower") for m in METHODS.names()}
    assert all(refusal(_cfg(m), "simulator") is None for m in METHODS.names())
    runs = {m for m, why in refused.items() if why is None}
    assert {"fedgmr", "fedavg", "fedasync", "fedprox", "heterofl", "fedrolex", "fjord", "fiarse"} <= runs
    # client state (kept on the node) and values beside the model (in the payload) run on Flower
    assert {"scaffold", "ditto", "fedbn", "feddyn", "fednova", "fedmrl"} <= runs
    # exactly the rows of the docs' table (docs/distributed.md, "What runs where")
    assert set(refused) - runs == {"cfl", "fedmd", "ifca", "local_only", "standalone"}


def test_unknown_runtime_is_an_error():
    with pytest.raises(ValueError, match="unknown runtime 'ray'"):
        refusal(_cfg("fedgmr"), "ray")


def test_the_docs_list_every_row_and_the_server_app_refuses_through_the_table(monkeypatch):
    text = DOCS.read_text()
    for rule in RUNTIME_RULES:
        assert f"| {rule.name} |" in text, rule.name
    from fedgmr import runtime_support
    from fedgmr.flower.server_app import refuse_client_state

    seen = []
    monkeypatch.setattr(runtime_support, "check_runtime", lambda cfg, rt: seen.append(rt))
    refuse_client_state(_cfg("scaffold"))
    assert seen == ["flower"]
