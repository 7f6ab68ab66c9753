"""The line of a queue: a heap of keyed entries with lazy deletion."""

from __future__ import annotations

import heapq
from typing import Any


class LazyHeap:
    """A binary heap of (key, name) with at most one live entry per name, and lazy deletion:
    `discard` and a new `push` of a name only forget its old entry, which `peek` and `pop` skip
    and drop when they meet it. Every operation costs O(log n) amortised.

    Remembers: the live entry of each name, and the heap array. Bound: the array holds at most
    2 x live + 64 entries; past that it is rebuilt from the live ones (O(live), amortised O(1)).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[Any, str]] = []
        self._live: dict[str, tuple[Any, str]] = {}

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, name: object) -> bool:
        return name in self._live

    def push(self, name: str, key: Any) -> None:
        entry = (key, name)
        self._live[name] = entry
        heapq.heappush(self._heap, entry)
        self._compact()

    def discard(self, name: str) -> None:
        if self._live.pop(name, None) is not None:
            self._compact()

    def peek(self) -> tuple[Any, str] | None:
        heap = self._heap
        while heap:
            entry = heap[0]
            if self._live.get(entry[1]) is entry:
                return entry
            heapq.heappop(heap)
        return None

    def pop(self) -> tuple[Any, str] | None:
        entry = self.peek()
        if entry is not None:
            heapq.heappop(self._heap)
            del self._live[entry[1]]
        return entry

    def smallest(self, k: int) -> list[tuple[Any, str]]:
        """The k smallest live entries, in order, without changing the heap: a walk down the
        heap's tree that opens a node's children only once the node is taken, O(k log k) plus
        the dead entries met on the way."""
        heap, out = self._heap, list[tuple[Any, str]]()
        frontier = [(heap[0], 0)] if heap else []
        while frontier and len(out) < k:
            entry, i = heapq.heappop(frontier)
            if self._live.get(entry[1]) is entry:
                out.append(entry)
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
        return out

    def _compact(self) -> None:
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)
