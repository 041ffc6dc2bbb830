"""FedDyn (fedgmr/baselines/feddyn.py): the client and server state updates as hand-computed
vectors, a run from the command line, an exact resume with h and h_i in the checkpoint,
and the refused configurations."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml

from conftest import run_cli, tiny_config
from fedgmr.algorithm.aggregation import RULES
from fedgmr.algorithm.params import get_buffers
from fedgmr.algorithm.policies import FullModelPolicy
from fedgmr.algorithm.restoration import DensityLadder
from fedgmr.algorithm.staleness import make_staleness
from fedgmr.baselines.feddyn import (FedDynClient, FedDynState, feddyn_client_state, feddyn_server_model,
                                     feddyn_server_state)
from fedgmr.errors import ConfigError
from fedgmr.experiment.build import build_experiment
from fedgmr.experiment.runner import run_experiment
from fedgmr.methods import METHODS, resolve_config
from fedgmr.sim.executor import ClientWorkload, TrainJob
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.messages import Reply
from fedgmr.training.client_methods import CLIENT_METHODS, client_method
from fedgmr.training.local import TrainSettings

T = torch.tensor


# ------------------------------------------------------------------ the math, by hand
def test_client_state_update_by_hand():
    h = T([1.0, -2.0])
    trained, received = T([0.5, 1.0]), T([0.0, 2.0])
    # h_i - alpha (w_i - w_server) = [1, -2] - 0.5 [0.5, -1]
    assert torch.equal(feddyn_client_state(h, trained, received, 0.5), T([0.75, -1.5]))
    # on a mask: coordinates off it keep h_i
    assert torch.equal(feddyn_client_state(h, trained, received, 0.5, T([True, False])), T([0.75, -2.0]))


def test_server_state_and_model_by_hand():
    h, received = T([0.2, 0.0]), T([1.0, 1.0])
    models = [T([2.0, 1.0]), T([1.0, 3.0])]
    # sum (w_i - w) = [1, 2]; h - 0.5 * [1, 2] / 4 (m = 4 clients, 2 took part)
    h_new = feddyn_server_state(h, received, models, 0.5, 4)
    assert torch.allclose(h_new, T([0.075, -0.25]), atol=1e-7, rtol=0)
    # mean [1.5, 2] - h_new / 0.5
    assert torch.allclose(feddyn_server_model(T([1.5, 2.0]), h_new, 0.5), T([1.35, 2.5]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError):
        feddyn_server_state(h, received, models, 0.0, 4)


# ------------------------------------------------------------------ the client on a quadratic
def _zero_input_workload(alpha: float, steps: int, lr: float = 0.5) -> ClientWorkload:
    """A bias-free linear model on all-zero inputs: the data loss has zero gradient, so the
    local objective is FedDyn's quadratic -<h_i, w> + alpha/2 ||w - w_server||^2 alone."""
    x, y = torch.zeros(8, 2), torch.tensor([0, 1] * 4)
    settings = TrainSettings(lr=lr, batch_size=4, local_steps=steps)
    return ClientWorkload(lambda: nn.Linear(2, 2, bias=False), [(x, y)], [(x[:0], y[:0])], settings,
                          client_method=FedDynClient(alpha=alpha))


def test_client_trains_on_the_dynamic_regulariser_by_hand():
    """e_k = w_k - w_server: e_{k+1} = (1 - lr alpha) e_k + lr h_i, e_0 = 0, so with lr = 0.5,
    alpha = 0.2: e_1 = 0.5 h_i, e_2 = 0.5 h_i (2 - 0.1) = 0.95 h_i; h_i+ = h_i - 0.2 e_2 = 0.81 h_i."""
    wl = _zero_input_workload(alpha=0.2, steps=2)
    server = T([0.1, 0.2, 0.3, 0.4])
    h = T([1.0, -2.0, 0.5, 4.0])
    job = TrainJob(0, 0, 7, server, {}, None, state={"h_i": h})
    res = wl.client_method.train(wl, job, *wl.client_data[0], None)
    assert torch.allclose(res.outcome.params, server + 0.95 * h, atol=1e-6, rtol=0)
    assert torch.allclose(res.state["h_i"], 0.81 * h, atol=1e-6, rtol=0)
    # the first job starts from h_i = 0: nothing pulls w away from the model received
    first = wl.client_method.train(wl, TrainJob(0, 0, 7, server, {}, None), *wl.client_data[0], None)
    assert torch.equal(first.outcome.params, server) and torch.equal(first.state["h_i"], torch.zeros(4))


