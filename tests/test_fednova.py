"""FedNova (fedgmr/baselines/fednova.py): the normalised server step as hand-computed
vectors, tau_i reported by the client and checked by the server, a run from the command
line, an exact resume, and the refused configurations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml

from conftest import run_cli, simulate, tiny_config
from fedgmr.algorithm.aggregation import RULES
from fedgmr.algorithm.local_rules import straggler_steps
from fedgmr.algorithm.params import ParamSpace, get_buffers
from fedgmr.algorithm.policies import FullModelPolicy
from fedgmr.algorithm.restoration import DensityLadder
from fedgmr.algorithm.staleness import make_staleness
from fedgmr.baselines.fednova import FedNovaClient, FedNovaStep, fednova_server_model
from fedgmr.errors import ConfigError
from fedgmr.experiment.build import build_experiment
from fedgmr.experiment.runner import run_experiment
from fedgmr.methods import METHODS, resolve_config
from fedgmr.sim.executor import ClientWorkload, TrainJob
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.messages import Reply
from fedgmr.training.client_methods import CLIENT_METHODS
from fedgmr.training.local import TrainSettings

T = torch.tensor


def test_server_step_by_hand():
    """w = [1, 1]; client 0: n = 10, tau = 2, w_0 = [3, 1]; client 1: n = 30, tau = 4, w_1 = [1, 5].
    p = [0.25, 0.75], tau_eff = 0.5 + 3 = 3.5, d_0 = [-1, 0], d_1 = [0, -1],
    w+ = [1, 1] - 3.5 [-0.25, -0.75] = [1.875, 3.625] (FedAvg: [1.5, 4])."""
    new = fednova_server_model(T([1.0, 1.0]), [T([3.0, 1.0]), T([1.0, 5.0])], [2.0, 4.0], [10.0, 30.0])
    assert torch.allclose(new, T([1.875, 3.625]), atol=1e-6, rtol=0)
    # equal steps: FedAvg's sample-weighted mean
    same = fednova_server_model(T([1.0, 1.0]), [T([3.0, 1.0]), T([1.0, 5.0])], [3.0, 3.0], [10.0, 30.0])
    assert torch.allclose(same, T([1.5, 4.0]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError):
        fednova_server_model(T([1.0]), [T([2.0])], [0.0], [1.0])


def _strategy(n: int = 2, max_tau: int = 4) -> MaskedBufferedStrategy:
    model = nn.Linear(2, 1, bias=False)
    space = ParamSpace(model)
    return MaskedBufferedStrategy(space, T([1.0, 1.0]), get_buffers(model), FullModelPolicy(space),
                                  DensityLadder((1.0,), [0] * n), RULES.get("ma"), make_staleness("constant"),
                                  "samples", False, plugins=[FedNovaStep(max_tau)])


def _reply(c: int, values, n: int, tau) -> Reply:
    extras = {} if tau is None else {"tau": T([float(tau)])}
    return Reply(c, 0, T(values), n, extras=extras)


def test_strategy_applies_the_normalised_step_and_checks_tau():
    s = _strategy()
    a = s.assign(0)
    assert a.wire.reply_plain == 1  # tau travels as one float32 beside the values
    s.assign(1)
    assert s.receive(_reply(0, [3.0, 1.0], 10, 2)) and s.receive(_reply(1, [1.0, 5.0], 30, 4))
    state, tensors = s.state_dict()  # a checkpoint between the replies and the aggregation keeps the taus
    other = _strategy()
    other.load_state_dict(state, {k: v.clone() for k, v in tensors.items()})
    for strat in (s, other):
        strat.aggregate()
        assert torch.allclose(strat.params, T([1.875, 3.625]), atol=1e-6, rtol=0)
    assert s.plugin(FedNovaStep)._taus == {} and s.version == 1


@pytest.mark.parametrize("tau", [None, 0, 5, 2.5, float("nan")])
def test_a_reply_without_a_valid_tau_is_rejected(tau):
    s = _strategy(max_tau=4)
    s.assign(0)
    assert not s.receive(_reply(0, [3.0, 1.0], 10, tau))
    assert s.rejected == 1 and s.arrivals == []


def test_client_reports_the_steps_it_took():
    x, y = torch.randn(16, 2), torch.tensor([0, 1] * 8)
    for stragglers, seed in ((0.0, 3), (1.0, 11)):
        wl = ClientWorkload(lambda: nn.Linear(2, 2), [(x, y)], [(x[:0], y[:0])],
                            TrainSettings(lr=0.1, batch_size=4, local_steps=4), client_method=FedNovaClient(stragglers))
        start = wl.space.flatten(wl.model)
        res = wl.run(TrainJob(0, 0, seed, start, {}, None))
        steps = straggler_steps(seed, stragglers, 4)
        assert stragglers == 0.0 or steps < 4  # the straggler case shows a shorter job
        assert torch.equal(res.extras["tau"], T([float(steps)])) and res.num_processed == steps * 4


def test_registered_and_refusals():
    from fedgmr.flower.server_app import refuse_client_state

    assert "fednova" in METHODS and "fednova" in CLIENT_METHODS
    refuse_client_state(resolve_config(tiny_config(method="fednova")))  # tau_i travels beside the values on Flower
    with pytest.raises(ConfigError, match=r"unknown option 'alpha' for client algorithm 'fednova'"):
        resolve_config(tiny_config(method="fednova", local={"options": {"alpha": 1}}))
    for sections, match in (({"method": "fednova", "training": {"momentum": 0.9}}, "training.momentum: 0"),
                            ({"method": "fedgmr_wo_asyn", "local": {"algorithm": "fednova"}}, "masked sub-models")):
        with pytest.raises(ConfigError, match=match):
            build_experiment(resolve_config(tiny_config(**sections))).executor.close()


def test_without_stragglers_fednova_is_fedavg_and_with_them_it_is_not():
    run = {"max_steps": 3, "eval_every": 1}
    avg, _ = simulate(tiny_config(method="fedavg", run=run))
    nova, _ = simulate(tiny_config(method="fednova", run=run))
    acc = lambda rs: [r["accuracy"] for r in rs]  # noqa: E731
    assert acc(nova) == pytest.approx(acc(avg), abs=1e-6)
    # tau_i travels: 4 more bytes per upload
    assert nova[-1]["bytes_up"] > avg[-1]["bytes_up"]
    avg_s, _ = simulate(tiny_config(method="fedavg", local={"stragglers": 0.8}, run=run))
    nova_s, _ = simulate(tiny_config(method="fednova", local={"stragglers": 0.8}, run=run))
    assert acc(nova_s) != acc(avg_s)


def test_cli_run_and_exact_resume(tmp_path: Path):
    cfg = tiny_config(method="fednova", local={"stragglers": 0.5}, run={"max_steps": 2, "eval_every": 1})
    (tmp_path / "fednova.yaml").write_text(yaml.safe_dump(cfg))
    res = run_cli(["run", "fednova.yaml", "--out", "run", "-q"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["method"] == "fednova"
    rc = resolve_config(tiny_config(method="fednova", local={"stragglers": 0.5}, clients={"concurrency": 4},
                                    run={"max_steps": 6, "eval_every": 1, "checkpoint_every": 2}))
    out, ref = tmp_path / "killed", tmp_path / "ref"
    assert run_experiment(rc, out, stop_after_steps=3)["interrupted"]
    run_experiment(rc, out, resume=True)
    run_experiment(rc, ref)
    assert (out / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()
