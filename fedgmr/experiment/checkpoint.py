"""Checkpoints: tensors in safetensors, everything else in JSON (never pickle).

A checkpoint is a directory ``checkpoint/`` with

* ``state.safetensors`` - model, buffered updates, in-flight results, masks;
* ``state.json`` - event queue, clocks, random-stream states, monitors, the config's
  sha256 and the sha256 of the metrics written so far;
* ``manifest.json`` - written last: size and sha256 of the two files above.

Tensors are saved from the CPU, whatever ``run.device`` the run had, so a checkpoint
written on a GPU resumes on the CPU and vice versa.

It is written to ``.checkpoint.tmp`` (each file fsynced), renamed into place and the
directory fsynced, so a crash mid-write leaves the previous checkpoint intact. Loading
verifies the manifest: a damaged or truncated file is a one-line
:class:`~fedgmr.errors.RunDirError` naming it, never a traceback or a silently
different run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from fedgmr.errors import RunDirError
from fedgmr.experiment.rundir import (CHECKPOINT_DIR, SMALL_FILE_BYTES, create_new, fsync_dir, fsync_file,
                                      read_run_file, refuse_link, remove_entry, sha256_bytes, writing)

STATE_JSON = "state.json"
STATE_TENSORS = "state.safetensors"
MANIFEST = "manifest.json"
FORMAT = 2


def _write(path: Path, data: bytes) -> None:
    with create_new(path) as fh:  # a new file, never through a link
        fh.write(data)
        fsync_file(fh)


def save_checkpoint(run_dir: str | Path, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    """Atomically write ``run_dir/checkpoint`` (an ``OSError`` becomes a ``RunDirError``)."""
    run_dir = Path(run_dir)
    final = run_dir / CHECKPOINT_DIR
    tmp = run_dir / f".{CHECKPOINT_DIR}.tmp"
    old = run_dir / f".{CHECKPOINT_DIR}.old"
    # safetensors refuses tensors that share memory: give each key its own copy, on the CPU
    # (a checkpoint is device-agnostic: the strategy moves what it loads to its own device)
    blob = save_tensors({k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()})
    text = json.dumps({**state, "format": FORMAT}).encode("utf-8")
    manifest = {"format": FORMAT, "step": state.get("step"),
                "files": {STATE_TENSORS: {"bytes": len(blob), "sha256": sha256_bytes(blob)},
                          STATE_JSON: {"bytes": len(text), "sha256": sha256_bytes(text)}}}
    for path in (final, tmp, old):  # a link planted at one of these names is refused, never followed
        refuse_link(path)
    with writing(run_dir):
        remove_entry(tmp)
        tmp.mkdir()
        _write(tmp / STATE_TENSORS, blob)
        _write(tmp / STATE_JSON, text)
        _write(tmp / MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))  # last: marks it complete
        fsync_dir(tmp)
        remove_entry(old)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        fsync_dir(run_dir)
        remove_entry(old)
    return final


def tensors_under(tensors: dict[str, torch.Tensor], section: str) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint saved under ``section/`` (``strategy``, ``sim``), with that
    prefix removed: what the section's ``load_state_dict`` takes."""
    prefix = section + "/"
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def checkpoint_path(run_dir: str | Path) -> Path | None:
    """The checkpoint to resume from: ``checkpoint/``, or ``.checkpoint.old`` when a crash
    came between the two renames of :func:`save_checkpoint`; None when there is none."""
    run_dir = Path(run_dir)
    final = run_dir / CHECKPOINT_DIR
    if final.exists():
        return final
    old = run_dir / f".{CHECKPOINT_DIR}.old"
    return old if (old / MANIFEST).exists() else None


def _read_verified(path: Path, name: str, entry: Any) -> bytes:
    file = path / name
    if not isinstance(entry, dict) or not {"bytes", "sha256"} <= set(entry) \
            or not isinstance(entry["bytes"], int) or entry["bytes"] < 0:
        raise RunDirError(f"{path / MANIFEST} is damaged: no checksum for {name}")
    try:  # a regular file of the size the manifest gives: a FIFO or a link to /dev/zero is refused
        data = read_run_file(file, entry["bytes"] + 1, prefix=True)
    except FileNotFoundError:
        raise RunDirError(f"{file} is missing: the checkpoint is incomplete") from None
    if len(data) != entry["bytes"] or sha256_bytes(data) != entry["sha256"]:
        raise RunDirError(f"{file} is damaged: its checksum does not match {MANIFEST}")
    return data


def load_checkpoint(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read and verify the checkpoint of ``run_dir``; a ``RunDirError`` naming the file
    when it is missing, damaged or from an older fedgmr."""
    path = checkpoint_path(run_dir)
    if path is None:
        raise RunDirError(f"{run_dir} has no checkpoint to resume from (the run stopped before its first "
                          f"checkpoint, or checkpoints were off); start it again with --overwrite")
    try:
        manifest = json.loads(read_run_file(path / MANIFEST, SMALL_FILE_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise RunDirError(f"{path / MANIFEST} is missing: the checkpoint is damaged or from an older "
                          f"fedgmr") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise RunDirError(f"{path / MANIFEST} is damaged: not valid JSON") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("format") != FORMAT:
        raise RunDirError(f"{path / MANIFEST} is damaged or from another fedgmr version")
    text = _read_verified(path, STATE_JSON, files.get(STATE_JSON))
    blob = _read_verified(path, STATE_TENSORS, files.get(STATE_TENSORS))
    try:
        state = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise RunDirError(f"{path / STATE_JSON} is damaged: not valid JSON") from None
    if not isinstance(state, dict):
        raise RunDirError(f"{path / STATE_JSON} is damaged: not a JSON object")
    try:
        tensors = load_tensors(blob)
    except Exception:  # noqa: BLE001 - any decoding error is a damaged file
        raise RunDirError(f"{path / STATE_TENSORS} is damaged: not a safetensors file") from None
    return state, tensors
