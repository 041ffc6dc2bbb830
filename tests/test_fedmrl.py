"""FedMRL (docs/methods/fedmrl.md) and standalone local training: exact vectors for the
forward, the summed loss and the server average of G; whole runs (payload bytes, compute
time, personalised evaluation); client state across executors and checkpoints; refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import simulate, tiny_config
from fedgmr.algorithm.aggregation import RULES
from fedgmr.algorithm.encoding import payload_nbytes
from fedgmr.algorithm.mrl import fuse, matryoshka_logits, mrl_loss
from fedgmr.algorithm.params import ParamSpace
from fedgmr.errors import ConfigError
from fedgmr.experiment.build import build_experiment
from fedgmr.experiment.runner import run_experiment
from fedgmr.methods import resolve_config
from fedgmr.training.fedmrl import MRLNet

MODEL = {"name": "rep_cnn", "options": {"channels": [4, 8], "hidden": 16}}


def _raw(method: str = "fedmrl", **sections) -> dict:
    run = {"max_steps": 4, "eval_every": 1, "personal_eval_every": 1, **sections.pop("run", {})}
    data = {"client_test_fraction": 0.2, **sections.pop("data", {})}
    return tiny_config(method=method, model=MODEL, fedmrl={"d1": 4, "d2": 8, **sections.pop("fedmrl", {})},
                       run=run, data=data, **sections)


def _linear(weight: list[list[float]], bias: list[float]) -> nn.Linear:
    layer = nn.Linear(len(weight[0]), len(weight))
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
        layer.bias.copy_(torch.tensor(bias))
    return layer


class _Tiny(nn.Module):
    """A representation model by hand: a linear extractor and a linear head."""

    def __init__(self, extractor: nn.Linear, head: nn.Linear) -> None:
        super().__init__()
        self.extractor, self.head = extractor, head


# ---------------------------------------------------------------------- exact vectors
def _hand_model() -> MRLNet:
    # x = [1]: r_G = 2 x = [2] (d1 = 1); r_F = [1, 3] x (d2 = 2)
    g = _Tiny(_linear([[2.0]], [0.0]), _linear([[1.0], [-1.0]], [0.0, 0.5]))
    f = _Tiny(_linear([[1.0], [3.0]], [0.0, 0.0]), _linear([[1.0, 0.0], [0.0, 2.0]], [0.0, 0.0]))
    # P [r_G; r_F] = [[1, 0, 1], [0, 1, -1]] [2, 1, 3] + [0, 0.5] = [5, -1.5]
    proj = _linear([[1.0, 0.0, 1.0], [0.0, 1.0, -1.0]], [0.0, 0.5])
    return MRLNet(g, f, proj, d1=1)


def test_forward_projects_the_concatenation_and_heads_read_nested_prefixes():
    net = _hand_model()
    x = torch.tensor([[1.0]])
    fused = fuse(net.g.extractor(x), net.f.extractor(x), net.projector)
    assert fused.tolist() == [[5.0, -1.5]]
    z_g, z_f = net.heads(x)
    assert z_g.tolist() == [[5.0, -4.5]]  # head_G reads the first d1 = 1 value: [5 * 1, 5 * -1 + 0.5]
    assert z_f.tolist() == [[5.0, -3.0]]  # head_F reads all of it: [5, 2 * -1.5]
    assert torch.equal(net(x), z_f)  # the personal prediction is F's head
    # the prefix is all G's head sees: changing the rest of the fused vector leaves z_G as it is
    g2, f2 = matryoshka_logits(torch.tensor([[5.0, 100.0]]), net.g.head, net.f.head, 1)
    assert torch.equal(g2, z_g) and not torch.equal(f2, z_f)


def test_loss_is_the_sum_of_both_heads_cross_entropies():
    net = _hand_model().double()  # float64: the losses below are small
    with torch.no_grad():
        z_g, z_f = net.heads(torch.tensor([[1.0]], dtype=torch.float64))
    y = torch.tensor([0])
    # CE(z, 0) = log(1 + exp(z_1 - z_0)): 9.5 and 8.0 apart
    expected = math.log1p(math.exp(-9.5)) + math.log1p(math.exp(-8.0))
    assert float(mrl_loss(z_g, z_f, y)) == pytest.approx(expected, rel=1e-12)
    y1 = torch.tensor([1])
    assert float(mrl_loss(z_g, z_f, y1)) == pytest.approx(math.log1p(math.exp(9.5)) + math.log1p(math.exp(8.0)),
                                                          rel=1e-12)


def test_d1_beyond_the_fused_representation_is_refused():
    with pytest.raises(ValueError, match="d1 must be in"):
        matryoshka_logits(torch.zeros(1, 2), nn.Linear(3, 2), nn.Linear(2, 2), 3)


def test_server_average_of_g_by_hand():
    """Only G travels; the server's FedAvg step on it: the sample-weighted mean."""
    ma = RULES.get("ma")
    full = torch.ones(2, dtype=torch.bool)
    new = ma(torch.zeros(2), [(full, torch.tensor([1.0, 2.0])), (full, torch.tensor([4.0, 8.0]))], [1.0, 3.0])
    assert new.tolist() == [3.25, 6.5]  # (1 * [1, 2] + 3 * [4, 8]) / 4


