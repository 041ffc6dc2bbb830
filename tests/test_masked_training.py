"""Masked local training (docs/reference.md §3.4) and evaluation with padding (§8, §9)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fedgmr.algorithm.params import ParamSpace, get_buffers
from fedgmr.algorithm.policies import MagnitudePolicy
from fedgmr.training import TrainSettings, evaluate, masked_local_training


class ConvBNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.fc1 = nn.Linear(6 * 4 * 4, 24)
        self.out = nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.out(torch.relu(self.fc1(x.flatten(1))))


@pytest.fixture(autouse=True)
def _single_thread():
    """Tiny tensors: one intra-op thread avoids oversubscription stalls on busy machines."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


SETTINGS = TrainSettings(lr=0.05, momentum=0.9, weight_decay=1e-2, batch_size=8, local_steps=20)


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model = ConvBNNet()
    space = ParamSpace(model)
    start = space.flatten(model)
    buffers = get_buffers(model)
    policy = MagnitudePolicy(space, [0.2, 1.0], start)
    mask = policy.mask(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 1, 8, 8, generator=g) * 2.0 + 0.5
    y = torch.randint(0, 5, (40,), generator=g)
    return model, space, start, buffers, mask, x, y


def test_pruned_coordinates_stay_exactly_zero_under_momentum_and_weight_decay(setup):
    model, space, start, buffers, mask, x, y = setup
    assert 0 < int((~mask).sum()) < space.numel
    out = masked_local_training(model, space, start, buffers, mask, x, y, SETTINGS, seed=3)
    zeros = torch.zeros(int((~mask).sum()))
    assert torch.equal(out.params[~mask], zeros)
    # the trained model itself (not only the returned copy) kept them at zero
    assert torch.equal(space.flatten(model)[~mask], zeros)
    # kept coordinates moved (weight decay alone moves every nonzero weight)
    kept_start = start[mask]
    kept_after = out.params[mask]
    assert bool((kept_after != kept_start).all())
    # returned params are the model's weights on the mask
    assert torch.equal(out.params[mask], space.flatten(model)[mask])
    assert out.num_samples == len(y)  # the training-set size: FedAvg's n_k
    assert out.num_processed == 20 * 8  # local steps x batch
    assert torch.isfinite(torch.tensor(out.loss))


def test_start_is_not_modified(setup):
    model, space, start, buffers, mask, x, y = setup
    before = start.clone()
    masked_local_training(model, space, start, buffers, mask, x, y, SETTINGS, seed=3)
    assert torch.equal(start, before)


def test_batchnorm_running_stats_are_updated_and_not_masked(setup):
    model, space, start, buffers, mask, x, y = setup
    before = {k: v.clone() for k, v in buffers.items()}
    out = masked_local_training(model, space, start, buffers, mask, x, y, SETTINGS, seed=3)
    assert set(out.buffers) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    assert int(out.buffers["bn.num_batches_tracked"]) == int(before["bn.num_batches_tracked"]) + 20
    rm, rv = out.buffers["bn.running_mean"], out.buffers["bn.running_var"]
    assert not torch.equal(rm, before["bn.running_mean"])
    assert not torch.equal(rv, before["bn.running_var"])
    # never masked / zeroed: every channel has a real statistic
    assert bool((rm != 0).all())
    assert bool((rv > 0).all())
    assert bool((rv != before["bn.running_var"]).all())
    # the input buffers were not modified in place
    for k, v in before.items():
        assert torch.equal(buffers[k], v)


def test_same_seed_identical_different_seed_different(setup):
    model, space, start, buffers, mask, x, y = setup
    a = masked_local_training(model, space, start, buffers, mask, x, y, SETTINGS, seed=7)
    b = masked_local_training(model, space, start, buffers, mask, x, y, SETTINGS, seed=7)
    c = masked_local_training(model, space, start, buffers, mask, x, y, SETTINGS, seed=8)
    assert torch.equal(a.params, b.params)
    assert a.loss == b.loss
    for k in a.buffers:
        assert torch.equal(a.buffers[k], b.buffers[k])
    assert not torch.equal(a.params, c.params)
    assert torch.equal(c.params[~mask], torch.zeros(int((~mask).sum())))


def test_full_model_training_without_mask(setup):
    model, space, start, buffers, _, x, y = setup
    out = masked_local_training(model, space, start, buffers, None, x, y, SETTINGS, seed=0)
    assert bool((out.params != start).all())


def test_empty_client_data_raises(setup):
    model, space, start, buffers, mask, x, y = setup
    with pytest.raises(ValueError):
        masked_local_training(model, space, start, buffers, mask, x[:0], y[:0], SETTINGS, seed=0)


# ---------------------------------------------------------------------------- evaluate

