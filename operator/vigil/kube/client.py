"""The one HTTP client of Vigil for the API server: requests, paginated lists and watches, over
aiohttp on the event loop, with the credentials of a kubeconfig (`vigil.kube.config`).

A request is a JSON body out and a decoded answer back (orjson), without model classes or
threads: reads are the hot path (a watched pod per heartbeat). What a caller relies on:

- Errors: every failure is a `vigil.kube.errors.ApiError`; a broken connection or a timeout is
  `Unreachable` (status 0), a watch that delivers nothing within its progress deadline `Stalled`.
- Timeouts: connecting is bounded by `connect_timeout`, each read of an answer by
  `read_timeout`; a watch's reads by the caller's progress deadline instead.
- The fence: a write passes `fence` before it is queued, and again as its bytes are written to
  the connection (`_FencedBody`): a write that waited for a free connection, a TLS handshake or
  a turn of the event loop while the fence closed is never sent. aiohttp sends a PUT or DELETE
  once more by itself when a kept-alive connection broke without an answer; that second try
  passes the fence again too. A fenced write's answer must come before the fence closes: the
  time the fence says is left is the request's timeout, and the API server's (its `timeout`
  parameter), so a write cannot wait 20 s for its answer against a 5 s margin
  (`core.election.fenced_timeout`).
- One connection pool per client. The operator makes one client for its work, one for its
  watches and one for its Lease (`vigil.manager`), so a renewal never waits behind the work,
  and a write never waits behind a watch for a connection.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

import aiohttp
from aiohttp.payload import BytesPayload

from vigil.core.election import fenced_timeout, go_duration
from vigil.kube.config import Credentials
from vigil.kube.errors import ApiError, Stalled, TooLarge, Unreachable, from_status
from vigil.kube.useragent import user_agent as user_agent  # callers import it from here

try:
    import orjson
except ImportError:  # kubectl-vigil's zipapp holds no compiled module: the same names from json
    from vigil.kube import stdjson as orjson  # type: ignore[no-redef]

CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 20.0
LIST_TIMEOUT_SECONDS = 60.0  # one page of a list
CONNECTIONS = 16  # open at once at least; more calls wait for one
# Requests in flight besides the workers' and the event recorder's: background releases of
# finalizers, the queue status writes and the leader mark's reads and writes.
SPARE_CONNECTIONS = 8
MAX_EVENT_BYTES = 64 * 1024 * 1024  # far above etcd's object limit (1.5 MiB): a cap, not a tuning
# A list's pages are bounded in bytes, not only in count: a page is held as the API server sent
# it until it is trimmed, and its items are whatever their authors made them. A pod with 2,500
# labels and a 150 KB annotation (291 KiB of JSON) parses to 0.53 MiB of Python objects, one of
# tiny labels at etcd's 1.5 MiB limit to about 10 (bench/kept_objects.py): 500 of those in one
# page would be 5 GiB. So a page's answer is read up to twice PAGE_BYTES and no further (asked
# again with half the limit if it is longer, down to one item, which always fits: etcd stores
# at most 1.5 MiB an object), and each next page asks for as many items as fit in PAGE_BYTES at
# the sizes seen so far (`next_page_limit`), starting from FIRST_PAGE.
FIRST_PAGE = 10
PAGE_BYTES = 4 * 1024 * 1024

JSON = "application/json"
# The objects of a list as their metadata alone (PartialObjectMetadataList, as client-go's metadata
# client asks for it): a tenth of a pod's bytes to send and decode, for a reader of metadata only.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"

# Raises while a write may not be sent; else the seconds left before it closes (None: unbounded).
Fence = Callable[[], float | None]
# What a broken or slow connection raises inside aiohttp; each becomes Unreachable.
_TRANSPORT = (aiohttp.ClientError, TimeoutError, OSError)


def pool_size(workers: int, event_senders: int) -> int:
    """Connections for an operator with `workers` reconcilers and `event_senders`: each holds
    at most one request at a time, so none waits for a connection behind the others (with 16
    workers on a 16-connection pool, a wait for one ran past the connect timeout under load)."""
    return max(CONNECTIONS, workers + event_senders + SPARE_CONNECTIONS)


def resource_path(group: str, version: str, plural: str, namespace: str | None) -> str:
    """The collection's URL path, across all namespaces when `namespace` is None."""
    prefix = "/api/v1" if group == "" else f"/apis/{group}/{version}"
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


