"""Whose turn it is: round robin over tenants (namespaces), FIFO within each.

One FIFO shared by every namespace lets a namespace that makes 10,000 keys ready put another
namespace's one key behind all of them. `RoundRobin` keeps a line per tenant and a ring of the
tenants that have a key ready: each turn takes the first key of the tenant at the front of the
ring and sends that tenant to the back if it has more. A key that becomes ready in a tenant with
none waits for at most one key of each other tenant (one round), however many those others have.

Pure and synchronous: the work queue (`vigil.runtime.workqueue`) keeps its guarantees (one
waiting entry per key, one worker per key) around it and feeds it only keys not already in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T", bound=Hashable)


class RoundRobin(Generic[K, T]):
    def __init__(self) -> None:
        self._lines: dict[T, deque[K]] = {}  # a tenant is here only while it has a key ready
        self._ring: deque[T] = deque()  # the tenants of _lines, in turn order

    def push(self, tenant: T, key: K) -> None:
        """`key` is ready, at the end of its tenant's line (the caller pushes each key once)."""
        line = self._lines.get(tenant)
        if line is None:
            self._lines[tenant] = line = deque()
            self._ring.append(tenant)  # a tenant with nothing ready joins at the back: one round
        line.append(key)

    def pop(self) -> K:
        """The next key in turn; IndexError when none is ready."""
        tenant = self._ring.popleft()
        line = self._lines[tenant]
        key = line.popleft()
        if line:
            self._ring.append(tenant)
        else:
            del self._lines[tenant]
        return key

    def tenants(self) -> int:
        """Tenants with a key ready."""
        return len(self._ring)

    def __len__(self) -> int:
        return sum(len(line) for line in self._lines.values())

    def __bool__(self) -> bool:
        return bool(self._ring)
