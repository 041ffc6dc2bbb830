"""The inference max pool (fedgmr.models.pooling): the native module's values outside
autograd, the native kernel itself wherever it is not the plain non-overlapping case."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedgmr.models.pooling import MaxPool2d, window_max
from fedgmr.models.registry import build_model
from fedgmr.training.evaluate import evaluate


def _input(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).relu()  # post-ReLU: many tied zeros, as in the models
    x[..., 0, 0] = x[..., 0, 1] = 3.0  # a tie of non-zero values in the first window
    return x


@pytest.mark.parametrize("shape", [(4, 3, 8, 8), (2, 5, 7, 9), (3, 6, 6)])
@pytest.mark.parametrize("kernel", [2, 3])
def test_window_max_equals_the_native_kernel(shape: tuple[int, ...], kernel: int) -> None:
    x = _input(shape)
    assert torch.equal(window_max(x, (kernel, kernel)), F.max_pool2d(x, kernel))


def test_nan_and_infinities_propagate_as_in_the_native_kernel() -> None:
    x = torch.randn(1, 2, 4, 4)
    x[0, 0, 1, 1] = float("nan")   # not the first element of its window
    x[0, 1, 2, 3] = float("inf")
    x[0, 1, 0, 0] = float("-inf")
    got, want = window_max(x, (2, 2)), F.max_pool2d(x, 2)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == 1
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


def test_the_module_takes_the_fast_path_only_outside_autograd_on_plain_windows() -> None:
    x = _input((2, 3, 8, 8))
    pool = MaxPool2d(2)
    with torch.no_grad():
        assert pool._fast_window(x) == (2, 2)
    assert pool._fast_window(x) == (2, 2)  # grad mode, but the input needs no gradient
    assert pool._fast_window(x.clone().requires_grad_()) is None  # training: the native kernel
    for native_only in (MaxPool2d(3, stride=2, padding=1), MaxPool2d(2, stride=1), MaxPool2d(2, dilation=2),
                        MaxPool2d(2, return_indices=True)):
        assert native_only._fast_window(x) is None
    assert MaxPool2d(2, ceil_mode=True)._fast_window(x) == (2, 2)
    assert MaxPool2d(2, ceil_mode=True)._fast_window(_input((2, 3, 7, 8))) is None  # partial window


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_the_module_gives_the_native_modules_values(ceil_mode: bool) -> None:
    for shape in [(2, 3, 8, 8), (2, 3, 7, 9)]:
        x = _input(shape, seed=1)
        with torch.no_grad():
            assert torch.equal(MaxPool2d(2, ceil_mode=ceil_mode)(x), nn.MaxPool2d(2, ceil_mode=ceil_mode)(x))


def test_training_through_the_module_is_the_native_modules_bit_for_bit() -> None:
    x = _input((4, 3, 8, 8), seed=2)
    grads = []
    for cls in (nn.MaxPool2d, MaxPool2d):
        xi = x.clone().requires_grad_()
        y = cls(2)(xi)
        y.backward(torch.arange(y.numel(), dtype=torch.float32).reshape(y.shape))
        grads.append(xi.grad)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("name,options,shape", [("conv2", {"channels": [8, 16], "hidden": 32}, (1, 28, 28)),
                                                ("cnn", {}, (1, 8, 8))])
def test_a_models_test_evaluation_is_unchanged(name: str, options: dict, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = build_model(name, 10, shape, **options)
    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    assert pools and all(type(m) is MaxPool2d for m in pools)
    x, y = torch.randn(300, *shape), torch.randint(0, 10, (300,))
    fast = evaluate(model, x, y, batch_size=128)
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, MaxPool2d):
                setattr(parent, child_name, nn.MaxPool2d(child.kernel_size))
    assert evaluate(model, x, y, batch_size=128) == fast
