"""Write the small Flower app project that ``flwr run`` needs.

A Flower app is a directory with a ``pyproject.toml`` naming the ServerApp and ClientApp
and the run config. FedGMR's apps live in the installed package, so the project holds
nothing else; :func:`write_app` writes one, and :func:`write_flower_config` writes the
``config.toml`` (under ``$FLWR_HOME``) naming SuperLink connections for ``flwr run``.
A simulation's settings (``num-supernodes``, ...) are no longer part of a connection
(Flower 1.42 deprecates its ``options`` table): pass them to ``flwr run`` with
:func:`federation_config_args`.
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
    ``root-certificates``) to values. A nested table (the ``options`` of a simulation,
    which Flower 1.42 deprecates) is refused: pass a simulation's settings to ``flwr run``
    with :func:`federation_config_args` instead.
    """
    home = Path(flwr_home)
    home.mkdir(parents=True, exist_ok=True)
    lines = ["[superlink]", f"default = {_toml_value(default or next(iter(connections)))}", ""]
    for name, conn in connections.items():
        lines.append(f"[superlink.{name}]")
        for k, v in conn.items():
            if isinstance(v, Mapping):
                raise ValueError(f"connection {name!r}: a nested '{k}' table is deprecated in Flower 1.42; pass "
                                 f"simulation settings to `flwr run` with federation_config_args({dict(v)!r})")
            lines.append(f"{k} = {_toml_value(v)}")
        lines.append("")
    path = home / "config.toml"
    path.write_text("\n".join(lines))
    return path


def federation_config_args(settings: Mapping[str, Any]) -> list[str]:
    """``flwr run`` arguments for a simulation's settings (Flower 1.42's
    ``--federation-config``), e.g. ``{"num-supernodes": 10}`` ->
    ``["--federation-config", "num-supernodes=10"]``.

    Keys are those of ``flwr federation simulation-config`` without the dashes in front:
    ``num-supernodes``, ``client-resources-num-cpus``, ``client-resources-num-gpus``,
    ``backend``, ``verbose``, ``init-args-num-cpus``, ...
    """
    if not settings:
        return []
    return ["--federation-config", " ".join(f"{k}={_toml_value(v)}" for k, v in settings.items())]