def test_client_converges_to_the_stationary_point_where_h_i_vanishes():
    """The minimiser of the quadratic is w* = w_server + h_i / alpha, and there h_i+ = 0."""
    wl = _zero_input_workload(alpha=0.5, steps=200, lr=0.5)
    server, h = T([0.1, 0.2, 0.3, 0.4]), T([1.0, -2.0, 0.5, 4.0])
    res = wl.client_method.train(wl, TrainJob(0, 0, 7, server, {}, None, state={"h_i": h}),
                                 *wl.client_data[0], None)
    assert torch.allclose(res.outcome.params, server + h / 0.5, atol=1e-5, rtol=0)
    assert torch.allclose(res.state["h_i"], torch.zeros(4), atol=1e-5, rtol=0)


# ------------------------------------------------------------------ the server strategy, by hand
def _strategy(n: int = 4, alpha: float = 0.5, start=(1.0, 1.0)) -> MaskedBufferedStrategy:
    model = nn.Linear(2, 1, bias=False)
    from fedgmr.algorithm.params import ParamSpace

    space = ParamSpace(model)
    return MaskedBufferedStrategy(space, T(list(start)), get_buffers(model), FullModelPolicy(space),
                                  DensityLadder((1.0,), [0] * n), RULES.get("ma"), make_staleness("constant"),
                                  "equal", False, plugins=[FedDynState(alpha)])


def _h(s: MaskedBufferedStrategy) -> torch.Tensor:
    return s.plugin(FedDynState).h


def test_server_rounds_by_hand_and_checkpoint_round_trip():
    s = _strategy()
    # round 1: clients 0, 1 of m = 4; h = 0 - 0.5 [1, 2] / 4 = [-0.125, -0.25]; w = [1.5, 2] - h / 0.5
    s.assign(0), s.assign(1)
    assert s.receive(Reply(0, 0, T([2.0, 1.0]), 10)) and s.receive(Reply(1, 0, T([1.0, 3.0]), 30))
    s.aggregate()
    assert torch.allclose(_h(s), T([-0.125, -0.25]), atol=1e-7, rtol=0)
    assert torch.allclose(s.params, T([1.75, 2.5]), atol=1e-6, rtol=0)
    # round 2: clients 2, 3 move by [1, 0] and [-1, 2]: h = h - 0.5 [0, 2] / 4; w = [1.75, 3.5] - h / 0.5
    s.assign(2), s.assign(3)
    w = s.params.clone()
    assert s.receive(Reply(2, 1, w + T([1.0, 0.0]), 10)) and s.receive(Reply(3, 1, w + T([-1.0, 2.0]), 10))
    s.aggregate()
    assert torch.allclose(_h(s), T([-0.125, -0.5]), atol=1e-7, rtol=0)
    assert torch.allclose(s.params, T([2.0, 4.5]), atol=1e-6, rtol=0)
    # h is part of the strategy's checkpoint
    state, tensors = s.state_dict()
    other = _strategy()
    other.load_state_dict(state, {k: v.clone() for k, v in tensors.items()})
    assert torch.equal(_h(other), _h(s)) and torch.equal(other.params, s.params)


def test_a_round_whose_model_is_not_finite_leaves_h_alone():
    s = _strategy(n=1)
    s.assign(0)
    s.receive(Reply(0, 0, T([3.0e38, 1.0]), 10))
    s.plugin(FedDynState).alpha = 1e-30  # mean - h / alpha = 3e38 + 3e38 overflows float32: the model and h are both kept
    s.aggregate()
    assert torch.equal(_h(s), torch.zeros(2)) and torch.equal(s.params, T([1.0, 1.0]))


