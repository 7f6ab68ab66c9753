"""List+watch of one kind of object, that never lies silently.

An `Informer` lists a collection, then watches it from the list's resourceVersion, and hands
every change on as a `seen.Delta`. What it adds to a plain watch, and why:

- Bookmarks and a progress deadline. The watch asks for bookmarks and ends itself every
  `watch_seconds` (timeoutSeconds, jittered): the server then closes it, having sent a bookmark
  first. So a healthy watch makes progress at least that often even on a quiet collection, and a
  connection that delivers nothing for `progress_deadline` seconds is dead (a half-open
  connection through a load balancer, a partition): it is dropped, and the collection listed
  again, since what happened meanwhile is not known.
- Relists that reconcile. After a 410 Gone, a stall or a `repair()`, the new list is compared
  with what was delivered (`seen.SeenObjects`): objects gone meanwhile are reported deleted,
  exactly once. A watch that merely ended resumes from its last resourceVersion without a list.
- Freshness. `fresh()` says at every moment whether what was delivered can be believed: listed
  at least once, no failure since the last successful (re)connection, and some progress (an
  event, a bookmark, a stream opened or ended by the server) within the progress deadline. A
  consumer must not take destructive decisions on silence it observed while not fresh.

It remembers only `SeenObjects` (identity and version per object) and its freshness; the
objects themselves are kept by the consumer of the deltas.

What reaches the consumer is what `trim` makes of each object as it arrives, as client-go's
SetTransform: a list is trimmed page by page (never held whole as the API server sent it; its
pages sized by bytes, `ApiClient.list_all`), a watch event before it is remembered. `trim` may
refuse an object (None): it is then neither remembered nor delivered, and an object that was
delivered and is refused later (its owner reference removed, say) is reported deleted, once,
as a filtering event handler does.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping

from vigil.core import fields
from vigil.core.backoff import backoff
from vigil.core.objects import strip
from vigil.kube.client import PAGE_BYTES, ApiClient
from vigil.kube.errors import ApiError, Expired, Stalled
from vigil.kube.freshness import Freshness
from vigil.kube.seen import Delta, SeenObjects
from vigil.runtime.clock import SYSTEM, Clock
from vigil.runtime.memory import give_back

log = logging.getLogger(__name__)

# A watch that stalls half-open hides every new job and pod until it is noticed, so it should be
# noticed within half a minute; a watch restarted every 15-22.5 s costs the API server one
# request from the watch cache's resourceVersion, nothing.
WATCH_SECONDS = 15  # the server ends each watch after 15-22.5 s, with a bookmark first
PROGRESS_DEADLINE_SECONDS = 30.0  # > 22.5 s + slack: silence beyond this is a dead connection
RETRY_DELAYS = (0.5, 30.0)  # first and largest delay between failed attempts to list or watch
# The pod watches carry every heartbeat (a whole pod per beat). Resting their connections 0.1 s
# after each read lets the beats of that time come in one read, one TLS pass and one parse
# (bench/README.md, "Reading watches in batches"); a pod's change is seen at most 0.1 s later,
# nothing beside heartbeat timeouts of seconds. The job and queue watches are
# not paced: a new job is started as soon as it is seen. `vigil operator --pod-watch-pace` sets it.
POD_WATCH_PACE_SECONDS = 0.1
MAX_POD_WATCH_PACE_SECONDS = 1.0  # beyond this the delay would start to eat into short timeouts


class Informer:
    """List+watch of one collection, with deltas handed to `on_delta` in order."""

    def __init__(
        self,
        reader: ApiClient,
        path: str,
        on_delta: Callable[[Delta], None] | None = None,
        *,
        params: Mapping[str, str] | None = None,
        name: str,
        accept: Callable[[Mapping], bool] = lambda _: True,
        watch_seconds: int = WATCH_SECONDS,
        progress_deadline: float = PROGRESS_DEADLINE_SECONDS,
        clock: Clock = SYSTEM,
        rng: random.Random | None = None,
        on_relist: Callable[[], None] = lambda: None,
        pace: float = 0.0,
        trim: Callable[[dict], dict | None] = strip,
        page: int = 500,
        page_bytes: int | None = PAGE_BYTES,
    ) -> None:
        self.reader, self.path, self.name = reader, path, name
        self.handlers: list[Callable[[Delta], None]] = [on_delta] if on_delta is not None else []
        self.on_relist = on_relist
        self.params = dict(params or {})
        self.accept = accept  # a client-side filter (namespace globs)
        self.watch_seconds = watch_seconds
        self.pace = pace  # seconds the watch's connection rests after each read (ApiClient.watch)
        # Drops, in place, what the consumer never reads (objects.strip, podstate.keep_job_pod),
        # or refuses the whole object (None).
        self.trim = trim
        self.page = page  # items per page of a list, at most
        self.page_bytes = page_bytes  # and about this many bytes of JSON (ApiClient.list_all)
        self.clock = clock
        self.rng = rng or random.Random()
        self.seen = SeenObjects()
        self.freshness = Freshness(progress_deadline)
        self.synced = asyncio.Event()
        self.relists = 0  # lists after the first one: each is a moment the watch was not trusted
        self._resource_version = ""
        self._relist_wanted = True
        self._repairing = False  # repair() cancelled the running task to cut its connection
        self._current: asyncio.Task | None = None

    def add_handler(self, handler: Callable[[Delta], None]) -> None:
        """Every delta from now on goes to `handler` too (register before `run()`)."""
        self.handlers.append(handler)

    def fresh(self) -> bool:
        return self.freshness.fresh(self.clock.monotonic())

    def repair(self, reason: str) -> None:
        """Distrust the watch: drop its connection and list again (a direct read showed that it
        missed something)."""
        log.warning("%s: %s; listing again", self.name, reason)
        self._relist_wanted = True
        self.freshness.broken = True
        if self._current is not None and not self._repairing:
            self._repairing = True
            self._current.cancel()

    async def run(self) -> None:
        failures = 0
        while True:
            self._current = asyncio.current_task()
            try:
                if self._relist_wanted:
                    await self._list()
                await self._watch()
                failures = 0
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not self._repairing or task is None or task.uncancel() > 0:
                    raise  # cancelled from outside (shutdown), not (only) by repair()
                self._repairing = False
            except Expired as err:
                self.freshness.broken = True
                log.info("%s: resourceVersion is too old (410 Gone: %s); listing again", self.name, err.message)
                self._relist_wanted = True
            except Stalled as err:
                self.freshness.broken = True
                self._relist_wanted = True
                log.warning("%s: watch stalled (%s); reconnecting and listing again", self.name, err)
            except ApiError as err:
                self.freshness.broken = True
                failures += 1
                await self._pause(failures, str(err))

    async def _pause(self, failures: int, why: str) -> None:
        delay = backoff(failures, *RETRY_DELAYS, self.rng.random())
        log.warning("%s: %s; retrying in %.1fs", self.name, why, delay)
        await self.clock.sleep(delay)

    async def _list(self) -> None:
        items, version = await self.reader.list_all(
            self.path, self.params, page=self.page, keep=self._keep, page_bytes=self.page_bytes
        )
        deltas = self.seen.relist(items)
        del items
        give_back()  # what the pages' parse grew the heap by
        if self.synced.is_set():
            self.relists += 1
            self.on_relist()
            gone = sum(delta.kind == "delete" for delta in deltas)
            log.info("%s: listed again at %s: %d changes, %d gone meanwhile", self.name, version, len(deltas), gone)
        self._resource_version = version
        self._relist_wanted = False
        for delta in deltas:
            self._deliver(delta)
        self.freshness.synced = True
        self.freshness.recovered(self.clock.monotonic())
        self.synced.set()

    async def _watch(self) -> None:
        timeout = self.watch_seconds + int(self.rng.random() * self.watch_seconds / 2)
        params = {**self.params, "resourceVersion": self._resource_version, "timeoutSeconds": str(timeout)}
        alive = False

        def on_bytes() -> None:  # the stream was accepted, or bytes arrived: the connection lives
            nonlocal alive
            alive = True
            self.freshness.recovered(self.clock.monotonic())

        events = self.reader.watch(self.path, params, self.freshness.deadline, on_bytes, self.pace)
        try:
            async for event in events:
                obj = event.get("object") or {}
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if event.get("type") == "BOOKMARK":
                    self._resource_version = version or self._resource_version
                    continue
                if self.accept(obj):
                    kept = self.trim(obj)
                    deltas = self.seen.dropped(obj) if kept is None else self.seen.event(event["type"], kept)
                    for delta in deltas:
                        self._deliver(delta)
                self._resource_version = version or self._resource_version
            if alive:  # the server ended the watch as asked: progress, not failure
                self.freshness.recovered(self.clock.monotonic())
        finally:
            await events.aclose()

    def _keep(self, item: dict) -> dict | None:
        return self.trim(item) if self.accept(item) else None

    def _deliver(self, delta: Delta) -> None:
        for handler in self.handlers:
            try:
                handler(delta)
            except Exception:  # a consumer's bug must not stop the watch of every other object
                name = fields.metadata(delta.obj).get("name")
                log.exception("%s: handling a %s of %s failed", self.name, delta.kind, name)


class Watches:
    """The informers of one kind of object, one per watched scope, asked as one."""

    def __init__(self, informers: list[Informer]) -> None:
        self.informers = informers

    def fresh(self) -> bool:
        return all(informer.fresh() for informer in self.informers)

    def repair(self, reason: str) -> None:
        for informer in self.informers:
            informer.repair(reason)

    def add_handler(self, handler: Callable[[Delta], None]) -> None:
        for informer in self.informers:
            informer.add_handler(handler)
