"""A stand-in CUDA device on the CPU that records every operation mixing devices.

Machines without a GPU cannot run ``run.device=cuda``, yet most device bugs are a tensor
created on the CPU and combined with one on the GPU. Inside :func:`fake_cuda`,
``torch.cuda.is_available()`` is True and tensors "on cuda" are CPU tensors tagged as
such: ``.to("cuda")``, factories with ``device="cuda"`` and ``Module.to("cuda")`` tag
their results, ``tensor.device`` reports the tag, every op's result inherits its inputs'
tag, and an op whose inputs mix tags (0-dim CPU tensors aside, as on a real GPU) is
recorded in :attr:`FakeCuda.violations` with the stack that issued it. The numbers are
the CPU's, so a run on the fake device must give exactly the CPU run's metrics.

Limits: one process (pool and Ray workers see no fake); tensors created inside C++
without a Python-visible op (autograd's gradients) take their owner's tag through the
``.grad`` getter or count as CPU tensors.
"""

from __future__ import annotations

import traceback
import weakref
from contextlib import contextmanager
from typing import Any, Iterator
from unittest import mock

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
#: id(tensor) -> (weak reference, "cuda" | "cpu"); untagged tensors are CPU tensors
_TAGS: dict[int, tuple[weakref.ref, str]] = {}


def tag_of(t: torch.Tensor) -> str:
    hit = _TAGS.get(id(t))
    return hit[1] if hit is not None and hit[0]() is t else "cpu"


def _tag(t: torch.Tensor, tag: str) -> None:
    key = id(t)
    _TAGS[key] = (weakref.ref(t, lambda _r, k=key: _TAGS.pop(k, None)), tag)


def _kind(device: Any) -> str:
    return "cuda" if device is not None and torch.device(device).type == "cuda" else "cpu"


def _tensors(obj: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tensors(o, out)
    return out


def _parse_to(args: tuple, kwargs: dict) -> tuple[torch.device | None, torch.dtype | None]:
    """(device, dtype) of a ``Tensor.to`` / ``Module.to`` call."""
    kw = {k: v for k, v in kwargs.items() if k != "copy"}
    device, dtype, _, _ = torch._C._nn._parse_to(*[a for a in args if not isinstance(a, bool)], **kw)
    return device, dtype


class FakeCuda(TorchFunctionMode):
    """The mode :func:`fake_cuda` enters; ``violations`` lists the mixing ops."""

    def __init__(self) -> None:
        super().__init__()
        self.violations: list[str] = []

    def _move(self, src: torch.Tensor, device: torch.device | None, dtype: torch.dtype | None,
              copy: bool) -> torch.Tensor:
        """``src.to(device, dtype)`` with the real semantics: itself when nothing changes."""
        kw: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
        to = tag_of(src) if device is None else _kind(device)
        if to != tag_of(src):
            copy = True
        out = src.to(**kw, copy=copy) if kw or copy else src
        if out is not src:
            _tag(out, to)
        return out

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":  # properties
            prop = getattr(getattr(func, "__self__", None), "__name__", "")
            if prop == "device":
                return CUDA if tag_of(args[0]) == "cuda" else CPU
            if prop == "is_cuda":
                return tag_of(args[0]) == "cuda"
            out = func(*args, **kwargs)
            if prop in ("grad", "data") and isinstance(out, torch.Tensor):
                _tag(out, tag_of(args[0]))
            return out
        if name in ("to", "cpu", "cuda") and args and isinstance(args[0], torch.Tensor):
            if name == "to":
                device, dtype = _parse_to(args[1:], kwargs)
            else:
                device, dtype = (CPU if name == "cpu" else CUDA), None
            return self._move(args[0], device, dtype, bool(kwargs.get("copy")))
        inputs = _tensors(args, []) + _tensors(kwargs, [])
        tags = {tag_of(t) for t in inputs if t.dim() > 0 or tag_of(t) == "cuda"}
        if name == "numpy" and "cuda" in tags:
            self._record("numpy() of a cuda tensor")
        elif len(tags) > 1:  # stricter than a GPU, which lets CPU indices and copy_ sources pass
            self._record(f"{name} mixes cuda and cpu tensors")
        device = kwargs.get("device")
        if device is not None:
            kwargs = {**kwargs, "device": CPU}
        out = func(*args, **kwargs)
        if device is not None:
            tag = _kind(device)
        elif name.endswith("_") and inputs:  # in place: keeps self's device
            tag = tag_of(inputs[0])
        else:
            tag = "cuda" if "cuda" in {tag_of(t) for t in inputs} else "cpu"
        for o in _tensors(out, []):
            if not (inputs and o is inputs[0]) or name.endswith("_"):
                _tag(o, tag)
        return out

    def _record(self, what: str) -> None:
        stack = [line for line in traceback.format_stack()[:-2] if "fedgmr" in line]
        self.violations.append(what + "\n" + "".join(stack[-4:]))


_module_to = nn.Module.to


def _fake_module_to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
    device, dtype = _parse_to(args, kwargs)
    if dtype is not None:
        _module_to(self, dtype=dtype)
    if device is not None:
        for t in [*self.parameters(), *self.buffers()]:
            _tag(t, _kind(device))
    return self


@contextmanager
def fake_cuda() -> Iterator[FakeCuda]:
    """One fake GPU (``cuda:0``) for the ``with`` block; yields the recording mode."""
    mode = FakeCuda()
    cudnn = torch.backends.cudnn
    saved = cudnn.benchmark, cudnn.deterministic  # resolving a CUDA device sets them
    try:
        with mock.patch.object(torch.cuda, "is_available", lambda: True), \
                mock.patch.object(torch.cuda, "device_count", lambda: 1), \
                mock.patch.object(torch.cuda, "current_device", lambda: 0), \
                mock.patch.object(nn.Module, "to", _fake_module_to), mode:
            yield mode
    finally:
        cudnn.benchmark, cudnn.deterministic = saved
