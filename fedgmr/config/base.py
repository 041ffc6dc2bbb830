"""The base of every config section and the small checks the sections share."""

from __future__ import annotations

import math
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def check_known(names: list[str], registry: Any, what: str) -> None:
    """ValueError naming the first of ``names`` that ``registry`` lacks, with the known names."""
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise ValueError(f"unknown {what} {unknown[0]!r} (known: {', '.join(registry.names())})")


def _holds_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_bool(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_bool(v) for v in value.values())
    return False


def _types(annotation: Any) -> set[Any]:
    """Every type named in an annotation (``list[float] | None`` -> list, float, NoneType)."""
    found = {get_origin(annotation) or annotation}
    for arg in get_args(annotation):
        if get_origin(annotation) is not Literal:
            found |= _types(arg)
    return found


def _numeric(annotation: Any) -> bool:
    """Whether a field holds numbers and no booleans: ``int``, ``float``, lists of them."""
    types = _types(annotation)
    return bool(types & {int, float}) and not types & {bool, Any}


def is_real(value: Any) -> bool:
    """A finite int or float that is not a boolean (YAML's ``.nan``/``.inf`` are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Section(BaseModel):
    """Base of every config section: unknown keys, inf/NaN and booleans given for
    numbers are refused (``true`` is not the integer 1)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _numeric(field.annotation) and _holds_bool(value):
            raise ValueError("must be a number, not a boolean")
        return value
