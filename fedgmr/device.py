"""Where a run computes: ``run.device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``).

The config checks a device string's form; :func:`resolve_device` turns it into a
``torch.device`` when an experiment is built (and again in every executor worker), and
refuses a device this machine does not have with a one-line
:class:`~fedgmr.errors.ConfigError`. ``auto`` is CUDA when available, else the CPU (MPS
only when asked for by name).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from fedgmr.config import DEVICE_FORMS, DEVICE_PATTERN, device_index_error
from fedgmr.errors import ConfigError


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


#: per device type: (is it available here, how many devices of the type, what is missing)
_BACKENDS: dict[str, tuple[Callable[[], bool], Callable[[], int], str]] = {
    "cpu": (lambda: True, lambda: 1, ""),
    "cuda": (lambda: torch.cuda.is_available(), lambda: torch.cuda.device_count(),
             "torch.cuda.is_available() is False here (no NVIDIA GPU or driver, or a CPU-only torch build)"),
    "mps": (_mps_available, lambda: 1,
            "torch.backends.mps.is_available() is False here (MPS needs Apple silicon and a torch build with MPS)"),
}


def resolve_device(spec: str | torch.device) -> torch.device:
    """The ``torch.device`` a ``run.device`` value names on this machine.

    ``auto``: CUDA when available, else the CPU. A device this machine lacks (or a CUDA
    index beyond its GPUs) is a one-line :class:`ConfigError`. The result carries its
    index (``cuda:0``, as tensors report their device). Resolving a CUDA device turns
    cuDNN's autotuner off and its deterministic kernels on, for the whole process."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    check = DEVICE_PATTERN.fullmatch(spec) if isinstance(spec, str) else None
    if check is None:
        raise ConfigError(f"invalid value for 'run.device': must be {DEVICE_FORMS} (got {spec!r})")
    why = device_index_error(spec)
    if why:
        raise ConfigError(f"invalid value for 'run.device': {why} (got {spec[:40]!r})")
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(spec)
    available, count, missing = _BACKENDS[device.type]
    if not available():
        raise ConfigError(f"run.device '{spec}' is not available: {missing}; use run.device=cpu or auto")
    if device.index is not None and device.index >= count():
        n = count()
        raise ConfigError(f"run.device '{spec}' is not available: this machine has {n} {device.type} "
                          f"device{'s' if n != 1 else ''} ({device.type}:0 to {device.type}:{n - 1})")
    if device.type == "cuda":
        # a rerun on the same GPU should repeat: no autotuned, no nondeterministic cuDNN kernels
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    if device.type != "cpu" and device.index is None:  # as tensors report it: cuda:0, not cuda
        device = torch.device(device.type, torch.cuda.current_device() if device.type == "cuda" else 0)
    return device


def module_device(model: nn.Module) -> torch.device:
    """The device of a model's first parameter (or buffer); the CPU for an empty model."""
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def to_device(tensors: dict[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    """A dict of tensors on ``device`` (the same dict when every tensor is there already)."""
    moved = {k: t.to(device) for k, t in tensors.items()}
    return tensors if all(moved[k] is t for k, t in tensors.items()) else moved
