"""What becomes of an event before it is written: client-go's event correlator
(`tools/record/events_cache.go`, `NewEventCorrelator`), with its defaults, on a clock handed in.

Three steps, in client-go's order:

1. Aggregation. Events on one job of the same type and reason but with other messages are
   similar. When the `MAX_SIMILAR`th distinct message of a group comes, each of them less than
   `SIMILAR_INTERVAL_SECONDS` after the group's last event, it and every new message after it
   (while they keep coming that often) are written as one event,
   "(combined from similar events): <message>": a message that changes every time (an attempt
   number, a reason's detail) makes one event, not one each.
2. Counting. An exact repeat (same job, type, reason and message; or the combined event again)
   updates the Event written first, its count and lastTimestamp (`Patch`), instead of creating
   another (`Create`).
3. Spam filter. Per job, a token bucket of `SPAM_BURST` events refilled with one every
   1/`SPAM_QPS` = 300 s; past it, events are dropped (`Drop`): a job that is always unhealthy
   cannot post without end. As in client-go the filter comes last, so a dropped event is still
   counted, and the next one written says how many times it happened.

Each step remembers at most `CACHE_ENTRIES` keys, the least recently used going first: memory
is bounded however many jobs come and go. Forgetting is harmless: a forgotten event is created
anew, a forgotten job gets a full bucket.

`Backlog` holds the writes not yet sent, one per Event (a newer write of a waiting event takes
its place: it says all the older one did), at most `share` per namespace and `capacity` in all,
so one namespace's flood fills its own share and drops only its own events. The recorder
(`vigil.kube.events`) sends them, in turn across namespaces.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vigil.core import fields
from vigil.core.lru import Lru
from vigil.core.ratelimit import TokenBucket

CACHE_ENTRIES = 4096  # maxLruCacheEntries
MAX_SIMILAR = 10  # defaultAggregateMaxEvents
SIMILAR_INTERVAL_SECONDS = 600.0  # defaultAggregateIntervalInSeconds
SPAM_BURST = 25  # defaultSpamBurst
SPAM_QPS = 1.0 / 300.0  # defaultSpamQPS
COMBINED = "(combined from similar events): "  # EventAggregatorByReasonMessageFunc
MAX_EVENT_NAME = 253  # a DNS subdomain

Involved = tuple[str, str, str]  # the job's namespace, name and uid


@dataclass(frozen=True, slots=True)
class Write:
    """An Event as it is to be written: its name, what happened, how many times, first and last."""

    name: str
    type_: str
    reason: str
    message: str
    count: int
    first: datetime
    last: datetime


@dataclass(frozen=True, slots=True)
class Create(Write):
    """A new Event of this name."""


@dataclass(frozen=True, slots=True)
class Patch(Write):
    """The Event of this name again: its count, lastTimestamp and message change."""


@dataclass(frozen=True, slots=True)
class Drop:
    """Spam-filtered: nothing is written."""


def created(write: Write) -> Create:
    """The same Event, to be created: a patch whose Event is gone (events live an hour) is
    created again, with the count it has reached."""
    return Create(**{field.name: getattr(write, field.name) for field in dataclasses.fields(Write)})


def supersede(waiting: Write, newer: Write) -> Write:
    """What one write of an Event says where two wait: the newer, which carries the older's name,
    first time and a higher count; a create, if the older was one (the Event does not exist yet)."""
    return created(newer) if isinstance(waiting, Create) else newer


def event_name(job_name: str, suffix: str) -> str:
    """A unique event name that is valid for any job name (up to 253 characters)."""
    suffix = f".{suffix}"
    return job_name[: MAX_EVENT_NAME - len(suffix)].rstrip(".-") + suffix


@dataclass
class _Similar:
    messages: dict[str, None]  # the distinct messages seen, oldest first, fewer than MAX_SIMILAR
    last: float  # monotonic: when the last of them came


@dataclass(frozen=True)
class _Written:
    name: str
    count: int
    first: datetime


class EventCorrelator:
    """Decides each event's fate (`correlate`). `rng` picks the names' suffixes."""

    def __init__(
        self,
        *,
        entries: int = CACHE_ENTRIES,
        max_similar: int = MAX_SIMILAR,
        similar_interval: float = SIMILAR_INTERVAL_SECONDS,
        burst: int = SPAM_BURST,
        qps: float = SPAM_QPS,
        rng: random.Random | None = None,
    ) -> None:
        self.max_similar, self.similar_interval, self.burst, self.qps = max_similar, similar_interval, burst, qps
        self.rng = rng or random.Random()
        self.similar: Lru[tuple[str, ...], _Similar] = Lru(entries)
        self.written: Lru[tuple[str, ...], _Written] = Lru(entries)
        self.buckets: Lru[Involved, TokenBucket] = Lru(entries)

    def correlate(
        self, involved: Involved, type_: str, reason: str, message: str, *, now: float, wall: datetime
    ) -> Create | Patch | Drop:
        """The event `reason` (`message`) on the job `involved`, at monotonic `now` (wall `wall`)."""
        group = (*involved, type_, reason)
        similar = self.similar.get(group)
        if similar is None or now - similar.last > self.similar_interval:
            similar = _Similar({}, now)
        similar.messages[message] = None
        similar.last = now
        self.similar.put(group, similar)
        key: tuple[str, ...] = (*group, message)
        if len(similar.messages) >= self.max_similar:
            # client-go drops any one message to keep the set below the bound: the oldest here,
            # so the decision is the same every time.
            del similar.messages[next(iter(similar.messages))]
            key, message = group, COMBINED + message  # the combined event: one per group

        before = self.written.get(key)
        if before is None:
            written = _Written(event_name(involved[1], f"{self.rng.getrandbits(64):016x}"), 1, wall)
        else:
            written = _Written(before.name, before.count + 1, before.first)
        self.written.put(key, written)

        bucket = self.buckets.get(involved)
        if bucket is None:
            bucket = TokenBucket(rate=self.qps, burst=self.burst)
            self.buckets.put(involved, bucket)
        if not bucket.take(now):
            return Drop()
        kind = Create if before is None else Patch
        return kind(written.name, type_, reason, message, written.count, written.first, wall)


Pending = tuple[Mapping[str, Any], Write]  # the job (for the involvedObject) and its write
EventKey = tuple[str, str]  # (namespace, Event name): where an Event's write waits


class Backlog:
    """The writes waiting to be sent, by (namespace, event name)."""

    def __init__(self, capacity: int, share: int) -> None:
        self.capacity, self.share = capacity, share
        self._pending: dict[EventKey, Pending] = {}
        self._per_namespace: dict[str, int] = {}

    def put(self, job: Mapping[str, Any], write: Write) -> EventKey | None:
        """The key the write waits under; None if it is dropped: its namespace holds its share
        already, or the backlog its capacity."""
        namespace = fields.namespace(job)
        key = (namespace, write.name)
        waiting = self._pending.get(key)
        if waiting is not None:  # the same Event: no more room taken
            self._pending[key] = (job, supersede(waiting[1], write))
            return key
        held = self._per_namespace.get(namespace, 0)
        if held >= self.share or len(self._pending) >= self.capacity:
            return None
        self._pending[key] = (job, write)
        self._per_namespace[namespace] = held + 1
        return key

    def pop(self, key: EventKey) -> Pending:
        pending = self._pending.pop(key)
        held = self._per_namespace[key[0]] - 1
        if held:
            self._per_namespace[key[0]] = held
        else:
            del self._per_namespace[key[0]]
        return pending

    def held(self, namespace: str) -> int:
        return self._per_namespace.get(namespace, 0)

    def __len__(self) -> int:
        return len(self._pending)