def test_server_averages_exactly_the_uploaded_g_in_a_run():
    cfg = resolve_config(_raw(run={"max_steps": 1}))
    exp = build_experiment(cfg)
    replies = []
    receive = exp.strategy.receive
    exp.strategy.receive = lambda r: replies.append(r) or receive(r)  # type: ignore[method-assign]
    try:
        exp.simulator.run(1)
    finally:
        exp.executor.close()
    g_numel = exp.space.numel
    assert len(replies) == 10 and all(r.values.numel() == g_numel for r in replies)
    n = torch.tensor([float(r.num_samples) for r in replies], dtype=torch.float64)
    mean = sum(w * r.values.double() for w, r in zip(n, replies)) / n.sum()
    assert torch.allclose(exp.strategy.params.double(), mean, atol=1e-6)


# ---------------------------------------------------------------------- whole runs
def test_only_g_is_communicated_and_payloads_show_it():
    records, exp = simulate(_raw(network={"model_size_mb": None}, run={"max_steps": 2}))
    g = exp.space.numel
    f_sizes = {ParamSpace(exp.executor.workload.client_method.bound.local(c)).numel for c in range(5)}
    assert g < min(f_sizes)  # G is the small model; the F_i are larger and all different
    assert len(f_sizes) == 5
    last = records[-1]
    assert last["bytes_up"] == last["uploads"] * payload_nbytes(g)  # values of G only, no mask, no F_i or P_i
    # the mask code goes down once per client (first contact), then G's values only
    assert last["uploads"] == 20 and last["downloads"] == 20
    with_model_size, exp2 = simulate(_raw(run={"max_steps": 1}))  # model_size_mb 2: the full-width F is 2 MB
    ref = exp2.executor.workload.client_method.reference_numel()
    up = with_model_size[-1]["bytes_up"]
    assert up == pytest.approx(10 * 2e6 * payload_nbytes(g) / payload_nbytes(ref), rel=1e-12)


def test_accuracy_is_g_with_its_own_head_and_personal_accuracy_the_clients_mrl_models():
    records, exp = simulate(_raw())
    last = records[-1]
    acc, _ = exp.simulator.evaluator(exp.strategy.params, exp.strategy.buffers, "test")
    assert last["accuracy"] == acc
    accs = last["personal_accuracies"]
    assert len(accs) == 10 and last["personal_accuracy"] == pytest.approx(sum(accs) / 10, abs=1e-12)
    assert records[0]["personal_accuracy"] != last["personal_accuracy"]


def test_personal_evaluation_changes_nothing_else():
    on, _ = simulate(_raw())
    off, _ = simulate(_raw(run={"personal_eval_every": None}))
    assert [{k: v for k, v in r.items() if not k.startswith("personal")} for r in on] == off


def test_client_state_holds_f_p_and_a_private_optimiser():
    _, exp = simulate(_raw(training={"momentum": 0.9}, run={"max_steps": 2}))
    states = exp.simulator.client_states
    assert sorted(states) == list(range(10))
    for c, st in states.items():
        assert {"client", "f", "p", "opt/g", "opt/f", "opt/p"} <= set(st)
        assert int(st["client"][0]) == c
    # one optimiser per client: momentum buffers differ between clients of the same width
    assert not torch.equal(states[0]["opt/f"], states[5]["opt/f"])
    assert states[0]["f"].numel() == states[5]["f"].numel() != states[1]["f"].numel()


def test_compute_time_reflects_the_larger_local_model():
    raw = _raw(network={"compute": {"kind": "flops"}}, run={"max_steps": 1})
    exp = build_experiment(resolve_config(raw))
    exp.executor.close()
    work = exp.simulator.compute.client_work
    assert work is not None and work[0] > work[1] > work[2] > work[3] > work[4] and work[0] == work[5]
    assert work[0] > 1.0  # G + the full-width F + P: more than one full-width model
    t = exp.simulator.compute.time
    assert t(0, None) == pytest.approx(0.5 * work[0]) and t(4, None) < t(0, None)
    alone = build_experiment(resolve_config(_raw("standalone", network={"compute": {"kind": "flops"}},
                                                 run={"max_steps": 1})))
    alone.executor.close()
    assert alone.simulator.compute.client_work[0] == pytest.approx(1.0)  # the full-width F alone
    assert all(a < b for a, b in zip(alone.simulator.compute.client_work, work))


