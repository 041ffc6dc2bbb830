"""Width-structured sub-models: shapes at every level for every model, index chaining
(residual shortcuts, attention heads, LSTM gates, flattened features), rolling windows,
and the sub-model computing exactly what the zero-masked full model computes."""

from __future__ import annotations

import math

import pytest
import torch

from fedgmr.algorithm.params import ParamSpace
from fedgmr.baselines.policies import RollingPolicy, WidthPolicy
from fedgmr.baselines.structure import WidthStructure, window
from fedgmr.baselines.training import ModelSpec, WidthClient
from fedgmr.baselines.wire import decode_structured, encode_structured, structured_nbytes
from fedgmr.models import build_model
from fedgmr.models.scaler import attach_scaler
from fedgmr.training.local import TrainSettings, masked_local_training

RATES = [0.0625, 0.125, 0.25, 0.5, 1.0]
MODELS = {
    "mlp": (10, (1, 8, 8), {}),
    "cnn": (10, (1, 8, 8), {}),
    "conv2": (10, (1, 8, 8), {}),
    "vgg11": (10, (3, 8, 8), {"hidden": (64, 64)}),
    "resnet18": (10, (3, 8, 8), {}),
    "transformer_lm": (50, (6,), {"embed_dim": 32, "hidden": 64, "heads": 4}),
    "char_lstm": (30, (6,), {"hidden": 32}),
}


def _spec(name: str) -> ModelSpec:
    nc, shape, opts = MODELS[name]
    return ModelSpec(name, nc, shape, tuple(sorted(opts.items())))


def _input(name: str, n: int = 4) -> torch.Tensor:
    nc, shape, _ = MODELS[name]
    g = torch.Generator().manual_seed(0)
    if len(shape) == 1:
        return torch.randint(0, nc, (n, *shape), generator=g)
    return torch.randn(n, *shape, generator=g)


@pytest.fixture(scope="module")
def structures() -> dict[str, WidthStructure]:
    out = {}
    for name in MODELS:
        spec = _spec(name)
        torch.manual_seed(0)
        out[name] = WidthStructure(spec, spec(1.0))
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_every_level_slices_to_the_width_r_model(name, structures):
    ws = structures[name]
    x = _input(name)
    flat = ws.space.flatten(ws.full)
    for rate in RATES:
        for shift in (0, 5):
            sl = ws.slice(rate, shift)
            sub, sub_space = ws.model(rate)
            assert sl.gather.numel() == sub_space.numel == int(sl.mask.sum())
            for p, q in zip(ws.full.parameters(), sub.parameters()):
                assert p.ndim == q.ndim
                for fd, sd in zip(p.shape, q.shape):
                    assert sd == fd or sd == math.ceil(rate * fd - 1e-9) or name == "transformer_lm"
            sub_space.load(sub, flat[sl.gather])
            sub.eval()
            out = sub(x)
            assert out.shape[-1] == MODELS[name][0]  # the classifier keeps every class
            assert torch.equal(ws.slice_from_mask(sl.mask, rate).mask, sl.mask)


@pytest.mark.parametrize("name", ["mlp", "cnn", "conv2", "vgg11", "resnet18", "char_lstm"])
@pytest.mark.parametrize("shift", [0, 3])
def test_sub_model_equals_zero_masked_full_model(name, shift, structures):
    """Index chaining is right iff the width-r model computes what the full model computes
    with everything outside the slice set to zero (BatchNorm on batch statistics)."""
    ws = structures[name]
    x = _input(name, 8)
    flat = ws.space.flatten(ws.full)
    full_model = _spec(name)(1.0)
    for rate in (0.25, 0.5):
        sl = ws.slice(rate, shift)
        sub, sub_space = ws.model(rate)
        sub_space.load(sub, flat[sl.gather])
        ws.space.load(full_model, flat * sl.mask)
        sub.train()
        full_model.train()
        with torch.no_grad():
            assert torch.allclose(sub(x), full_model(x), atol=1e-5), (name, rate, shift)


