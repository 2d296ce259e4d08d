"""Tier eviction orders, separate from admission (libCacheSim style: admission and
eviction are independent plug-ins combined at run time, each created by name)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator


class EvictionPolicy(ABC):
    """Orders a tier's resident keys; the tier asks it for victims, never the reverse."""

    name: str = ""

    @abstractmethod
    def insert(self, key: int) -> None:
        """A key became resident."""

    @abstractmethod
    def access(self, key: int) -> None:
        """A resident key was read or re-used."""

    def access_many(self, keys: Iterable[int]) -> None:
        """Batch of ``access`` in order (the per-request hot path)."""
        for k in keys:
            self.access(k)

    @abstractmethod
    def remove(self, key: int) -> None:
        """A resident key left the tier."""

    @abstractmethod
    def victims(self) -> Iterator[int]:
        """Resident keys from the eviction end; do not mutate the tier while iterating."""

    @abstractmethod
    def victim(self) -> int:
        """The next key to evict (the tier must be non-empty)."""


class LRUEviction(EvictionPolicy):
    """Least recently used first; O(1) per operation (OrderedDict is an intrusive list)."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def insert(self, key: int) -> None:
        self._order[key] = None

    def access(self, key: int) -> None:
        self._order.move_to_end(key)

    def access_many(self, keys: Iterable[int]) -> None:
        deque(map(self._order.move_to_end, keys), 0)  # the loop runs in C: this is the per-request hot path

    def remove(self, key: int) -> None:
        del self._order[key]

    def victims(self) -> Iterator[int]:
        return iter(self._order)

    def victim(self) -> int:
        return next(iter(self._order))

    def demote(self, key: int) -> None:
        """A resident key becomes the next victim (an agent said its session ended)."""
        self._order.move_to_end(key, last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)


class FIFOEviction(LRUEviction):
    """Oldest insertion first; accesses do not reorder (a cheap baseline for comparisons)."""

    name = "fifo"

    def access(self, key: int) -> None:
        return None

    def access_many(self, keys: Iterable[int]) -> None:
        return None


EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {"lru": LRUEviction, "fifo": FIFOEviction}


def make_eviction(name: str) -> EvictionPolicy:
    try:
        return EVICTION_POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; known: {', '.join(EVICTION_POLICIES)}") from None
