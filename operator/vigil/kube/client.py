"""A lean HTTP client for Vigil's writes and direct reads, over aiohttp, on the event loop.

The official client costs most of the operator's CPU on the hot path: every call validated by
pydantic, run in a worker thread, its answer turned into model objects and back into dicts. Here
a request is a JSON body out and a decoded answer back (orjson, as in `vigil.kube.streaming`), with
the credentials, the CA and the User-Agent of `vigil.kube.streaming.ApiReader` (its sibling for lists
and watches).

What the official client did and this one keeps:

- Errors: an error status raises `kubernetes.client.ApiException` with `status`, `reason`,
  `body` (the text) and `headers`, so callers keep telling outcomes apart as they did. A broken
  connection or a timeout raises aiohttp's `ClientError` or `TimeoutError`: transient failures,
  as urllib3's errors were.
- Timeouts: each call has its own, 5 s to connect, 20 s for each read.
- The fence: a write passes `fence` before it is queued, and again as its bytes are written to
  the connection (`_FencedBody`): a write that waited for a free connection, a TLS handshake or
  a turn of the event loop while the fence closed is never sent. aiohttp sends a PUT or DELETE
  once more by itself when the connection broke without an answer; that second try passes the
  fence again too, as urllib3's retries did (the old `FencedRetry`).
- Content types: `application/json` for creates and deletes, and for patches what the official
  client picked: a strategic merge patch for core objects, a merge patch for custom resources.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp.payload import BytesPayload
from kubernetes import client
from kubernetes.client.rest import ApiException

from vigil.kube.streaming import CONNECT_TIMEOUT_SECONDS, auth_headers, ssl_context

READ_TIMEOUT_SECONDS = 20.0
CONNECTIONS = 16  # open at once at least; more calls wait for one (the old thread pool allowed 6)
# Requests in flight besides the workers' and the event recorder's: background releases of
# finalizers, the dispatcher's and the leader mark's reads and writes.
SPARE_CONNECTIONS = 8


def pool_size(workers: int, event_senders: int) -> int:
    """Connections for an operator with `workers` reconcilers and `event_senders`: each holds
    at most one request at a time, so none waits for a connection behind the others (with 16
    workers on a 16-connection pool, a wait for one ran past the connect timeout under load)."""
    return max(CONNECTIONS, workers + event_senders + SPARE_CONNECTIONS)


JSON = "application/json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"

Fence = Callable[[], None]


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
    """Requests to one API server, sharing one connection pool (not the watches': a write never
    waits behind a watch for a connection)."""

    def __init__(
        self, configuration: client.Configuration, user_agent: str = "vigil", connections: int = CONNECTIONS
    ) -> None:
        self.configuration = configuration
        self.user_agent = user_agent
        self.connections = connections
        self.base = configuration.host.rstrip("/")
        self._ssl = ssl_context(configuration)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=self.connections),
                timeout=self.timeout(),
            )
        return self._session

    @staticmethod
    def timeout() -> aiohttp.ClientTimeout:
        # sock_connect: the TCP connect, as urllib3's connect timeout; sock_read: each read, as
        # urllib3's read timeout. `connect` bounds waiting for a connection plus the TLS handshake.
        return aiohttp.ClientTimeout(
            total=None,
            connect=CONNECT_TIMEOUT_SECONDS + READ_TIMEOUT_SECONDS,
            sock_connect=CONNECT_TIMEOUT_SECONDS,
            sock_read=READ_TIMEOUT_SECONDS,
        )

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
    ) -> Any:
        """One request; the decoded answer (None for an empty one). `fence`, for a write (every
        write of Vigil's has a body), is called before the request is queued and again as its
        body is written."""
        headers = {"Accept": JSON, "User-Agent": self.user_agent, **auth_headers(self.configuration)}
        data: bytes | _FencedBody | None = None
        if body is not None:
            raw = orjson.dumps(body)
            data = raw if fence is None else _FencedBody(raw, content_type, fence)
            headers["Content-Type"] = content_type
        if fence is not None:
            fence()
        try:
            async with self.session.request(
                method, self.base + path, params=params, data=data, headers=headers
            ) as response:
                text = await response.read()
                if response.status >= 400:
                    error = ApiException(status=response.status, reason=response.reason)
                    error.body = text.decode("utf-8", errors="replace")
                    error.headers = response.headers
                    raise error
                return orjson.loads(text) if text else None
        except aiohttp.ClientError:
            if isinstance(data, _FencedBody) and data.refused is not None:
                raise data.refused from None  # nothing was sent: the fence closed
            raise