class EchoLM(nn.Module):
    """Predicts the input token at every position: logits (B, T, V)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.one_hot(x, self.vocab).float() * 4.0 + self.dummy


def test_evaluate_next_token_ignores_padding():
    model = EchoLM(5)
    x = torch.tensor([[1, 2, 3, 0, 0], [4, 4, 0, 0, 0]])
    y = torch.tensor([[1, 2, 4, 0, 0], [4, 1, 0, 0, 0]])
    # non-padding targets: 1✓ 2✓ 4✗ | 4✓ 1✗ -> 3/5; the 5 padding positions would all be
    # "correct" (pred 0 == target 0) if they were counted (8/10)
    acc, loss = evaluate(model, x, y, task="next_token", pad_index=0)
    assert acc == pytest.approx(0.6, abs=1e-12)
    with torch.no_grad():
        logits = model(x)
    keep = y != 0
    expected_loss = F.cross_entropy(logits[keep], y[keep], reduction="mean")
    assert loss == pytest.approx(float(expected_loss), rel=1e-6)
    # without a pad index every position counts
    acc_all, _ = evaluate(model, x, y, task="next_token", pad_index=None)
    assert acc_all == pytest.approx(0.8, abs=1e-12)


def test_evaluate_next_token_small_batches_agree():
    model = EchoLM(5)
    x = torch.tensor([[1, 2, 3, 0, 0], [4, 4, 0, 0, 0], [2, 0, 0, 0, 0]])
    y = torch.tensor([[1, 2, 4, 0, 0], [4, 1, 0, 0, 0], [2, 0, 0, 0, 0]])
    full = evaluate(model, x, y, task="next_token", pad_index=0)
    small = evaluate(model, x, y, task="next_token", pad_index=0, batch_size=1)
    assert full[0] == pytest.approx(4 / 6) and small[0] == pytest.approx(4 / 6)
    assert full[1] == pytest.approx(small[1], rel=1e-6)


def test_evaluate_restores_training_mode():
    model = EchoLM(5)
    model.train()
    evaluate(model, torch.tensor([[1]]), torch.tensor([[1]]), task="next_token", pad_index=0)
    assert model.training


class WithUnusedLayer(nn.Module):
    """A parameter that takes no part in this forward pass (e.g. an auxiliary head)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.unused = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.a(x)))


def test_masked_training_with_a_parameter_outside_the_graph():
    # full-model training works on this model, so masked training must too
    torch.manual_seed(0)
    model = WithUnusedLayer()
    space = ParamSpace(model)
    start = space.flatten(model)
    mask = MagnitudePolicy(space, [0.5, 1.0], start).mask(0)
    unused = next(p for p in space.params if p.name == "unused.weight")
    assert not bool(mask[unused.slice].all())
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    settings = TrainSettings(lr=0.05, momentum=0.9, weight_decay=1e-2, batch_size=8, local_steps=4)
    masked_local_training(model, space, start, {}, None, x, y, settings, seed=0)
    out = masked_local_training(model, space, start, {}, mask, x, y, settings, seed=0)
    assert torch.equal(out.params[~mask], torch.zeros(int((~mask).sum())))
    # no gradient reaches the unused layer: its kept coordinates are untouched
    kept_unused = mask[unused.slice]
    assert torch.equal(out.params[unused.slice][kept_unused], start[unused.slice][kept_unused])


def test_plain_sgd_steps_with_the_mask_in_the_step(setup):
    """No momentum, no weight decay: the masked step is fused (``p - lr * g * m``). Pruned
    coordinates stay exactly 0, and one step equals the unfused step on the masked gradient
    within one rounding (the fused step rounds the product and the sum separately)."""
    model, space, start, buffers, mask, x, y = setup
    plain = TrainSettings(lr=0.05, batch_size=8, local_steps=1)
    out = masked_local_training(model, space, start, buffers, mask, x, y, plain, seed=3)
    assert torch.equal(out.params[~mask], torch.zeros(int((~mask).sum())))
    # the same step by hand: W * m, one batch (the job's first), the gradient masked, SGD
    ref = ConvBNNet()
    space.load(ref, start * mask)
    ref.load_state_dict({**ref.state_dict(), **buffers})
    idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(3))[:8]
    ref.train()
    F.cross_entropy(ref(x[idx]), y[idx]).backward()
    grad = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
    by_hand = start * mask - 0.05 * (grad * mask)
    assert torch.equal(out.params[~mask], by_hand[~mask])
    torch.testing.assert_close(out.params, by_hand, rtol=1e-6, atol=1e-7)
    assert bool((out.params[mask] != start[mask]).any())  # and it did move


def test_all_finite_matches_isfinite():
    from fedgmr.algorithm.params import all_finite

    v = torch.randn(1000)
    assert all_finite(v) and all_finite(torch.zeros(0)) and all_finite(torch.arange(5))
    for bad in (float("nan"), float("inf"), -float("inf")):
        w = v.clone()
        w[417] = bad
        assert not all_finite(w) and not all_finite(w.double()) and not all_finite(w.half())


