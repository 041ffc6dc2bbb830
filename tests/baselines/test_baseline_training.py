"""Client methods of FjORD and FIARSE, and the server-side static BatchNorm pass."""

from __future__ import annotations

import torch

from fedgmr.algorithm.params import ParamSpace
from fedgmr.baselines import fiarse_math
from fedgmr.baselines.policies import FiarsePolicy, OrderedDropoutPolicy
from fedgmr.baselines.server import BNStatistics
from fedgmr.baselines.structure import WidthStructure
from fedgmr.baselines.training import (FiarseClient, ModelSpec, OrderedDropoutClient, WidthClient,
                                       fiarse_local_training)
from fedgmr.training.local import TrainSettings

SPEC = ModelSpec("cnn", 10, (1, 8, 8), ())


class _Workload:
    def __init__(self, model, settings):
        self.model, self.space, self.settings = model, ParamSpace(model), settings


class _Job:
    def __init__(self, start, mask, buffers=None, seed=5):
        self.start, self.mask, self.seed, self.buffers = start, mask, seed, buffers or {}


def _data(n=30):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_fjord_with_one_allowed_width_is_plain_sgd_on_the_sub_model():
    torch.manual_seed(0)
    full = SPEC(1.0)
    space = ParamSpace(full)
    ws = WidthStructure(SPEC, full)
    sl = ws.slice(0.5, 0)
    s = TrainSettings(lr=0.1, momentum=0.9, weight_decay=1e-3, batch_size=10, local_steps=4)
    x, y = _data()
    sizes = (int(sl.mask.sum()), space.numel)
    od = OrderedDropoutClient(SPEC, (0.5, 1.0), sizes, p_values=(0.5,))
    plain = WidthClient(SPEC, (0.5, 1.0), sizes, scaler=False)
    start = space.flatten(full)
    a = od.train(_Workload(SPEC(1.0), s), _Job(start, sl.mask), x, y, None).outcome
    b = plain.train(_Workload(SPEC(1.0), s), _Job(start, sl.mask), x, y, None).outcome
    assert torch.allclose(a.params, b.params, atol=1e-5)


def test_fjord_trains_only_inside_its_tier_and_distills():
    torch.manual_seed(0)
    full = SPEC(1.0)
    space = ParamSpace(full)
    policy = OrderedDropoutPolicy(space, [0.3, 1.0], full, SPEC, rates=[0.6, 1.0])
    assert policy.allowed(0) == [0.2, 0.4, 0.6]
    mask = policy.mask(0)
    x, y = _data()
    s = TrainSettings(lr=0.1, batch_size=10, local_steps=6)
    for distill in (False, True):
        tr = OrderedDropoutClient(SPEC, tuple(policy.rates), tuple(policy.level_sizes()), policy.p_values, distill)
        out = tr.train(_Workload(SPEC(1.0), s), _Job(space.flatten(full), mask), x, y, None).outcome
        assert bool((out.params[~mask] == 0).all())
        assert not torch.equal(out.params[mask], space.flatten(full)[mask])


def test_fiarse_masks_never_grow_within_a_local_round():
    torch.manual_seed(0)
    model = SPEC(1.0)
    space = ParamSpace(model)
    params = space.flatten(model)
    policy = FiarsePolicy(space, [0.25, 1.0], params, model)
    mask = policy.mask(0)
    seen: list[torch.Tensor] = []
    s = TrainSettings(lr=0.5, momentum=0.5, batch_size=10, local_steps=8)
    x, y = _data()
    out = fiarse_local_training(model, space, params, {}, mask, policy.groups, x, y, s, 1, on_step=seen.append)
    prev = mask
    shrunk = False
    for m in seen:
        assert not bool((m & ~prev).any())  # never grows
        shrunk |= bool((prev & ~m).any())
        prev = m
    assert shrunk  # with this learning rate some weights drop below their threshold
    assert bool((out.params[~mask] == 0).all())
    assert bool((policy.groups[~mask] >= 0).all())  # norm parameters are always kept


