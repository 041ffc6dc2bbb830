"""Learning-rate schedules over model versions and image augmentation in local training:
hand-computed rates, the augmentation's geometry, and runs that use them."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import simulate, tiny_config
from fedgmr.errors import ConfigError
from fedgmr.methods import resolve_config
from fedgmr.training.augment import augment_images
from fedgmr.training.local import TrainSettings
from fedgmr.training.schedules import lr_at


def test_step_and_cosine_rates_by_hand():
    assert [lr_at("step", 0.1, v, step_every=10, gamma=0.5) for v in (0, 9, 10, 25)] == \
        pytest.approx([0.1, 0.1, 0.05, 0.025])
    cos = [lr_at("cosine", 0.1, v, total_steps=100, min_lr=0.0) for v in (0, 50, 100, 150)]
    assert cos == pytest.approx([0.1, 0.05, 0.0, 0.0])
    assert lr_at("cosine", 0.1, 25, total_steps=100, min_lr=0.02) == pytest.approx(
        0.02 + 0.08 * (1 + math.cos(math.pi / 4)) / 2)
    assert lr_at("constant", 0.3, 999) == 0.3
    with pytest.raises(ValueError):
        lr_at("cosine", 0.1, 3)


def test_settings_for_a_version_carry_the_scheduled_rate():
    s = TrainSettings(lr=0.2, lr_schedule=("step", 5, 0.1, None, 0.0))
    assert s.for_version(4).lr == 0.2 and s.for_version(5).lr == pytest.approx(0.02)
    assert s.for_version(5).batch_size == s.batch_size
    plain = TrainSettings(lr=0.2)
    assert plain.for_version(100) is plain


def test_crops_are_windows_of_the_padded_image_and_flips_mirror_it():
    x = torch.arange(4 * 2 * 5 * 5, dtype=torch.float32).view(4, 2, 5, 5)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    out = augment_images(x, torch.Generator().manual_seed(3), crop_padding=2)
    assert out.shape == x.shape and not torch.equal(out, x)
    for i in range(4):  # each output is one 5 x 5 window of its own padded image, all channels alike
        windows = [padded[i, :, r:r + 5, c:c + 5] for r in range(5) for c in range(5)]
        assert any(torch.equal(out[i], w) for w in windows)
    flipped = augment_images(x, torch.Generator().manual_seed(3), flip=True)
    for i in range(4):
        assert torch.equal(flipped[i], x[i]) or torch.equal(flipped[i], x[i].flip(-1))
    # the job's seed decides: the same generator seed, the same images
    again = augment_images(x, torch.Generator().manual_seed(3), crop_padding=2)
    assert torch.equal(out, again)
    with pytest.raises(ValueError, match="images"):
        augment_images(x.view(4, -1), torch.Generator(), flip=True)


def _run(**training):
    records, _ = simulate(tiny_config(model={"name": "cnn", "options": {"channels": [4, 8]}},
                                      training={"lr": 0.1, "local_steps": 2, **training},
                                      run={"max_steps": 6, "eval_every": 3}))
    return [(r["step"], r["accuracy"], r["loss"]) for r in records]


def test_a_run_trains_with_the_schedule_and_the_augmentation():
    plain = _run()
    # a step schedule whose gamma is 1 changes nothing: the wiring alone is bit-neutral
    assert _run(lr_schedule={"kind": "step", "step_every": 1, "gamma": 1.0}) == plain
    decayed = _run(lr_schedule={"kind": "step", "step_every": 1, "gamma": 0.1})
    assert decayed[0] == plain[0] and decayed[1:] != plain[1:]  # same start, slower steps after
    augmented = _run(augment={"flip": True, "crop_padding": 1})
    assert augmented[0] == plain[0] and augmented[1:] != plain[1:]
    assert _run(augment={"flip": True, "crop_padding": 1}) == augmented  # one seed, one run


def test_bad_schedule_and_augmentation_settings_are_refused():
    for bad in ({"lr_schedule": {"kind": "cosine"}}, {"lr_schedule": {"kind": "warmup"}},
                {"lr_schedule": {"gamma": 0}}, {"augment": {"crop_padding": -1}}):
        with pytest.raises(ConfigError):
            resolve_config(tiny_config(training=bad))