def test_clip_grad_norm_matches_torch_clipping_of_the_masked_gradient(setup):
    """One plain-SGD step with clipping moves by lr * the masked gradient scaled to the
    norm, exactly as ``clip_grad_norm_`` on the masked gradient; pruned coordinates stay 0."""
    model, space, start, buffers, mask, x, y = setup
    s = TrainSettings(lr=0.1, batch_size=40, local_steps=1, clip_grad_norm=0.05)
    out = masked_local_training(model, space, start, buffers, mask, x, y, s, seed=3)
    # by hand: the full batch's gradient at W * m, masked, clipped, one step
    ref = ConvBNNet()
    space.load(ref, start * mask)
    from fedgmr.algorithm.params import set_buffers
    set_buffers(ref, buffers)
    ref.train()
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(3))
    F.cross_entropy(ref(x[perm]), y[perm]).backward()
    g = torch.cat([p.grad.reshape(-1) for p in ref.parameters()]) * mask
    assert float(g.norm()) > 0.05  # the bound binds
    expected = start * mask - 0.1 * g * (0.05 / (g.norm() + 1e-6))
    assert torch.allclose(out.params, expected, atol=1e-6)
    assert torch.equal(out.params[~mask], torch.zeros(int((~mask).sum())))


def test_clip_flat_has_torch_clipping_coefficient():
    from fedgmr.training.local import clip_flat
    g = torch.tensor([3.0, 4.0])
    assert torch.allclose(clip_flat(g, 1.0), g * (1.0 / (5.0 + 1e-6)))
    assert torch.equal(clip_flat(g, 10.0), g)  # below the bound: unchanged
    assert clip_flat(g, None) is g
    p = nn.Parameter(torch.zeros(2))
    p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_([p], 1.0)
    assert torch.allclose(clip_flat(g, 1.0), p.grad)


# --- the one client loop (run_local_steps) and its steps -------------------------------

@pytest.mark.parametrize("settings", [TrainSettings(lr=0.05, batch_size=8, local_steps=7),
                                      TrainSettings(lr=0.05, momentum=0.9, weight_decay=1e-2, batch_size=8,
                                                    local_steps=7, clip_grad_norm=0.5)])
def test_model_sgd_step_with_a_loss_hook_is_a_plain_torch_sgd_loop_bit_for_bit(setup, settings):
    """FedMRL's loop before it went through the shared one: the same weights, momentum
    kept in the optimiser, the same loss sum, to the bit."""
    from fedgmr.training.local import BatchOrder, ModelSGDStep, run_local_steps

    model, space, start, _, _, x, y = setup

    def run(shared: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        space.load(model, start)
        opt = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum,
                              weight_decay=settings.weight_decay)

        def loss_fn(xb, yb):
            return F.cross_entropy(model(xb), yb) + 0.5 * F.cross_entropy(model(xb * 0.5), yb)

        if shared:
            step = ModelSGDStep(model, opt, settings, loss_fn=loss_fn)
            run_local_steps(x, y, settings.batch_size, 11, settings.local_steps, "cpu", step)
            total = step.total
        else:
            batches = BatchOrder(len(y), settings.batch_size, torch.Generator().manual_seed(11))
            model.train()
            total = torch.zeros(())
            for _ in range(settings.local_steps):
                idx = batches.next()
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(x[idx], y[idx])
                loss.backward()
                if settings.clip_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), settings.clip_grad_norm)
                opt.step()
                total += loss.detach()
        bufs = [opt.state[p].get("momentum_buffer", torch.zeros(0)) for p in model.parameters()]
        return space.flatten(model), total, torch.cat([b.reshape(-1) for b in bufs])

    for a, b in zip(run(True), run(False)):
        assert torch.equal(a, b)


def test_flat_sgd_is_the_written_out_update_bit_for_bit():
    from fedgmr.training.local import FlatSGD, clip_flat

    g = torch.Generator().manual_seed(0)
    w0, decay_mask, step_mask = torch.randn(50, generator=g), torch.rand(50, generator=g) > 0.3, \
        torch.rand(50, generator=g) > 0.2
    s = TrainSettings(lr=0.1, momentum=0.9, weight_decay=1e-2, clip_grad_norm=0.7)
    sgd = FlatSGD(w0.clone(), s)
    w, momentum = w0.clone(), torch.zeros(50)
    for _ in range(3):
        grad = torch.randn(50, generator=g)
        sgd.step(grad, decay_mask, step_mask)
        grad = clip_flat(grad, s.clip_grad_norm) + s.weight_decay * w * decay_mask
        momentum = s.momentum * momentum + grad
        w = w - s.lr * momentum * step_mask
    assert torch.equal(sgd.w, w)