def test_resnet_shortcut_takes_block_input_and_output_indices(structures):
    ws = structures["resnet18"]
    for shift in (0, 7):
        sl = ws.slice(0.25, shift)
        from fedgmr.baselines.structure import project

        lists = project(sl.mask, ws.space)
        block = "layers.1.0"
        sc = lists[f"{block}.shortcut.0.weight"]
        assert torch.equal(sc[1], lists[f"{block}.conv1.weight"][1])  # block input
        assert torch.equal(sc[0], lists[f"{block}.conv2.weight"][0])  # block output
        assert torch.equal(lists[f"{block}.shortcut.1.weight"][0], sc[0])  # its BN follows
        assert torch.equal(lists["layers.0.0.conv1.weight"][1], lists["stem.0.weight"][0])


def test_transformer_keeps_heads_and_shrinks_head_dim(structures):
    ws = structures["transformer_lm"]
    sl = ws.slice(0.5, 0)
    from fedgmr.baselines.structure import project

    lists = project(sl.mask, ws.space)
    head = torch.cat([h * 8 + torch.arange(4) for h in range(4)])  # E 32, 4 heads: 8 -> 4 dims
    for c in "qkv":
        assert torch.equal(lists[f"blocks.0.attn.{c}.weight"][0], head)
        assert torch.equal(lists[f"blocks.0.attn.{c}.weight"][1], torch.arange(16))
    assert torch.equal(lists["blocks.0.attn.out.weight"][1], head)
    assert torch.equal(lists["blocks.0.attn.out.weight"][0], torch.arange(16))
    assert torch.equal(lists["embed.weight"][0], torch.arange(50))  # every token row
    sub, _ = ws.model(0.5)
    assert sub.blocks[0].attn.heads == 4 and sub.blocks[0].attn.head_dim == 4


def test_lstm_gates_are_windowed_per_gate(structures):
    ws = structures["char_lstm"]
    sl = ws.slice(0.25, 1)
    from fedgmr.baselines.structure import project

    lists = project(sl.mask, ws.space)
    win = torch.sort(window(32, 8, 1)).values
    gates = torch.cat([g * 32 + win for g in range(4)])
    assert torch.equal(lists["lstm.weight_hh_l0"][0], gates)
    assert torch.equal(lists["lstm.weight_hh_l0"][1], win)


def test_fedrolex_coverage_over_k_rounds_is_equal():
    spec = ModelSpec("mlp", 10, (1, 8, 8), (("hidden", (8,)),))
    model = spec(1.0)
    space = ParamSpace(model)
    policy = RollingPolicy(space, [0.3, 1.0], model, spec, rates=[0.25, 1.0])
    k = 8
    counts = torch.zeros(space.numel, dtype=torch.long)
    for step in range(k):
        policy.refresh(step, torch.zeros(space.numel))
        counts += policy.mask(0).long()
    hidden_w = counts[space.params[0].slice].view(8, 64)
    assert hidden_w.eq(2).all()  # each of the 8 hidden units covered 8 * 2 / 8 = 2 times
    assert not policy.nested
    policy.refresh(1, torch.zeros(space.numel))
    first = policy.mask(0)[space.params[0].slice].view(8, 64).any(1).nonzero().view(-1)
    assert first.tolist() == [0, 7]


def test_heterofl_levels_are_nested_and_report_parameter_fractions():
    spec = ModelSpec("cnn", 10, (1, 8, 8), ())
    model = spec(1.0)
    space = ParamSpace(model)
    policy = WidthPolicy(space, [0.05, 0.1, 0.2, 0.5, 1.0], model, spec)
    masks = [policy.mask(l) for l in range(5)]
    assert all(bool((a & ~b).sum() == 0) for a, b in zip(masks, masks[1:]))
    fr = policy.level_densities()
    assert fr[-1] == 1.0 and all(a < b for a, b in zip(fr, fr[1:]))
    assert all(f <= d + 1e-9 for f, d in zip(fr, [0.05, 0.1, 0.2, 0.5, 1.0]))
    incs = policy.increments()
    assert torch.equal(torch.stack(incs).sum(0), masks[-1].long())


