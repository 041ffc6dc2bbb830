"""Preset configs shipped with the package (``fedgmr run quickstart``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from fedgmr.config import read_config_file


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__package__).iterdir() if p.name.endswith(".yaml"))


def preset_path(name: str) -> Path:
    return Path(str(resources.files(__package__).joinpath(f"{name}.yaml")))


def load_preset(name: str) -> dict[str, Any]:
    """The raw config dict of a preset."""
    return read_config_file(preset_path(name))
