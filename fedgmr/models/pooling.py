"""Max pooling whose inference on the CPU skips the index bookkeeping.

On the CPU, ``nn.MaxPool2d`` always runs ``max_pool2d_with_indices``, even under
``torch.no_grad``: on a contiguous (NCHW) batch it walks every window element by element
and records where each maximum was. In a test evaluation of the ``mnist`` preset's Conv-2
that kernel took 40 % of the CPU. For the windows the library's models use (kernel equal to
stride, no padding, no dilation: they do not overlap), the maximum of the ``k * k`` strided
views of the input is the same value, in a few vectorised element-wise passes.

The values are equal as numbers to the native kernel's (a maximum is exact; NaN propagates
the same way). Only the sign of a zero can differ where a window holds both ``-0.0`` and
``+0.0``; ``-0.0 == 0.0``, and a zero's sign cannot change a later sum that holds any
non-zero term. Training (autograd recording) keeps the native kernel, whose indices the
backward pass routes the gradient by, so training is unchanged bit for bit.
"""
from __future__ import annotations

import torch
from torch import nn


def _pair(v: int | tuple[int, ...]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def window_max(x: torch.Tensor, kernel: tuple[int, int]) -> torch.Tensor:
    """Max over non-overlapping ``kernel`` windows (stride = kernel), floor mode: the
    maximum of the ``kh * kw`` strided views of ``x`` (..., H, W)."""
    kh, kw = kernel
    h, w = x.shape[-2] // kh * kh, x.shape[-1] // kw * kw
    if h == 0 or w == 0:
        raise ValueError(f"input of spatial size {tuple(x.shape[-2:])} is smaller than the window {kernel}")
    x = x[..., :h, :w]
    out = x[..., 0::kh, 0::kw]
    for i in range(kh):
        for j in range(kw):
            if i or j:
                out = torch.maximum(out, x[..., i::kh, j::kw])
    return out


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` that, outside autograd on the CPU and for non-overlapping windows,
    computes :func:`window_max` instead of the native kernel (same values, see the module
    docstring). Everything else - training, other devices, overlapping or padded windows,
    ``return_indices`` - is the native module's."""

    def _fast_window(self, x: torch.Tensor) -> tuple[int, int] | None:
        if x.device.type != "cpu" or x.dim() not in (3, 4) or self.return_indices:
            return None
        if torch.is_grad_enabled() and x.requires_grad:
            return None
        kernel, stride = _pair(self.kernel_size), _pair(self.stride if self.stride is not None else self.kernel_size)
        if kernel != stride or _pair(self.padding) != (0, 0) or _pair(self.dilation) != (1, 1):
            return None
        if self.ceil_mode and (x.shape[-2] % kernel[0] or x.shape[-1] % kernel[1]):
            return None  # ceil mode keeps a partial last window: the native kernel's case
        if x.shape[-2] < kernel[0] or x.shape[-1] < kernel[1]:
            return None  # the native module's error
        return kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = self._fast_window(x)
        if kernel is None:
            return super().forward(x)
        return window_max(x, kernel)


__all__ = ["MaxPool2d", "window_max"]
