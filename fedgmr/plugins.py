"""Your own code from the command line: ``--import`` and the ``fedgmr.plugins`` entry points.

Anything a module registers when it is imported (models, data sets, methods, aggregation
rules, sub-model policies, ...) can then be named in a config. Two ways in:

* ``fedgmr run ... --import my_module`` or ``--import path/to/my_plugin.py`` (also on ``demo``,
  ``sweep``, ``config`` and ``methods``; a sweep file may list ``imports: [...]``);
  :func:`import_code` does the import. A failure is a :class:`~fedgmr.errors.PluginError`
  naming the module and the exception.
* An installed package declares an entry point in the ``fedgmr.plugins`` group, e.g. in its
  ``pyproject.toml``::

      [project.entry-points."fedgmr.plugins"]
      my_sensors = "my_package.fedgmr_plugin"          # a module: importing it registers
      my_models = "my_package.models:register_all"     # or a function, called once

  The CLI loads every one at start-up (:func:`load_plugins`); a broken plugin is reported
  and skipped. From Python, call :func:`load_plugins` yourself.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import traceback
import zlib
from pathlib import Path
from types import ModuleType
from typing import Iterable

from fedgmr.errors import PluginError

#: the entry-point group an installed package registers its plugin in
ENTRY_POINT_GROUP = "fedgmr.plugins"

_imported_files: dict[Path, ModuleType] = {}
_loaded_entry_points: dict[str, str | None] = {}  # "name = value" -> None (loaded) or the error


def is_path(spec: str) -> bool:
    """Whether an import spec names a ``.py`` file (rather than a module name)."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def normalize_import(spec: str, base: str | Path | None = None) -> str:
    """A file spec as an absolute path (relative to ``base``, default the current
    directory); a module name as it is. PluginError when the file does not exist."""
    spec = spec.strip()
    if not spec:
        raise PluginError("--import needs a module name or a .py file, got an empty string")
    if not is_path(spec):
        return spec
    path = (Path(base) if base is not None else Path.cwd()) / Path(spec).expanduser()
    if not path.is_file():
        raise PluginError(f"cannot import '{spec}': no such file {path}")
    return str(path.resolve())


def import_code(spec: str, base: str | Path | None = None) -> ModuleType:
    """Import a module by name (from the current directory or ``sys.path``) or a ``.py``
    file (relative to ``base``, default the current directory), once per process.

    A file becomes the module named after its stem when that name is free (so what it
    defines pickles to worker processes), and its folder joins ``sys.path`` as for a
    script, so it can import its neighbours."""
    target = normalize_import(spec, base)
    try:
        if is_path(target):
            return _import_file(Path(target))
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        return importlib.import_module(target)
    except PluginError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name is not None and (target == exc.name or target.startswith(exc.name + ".")):
            raise PluginError(f"cannot import '{spec}': no module named '{exc.name}' (looked in the current "
                              f"directory and sys.path; a file is given by its path, e.g. dir/{exc.name}.py)") from None
        raise PluginError(_failure(spec, exc)) from exc
    except Exception as exc:  # noqa: BLE001 - any error in the user's module is reported, in one line
        raise PluginError(_failure(spec, exc)) from exc
    except SystemExit as exc:  # sys.exit() at import: the command would end having done nothing
        raise PluginError(f"cannot import '{spec}': it called sys.exit({exc.code!r}) while being imported") from None


def import_all(specs: Iterable[str], base: str | Path | None = None) -> list[ModuleType]:
    """:func:`import_code` for each spec, in order."""
    return [import_code(s, base) for s in specs]


def _import_file(path: Path) -> ModuleType:
    for module in (_imported_files.get(path), sys.modules.get(path.stem)):  # this file was imported already
        file = getattr(module, "__file__", None)
        if module is not None and file and Path(file).resolve() == path:
            return module
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = path.stem if _free_name(path.stem, path) else (
        "fedgmr_user_" + re.sub(r"\W", "_", path.stem) + f"_{zlib.crc32(str(path).encode()):08x}")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"cannot import '{path}': not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _imported_files[path] = module
    return module


def _free_name(name: str, path: Path) -> bool:
    """Whether ``name`` can be the module name of ``path``: an identifier no loaded module
    has, which an ``import name`` elsewhere (a worker process) would also resolve to it."""
    if not name.isidentifier() or name in sys.modules:
        return False
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return found is None or (found.origin is not None and Path(found.origin).resolve() == path)


def _failure(spec: str, exc: BaseException) -> str:
    """``cannot import 'x': ZeroDivisionError: division by zero (at x.py:3)``: one line."""
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" (at {_short_path(exc.filename)}:{exc.lineno})"
    else:
        library = str(Path(__file__).resolve().parent)
        own = [f for f in traceback.extract_tb(exc.__traceback__)
               if not f.filename.startswith(("<frozen", library)) and "importlib" not in f.filename]
        if own:
            where = f" (at {_short_path(own[-1].filename)}:{own[-1].lineno})"
    message = " ".join(str(exc).split()) if not isinstance(exc, SyntaxError) else exc.msg
    return f"cannot import '{spec}': {type(exc).__name__}{': ' + message if message else ''}{where}"


def _short_path(filename: str) -> str:
    """A path relative to the current directory when it is inside it."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        return filename


def load_plugins() -> list[tuple[str, str]]:
    """Load every entry point of the ``fedgmr.plugins`` group once per process: a module
    is imported, a function is then called with no arguments. Returns ``(entry point,
    error)`` for those that failed (their error in one line); the others stay loaded."""
    failed = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"{ep.name} = {ep.value}"
        if key not in _loaded_entry_points:
            _loaded_entry_points[key] = _load_entry_point(ep)
        if _loaded_entry_points[key] is not None:
            failed.append((key, _loaded_entry_points[key]))  # type: ignore[arg-type]
    return failed


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> str | None:
    try:
        obj = ep.load()
        if not inspect.ismodule(obj):
            if not callable(obj):
                return f"{ep.value} is neither a module nor a function"
            obj()
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the CLI
        return _failure(ep.value, exc).removeprefix(f"cannot import '{ep.value}': ")
    except SystemExit as exc:
        return f"it called sys.exit({exc.code!r}) while being loaded"
    return None


__all__ = ["ENTRY_POINT_GROUP", "import_code", "import_all", "normalize_import", "is_path", "load_plugins"]