def test_fiarse_stage_thresholds_and_global_threshold():
    model = ModelSpec("resnet18", 10, (3, 8, 8), ())(1.0)
    space = ParamSpace(model)
    g = fiarse_math.score_groups(model, space, "stage")
    assert int(g.max()) + 1 == 6  # stem, layers.0..3, classifier
    params = space.flatten(model)
    policy = FiarsePolicy(space, [0.1, 1.0], params, model, scope="stage")
    for k in range(6):
        sel = g == k
        frac = float(policy.mask(0)[sel].float().mean())
        assert abs(frac - 0.1) < 0.01
    assert fiarse_math.score_groups(model, space, "global").max() == 0


def test_fiarse_client_uses_extracted_thresholds():
    torch.manual_seed(0)
    model = SPEC(1.0)
    space = ParamSpace(model)
    params = space.flatten(model)
    policy = FiarsePolicy(space, [0.5, 1.0], params, model)
    s = TrainSettings(lr=0.05, batch_size=10, local_steps=2)
    x, y = _data()
    out = FiarseClient().train(_Workload(SPEC(1.0), s), _Job(params, policy.mask(0)), x, y, None).outcome
    assert out.params.shape == params.shape and bool((out.params[~policy.mask(0)] == 0).all())


def test_fiarse_full_client_trains_through_an_exact_zero_weight():
    # Regression: a full-size client's threshold is its smallest |w|; one weight at exactly
    # 0 made theta = 0 and the multiplier 0/0, so every update came back NaN and the full
    # client was rejected for the rest of the run (MNIST Table 1, FIARSE High).
    torch.manual_seed(0)
    model = SPEC(1.0)
    space = ParamSpace(model)
    params = space.flatten(model)
    params[3] = 0.0
    full = torch.ones(space.numel, dtype=torch.bool)
    groups = fiarse_math.score_groups(model, space)
    s = TrainSettings(lr=0.05, batch_size=10, local_steps=3)
    x, y = _data()
    out = fiarse_local_training(model, space, params, {}, full, groups, x, y, s, 1)
    assert bool(torch.isfinite(out.params).all())
    assert not torch.equal(out.params, params)  # it trained
    # theta = 0 makes the multiplier 1 everywhere: plain masked SGD on the full model
    plain = fiarse_local_training(model, space, params, {}, full, torch.full_like(groups, -1), x, y, s, 1)
    assert torch.equal(out.params, plain.params)


def test_server_bn_pass_is_a_cumulative_average_over_the_split():
    torch.manual_seed(0)
    model = SPEC(1.0)
    space = ParamSpace(model)
    x, _ = _data(40)
    stats = BNStatistics(model, space, x, batch_size=8)  # equal batches: the mean of batch means
    bufs = stats(space.flatten(model))
    first = model.features[0](x)
    assert torch.allclose(bufs["features.1.running_mean"], first.mean((0, 2, 3)), atol=1e-5)
    ws = WidthStructure(SPEC, SPEC(1.0))
    per_width = BNStatistics(SPEC(1.0), space, x, structure=ws, widths=[0.5, 1.0])
    per_width(space.flatten(model))
    assert per_width.width_buffers[0]["features.1.running_mean"].numel() == 8
    assert per_width.width_buffers[1]["features.1.running_mean"].numel() == 16


# --- training.clip_grad_norm (HeteroFL's and FedRolex's published client loops clip at 1) ---

def _one_step(s):
    """One plain-SGD step of each width client method from the same start: its parameter change."""
    torch.manual_seed(0)
    full = SPEC(1.0)
    space = ParamSpace(full)
    ws = WidthStructure(SPEC, full)
    sl = ws.slice(0.5, 0)
    sizes = (int(sl.mask.sum()), space.numel)
    x, y = _data()
    start = space.flatten(full)
    out = {}
    for name, tr in (("width", WidthClient(SPEC, (0.5, 1.0), sizes, scaler=True)),
                     ("fjord", OrderedDropoutClient(SPEC, (0.5, 1.0), sizes, p_values=(0.5,)))):
        out[name] = tr.train(_Workload(SPEC(1.0), s), _Job(start, sl.mask), x, y, None).outcome.params - start * sl.mask
    policy = FiarsePolicy(space, [0.5, 1.0], start, full)
    out["fiarse"] = FiarseClient().train(_Workload(SPEC(1.0), s), _Job(start, policy.mask(0)), x, y, None).outcome.params \
        - start * policy.mask(0)
    return out


