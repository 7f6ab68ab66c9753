"""Sets of task indexes as ranges, written as batch/v1 writes completedIndexes: "0-99,120,130-4999".

An array's tasks mostly start and end in index order, so a few ranges hold what a list of
100,000 indexes would: the size of a set is that of its gaps, not of its members.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator

_PART = re.compile(r"^(\d{1,9})(?:-(\d{1,9}))?$")
MAX_TEXT = 1 << 20  # a ranges string longer than this is refused before it is parsed


class IndexSet:
    """An immutable set of non-negative integers kept as sorted, disjoint, non-adjacent ranges
    (inclusive)."""

    __slots__ = ("_ranges", "_len")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        merged: list[tuple[int, int]] = []
        for start, end in sorted(ranges):
            if start > end or start < 0:
                raise ValueError(f"bad range {start}-{end}")
            if merged and start <= merged[-1][1] + 1:
                if end > merged[-1][1]:
                    merged[-1] = (merged[-1][0], end)
            else:
                merged.append((start, end))
        self._ranges: tuple[tuple[int, int], ...] = tuple(merged)
        self._len = sum(end - start + 1 for start, end in merged)

    @classmethod
    def of(cls, indexes: Iterable[int]) -> IndexSet:
        return cls((i, i) for i in indexes)

    @classmethod
    def span(cls, start: int, stop: int) -> IndexSet:
        """start, ..., stop - 1 (empty when stop <= start)."""
        return cls([(start, stop - 1)] if stop > start else [])

    @classmethod
    def parse(cls, text: str | None) -> IndexSet:
        """ "0-4,6" -> {0, 1, 2, 3, 4, 6}; "" or None -> empty. Raises ValueError saying what is wrong."""
        if not text:
            return cls()
        if len(text) > MAX_TEXT:
            raise ValueError(f"index ranges longer than {MAX_TEXT} characters")
        ranges = []
        for part in text.split(","):
            match = _PART.match(part.strip())
            if match is None:
                raise ValueError(
                    f'"{part.strip()[:40]}" is not an index or a range of indexes: write them as "5", "7-9", '
                    'joined by commas ("5,7-9")'
                )
            start = int(match.group(1))
            end = int(match.group(2)) if match.group(2) is not None else start
            if end < start:
                raise ValueError(f'"{part.strip()}" is a range that ends before it starts')
            ranges.append((start, end))
        return cls(ranges)

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        return self._ranges

    def __str__(self) -> str:
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self._ranges)

    def __repr__(self) -> str:
        return f"IndexSet.parse({str(self)!r})"

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IndexSet) and self._ranges == other._ranges

    def __hash__(self) -> int:
        return hash(self._ranges)

    def __contains__(self, index: object) -> bool:
        if not isinstance(index, int):
            return False
        i = bisect.bisect_right(self._ranges, (index, float("inf"))) - 1
        return i >= 0 and self._ranges[i][0] <= index <= self._ranges[i][1]

    def __iter__(self) -> Iterator[int]:
        for start, end in self._ranges:
            yield from range(start, end + 1)

    def __or__(self, other: IndexSet) -> IndexSet:
        return IndexSet(self._ranges + other._ranges)

    def __sub__(self, other: IndexSet) -> IndexSet:
        out: list[tuple[int, int]] = []
        theirs = other._ranges
        j = 0
        for start, end in self._ranges:
            while j < len(theirs) and theirs[j][1] < start:
                j += 1
            k, cursor = j, start
            while k < len(theirs) and theirs[k][0] <= end:
                if theirs[k][0] > cursor:
                    out.append((cursor, theirs[k][0] - 1))
                cursor = max(cursor, theirs[k][1] + 1)
                k += 1
            if cursor <= end:
                out.append((cursor, end))
        return IndexSet(out)

    def __and__(self, other: IndexSet) -> IndexSet:
        return self - (self - other)

    def first(self, k: int, *, below: int | None = None) -> list[int]:
        """The `k` smallest members (those below `below` only, when given)."""
        out: list[int] = []
        for start, end in self._ranges:
            for i in range(start, end + 1):
                if len(out) >= k or (below is not None and i >= below):
                    return out
                out.append(i)
        return out

    def max(self) -> int | None:
        return self._ranges[-1][1] if self._ranges else None
