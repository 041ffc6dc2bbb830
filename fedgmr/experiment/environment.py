"""The software and hardware a run was computed on, recorded in its ``summary.json``.

A run is a function of its config and seed on one machine and software stack. Across
machines the same config gives close but not bit-identical metrics: PyTorch picks its CPU
kernels by the processor's vector instructions (AVX2, AVX-512), and they sum in different
orders. The record says which stack made a run, so two runs that differ in the fourth
decimal can be told apart from two that disagree.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def _cpu_model() -> str | None:
    """The processor's name (``/proc/cpuinfo`` on Linux, ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


#: environment variables that pin the CPU kernels of PyTorch (ATen), oneDNN and MKL: with all
#: three at AVX2 a CPU with AVX-512 computes bit for bit what an AVX2-only CPU does
#: (constraints/repro.env, docs/protocol.md)
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")


def _cpu_isa() -> str | None:
    """The widest x86 vector extension the processor has (``avx512``, ``avx2``, ``avx``),
    whatever the kernels were limited to; None where ``/proc/cpuinfo`` says nothing."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.lower().startswith("flags")), [])
    for isa, flag in (("avx512", "avx512f"), ("avx2", "avx2"), ("avx", "avx")):
        if flag in flags:
            return isa
    return None


#: the repository that holds the imported package, when it was installed from a checkout
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    """``git -C SOURCE_ROOT args``'s output, or None (no git, not a checkout, an error)."""
    try:
        out = subprocess.run(["git", "-C", str(SOURCE_ROOT), *args], capture_output=True, text=True,
                             timeout=30, check=True, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def source_version() -> dict[str, Any] | None:
    """The commit the imported ``fedgmr`` package was checked out at, and the files of the
    package that differ from it (``modified``, paths relative to the checkout; empty when
    the code is the commit's). None for an installed wheel, without git, or outside a
    checkout: the package version (``fedgmr``) is what names the code there."""
    if not (SOURCE_ROOT / ".git").exists():
        return None
    commit = (_git("rev-parse", "HEAD") or "").strip()
    if not commit:
        return None
    status = _git("status", "--porcelain", "--untracked-files=no", "--", "fedgmr")
    modified = None if status is None else sorted(line[3:] for line in status.splitlines() if len(line) > 3)
    return {"commit": commit, "modified": modified}


def environment(device: str | None = None) -> dict[str, Any]:
    """Versions (this package's as ``fedgmr``, and the commit of its checkout as ``source``),
    processor, its widest vector extension (``cpu_isa``), torch's CPU kernel level
    (``cpu_capability``: ``AVX2``, ``AVX512``, ...) and the variables that limit the kernels
    (``kernel_env``) of this process; ``device`` is the run's resolved device."""
    import numpy
    import torch

    import fedgmr

    try:
        capability: str | None = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):  # older torch
        capability = None
    record: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
        "platform": f"{sys.platform}-{platform.machine()}", "cpu": _cpu_model(), "cpu_capability": capability,
        "torch_threads": torch.get_num_threads(), "cpu_isa": _cpu_isa(),
        "kernel_env": {k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ},
        "fedgmr": fedgmr.__version__,
    }
    source = source_version()
    if source is not None:
        record["source"] = source
    if device is not None:
        record["device"] = device
    return record


__all__ = ["environment"]