def test_clip_grad_norm_bounds_every_width_clients_step_to_lr_times_the_norm():
    free = _one_step(TrainSettings(lr=0.5, batch_size=10, local_steps=1))
    clipped = _one_step(TrainSettings(lr=0.5, batch_size=10, local_steps=1, clip_grad_norm=0.01))
    for name in free:
        n_free, n_clip = float(free[name].norm()), float(clipped[name].norm())
        assert n_free > 0.5 * 0.01 * 10, name  # the unclipped step is far larger than the bound
        # one SGD step of a gradient clipped to 0.01: |delta| = lr * 0.01 (FIARSE's masks may
        # also drop coordinates below their threshold, which only removes norm)
        assert n_clip <= 0.5 * 0.01 * (1 + 1e-4), name
        if name != "fiarse":
            assert abs(n_clip - 0.5 * 0.01) < 1e-6, name
            # same direction: clipping scales the gradient, it does not change it
            cos = float(free[name] @ clipped[name]) / (n_free * n_clip)
            assert cos > 0.9999, name


def _dense_fiarse_reference(model, space, start, mask, groups, x, y, s, seed):
    """FIARSE's local round written plainly: every step rescans the whole mask."""
    from fedgmr.training.local import BatchOrder, task_loss
    scored = groups >= 0
    theta = fiarse_math.thresholds_from_mask(start, mask, groups)
    w, m, momentum = start.clone(), mask.clone(), torch.zeros_like(start)
    gen = torch.Generator().manual_seed(seed)
    batches = BatchOrder(len(y), s.batch_size, gen)
    masks = []
    model.train()
    for _ in range(s.local_steps):
        idx = batches.next()
        space.load(model, w * m)
        model.zero_grad(set_to_none=True)
        task_loss(model(x[idx]), y[idx], s.task, s.loss, s.pad_index).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()]) * m
        g = torch.where(scored & m, g * fiarse_math.multiplier(w, theta), g)
        momentum = s.momentum * momentum + g
        w = w - s.lr * momentum * mask
        m = m & ~(scored & (w.abs() < theta))
        masks.append(m.clone())
    return w * mask, masks


def test_fiarse_local_round_matches_the_plain_dense_round_bit_for_bit():
    # the client's indexed multiplier against the plain dense form of the same round:
    # same weights and same masks, to the bit
    torch.manual_seed(3)
    model = SPEC(1.0)
    space = ParamSpace(model)
    params = space.flatten(model)
    x, y = _data()
    s = TrainSettings(lr=0.5, momentum=0.5, batch_size=10, local_steps=8)
    for size in (0.25, 1.0):
        policy = FiarsePolicy(space, [size], params, model)
        mask = policy.mask(0)
        seen: list[torch.Tensor] = []
        out = fiarse_local_training(model, space, params, {}, mask, policy.groups, x, y, s, 7, on_step=seen.append)
        ref, ref_masks = _dense_fiarse_reference(SPEC(1.0), space, params, mask, policy.groups, x, y, s, 7)
        assert torch.equal(out.params, ref)
        assert len(seen) == len(ref_masks) and all(torch.equal(a, b) for a, b in zip(seen, ref_masks))
        assert bool((seen[-1] != mask).any())  # weights did drop out


def test_fiarse_level_masks_from_one_sort_match_a_topk_per_size():
    g = torch.Generator().manual_seed(0)
    params = torch.randn(400, generator=g)
    params[:40] = 0.25  # ties across the thresholds
    groups = torch.randint(-1, 3, (400,), generator=g)  # three groups and unscored coordinates
    sizes = [0.01, 0.05, 0.2, 0.5, 1.0]
    got = fiarse_math.level_masks(params, groups, sizes)
    for size, mask in zip(sizes, got):
        want = groups < 0
        for grp in range(3):
            sel = groups == grp
            scores = params.abs()[sel]
            k = int(scores.numel() * size + 1e-9)
            theta = torch.topk(scores.double(), k).values[-1].item() if k else float("inf")
            want[sel] = scores >= theta
        assert torch.equal(mask, want), size
        assert torch.equal(fiarse_math.level_mask(params, groups, size), want)
    assert fiarse_math.thresholds(params.abs(), [0.001, 1.0]) == [float("inf"), float(params.abs().min())]
