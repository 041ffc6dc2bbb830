"""docs/configuration.md lists every config key, and only keys that exist.

The key table's rows name keys relative to their section (`name`, `baseline.width_rates`)
and may continue a dotted key with a leading dot (`staleness.kind`, `.a`, `.b`); a row with
an empty section column belongs to the section above it. The config models are walked
field by field, so a key added to a section of ``fedgmr/config/`` without a row fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from fedgmr.config import ExperimentConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _is_section(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def config_keys(model: type[BaseModel] = ExperimentConfig, prefix: str = "") -> set[str]:
    """Every leaf key path of the config models (``aggregation.staleness.a``, ...)."""
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        if _is_section(field.annotation):
            keys |= config_keys(field.annotation, f"{prefix}{name}.")  # type: ignore[arg-type]
        else:
            keys.add(prefix + name)
    return keys


def documented_keys(text: str) -> set[str]:
    """The key paths named in the key table (the first table whose header starts with
    ``| section | key |``)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\|\s*section\s*\|\s*key\s*\|", line))
    keys: set[str] = set()
    section = ""
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells[0]:
            section = cells[0].strip("`")
        parent = ""
        for token in re.findall(r"`([^`]+)`", cells[1]):
            if token.startswith("."):
                key = parent + token
            else:
                key = token
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            keys.add(f"{section}.{key}" if section else key)
    return keys


def test_the_table_is_found_and_parsed():
    keys = documented_keys(DOC.read_text(encoding="utf-8"))
    assert {"seed", "aggregation.staleness.b", "network.compute.speeds", "submodel.baseline.server_lr"} <= keys


def test_every_config_key_is_documented():
    missing = sorted(config_keys() - documented_keys(DOC.read_text(encoding="utf-8")))
    assert not missing, f"config keys without a row in docs/configuration.md: {missing}"


def test_every_documented_key_exists():
    unknown = sorted(documented_keys(DOC.read_text(encoding="utf-8")) - config_keys())
    assert not unknown, f"docs/configuration.md names keys the config does not have: {unknown}"
