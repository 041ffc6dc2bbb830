"""Checks of ``data.options`` and ``model.options``: names against the registered
builder's signature (at config resolution, before anything is built) and values inside
the builders. Every failure is a :class:`~fedgmr.errors.ConfigError` naming the key,
e.g. ``invalid value for 'model.options.hidden': ...``."""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Sequence

from fedgmr.errors import ConfigError


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _bad(key: str, rule: str, value: Any) -> ConfigError:
    return ConfigError(f"invalid value for '{key}': {rule} (got {_short(value)})")


def accepted_options(builder: Callable[..., Any], reserved: Sequence[str]) -> list[str] | None:
    """Keyword options ``builder`` accepts, minus the ``reserved`` ones the library passes
    itself; None when it takes ``**kwargs`` (anything goes)."""
    params = inspect.signature(builder).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            and p.name not in reserved]


def check_option_names(section: str, kind: str, name: str, builder: Callable[..., Any],
                       options: dict[str, Any], reserved: Sequence[str]) -> None:
    """Refuse an option ``builder`` does not take: ``unknown option 'foo' for model 'cnn'
    (accepted: channels, batch_norm) in 'model.options'``."""
    check_accepted(section, kind, name, accepted_options(builder, reserved), options, reserved)


def check_accepted(section: str, kind: str, name: str, accepted: Sequence[str] | None,
                   options: dict[str, Any], reserved: Sequence[str]) -> None:
    """:func:`check_option_names` with the builder's ``accepted`` options (None: anything
    goes) already known, e.g. read from its source (:mod:`fedgmr.builtin_names`)."""
    if accepted is None:
        return
    accepted = [a for a in accepted if a not in reserved]
    for key in options:
        if key in reserved:
            raise ConfigError(f"'{section}.options.{key}' is set by the library, not by an option of "
                              f"{kind} '{name}' (accepted: {', '.join(accepted) or 'none'})")
        if key not in accepted:
            raise ConfigError(f"unknown option '{key}' for {kind} '{name}' in '{section}.options' "
                              f"(accepted: {', '.join(accepted) or 'none'})")


def int_option(key: str, value: Any, minimum: int = 1, optional: bool = False) -> int | None:
    """An integer option ``>= minimum`` (``None`` allowed when ``optional``; booleans refused)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        rule = f"must be an integer >= {minimum}" + (" or null" if optional else "")
        raise _bad(key, rule, value)
    return value


def float_option(key: str, value: Any, low: float, high: float, low_open: bool = False,
                 high_open: bool = False) -> float:
    """A finite number in ``[low, high]`` (either end open when asked)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise _bad(key, f"must be a number in {lo}{low:g}, {high:g}{hi}", value)
    return float(value)


def bool_option(key: str, value: Any, optional: bool = False) -> bool | None:
    """``true`` or ``false`` (``null`` allowed when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise _bad(key, "must be true or false" + (" or null" if optional else ""), value)
    return value


def ints_option(key: str, value: Any, length: int | None = None, minimum: int = 1) -> tuple[int, ...]:
    """A list of integers ``>= minimum`` (exactly ``length`` of them when given)."""
    if not isinstance(value, (list, tuple)) or (length is not None and len(value) != length) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in value):
        count = f"{length} " if length is not None else ""
        raise _bad(key, f"must be a list of {count}integers >= {minimum}", value)
    return tuple(value)


def str_option(key: str, value: Any, optional: bool = False) -> str | None:
    """A non-empty string (``null`` allowed when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise _bad(key, "must be a non-empty string" + (" or null" if optional else ""), value)
    return value


__all__ = ["accepted_options", "check_accepted", "check_option_names", "int_option", "float_option", "bool_option",
           "ints_option", "str_option"]
