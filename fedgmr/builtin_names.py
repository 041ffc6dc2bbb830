"""The names and option names of the built-in models and data sets, read from the source
of ``fedgmr/models`` and ``fedgmr/data`` without importing it (those modules import
PyTorch, which takes seconds to load).

``fedgmr run`` and ``fedgmr config`` check a config's ``model.name``, ``data.name`` and
their ``options`` before anything heavy is imported, so that a mistake on the command
line or in the config answers in about a second. While ``fedgmr.models`` (or
``fedgmr.data``) has not been imported, nothing can have registered into its registry
(registering imports it), so the built-in builders found here are the whole registry;
once it has been imported (a plugin, an ``--import``), the live registry is used.
A test checks that this reading agrees with the live registries.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

#: package under fedgmr/ -> the name its registry is bound to in the modules that register
REGISTRIES = {"models": "MODELS", "data": "DATASETS"}

#: a registered object whose accepted options cannot be read from its source (e.g. a class)
UNREADABLE = object()


def _accepted(node: ast.AST) -> list[str] | None | object:
    """Keyword options a ``def`` accepts (None: it takes ``**kwargs``), as
    :func:`fedgmr.options.accepted_options` reads them from the live function."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return UNREADABLE
    if node.args.kwarg is not None:
        return None
    return [a.arg for a in node.args.args] + [a.arg for a in node.args.kwonlyargs]


@functools.lru_cache(maxsize=None)
def builtin_builders(package: str) -> dict[str, list[str] | None | object]:
    """``{name: accepted options}`` of what ``fedgmr/<package>/*.py`` registers with
    ``@<REGISTRY>.register("name")`` (options: None for ``**kwargs``; :data:`UNREADABLE`
    when the source does not say)."""
    registry = REGISTRIES[package]
    found: dict[str, list[str] | None | object] = {}
    for path in sorted((Path(__file__).parent / package).glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            for dec in getattr(node, "decorator_list", ()):
                if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "register"
                        and isinstance(dec.func.value, ast.Name) and dec.func.value.id == registry and dec.args
                        and isinstance(dec.args[0], ast.Constant) and isinstance(dec.args[0].value, str)):
                    found[dec.args[0].value] = _accepted(node)
    return found


def static_builders(package: str) -> dict[str, list[str] | None | object] | None:
    """The built-in builders of ``package`` while its live registry is not loaded, else None
    (then ask the live registry: a plugin may have registered more)."""
    if f"fedgmr.{package}" in sys.modules:
        return None
    return builtin_builders(package)


__all__ = ["REGISTRIES", "UNREADABLE", "builtin_builders", "static_builders"]
