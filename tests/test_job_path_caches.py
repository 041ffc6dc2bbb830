"""The client job path's lookups, kept between jobs (issue 39, per-job overhead): a model's
parameters, buffers and modules are looked up once (fedgmr.algorithm.params.model_refs)
and looked up again whenever the model changed; plain SGD without a mask steps as
torch.optim.SGD does; the mask facts computed the fast way equal torch's."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fedgmr.algorithm.maskinfo import MaskMutatedError, mask_count, mask_indices
from fedgmr.algorithm.params import ParamSpace, get_buffers, model_refs, set_buffers
from fedgmr.training.local import BatchOrder, TrainSettings, masked_local_training
from fedgmr.training.losses import task_loss


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _names(model: nn.Module) -> tuple[list[str], list[str]]:
    return [n for n, _ in model.named_parameters()], [n for n, _ in model.named_buffers()]


def test_refs_are_kept_while_the_model_is_unchanged_and_list_what_torch_lists():
    model = _net()
    refs = model_refs(model)
    assert model_refs(model) is refs
    assert (list(refs.params), list(refs.buffers)) == _names(model)
    assert all(refs.params[n] is p for n, p in model.named_parameters())
    shared = nn.Linear(2, 2)  # a module (and its parameters) twice: listed once, as torch does
    tied = nn.Sequential(shared, nn.ReLU(), shared, nn.BatchNorm1d(2))
    assert (list(model_refs(tied).params), list(model_refs(tied).buffers)) == _names(tied)


@pytest.mark.parametrize("change", ["replace_parameter", "replace_buffer", "add_module", "replace_module",
                                    "register_buffer", "delete_parameter"])
def test_refs_are_looked_up_again_when_the_model_changes(change):
    model = _net()
    refs = model_refs(model)
    if change == "replace_parameter":
        model[0].weight = nn.Parameter(torch.zeros(8, 6))
    elif change == "replace_buffer":
        model[1].running_mean = torch.ones(8)
    elif change == "add_module":
        model.add_module("extra", nn.Linear(3, 3))
    elif change == "replace_module":
        model[3] = nn.Linear(8, 3)
    elif change == "register_buffer":
        model[0].register_buffer("scale", torch.ones(1))
    else:
        del model[3].bias
        model[3].register_parameter("bias", None)
    new = model_refs(model)
    assert new is not refs
    assert (list(new.params), list(new.buffers)) == _names(model)
    assert all(new.params[n] is p for n, p in model.named_parameters())
    assert all(new.buffers[n] is b for n, b in model.named_buffers())


def test_training_writes_into_a_parameter_replaced_between_jobs():
    model = _net()
    space = ParamSpace(model)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    settings = TrainSettings(lr=0.1, local_steps=2, batch_size=8)
    start = space.flatten(model)
    masked_local_training(model, space, start, get_buffers(model), None, x, y, settings, 1)
    model[3].weight = nn.Parameter(torch.zeros(3, 8))  # what the next job must start from and train
    out = masked_local_training(model, space, start, get_buffers(model), None, x, y, settings, 2)
    assert torch.equal(out.params, space.flatten(model))
    assert torch.equal(model[3].weight.detach(), space.views(out.params)["3.weight"])
    assert not torch.equal(model[3].weight.detach(), space.views(start)["3.weight"])  # trained


def test_buffers_are_read_and_written_by_name():
    model = _net()
    bufs = {k: v + 1.0 if v.is_floating_point() else v + 1 for k, v in get_buffers(model).items()}
    set_buffers(model, bufs)
    assert all(torch.equal(b, bufs[n]) for n, b in model.named_buffers())
    out = get_buffers(model)
    assert list(out) == [n for n, _ in model.named_buffers()]
    assert all(out[n] is not b and torch.equal(out[n], b) for n, b in model.named_buffers())


def test_a_model_that_overrides_train_is_still_put_in_training_mode():
    calls = []

    class Frozen(nn.Linear):
        def train(self, mode: bool = True):
            calls.append(mode)
            return super().train(mode)

    model = nn.Sequential(nn.Linear(4, 4), Frozen(4, 2))
    space = ParamSpace(model)
    x, y = torch.randn(10, 4), torch.randint(0, 2, (10,))
    masked_local_training(model, space, space.flatten(model), {}, None, x, y, TrainSettings(local_steps=1), 0)
    assert calls == [True]


def test_plain_sgd_without_a_mask_steps_as_torch_optim_sgd_bit_for_bit():
    model, ref = _net(), _net()
    space = ParamSpace(model)
    x, y = torch.randn(50, 6), torch.randint(0, 3, (50,))
    settings = TrainSettings(lr=0.07, local_steps=7, batch_size=8)
    start = space.flatten(model)
    out = masked_local_training(model, space, start, get_buffers(model), None, x, y, settings, 123)
    opt = torch.optim.SGD(ref.parameters(), lr=settings.lr)
    batches = BatchOrder(len(y), settings.batch_size, torch.Generator().manual_seed(123))
    ref.train()
    for _ in range(settings.local_steps):
        idx = batches.next()
        opt.zero_grad()
        task_loss(ref(x[idx]), y[idx], "classification").backward()
        opt.step()
    assert torch.equal(out.params, space.flatten(ref))
    assert all(torch.equal(out.buffers[n], b) for n, b in ref.named_buffers())


@pytest.mark.parametrize("density", [0.0, 0.01, 0.5, 1.0])
def test_mask_facts_equal_torchs(density):
    gen = torch.Generator().manual_seed(3)
    mask = torch.rand(1001, generator=gen) < density
    idx = mask_indices(mask)
    assert idx.dtype == torch.int64 and torch.equal(idx, torch.nonzero(mask).squeeze(1))
    assert mask_count(mask) == int(mask.sum())
    grid = torch.rand(7, 9, generator=gen) < density  # not flat
    assert torch.equal(mask_indices(grid), torch.nonzero(grid.reshape(-1)).squeeze(1))


def test_a_mask_written_in_place_after_use_is_still_refused():
    mask = torch.tensor([True, False, True])
    assert mask_count(mask) == 2
    mask[1] = True
    with pytest.raises(MaskMutatedError):
        mask_indices(mask)
