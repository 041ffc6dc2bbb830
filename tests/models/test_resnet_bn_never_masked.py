"""ResNet-18's BatchNorm running statistics are never masked (docs/reference.md §3.3)."""

from __future__ import annotations

import torch

from fedgmr.algorithm.masks import magnitude_ranking, mask_from_ranking
from fedgmr.algorithm.params import ParamSpace, get_buffers
from fedgmr.models import build_model
from fedgmr.training.local import TrainSettings, masked_local_training


def test_resnet18_bn_statistics_train_unmasked_under_a_sparse_mask():
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=10, input_shape=(3, 16, 16), width=0.125)
    space = ParamSpace(model)
    bn_buffers = [n for n in space.buffer_names if n.endswith("running_mean")]
    assert len(bn_buffers) >= 17  # stem + 16 block norms (+ shortcut norms)
    assert not any(p.name.endswith(("running_mean", "running_var")) for p in space.params)
    flat = space.flatten(model)
    mask = mask_from_ranking(magnitude_ranking(flat, space), space, 0.05)
    before = get_buffers(model)
    x, y = torch.randn(40, 3, 16, 16), torch.randint(0, 10, (40,))
    out = masked_local_training(model, space, flat, before, mask, x, y,
                                TrainSettings(lr=0.05, local_steps=3, batch_size=8), seed=1)
    assert torch.equal(out.params[~mask], torch.zeros(int((~mask).sum())))  # weights pruned exactly
    for name in bn_buffers:
        var = name.replace("running_mean", "running_var")
        # every channel's statistics moved - none were zeroed or frozen by the mask
        assert bool((out.buffers[name] != before[name]).all()), name
        assert bool((out.buffers[var] > 0).all()), var
