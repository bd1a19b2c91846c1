"""An immutable, hashable mapping: the model's states are values, and values must hash."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

__all__ = ["FrozenMap"]

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V], Generic[K, V]):
    """A dict that cannot change.  ``set`` and ``without`` return new maps."""

    __slots__ = ("_hash", "_items")

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        self._items: dict[K, V] = dict(items)
        self._hash: int | None = None

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._items.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._items == other._items
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"

    def set(self, key: K, value: V) -> FrozenMap[K, V]:
        """A copy with ``key`` bound to ``value``."""
        items = dict(self._items)
        items[key] = value
        return FrozenMap(items)

    def without(self, key: K) -> FrozenMap[K, V]:
        """A copy without ``key`` (which need not be present)."""
        items = dict(self._items)
        items.pop(key, None)
        return FrozenMap(items)
