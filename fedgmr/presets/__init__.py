"""Preset configs shipped with the package (``fedgmr run quickstart``)."""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

from fedgmr.config import read_config_file


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__package__).iterdir() if p.name.endswith(".yaml"))


def preset_path(name: str) -> Path:
    return Path(str(resources.files(__package__).joinpath(f"{name}.yaml")))


def preset_description(name: str, limit: int = 110) -> str:
    """One line about a preset, from its file's header comment: the first sentence, or when
    that is longer than ``limit`` characters, its opening up to the first `` (`` or ``, ``
    after 30 characters (e.g. ``CIFAR-10 as in the FedGMR paper``)."""
    lines = []
    for line in preset_path(name).read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    text = " ".join(x for x in lines if x)
    match = re.match(r"(.+?[.;])(\s|$)", text)
    first = match.group(1).rstrip(";") if match else text
    if len(first) <= limit:
        return first
    cut = re.search(r" \(|, ", first[30:])
    short = first[:30 + cut.start()] if cut else first[:limit]
    return short if len(short) <= limit else short[:limit - 3].rsplit(" ", 1)[0] + "..."


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


def load_raw_config(config: str) -> dict[str, Any]:
    """A config file path, or the name of a shipped preset (a file wins over a preset of
    the same name; a directory never shadows a preset). ConfigError when it is neither."""
    from fedgmr.errors import ConfigError

    path = Path(config)
    if path.is_file():
        return read_config_file(path)
    if config in preset_names():
        return load_preset(config)
    if path.exists():
        raise ConfigError(f"'{config}' is not a config file (a directory?) nor a preset "
                          f"(presets: {', '.join(preset_names())})")
    raise ConfigError(f"'{config}' is neither a config file nor a preset (presets: {', '.join(preset_names())})")
