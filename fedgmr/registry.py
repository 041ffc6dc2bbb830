"""A tiny name -> factory registry used for methods, models, datasets, rules, ...

Using registries instead of if/elif chains lets users add their own components::

    from fedgmr.models import MODELS

    @MODELS.register("my_net")
    def build_my_net(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0):
        ...
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from fedgmr.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects (usually factories); lookups fail with a clear error."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; usable as a decorator when ``obj`` is omitted."""

        def _add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = item
            return item

        if obj is not None:
            return _add(obj)
        return _add

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