def test_scaler_is_identity_in_evaluation_and_divides_in_training():
    model = build_model("mlp", 10, (1, 8, 8), hidden=(16,))
    x = torch.randn(4, 1, 8, 8)
    model.eval()
    ref = model(x)
    handles = attach_scaler(model, 0.25, ParamSpace(model).output_layer)
    assert torch.equal(model(x), ref)
    model.train()
    l1, l2 = model.net[1], model.net[3]
    hidden = torch.nn.functional.linear(x.flatten(1), l1.weight, l1.bias) / 0.25
    expect = torch.nn.functional.linear(torch.relu(hidden), l2.weight, l2.bias)  # output layer: not scaled
    assert torch.allclose(model(x), expect)
    for h in handles:
        h.remove()
    assert torch.allclose(model(x), expect * 0 + torch.nn.functional.linear(
        torch.relu(hidden * 0.25), l2.weight, l2.bias))


class _Workload:
    def __init__(self, model, settings):
        self.model, self.space, self.settings = model, ParamSpace(model), settings


class _Job:
    def __init__(self, start, mask, seed=3):
        self.start, self.mask, self.seed, self.buffers = start, mask, seed, {}


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_training_the_small_model_equals_masked_full_training(name):
    spec = _spec(name)
    torch.manual_seed(1)
    full = spec(1.0)
    space = ParamSpace(full)
    settings = TrainSettings(lr=0.1, momentum=0.5, batch_size=8, local_steps=3)
    x, y = _input(name, 24), torch.randint(0, 10, (24,))
    ws = WidthStructure(spec, full)
    for shift in (0, 2):
        sl = ws.slice(0.5, shift)
        method = WidthClient(spec, (0.5, 1.0), (int(sl.mask.sum()), space.numel), scaler=False)
        start = space.flatten(full)
        got = method.train(_Workload(spec(1.0), settings), _Job(start, sl.mask), x, y, None).outcome
        ref = masked_local_training(spec(1.0), space, start, {}, sl.mask, x, y, settings, 3)
        assert torch.allclose(got.params, ref.params, atol=1e-5)
        assert bool((got.params[~sl.mask] == 0).all())


def test_structured_payload_has_no_mask_bits_and_round_trips(structures):
    ws = structures["cnn"]
    sl = ws.slice(0.5, 3)
    values = torch.randn(int(sl.mask.sum()))
    data = encode_structured(values, ws.space.numel, 0.5, 3)
    assert len(data) == structured_nbytes(values.numel())

    def mask_fn(rate: float, shift: int) -> torch.Tensor:
        return ws.slice(min(RATES, key=lambda r: abs(r - rate)), shift).mask

    mask, got = decode_structured(data, mask_fn, ws.space.numel)
    assert torch.equal(mask, sl.mask) and torch.equal(got, values)
    inc = ws.slice(0.5, 0).mask & ~ws.slice(0.25, 0).mask
    data = encode_structured(torch.zeros(int(inc.sum())), ws.space.numel, 0.5, 0, lower=0.25)
    mask, _ = decode_structured(data, mask_fn, ws.space.numel)
    assert torch.equal(mask, inc) and len(data) == structured_nbytes(int(inc.sum()))


def test_slices_are_cached_per_rate_and_shift_and_the_oldest_shift_goes(structures):
    from fedgmr.baselines import structure as structure_module

    ws = next(iter(structures.values()))
    first = ws.slice(0.5, 0)
    assert ws.slice(0.5, 0) is first  # FjORD asks for it at every job
    rolled = ws.slice(0.5, 1)
    assert rolled is not first and not torch.equal(rolled.gather, first.gather)
    fresh = structure_module.WidthStructure(ws.build, ws.full)  # uncached: the same slice
    assert torch.equal(fresh.slice(0.5, 1).gather, rolled.gather) and torch.equal(fresh.slice(0.5, 1).mask, rolled.mask)
    for shift in range(2, 2 + structure_module.SLICE_CACHE):
        ws.slice(0.5, shift)
    assert len(ws._slices) == structure_module.SLICE_CACHE
    assert ws.slice(0.5, 0) is not first  # evicted, then rebuilt equal
    assert torch.equal(ws.slice(0.5, 0).gather, first.gather)
