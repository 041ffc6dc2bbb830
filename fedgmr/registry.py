"""A tiny name -> factory registry used for methods, models, datasets, rules, ...

Using registries instead of if/elif chains lets users add their own components::

    from fedgmr.models import MODELS

    @MODELS.register("my_net")
    def build_my_net(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0):
        ...

Registering is safe to repeat: the same object (or an equal value) under the same name
again is a no-op, and the same definition run again (a function or class with the same
module and qualified name, as when a notebook cell is re-run) replaces the old one. A
*different* object under a taken name raises :class:`~fedgmr.errors.RegistryError`;
pass ``replace=True`` to replace it on purpose.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, TypeVar

from fedgmr.errors import ConfigError, RegistryError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects (usually factories); lookups fail with a clear error."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None, *, replace: bool = False) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; usable as a decorator when ``obj`` is omitted.

        Registering the same object (or an equal value) again is a no-op and the same
        definition run again replaces the old one; a different object under a taken name
        raises :class:`RegistryError` unless ``replace=True``."""

        def _add(item: T) -> T:
            if name in self._items and not replace:
                existing = self._items[name]
                if existing is item or _equal(existing, item):
                    return item  # registered again: nothing changes
                if not _redefinition(existing, item):
                    raise RegistryError(
                        f"{self.kind} {name!r} is already registered (to {_describe(existing)}); "
                        f"register({name!r}, ..., replace=True) replaces it, or choose another name")
            self._items[name] = item
            return item

        if obj is not None:
            return _add(obj)
        return _add

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return what it was registered to (ConfigError if unknown)."""
        item = self.get(name)
        del self._items[name]
        return item

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise ConfigError(f"unknown {self.kind} {name!r} (known: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)


def _equal(old: Any, new: Any) -> bool:
    """An equal value of the same type (a ``Method`` built again with the same settings)."""
    try:
        return type(old) is type(new) and bool(old == new)
    except Exception:  # noqa: BLE001 - objects whose == raises or is ambiguous are not equal
        return False


def _redefinition(old: Any, new: Any) -> bool:
    """A function or class with the same module and qualified name: its definition run
    again (a re-run notebook cell, a reloaded module); the new one replaces the old."""
    key = ("__module__", "__qualname__")
    if not (callable(old) and callable(new) and all(hasattr(old, k) and hasattr(new, k) for k in key)
            and all(getattr(old, k) == getattr(new, k) for k in key)):
        return False
    if old.__qualname__.endswith("<lambda>"):  # one module's lambdas share a name: same place in the source too
        return _where(old) is not None and _where(old) == _where(new)
    return True


def _where(obj: Any) -> tuple[str, int] | None:
    code = getattr(obj, "__code__", None)
    return None if code is None else (code.co_filename, code.co_firstlineno)


def _describe(obj: Any) -> str:
    """``module.qualname`` of a function or class, else a short repr."""
    if hasattr(obj, "__module__") and hasattr(obj, "__qualname__"):
        return f"{obj.__module__}.{obj.__qualname__}"
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."
