"""Checkpoints: tensors in safetensors, everything else in JSON (never pickle).

A checkpoint is a directory with ``state.safetensors`` and ``state.json``; it is written
to a temporary directory and renamed into place, so a crash mid-write never leaves a
half checkpoint behind.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from fedgmr.errors import FedGMRError

CHECKPOINT_DIR = "checkpoint"


def save_checkpoint(run_dir: str | Path, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    """Atomically write ``run_dir/checkpoint``."""
    run_dir = Path(run_dir)
    final = run_dir / CHECKPOINT_DIR
    tmp = run_dir / f".{CHECKPOINT_DIR}.tmp"
    old = run_dir / f".{CHECKPOINT_DIR}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # safetensors refuses tensors that share memory: give each key its own copy
    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, str(tmp / "state.safetensors"))
    with open(tmp / "state.json", "w") as fh:
        json.dump(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read ``run_dir/checkpoint``; a clear error when it is missing or damaged."""
    path = Path(run_dir) / CHECKPOINT_DIR
    if not (path / "state.json").exists() or not (path / "state.safetensors").exists():
        old = Path(run_dir) / f".{CHECKPOINT_DIR}.old"
        if (old / "state.json").exists():
            path = old
        else:
            raise FedGMRError(f"{run_dir} has no checkpoint to resume from (was run.checkpoint_every set?)")
    try:
        state = json.loads((path / "state.json").read_text())
        tensors = load_file(str(path / "state.safetensors"))
    except Exception as exc:  # noqa: BLE001
        raise FedGMRError(f"checkpoint in {path} is damaged: {exc}") from None
    return state, tensors