def test_local_only_sends_nothing_and_never_aggregates():
    records, exp = simulate(_raw("standalone", network={"model_size_mb": None}))
    init = build_experiment(resolve_config(_raw("standalone")))
    init.executor.close()
    assert torch.equal(exp.strategy.params, init.strategy.params)
    last = records[-1]
    assert last["uploads"] > 0 and last["bytes_up"] == last["bytes_down"] == 0  # no message either way
    assert all(set(st) == {"client", "f"} for st in exp.simulator.client_states.values())
    assert last["personal_accuracy"] != records[0]["personal_accuracy"]


# ---------------------------------------------------------------------- executors, checkpoints
def _same_runs(a: tuple, b: tuple) -> None:
    (ra, ea), (rb, eb) = a, b
    assert ra == rb
    assert torch.equal(ea.strategy.params, eb.strategy.params)
    sa, sb = ea.simulator.client_states, eb.simulator.client_states
    assert sa.keys() == sb.keys()
    for c in sa:
        assert sa[c].keys() == sb[c].keys() and all(torch.equal(v, sb[c][k]) for k, v in sa[c].items())


@pytest.mark.parametrize("method", ["fedmrl", "standalone"])
def test_process_pool_matches_serial(method: str):
    raw = dict(training={"momentum": 0.9})
    _same_runs(simulate(_raw(method, **raw)), simulate(_raw(method, run={"executor": "process", "workers": 2}, **raw)))


def test_ray_matches_serial(ray_session):  # the test process's one Ray instance (conftest)
    raw = dict(training={"momentum": 0.9}, run={"max_steps": 2})
    _same_runs(simulate(_raw(**raw)),
               simulate(_raw(training={"momentum": 0.9}, run={"max_steps": 2, "executor": "ray", "workers": 2})))


def test_client_state_is_checkpointed_and_resumes_exactly(tmp_path: Path):
    cfg = resolve_config(_raw(training={"momentum": 0.9}, run={"max_steps": 8, "checkpoint_every": 2}))
    out, ref = tmp_path / "killed", tmp_path / "ref"
    assert run_experiment(cfg, out, stop_after_steps=5)["interrupted"]
    from safetensors.torch import load_file

    saved = load_file(out / "checkpoint" / "state.safetensors")
    for key in ("f", "p", "opt/g", "opt/f", "opt/p"):
        assert any(k.startswith("sim/client/") and k.endswith(f"/{key}") for k in saved), key
    run_experiment(cfg, out, resume=True)
    run_experiment(cfg, ref)
    assert (out / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()


# ---------------------------------------------------------------------- refusals
@pytest.mark.parametrize("set_, match", [
    ({"method": "fedgmr", "local": {"algorithm": "fedmrl"}}, "submodel.policy must be 'full'"),
    ({"method": "heterofl", "local": {"algorithm": "fedmrl"}}, "submodel.policy must be 'full', not 'heterofl'"),
    ({"model": {"name": "mlp", "options": {"hidden": [8]}}}, "needs a representation model"),
    ({"model": {"name": "rep_cnn", "options": {"rep_dim": 8}}}, "set by FedMRL"),
    ({"fedmrl": {"d1": 9, "d2": 8}}, r"fedmrl.d1 \(9\) must be at most fedmrl.d2 \(8\)"),
    ({"fedmrl": {"widths": []}}, "width rates"),
    ({"method": "fedmrl", "submodel": {"policy": "magnitude"}}, "fixed to 'full' by method 'fedmrl'"),
])
def test_impossible_combinations_are_one_line_config_errors(set_, match):
    raw = _raw(run={"max_steps": 1})
    raw.update({k: ({**raw.get(k, {}), **v} if isinstance(v, dict) and k != "model" else v)
                for k, v in set_.items()})
    explicit = {"submodel.policy": "magnitude"} if "submodel" in set_ else None
    with pytest.raises(ConfigError, match=match) as err:
        cfg = resolve_config(raw, explicit)
        build_experiment(cfg).executor.close()
    assert "\n" not in str(err.value)


def test_flower_runs_fedmrl_and_refuses_standalone():
    from fedgmr.flower.server_app import refuse_client_state

    refuse_client_state(resolve_config(_raw("fedmrl")))  # F_i and the projector stay on the node
    with pytest.raises(ConfigError, match="Flower"):  # no global model: its result is the client models
        refuse_client_state(resolve_config(_raw("standalone")))
