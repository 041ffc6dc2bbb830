"""Write the small Flower app project that ``flwr run`` needs.

A Flower app is a directory with a ``pyproject.toml`` naming the ServerApp and ClientApp
and the run config. FedGMR's apps live in the installed package, so the project holds
nothing else; :func:`write_app` writes one, and :func:`write_flower_config` writes the
``config.toml`` (under ``$FLWR_HOME``) naming SuperLink connections for ``flwr run``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(f"cannot write {type(v).__name__} to the Flower run config")


def write_app(directory: str | Path, run_config: Mapping[str, Any] | None = None,
              name: str = "fedgmr-flower-app") -> Path:
    """Write ``directory/pyproject.toml`` for a FedGMR Flower app; returns the directory.

    ``run_config`` becomes ``[tool.flwr.app.config]`` (see :mod:`fedgmr.flower.server_app`
    for the keys).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    lines = [
        "[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', "",
        "[project]", f'name = "{name}"', 'version = "1.0.0"',
        'description = "FedGMR: semi-asynchronous masked sub-model training on Flower"',
        'license = "Apache-2.0"', 'dependencies = ["fedgmr[flower]"]', "",
        "[tool.flwr.app]", 'publisher = "fedgmr"', "",
        "[tool.flwr.app.components]", 'serverapp = "fedgmr.flower.server_app:app"',
        'clientapp = "fedgmr.flower.client_app:app"', "",
        "[tool.flwr.app.config]",
    ]
    lines += [f"{k} = {_toml_value(v)}" for k, v in (run_config or {}).items()]
    (d / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return d


def write_flower_config(flwr_home: str | Path, connections: Mapping[str, Mapping[str, Any]],
                        default: str | None = None) -> Path:
    """Write ``flwr_home/config.toml`` with SuperLink connections for ``flwr run``.

    Each connection maps keys such as ``address`` and ``insecure`` (or
    ``root-certificates``); a nested ``options`` mapping (e.g. ``{"num-supernodes": 10}``)
    configures a simulation.
    """
    home = Path(flwr_home)
    home.mkdir(parents=True, exist_ok=True)
    lines = ["[superlink]", f"default = {_toml_value(default or next(iter(connections)))}", ""]
    for name, conn in connections.items():
        lines.append(f"[superlink.{name}]")
        opts = {}
        for k, v in conn.items():
            if isinstance(v, Mapping):
                opts[k] = v
            else:
                lines.append(f"{k} = {_toml_value(v)}")
        for sub, values in opts.items():
            lines += ["", f"[superlink.{name}.{sub}]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
        lines.append("")
    path = home / "config.toml"
    path.write_text("\n".join(lines))
    return path
