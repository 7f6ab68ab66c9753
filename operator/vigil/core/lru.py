"""A map of at most `entries` values, the least recently used (read or written) going first, as
groupcache's `lru.Cache` that client-go's caches use: the metrics server's verdicts
(`vigil.core.access`) and the event correlator's three caches (`vigil.core.events`) keep their
memory bounded with it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._held: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._held.get(key)
        if value is not None:
            self._held.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._held[key] = value
        self._held.move_to_end(key)
        while len(self._held) > self.entries:
            self._held.popitem(last=False)

    def discard(self, key: K) -> None:
        self._held.pop(key, None)

    def __len__(self) -> int:
        return len(self._held)
