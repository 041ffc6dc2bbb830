"""Per-key help for configs (``fedgmr config --explain KEY``): each key's type, default,
allowed range and description, read from the config schema itself (the pydantic fields and
the ``key: text`` lines of each section's docstring), so it never drifts from what is
validated."""

from __future__ import annotations

import inspect
import re
import typing
from typing import Any

from pydantic import BaseModel

from fedgmr.errors import ConfigError


def _docstring_entries(cls: type) -> dict[str, str]:
    """``{key: text}`` from a section docstring's ``key: text`` paragraphs (continuation
    lines indented), as the sections of :mod:`fedgmr.config` write them."""
    doc = inspect.getdoc(cls) or ""
    entries: dict[str, str] = {}
    current = None
    for line in doc.splitlines():
        m = re.match(r"^([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*): (.*)$", line)
        if m:
            names = [n.strip() for n in m.group(1).split(",")]
            current = names
            for n in names:
                entries[n] = m.group(2).strip()
        elif current and line.startswith("    ") and line.strip():
            for n in current:
                entries[n] += " " + line.strip()
        else:
            current = None
    return entries


def _section_summary(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _type_name(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "")
    return re.sub(r"<class '([^']+)'>", r"\1", text)


def _constraints(field: Any) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def explain(key: str, model: type[BaseModel] | None = None) -> str:
    """The help text of a dotted config key (``aggregation.trim``), or of every key of a
    section (``aggregation``); ConfigError naming the keys there are for an unknown one."""
    if model is None:
        from fedgmr.config import ExperimentConfig

        model = ExperimentConfig
    parts = [p for p in key.split(".") if p]
    cls: type[BaseModel] = model
    path: list[str] = []
    for i, part in enumerate(parts):
        fields = cls.model_fields
        if part not in fields:
            where = ".".join(path) or "the top level"
            raise ConfigError(f"no config key '{'.'.join(path + [part])}' (keys of {where}: "
                              f"{', '.join(fields)})")
        field = fields[part]
        sub = _section_of(field.annotation)
        path.append(part)
        if sub is None:
            if i != len(parts) - 1:
                raise ConfigError(f"'{'.'.join(path)}' is a value, not a section")
            return _one(".".join(path), part, field, cls)
        cls = sub
    lines = [f"{'.'.join(path) or 'config'}: {_section_summary(cls)}"]
    for name, field in cls.model_fields.items():
        sub = _section_of(field.annotation)
        dotted = ".".join(path + [name])
        lines.append(f"  {dotted} (section: fedgmr config --explain {dotted})" if sub is not None
                     else "  " + _one(dotted, name, field, cls).replace("\n", "\n  "))
    return "\n".join(lines)


def _section_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _one(dotted: str, name: str, field: Any, cls: type) -> str:
    default = field.default if field.default_factory is None else field.default_factory()
    allowed = typing.get_args(field.annotation) if typing.get_origin(field.annotation) is typing.Literal else ()
    head = f"{dotted}: {_type_name(field.annotation) if not allowed else ' | '.join(map(repr, allowed))}"
    head += f", default {default!r}"
    bounds = _constraints(field)
    if bounds:
        head += f", {bounds}"
    text = _docstring_entries(cls).get(name)
    return head + (f"\n    {text}" if text else "")


__all__ = ["explain"]
