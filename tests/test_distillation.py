"""Federated distillation: FedDF (feddf, fedgmr_df) and FedMD (fedmd) - exact vectors for
the rules, whole runs (no client cost, virtual time, executors, checkpoints) and refusals.
Proxy data here are scikit-learn's digits: nothing from ../shared/data is needed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import simulate, tiny_config
from fedgmr.algorithm.distillation import consensus, distill_loss, ensemble_targets
from fedgmr.algorithm.encoding import payload_nbytes
from fedgmr.algorithm.maskinfo import frozen
from fedgmr.algorithm.params import ParamSpace
from fedgmr.errors import ConfigError
from fedgmr.experiment.build import build_experiment
from fedgmr.experiment.runner import run_experiment
from fedgmr.methods import resolve_config
from fedgmr.strategy.distill import FedDFDistillation, FedMDConsensus, ServerDistiller
from fedgmr.strategy.update import Update

PROXY = {"proxy": {"name": "digits", "size": 120}, "steps": 4, "batch_size": 32}


def _raw(method: str, **sections) -> dict:
    distill = {**PROXY, **sections.pop("distill", {})}
    run = {"max_steps": 5, "eval_every": 1, **sections.pop("run", {})}
    return tiny_config(method=method, distill=distill, run=run, **sections)


# ------------------------------------------------------------------ exact vectors
def test_ensemble_target_is_the_softened_mean_of_the_teachers_logits():
    # teachers z1 = (1, 0), z2 = (3, 0); T = 2: softmax((2, 0) / 2) = (e / (e + 1), 1 / (e + 1))
    p = ensemble_targets([torch.tensor([[1.0, 0.0]]), torch.tensor([[3.0, 0.0]])], 2.0)
    assert p.tolist()[0] == pytest.approx([0.7310585786, 0.2689414214], abs=1e-7)
    # the mean is taken on logits, not on probabilities: not (softmax(z1/2) + softmax(z2/2)) / 2
    probs = (torch.softmax(torch.tensor([0.5, 0.0]), 0) + torch.softmax(torch.tensor([1.5, 0.0]), 0)) / 2
    assert abs(float(probs[0]) - float(p[0, 0])) > 1e-3


def test_kl_loss_and_its_gradient_on_a_tiny_linear_model_by_hand():
    """z = W x + b with W = [[.5, -.5], [0, .25]], b = (.1, -.1), x = (1, 2): z = (-.4, .4);
    T = 2: q = softmax(z / T) = (0.401312, 0.598688); target p = (0.731059, 0.268941).
    loss = T^2 KL(p || q) = 0.892942; dL/dz = T (q - p) = (-0.659494, 0.659494);
    dL/dW = dL/dz x^T, dL/db = dL/dz."""
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.5, -0.5], [0.0, 0.25]]))
        lin.bias.copy_(torch.tensor([0.1, -0.1]))
    x = torch.tensor([[1.0, 2.0]])
    p = ensemble_targets([torch.tensor([[1.0, 0.0]]), torch.tensor([[3.0, 0.0]])], 2.0)
    loss = distill_loss(lin(x), p, 2.0)
    assert float(loss.detach()) == pytest.approx(0.892942, abs=1e-5)
    loss.backward()
    g = 0.659494
    assert lin.weight.grad.tolist() == [pytest.approx([-g, -2 * g], abs=1e-5), pytest.approx([g, 2 * g], abs=1e-5)]
    assert lin.bias.grad.tolist() == pytest.approx([-g, g], abs=1e-5)


def test_one_server_distillation_step_by_hand():
    """ServerDistiller's first Adam step moves every coordinate by lr against the sign of
    its gradient (m / sqrt(v) = g / |g| at step 1): W1 = W0 - 0.01 sign(dL/dW)."""
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.5, -0.5], [0.0, 0.25]]))
        lin.bias.copy_(torch.tensor([0.1, -0.1]))
    space = ParamSpace(lin)
    start = space.flatten(lin).clone()
    d = ServerDistiller(lin, space, torch.tensor([[1.0, 2.0]]), temperature=2.0, steps=1, batch_size=1, lr=0.01)
    out, steps = d.distil(start, {}, [torch.tensor([[1.0, 0.0]]), torch.tensor([[3.0, 0.0]])], version=0)
    assert steps == 1
    # flat order: weight (row-major), then bias
    assert out.tolist() == pytest.approx([0.51, -0.49, -0.01, 0.24, 0.11, -0.11], abs=1e-6)


def test_fedmd_consensus_and_soft_targets():
    z = [torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([[0.0, 2.0, 1.0]]), torch.tensor([[1.0, 1.0, 3.0]])]
    c = consensus(z)
    assert c.tolist() == [[1.0, 1.0, 1.0]]
    target = torch.softmax(c / 1.0, dim=-1)  # what FedMD's client digests towards (T = 1)
    assert target.tolist()[0] == pytest.approx([1 / 3] * 3)
    # mse on soft targets: student z = (0, 0, ln 4): q = (1/6, 1/6, 2/3)
    q_logits = torch.tensor([[0.0, 0.0, math.log(4.0)]])
    expect = ((1 / 6 - 1 / 3) ** 2 * 2 + (2 / 3 - 1 / 3) ** 2) / 3
    assert float(distill_loss(q_logits, target, 1.0, "mse")) == pytest.approx(expect, abs=1e-7)
    # kl: KL(u || q) = sum u ln(u / q) = (1/3)(2 ln 2 + ln 0.5)
    assert float(distill_loss(q_logits, target, 1.0, "kl")) == pytest.approx((2 * math.log(2) + math.log(0.5)) / 3,
                                                                             abs=1e-6)


def test_each_teacher_is_evaluated_under_its_own_mask():
    """A buffered update's teacher is the client's sub-model: its values on its mask, zero
    elsewhere (a linear model on digits, checked with F.linear)."""
    cfg = resolve_config(_raw("fedgmr_df", model={"name": "mlp", "options": {"hidden": []}}))
    exp = build_experiment(cfg)
    try:
        s = exp.strategy
        n = s.space.numel
        gen = torch.Generator().manual_seed(0)
        mask = frozen(torch.rand(n, generator=gen) < 0.5)
        values = torch.randn(int(mask.sum()), generator=gen)
        e = Update(3, 0, mask, values, 10, {}, 10, 0.5)
        full = torch.zeros(n)
        full[mask] = values
        w, b = full[:n - 10].view(10, -1), full[n - 10:]
        df = s.plugin(FedDFDistillation)
        proxy = df.distiller.proxy
        expect = F.linear(proxy.flatten(1), w, b)
        assert torch.allclose(df.teacher(e), expect, atol=1e-5)
        assert df.teacher(e) is df.teacher(e)  # cached while it is the client's latest update
    finally:
        exp.executor.close()


# ------------------------------------------------------------------ whole runs
def _bytes(records: list[dict]) -> list[tuple]:
    return [(r["time"], r["bytes_up"], r["bytes_down"], r["uploads"], r["downloads"]) for r in records]


def test_feddf_costs_clients_nothing_and_changes_the_model():
    avg, _ = simulate(_raw("fedavg"))
    df, exp = simulate(_raw("feddf"))
    assert _bytes(df) == _bytes(avg)  # the same transfers at the same virtual times
    assert [r["accuracy"] for r in df] != [r["accuracy"] for r in avg]
    assert exp.strategy.plugin(FedDFDistillation).distill_steps == 5 * 4
    # on FedGMR's masks (fixed masks, no restoration: the transfers do not depend on the model)
    fixed = {"restoration": {"trigger": "none"}, "submodel": {"refresh_every": None}}
    gmr, _ = simulate(_raw("fedgmr", **fixed))
    gmr_df, _ = simulate(_raw("fedgmr_df", **fixed))
    assert _bytes(gmr_df) == _bytes(gmr)


def test_distillation_time_is_charged_on_the_virtual_clock_when_asked():
    free, _ = simulate(_raw("feddf", run={"max_steps": 3}))
    paid, _ = simulate(_raw("feddf", distill={"seconds_per_step": 1.5}, run={"max_steps": 3}))
    # every aggregation took 4 steps x 1.5 s more: round k ends 6 k seconds later
    assert [b["time"] - a["time"] for a, b in zip(free, paid)] == pytest.approx([0.0, 6.0, 12.0, 18.0])


def test_early_stopping_keeps_the_best_of_the_aggregate_and_the_students():
    records, exp = simulate(_raw("feddf", distill={"val_every": 1, "patience": 1, "steps": 6},
                                 run={"max_steps": 4}))
    assert exp.strategy.plugin(FedDFDistillation).distill_steps <= 4 * 6
    # the metrics say how often a student beat the aggregate on validation, and by how much
    last = records[-1]
    assert last["distillations"] == 4 and 0 <= last["students_kept"] <= 4
    kept = [r["students_kept"] for r in records]
    assert kept == sorted(kept)
    for prev, rec in zip(records, records[1:]):
        gain = rec["distill_val_gain"]
        assert gain is not None and gain >= 0  # the kept model is never worse than the aggregate on val
        assert (rec["students_kept"] - prev["students_kept"] == 1) == (gain > 0)
    # the aggregate's and the kept model's validation accuracy, as the distiller reports them
    start, best = exp.strategy.plugin(FedDFDistillation).distiller.last_val
    assert best - start == pytest.approx(last["distill_val_gain"])


def test_without_validation_the_metrics_count_distillations_only():
    records, _ = simulate(_raw("feddf", run={"max_steps": 3}))
    assert [r["distillations"] for r in records] == [0, 1, 2, 3]
    assert "students_kept" not in records[-1] and "distill_val_gain" not in records[-1]


def test_fedmd_sends_logits_and_keeps_client_models():
    records, exp = simulate(_raw("fedmd", data={"client_test_fraction": 0.2}, run={"personal_eval_every": 1}))
    classes, public = 10, 120
    up = payload_nbytes(public * classes)
    # round 1: nothing down (no consensus yet), logits up; then the consensus down, logits up
    assert records[1]["bytes_up"] == 10 * up and records[1]["bytes_down"] == 0
    assert records[2]["bytes_down"] == 10 * up and records[2]["bytes_up"] == 20 * up
    states = exp.simulator.client_states
    assert sorted(states) == list(range(10)) and all("w" in st for st in states.values())
    fedmd = exp.strategy.plugin(FedMDConsensus)
    assert fedmd.consensus is not None and fedmd.consensus.numel() == public * classes
    # the server's own parameters never move: FedMD has no global model
    init = build_experiment(resolve_config(_raw("fedmd")))
    init.executor.close()
    assert torch.equal(exp.strategy.params, init.strategy.params)
    # "accuracy" is the mean test accuracy of the client models
    from fedgmr.training.evaluate import evaluate

    model = exp.executor.workload.model
    accs = []
    for c in range(10):
        exp.space.load(model, states[c]["w"])
        accs.append(evaluate(model, exp.data.test.x, exp.data.test.y)[0])
    assert records[-1]["accuracy"] == pytest.approx(sum(accs) / 10, abs=1e-12)
    assert records[-1]["personal_accuracy"] != records[-1]["accuracy"]


@pytest.mark.parametrize("method", ["feddf", "fedgmr_df", "fedmd"])
def test_process_pool_matches_serial(method: str):
    serial, exp_s = simulate(_raw(method))
    pool, exp_p = simulate(_raw(method, run={"executor": "process", "workers": 1}))
    assert serial == pool
    assert torch.equal(exp_s.strategy.params, exp_p.strategy.params)


def test_ray_matches_serial(ray_session):  # the test process's one Ray instance (conftest)
    for method in ("fedgmr_df", "fedmd"):
        serial, _ = simulate(_raw(method, run={"max_steps": 3}))
        ray, _ = simulate(_raw(method, run={"max_steps": 3, "executor": "ray", "workers": 1}))
        assert serial == ray, method


@pytest.mark.parametrize("method, distill", [("fedgmr_df", {}), ("fedgmr_df", {"val_every": 2}), ("fedmd", {})])
def test_resumes_exactly(tmp_path: Path, method: str, distill: dict):
    cfg = resolve_config(_raw(method, distill=distill, run={"max_steps": 8, "checkpoint_every": 2}))
    out, ref = tmp_path / "killed", tmp_path / "ref"
    assert run_experiment(cfg, out, stop_after_steps=5)["interrupted"]
    run_experiment(cfg, out, resume=True)
    run_experiment(cfg, ref)
    assert (out / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()


def test_proxy_offset_takes_the_samples_after_it():
    from fedgmr.data import load_dataset
    from fedgmr.strategy.distill import load_proxy

    train = load_dataset("digits").train.x
    cfg = resolve_config(_raw("feddf", distill={"proxy": {"name": "digits", "size": 30, "offset": 100}}))
    x = load_proxy(cfg, tuple(train.shape[1:]))
    assert torch.equal(x, train[100:130].float())
    first = load_proxy(resolve_config(_raw("feddf", distill={"proxy": {"name": "digits", "size": 30}})),
                       tuple(train.shape[1:]))
    assert torch.equal(first, train[:30].float())


@pytest.mark.parametrize("raw, match", [
    (_raw("feddf", distill={"proxy": {"name": None}}), "distill.proxy.name"),
    (_raw("fedmd", distill={"proxy": {"name": None}}), "distill.proxy.name"),
    (_raw("heterofl", distill={"server": True}), "width baseline"),
    (_raw("heterofl", local={"algorithm": "fedmd"}), "exchanges logits"),
    (_raw("fedgmr", local={"algorithm": "fedmd"}), "exchanges logits"),
    (_raw("fedgmr_df", aggregation={"rule": "ga_delta", "buffer": False}), "receives deltas"),
    (_raw("fedgmr_df", local={"algorithm": "fedbn"}), "whole model"),
    (_raw("feddf", distill={"loss": "mse"}), "FedMD's"),
    (_raw("feddf", distill={"proxy": {"name": "synthetic", "size": 50}}), "shape"),
    (_raw("feddf", distill={"proxy": {"name": "digits", "size": 50, "offset": 10**6}}), "none from"),
])
def test_impossible_combinations_are_one_line_config_errors(raw: dict, match: str):
    with pytest.raises(ConfigError, match=match) as err:
        build_experiment(resolve_config(raw)).executor.close()
    assert "\n" not in str(err.value)


def test_flower_refuses_fedmd():
    from fedgmr.flower.server_app import refuse_client_state

    with pytest.raises(ConfigError, match="Flower"):
        refuse_client_state(resolve_config(_raw("fedmd")))
