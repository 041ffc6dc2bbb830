"""The client halves of FedProx, SCAFFOLD, Ditto and FedBN (fedgmr.training.client_methods)
and their server halves: which coordinates move, exact update vectors, the bytes on the wire."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fedgmr.algorithm.aggregation import RULES
from fedgmr.algorithm.local_rules import batch_norm_coordinates, straggler_steps
from fedgmr.algorithm.params import get_buffers
from fedgmr.algorithm.policies import FullModelPolicy
from fedgmr.algorithm.restoration import DensityLadder
from fedgmr.algorithm.staleness import make_staleness
from fedgmr.sim.executor import ClientWorkload, TrainJob
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.messages import Reply
from fedgmr.strategy.scaffold import ScaffoldControl
from fedgmr.training.client_methods import DittoClient, FedBNClient, FedProxClient, SGDClient, ScaffoldClient
from fedgmr.training.local import LocalTerms, TrainSettings, masked_local_training


def _net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _data(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def _workload(method=None, **settings) -> ClientWorkload:
    s = TrainSettings(**{"lr": 0.1, "batch_size": 8, "local_steps": 4, **settings})
    return ClientWorkload(_net, [_data(40, 0), _data(40, 1)], [_data(0), _data(0)], s, client_method=method)


def _mask(wl: ClientWorkload, keep: float = 0.5, seed: int = 1) -> torch.Tensor:
    """Prunable coordinates kept with probability ``keep``; the always-kept ones held."""
    g = torch.Generator().manual_seed(seed)
    return wl.space.always_kept | (torch.rand(wl.space.numel, generator=g) < keep)


def _job(wl: ClientWorkload, mask: torch.Tensor | None, seed: int = 7, **kw) -> TrainJob:
    start = wl.space.flatten(wl.model) + 0.5  # nonzero everywhere: pruned ones must still read 0
    return TrainJob(0, 0, seed, start, get_buffers(wl.model), mask, **kw)


# ------------------------------------------------------------------ FedProx
@pytest.mark.parametrize("momentum, wd", [(0.0, 0.0), (0.9, 0.01)])
def test_fedprox_leaves_pruned_coordinates_bit_identical(momentum, wd):
    wl = _workload(FedProxClient(mu=5.0), momentum=momentum, weight_decay=wd)
    mask = _mask(wl)
    job = _job(wl, mask)
    before = job.start * mask  # what the client holds before training: W * m
    out = wl.client_method.train(wl, job, *wl.client_data[0], None).outcome
    assert torch.equal(out.params[~mask], before[~mask])  # exactly 0.0, bit for bit
    assert bool((out.params[mask] != before[mask]).any())  # and the kept ones did train


def test_fedprox_step_is_the_sgd_step_minus_lr_mu_times_the_drift():
    """w2(mu) = w2(0) - lr mu (w1 - w0) * m: the second step's gradient is the same in
    both runs (same batches, same w1); only the proximal pull differs."""
    wl = _workload()
    mask = _mask(wl)
    start = wl.space.flatten(wl.model) + 0.5
    bufs = get_buffers(wl.model)
    x, y = wl.client_data[0]
    s = TrainSettings(lr=0.1, batch_size=8, local_steps=2)
    run = lambda terms, steps: masked_local_training(wl.model, wl.space, start, bufs, mask, x, y, s, 5,  # noqa: E731
                                                     terms=terms, steps=steps).params
    w0, w1 = start * mask, run(None, 1)
    w2_plain, w2_prox = run(None, 2), run(LocalTerms(prox_mu=0.7), 2)
    expected = w2_plain - 0.1 * 0.7 * (w1 - w0)
    assert torch.allclose(w2_prox, expected, atol=1e-6, rtol=0)
    assert torch.equal(w2_prox[~mask], torch.zeros(int((~mask).sum())))
    assert not torch.allclose(w2_prox, w2_plain, atol=1e-4)


def test_stragglers_run_fewer_steps_and_are_still_sent():
    wl = _workload(SGDClient(stragglers=1.0))
    res = wl.run(_job(wl, None, seed=11))
    k = straggler_steps(11, 1.0, 4)
    assert 1 <= k < 4 and res.num_processed == k * 8
    assert _workload(SGDClient(stragglers=0.0)).run(_job(wl, None, seed=11)).num_processed == 4 * 8


# ------------------------------------------------------------------ SCAFFOLD
def test_scaffold_client_first_job_is_sgd_and_its_control_variate_stays_on_the_mask():
    wl = _workload(ScaffoldClient())
    mask = _mask(wl)
    zero_c = torch.zeros(wl.space.numel)
    job = _job(wl, mask, extras={"c": zero_c})
    res = wl.client_method.train(wl, job, *wl.client_data[0], None)
    plain = SGDClient().train(wl, job, *wl.client_data[0], None).outcome
    assert torch.equal(res.outcome.params, plain.params)  # c = c_i = 0 at the start: no correction
    x = job.start * mask
    expected = (x - res.outcome.params) / (4 * 0.1)
    assert torch.allclose(res.state["c_i"], expected * mask, atol=1e-6, rtol=0)
    assert torch.equal(res.state["c_i"][~mask], torch.zeros(int((~mask).sum())))
    assert torch.equal(res.extras["delta_c"], res.state["c_i"])  # c_i was 0
    assert torch.equal(res.outcome.params[~mask], torch.zeros(int((~mask).sum())))
    # on the wire: the workload sends delta_c at the mask only
    sent = wl.run(job)
    assert sent.extras["delta_c"].numel() == int(mask.sum()) == sent.values.numel()


def test_scaffold_restored_coordinates_take_c():
    """A coordinate new to the mask starts with c_i = c, so its correction c - c_i is 0 and
    c_i+ = c - c + (x - y)/(K lr) there; a held one keeps c_i: c_i+ = c_i - c + (x - y)/(K lr)."""
    wl = _workload(ScaffoldClient())
    small, big = _mask(wl, 0.3, seed=1), None
    big = small | _mask(wl, 0.6, seed=2)
    c = torch.full((wl.space.numel,), 0.01)
    c_i = torch.where(small, torch.tensor(0.03), torch.tensor(0.0))
    job = _job(wl, big, extras={"c": c}, state={"c_i": c_i, "held": small})
    res = wl.client_method.train(wl, job, *wl.client_data[0], None)
    drift = (job.start * big - res.outcome.params) / (4 * 0.1)
    new = big & ~small
    assert torch.allclose(res.state["c_i"][new], drift[new], atol=1e-6, rtol=0)
    assert torch.allclose(res.state["c_i"][small], (0.03 - 0.01 + drift)[small], atol=1e-6, rtol=0)
    assert torch.equal(res.state["held"], big)


def _strategy(cls=MaskedBufferedStrategy, n: int = 4, **kw):
    wl = _workload()
    params = wl.space.flatten(wl.model)
    s = cls(wl.space, params, get_buffers(wl.model), FullModelPolicy(wl.space), DensityLadder((1.0,), [0] * n),
            RULES.get("ma"), make_staleness("constant"), "equal", False, **kw)
    return wl, s


def test_scaffold_server_moves_c_by_the_sum_over_all_clients_and_x_by_the_mean():
    wl, s = _strategy(n=4, plugins=[ScaffoldControl()])
    control = s.plugin(ScaffoldControl)
    x0 = s.params.clone()
    a0, a1 = s.assign(0), s.assign(1)
    assert a1.wire.beside["c"] is control.c  # one c for every client of a round
    assert a0.wire.beside["c"] is control.c and a0.wire.reply_beside == ("delta_c",)
    k = wl.space.numel
    ok = s.receive(Reply(0, 0, x0 + 1.0, 10, extras={"delta_c": torch.full((k,), 4.0)}))
    ok &= s.receive(Reply(1, 0, x0 + 3.0, 10, extras={"delta_c": torch.full((k,), 8.0)}))
    assert ok
    s.aggregate()
    assert torch.allclose(s.params, x0 + 2.0)  # x + mean(delta y)
    assert torch.equal(control.c, torch.full((k,), 3.0))  # (4 + 8) / N, N = 4 clients, 2 sampled
    # a reply without delta_c is refused and never aggregated
    s.assign(2)
    assert not s.receive(Reply(2, 1, s.params.clone(), 10))


def test_scaffold_server_learning_rate_scales_the_step():
    _, s = _strategy(n=1, plugins=[ScaffoldControl(server_lr=0.5)])
    x0 = s.params.clone()
    s.assign(0)
    s.receive(Reply(0, 0, x0 + 2.0, 10, extras={"delta_c": torch.zeros_like(x0)}))
    s.aggregate()
    assert torch.allclose(s.params, x0 + 1.0)


# ------------------------------------------------------------------ Ditto
def test_ditto_personal_model_lives_on_the_mask_and_global_update_is_fedavgs():
    wl = _workload(DittoClient(lam=1.0))
    mask = _mask(wl)
    job = _job(wl, mask)
    res = wl.client_method.train(wl, job, *wl.client_data[0], None)
    plain = SGDClient().train(wl, job, *wl.client_data[0], None).outcome
    assert torch.equal(res.outcome.params, plain.params)  # what the server gets: the ordinary update
    v = res.state["v"]
    assert torch.equal(v[~mask], torch.zeros(int((~mask).sum())))  # pruned: bit-identical zeros
    assert not torch.equal(v, plain.params)  # v trained on its own (other batches, the pull to w)
    assert set(res.state) >= {"v", "held", "buf/1.running_mean"}


def test_ditto_large_lambda_pins_v_to_w():
    """lam -> the pull dominates: v stays near w, much nearer than with lam = 0."""
    wl = _workload(momentum=0.0)
    mask = _mask(wl)
    job = _job(wl, mask)
    w = job.start * mask
    dist = {}
    for lam in (0.0, 8.0):
        v = DittoClient(lam=lam).train(wl, job, *wl.client_data[0], None).state["v"]
        dist[lam] = float((v - w).norm())
    assert dist[8.0] < 0.5 * dist[0.0]


def test_ditto_restored_coordinates_are_seeded_from_w():
    """With a zero learning rate nothing trains, so v after the job is exactly the seeded v."""
    wl = _workload(DittoClient(lam=1.0), lr=1e-30)
    small = _mask(wl, 0.3, seed=1)
    big = small | _mask(wl, 0.6, seed=2)
    old_v = torch.full((wl.space.numel,), 7.0) * small
    job = _job(wl, big, state={"v": old_v, "held": small})
    v = wl.client_method.train(wl, job, *wl.client_data[0], None).state["v"]
    w = job.start * big
    new = big & ~small
    assert torch.allclose(v[new], w[new], atol=1e-6, rtol=0)
    assert torch.allclose(v[small], old_v[small], atol=1e-6, rtol=0)
    assert torch.equal(v[~big], torch.zeros(int((~big).sum())))


# ------------------------------------------------------------------ FedBN
def test_fedbn_keeps_batch_norm_local_and_sends_the_rest():
    wl = _workload(FedBNClient())
    local, names = batch_norm_coordinates(wl.model, wl.space)
    assert int(local.sum()) == 16 and names == ("1.running_mean", "1.running_var", "1.num_batches_tracked")
    up = ~local
    job = _job(wl, None, upload_mask=up)
    res = wl.run(job)
    assert res.values.numel() == int(up.sum())  # BN parameters not uploaded
    assert set(res.buffers).isdisjoint(names)  # nor its statistics
    state = res.state
    assert state["bn"].numel() == 16 and set(state) == {"bn", *(f"buf/{n}" for n in names)}
    # the next job starts from the client's own BN, whatever the server sends there
    poisoned = job.start.clone()
    poisoned[local] = 100.0
    job2 = TrainJob(0, 1, 8, poisoned, job.buffers, None, upload_mask=up, state=state)
    res2 = wl.client_method.train(wl, job2, *wl.client_data[0], None)
    assert float(res2.outcome.params[local].abs().max()) < 10.0
    # personal model = global model with the client's BN
    p, b = wl.client_method.personal_model(wl.model, wl.space, poisoned, job.buffers, state)
    assert torch.equal(p[local], state["bn"]) and torch.equal(p[~local], poisoned[~local])
    assert torch.equal(b["1.running_mean"], state["buf/1.running_mean"])


def test_fedbn_server_never_moves_batch_norm():
    wl = _workload()
    local, _ = batch_norm_coordinates(wl.model, wl.space)
    _, s = _strategy(local_coords=local)
    before = s.params.clone()
    a = s.assign(0)
    assert torch.equal(a.reply_mask, ~local)
    assert s.receive(Reply(0, 0, torch.full((int((~local).sum()),), 2.0), 10))
    s.aggregate()
    assert torch.equal(s.params[local], before[local])
    assert torch.equal(s.params[~local], torch.full((int((~local).sum()),), 2.0))