class _FencedBody(BytesPayload):
    """A write's body that passes the fence as aiohttp writes it to the connection, headers and
    body together (aiohttp holds the headers back to send them with the body's first bytes): on
    Python 3.11 that happens in a task of its own, a turn of the event loop after the request
    was handed over, so a check before `session.request` alone would leave a window. A closed
    fence here sends nothing; the request fails and the fence's own exception is kept."""

    def __init__(self, value: bytes, content_type: str, fence: Fence) -> None:
        super().__init__(value, content_type=content_type)
        self.fence = fence
        self.refused: BaseException | None = None

    def _check(self) -> None:
        try:
            self.fence()
        except BaseException as err:
            self.refused = err
            raise

    async def write(self, writer: Any) -> None:
        self._check()
        await super().write(writer)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        self._check()
        await super().write_with_length(writer, content_length)


class ApiClient:
    """Requests to one API server over one connection pool."""

    def __init__(
        self,
        credentials: Credentials,
        user_agent: str = "vigil",
        *,
        connections: int = CONNECTIONS,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        read_timeout: float = READ_TIMEOUT_SECONDS,
    ) -> None:
        self.credentials = credentials
        self.user_agent = user_agent
        self.connections = connections
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.base = credentials.host.rstrip("/")
        self._ssl: ssl.SSLContext | bool = credentials.ssl_context()
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=self.connections),
                timeout=self.timeout(),
            )
        return self._session

    def timeout(self) -> aiohttp.ClientTimeout:
        """sock_connect bounds the TCP connect; sock_read each read of the answer; `connect`
        waiting for a free connection plus the TLS handshake."""
        return aiohttp.ClientTimeout(
            total=None,
            connect=self.connect_timeout + self.read_timeout,
            sock_connect=self.connect_timeout,
            sock_read=self.read_timeout,
        )

    def _headers(self) -> dict[str, str]:
        return {"Accept": JSON, "User-Agent": self.user_agent, **self.credentials.auth_headers()}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        fence: Fence | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
        as_bytes: bool = False,
        accept: str = JSON,
    ) -> Any:
        """One request; the decoded answer (None for an empty one). `fence`, for a write, is
        called before the request is queued and again as its body is written; the time it says
        is left bounds the whole request. `timeout` bounds the whole request instead of the
        client's per-read timeout. `max_bytes`: an answer longer than that is not read on
        (TooLarge). `as_bytes`: the answer's bytes as sent, whatever their type (a pod's log is
        plain text, the one answer that is not JSON). `accept`: a JSON media type with parameters
        (METADATA_LIST)."""
        headers = self._headers()
        headers["Accept"] = accept
        if as_bytes:
            headers["Accept"] = "*/*"
        data: bytes | _FencedBody | None = None
        if body is not None:
            raw = orjson.dumps(body)
            data = raw if fence is None else _FencedBody(raw, content_type, fence)
            headers["Content-Type"] = content_type
        if fence is not None:
            fenced = fenced_timeout(fence(), self.read_timeout if timeout is None else timeout)
            if fenced is not None:
                timeout = fenced
                params = {**(params or {}), "timeout": go_duration(fenced)}
        bound = None if timeout is None else aiohttp.ClientTimeout(total=timeout)
        try:
            async with self.session.request(
                method, self.base + path, params=params, data=data, headers=headers, timeout=bound or self.timeout()
            ) as response:
                text = await (response.read() if max_bytes is None else _read_at_most(response, max_bytes))
                if response.status >= 400:
                    raise from_status(response.status, text)
                if as_bytes:
                    return text
                return orjson.loads(text) if text else None
        except _TRANSPORT as err:
            if isinstance(data, _FencedBody) and data.refused is not None:
                raise data.refused from None  # nothing was sent: the fence closed
            raise Unreachable(f"{method} {path}: {_describe(err)}") from err
        except orjson.JSONDecodeError as err:
            raise ApiError(f"{method} {path}: the answer is not JSON ({err})") from err

    async def list_all(
        self,
        path: str,
        params: Mapping[str, str],
        page: int = 500,
        timeout: float = LIST_TIMEOUT_SECONDS,
        keep: Callable[[dict], dict | None] | None = None,
        page_bytes: int | None = None,
    ) -> tuple[list[dict], str]:
        """Every item, page by page (one consistent snapshot), and the list's resourceVersion.
        `keep`, if given, is applied to each item as its page arrives (None: drop it), so no more
        than one page is ever held as the API server sent it: a collection of large objects
        costs, while it is listed, what is kept of it plus one page. `page_bytes`: pages of at
        most `page` items are sized to about that many bytes of JSON (`next_page_limit`)."""
        items: list[dict] = []
        token = ""
        limit = page if page_bytes is None else min(page, FIRST_PAGE)
        cap = None if page_bytes is None else 2 * page_bytes
        while True:
            query = {**params, "limit": str(limit)}
            if token:
                query["continue"] = token
            try:
                body = await self.request("GET", path, params=query, timeout=timeout, max_bytes=cap) or {}
            except TooLarge:
                if limit == 1:
                    raise  # one object over the cap: larger than etcd stores, not a page to split
                limit = max(1, limit // 2)  # the same page again (the same continue token), smaller
                continue
            listed = body.pop("items", None) or []
            if page_bytes is not None and listed:
                size = sum(len(orjson.dumps(item)) for item in listed)
                limit = next_page_limit(limit, len(listed), size, page, page_bytes)
            if keep is None:
                items.extend(listed)
            else:
                items.extend(kept for item in listed if (kept := keep(item)) is not None)
            del listed  # the page as sent goes now, before the next one is read
            metadata = body.get("metadata") or {}
            token = metadata.get("continue") or ""
            if not token:
                return items, metadata.get("resourceVersion", "")

    async def watch(
        self,
        path: str,
        params: Mapping[str, str],
        progress_deadline: float,
        on_bytes: Callable[[], None],
        pace: float = 0.0,
    ) -> AsyncGenerator[dict, None]:
        """The events of one watch request, decoded, until the server ends it. Raises Stalled when
        no bytes at all arrive for `progress_deadline` seconds (a half-open connection), an
        ApiError when the server answers with an error or sends an ERROR event (Expired when the
        resourceVersion is too old). `on_bytes` is called when the server accepts the watch, and
        whenever bytes arrive: the connection is alive.

        `pace` > 0: after each read the connection is not read for `pace` seconds, so the events
        of that time wait in the socket and come in one read, one TLS decryption pass and one
        HTTP parse: a busy watch costs a few reads a second instead of one per event, for at
        most `pace` seconds of added delay."""
        timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout, sock_read=None)
        try:
            async with self.session.get(
                self.base + path,
                params={**params, "watch": "1", "allowWatchBookmarks": "true"},
                headers=self._headers(),
                timeout=timeout,
            ) as response:
                if response.status >= 400:
                    raise from_status(response.status, await response.read())
                on_bytes()
                buffer = b""
                while True:
                    try:
                        async with asyncio.timeout(progress_deadline):
                            chunk = await response.content.readany()
                    except TimeoutError:
                        raise Stalled(f"no event or bookmark for {progress_deadline:g}s") from None
                    if not chunk:
                        return  # the server ended the watch (its timeoutSeconds): resume from the last version
                    on_bytes()
                    buffer += chunk
                    if len(buffer) > MAX_EVENT_BYTES:
                        raise ApiError(f"a watch event over {MAX_EVENT_BYTES} bytes")
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        try:
                            event = orjson.loads(line)
                        except orjson.JSONDecodeError as err:
                            raise ApiError(f"a watch event that is not JSON ({err})") from err
                        if event.get("type") == "ERROR":
                            status = event.get("object") or {}
                            raise from_status(int(status.get("code") or 500), status)
                        yield event
                    if pace > 0 and response.connection is not None:
                        await _rest(response.connection.transport, pace)
        except _TRANSPORT as err:
            raise Unreachable(f"watch {path}: {_describe(err)}") from err


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The answer's body, or TooLarge once it is longer than `limit` bytes (the rest unread: the
    connection is closed with the response)."""
    if response.content_length is not None and response.content_length > limit:
        raise TooLarge(f"an answer of {response.content_length} bytes, over {limit}")
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"an answer over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def next_page_limit(limit: int, items: int, size: int, most: int, page_bytes: int) -> int:
    """The next page's limit after a page of `items` items and `size` bytes of JSON: as many as
    fit in `page_bytes` at that page's mean size, at least 1, at most 4 times `limit` (one page
    of small items says little of the next) and at most `most`."""
    fit = page_bytes * items // max(size, 1)
    return max(1, min(fit, 4 * limit, most))


async def _rest(transport: asyncio.Transport | None, seconds: float) -> None:
    """Leave a connection unread for `seconds` (of the event loop's own clock: this paces a
    socket, nothing a test reasons about): what arrives meanwhile waits in the socket."""
    if transport is None or transport.is_closing():
        return
    transport.pause_reading()
    try:
        await asyncio.sleep(seconds)
    finally:
        if not transport.is_closing():
            transport.resume_reading()


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
