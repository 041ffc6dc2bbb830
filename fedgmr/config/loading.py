"""From text to a validated config and back: reading config files, ``--set`` overrides,
dotted keys, one-line validation errors and the YAML dump."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from fedgmr.config.base import Section, short_repr
from fedgmr.config.experiment import ExperimentConfig
from fedgmr.errors import ConfigError


def _key(loc: tuple[Any, ...]) -> str:
    """A dotted config key from a pydantic error location: list positions as ``[i]``,
    union-member tags (``list[float]``, ``literal[...]``, ``int``) dropped."""
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif "[" in part or part in ("int", "float", "str", "bool", "none", "function-after", "function-before"):
            continue
        else:
            key += f".{part}" if key else part
    return key.replace("\n", " ")


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    key = _key(first["loc"]) or "<root>"
    if first["type"] == "extra_forbidden":
        return f"unknown config key '{key}'"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "finite_number":
        msg += " (inf and nan are not allowed here)"
    if first["type"] == "model_type":
        msg = "is a section: give a mapping of its keys"
    if not first["loc"]:
        return f"invalid config: {msg}"
    return f"invalid value for '{key}': {msg} (got {short_repr(first.get('input'))})"


def _sections(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The fields of ``model`` that are themselves sections."""
    return {name: f.annotation for name, f in model.model_fields.items()
            if isinstance(f.annotation, type) and issubclass(f.annotation, Section)}


def check_sections(data: dict[str, Any], model: type[BaseModel] | None = None, prefix: str = "") -> None:
    """Refuse a section given as something other than a mapping (``--set coordination=5``,
    an empty ``coordination:`` in YAML), naming it, before method settings are merged."""
    model = model or ExperimentConfig
    for name, section in _sections(model).items():
        if name not in data:
            continue
        key, value = prefix + name, data[name]
        if not isinstance(value, dict):
            raise ConfigError(f"invalid value for '{key}': '{key}' is a section: give a mapping of its keys "
                              f"(e.g. --set {key}.KEY=VALUE) (got {short_repr(value)})")
        check_sections(value, section, key + ".")


def parse_config(data: dict[str, Any]) -> ExperimentConfig:
    """Validate a plain dict; raises :class:`ConfigError` naming the first bad key."""
    if not isinstance(data, dict):
        raise ConfigError("a config must be a mapping of keys to values")
    check_sections(data)
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from None


#: the largest config or sweep file read (a config is a few kB; a parser would take minutes
#: over a file of this size, and a link to /dev/zero would never end)
MAX_CONFIG_BYTES = 8 << 20


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (or JSON) or TOML file into a dict.

    A regular file of at most :data:`MAX_CONFIG_BYTES` only: a FIFO, a device (a link to
    ``/dev/zero``), a directory or a larger file is one ``ConfigError`` line, never a hang
    or an unbounded read."""
    from fedgmr.errors import RunDirError
    from fedgmr.safe_read import read_run_file

    path = Path(path)
    try:
        data_bytes = read_run_file(path, MAX_CONFIG_BYTES)
    except FileNotFoundError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except RunDirError as exc:  # "cannot read PATH: it is a FIFO (named pipe), not a regular file", ...
        reason = str(exc).split(": ", 1)[-1] if str(exc).startswith("cannot read ") else str(exc)
        reason = reason.replace("a run-directory file may hold", "a config file may hold")
        raise ConfigError(f"cannot read config file {path}: {reason}") from None
    try:
        text = data_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config file {path}: not UTF-8 text (byte {exc.start})") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - any parser error becomes one line
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot parse config file {path}: {first}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys at its top level, "
                          f"not a {type(data).__name__} (got {short_repr(data)})")
    return data


def parse_value(text: str) -> Any:
    """Parse a ``--set`` value with YAML rules (numbers, booleans, null, lists)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """``set_dotted(d, "a.b", 1)`` sets ``d["a"]["b"] = 1``, creating sections."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"invalid config key '{key}'")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"unknown config key '{key}' ('{'.'.join(parts[:i + 1])}' is not a section)")
        node = child
    node[parts[-1]] = value


def get_dotted(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings to a config dict (in place) and return it."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got '{item}'")
        key, value = item.split("=", 1)
        set_dotted(data, key.strip(), parse_value(value))
    return data


def dump_config(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
