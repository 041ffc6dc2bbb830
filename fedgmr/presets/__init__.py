"""Preset configs shipped with the package (``fedgmr run quickstart``)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

from fedgmr.config import read_config_file


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__package__).iterdir() if p.name.endswith(".yaml"))


def preset_path(name: str) -> Path:
    return Path(str(resources.files(__package__).joinpath(f"{name}.yaml")))


#: where the shipped presets' data roots start; ``$FEDGMR_DATA`` replaces it
SHARED_DATA = "../shared/data/"


def load_preset(name: str) -> dict[str, Any]:
    """The raw config dict of a preset. A data root under ``../shared/data/`` moves under
    ``$FEDGMR_DATA`` when that is set (where ``fedgmr data fetch`` puts the files)."""
    raw = read_config_file(preset_path(name))
    moved = os.environ.get("FEDGMR_DATA")
    data = raw.get("data") if isinstance(raw, dict) else None
    if moved and isinstance(data, dict) and str(data.get("root", "")).startswith(SHARED_DATA):
        data["root"] = str(Path(moved) / str(data["root"])[len(SHARED_DATA):])
    return raw