# ------------------------------------------------------------------ registration, config, refusals
def test_registered_like_a_plugin_with_its_option():
    assert "feddyn" in METHODS and "feddyn" in CLIENT_METHODS
    cfg = resolve_config(tiny_config(method="feddyn", local={"options": {"alpha": 0.3}}))
    assert cfg.local.algorithm == "feddyn" and cfg.aggregation.weighting == "equal"
    assert client_method(cfg.local) == FedDynClient(0.0, 0.3)
    assert client_method(resolve_config(tiny_config(method="feddyn")).local).alpha == 0.01  # the paper's default


@pytest.mark.parametrize("alpha", [0, -0.1, float("nan"), True, "big"])
def test_alpha_at_most_zero_is_refused_in_one_line(alpha):
    with pytest.raises(ConfigError, match=r"^invalid value for 'local.options.alpha': FedDyn's alpha must be a "
                                          r"number > 0 \(got .*\)$"):
        resolve_config(tiny_config(method="feddyn", local={"options": {"alpha": alpha}}))


@pytest.mark.parametrize("sections, match", [
    ({"method": "feddyn", "local": {"options": {"beta": 1}}},
     r"unknown option 'beta' for client algorithm 'feddyn' in 'local.options' \(accepted: alpha\)"),
    ({"method": "fedavg", "local": {"options": {"alpha": 1}}},
     r"unknown option 'alpha' for client algorithm 'sgd' in 'local.options' \(accepted: none\)"),
])
def test_unknown_options_are_refused(sections, match):
    with pytest.raises(ConfigError, match=match):
        resolve_config(tiny_config(**sections))


@pytest.mark.parametrize("sections, match", [
    ({"method": "fedgmr_wo_asyn", "local": {"algorithm": "feddyn"}}, "masked sub-models are not supported"),
    ({"method": "fedgmr", "local": {"algorithm": "feddyn"}, "submodel": {"policy": "full"},
      "restoration": {"trigger": "none"}}, "synchronous-only"),
])
def test_masks_and_asynchrony_are_refused_when_the_run_is_built(sections, match):
    with pytest.raises(ConfigError, match=match) as err:
        build_experiment(resolve_config(tiny_config(**sections))).executor.close()
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ whole runs
def test_cli_run_keeps_h_and_each_h_i_in_its_checkpoint(tmp_path: Path):
    from safetensors.torch import load_file

    cfg = tiny_config(method="feddyn", local={"options": {"alpha": 0.1}},
                      run={"max_steps": 2, "eval_every": 1, "checkpoint_every": 1})
    (tmp_path / "feddyn.yaml").write_text(yaml.safe_dump(cfg))
    res = run_cli(["run", "feddyn.yaml", "--out", "run", "-q"], tmp_path)
    assert res.returncode == 0, res.stderr
    saved = load_file(tmp_path / "run" / "checkpoint" / "state.safetensors")
    assert bool((saved["strategy/feddyn/h"] != 0).any())  # the server state moved after a round
    states = [saved[f"sim/client/{c}/h_i"] for c in range(10)]  # every client took part (no sampling)
    assert all(bool((h != 0).any()) for h in states)


def test_process_pool_matches_serial_and_flower_runs_it():
    from conftest import simulate
    from fedgmr.flower.server_app import refuse_client_state

    raw = tiny_config(method="feddyn", local={"options": {"alpha": 0.1}}, run={"max_steps": 2, "eval_every": 1})
    serial, exp_s = simulate(raw)
    pool, exp_p = simulate({**raw, "run": {**raw["run"], "executor": "process", "workers": 1}})
    assert serial == pool and torch.equal(_h(exp_s.strategy), _h(exp_p.strategy))
    refuse_client_state(resolve_config(raw))  # h_i stays on the node under Flower: not refused


def test_resume_is_exact_with_h_and_h_i(tmp_path: Path):
    cfg = resolve_config(tiny_config(method="feddyn", local={"options": {"alpha": 0.1}},
                                     clients={"concurrency": 4},  # sampled rounds: h_i of idle clients wait
                                     run={"max_steps": 6, "eval_every": 1, "checkpoint_every": 2}))
    out, ref = tmp_path / "killed", tmp_path / "ref"
    assert run_experiment(cfg, out, stop_after_steps=3)["interrupted"]
    run_experiment(cfg, out, resume=True)
    run_experiment(cfg, ref)
    assert (out / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()
