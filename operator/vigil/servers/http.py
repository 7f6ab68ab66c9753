"""The one way Vigil serves HTTP: a server per port, each with one stack.

- `serve`: aiohttp routes (the probes, the metrics, the admission webhook).
- `serve_fast`: one hot route (the agents' beats), answered by the connection's own protocol.

Both listen through one gate (`_Listener`), so that anyone who can reach a port is bounded
before they cost anything dear:
- a connection is counted, against the server's limit and against its source address's, as soon
  as it is accepted: before its TLS handshake (a handshake and its buffers are the dear part);
  past either it is closed at once;
- until its first bytes come it is a socket alone (no TLS state, no buffer); they must come, and
  its handshake end, each within `Bounds.handshake_seconds`;
- a request's line and headers must all arrive within `Bounds.head_seconds` of its first byte,
  and be at most MAX_HEAD bytes;
- a kept-alive connection with nothing asked for `Bounds.idle_seconds` is closed (aiohttp's own
  keep-alive is set to the same, not left at its default of an hour).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random as _random
import resource
import ssl
from asyncio import sslproto
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any

import httptools
from aiohttp import web

from vigil.core.ratelimit import SourceBudget

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 1024**2  # aiohttp's own default: endpoints that take bodies say how much
# asyncio gives a TLS connection a 256 KiB read buffer, held for as long as it is open; an agent
# beating to the leader keeps one open, so 10,000 beating pods would hold 2.8 GiB (measured: 291
# KiB per idle connection, 50 KiB with 16 KiB; bench/README.md). A TLS record carries at most 16
# KiB, so a smaller buffer costs only more reads of large bodies. Set on this module's own
# subclass of asyncio's TLS protocol, so only the connections these servers accept have it.
TLS_READ_BUFFER = 16 * 1024
HANDSHAKE_SECONDS = 5.0  # a client on a slow link handshakes in well under a second
HEAD_SECONDS = 10.0  # from a request's first byte to the end of its headers
IDLE_SECONDS = 75.0  # nothing asked on a kept-alive connection (nginx's and Go's default is near)
MAX_HEAD = 16 * 1024  # a request's line and headers (a projected token is ~1 KiB, a review's head less)

# The connections the beat server holds for beats. Every beating pod keeps one to the leader, so
# the 50,000 attempts in flight Vigil is sized for (docs/capacity-planning.md) need 50,000; each
# costs a descriptor and ~45 KiB (bench/README.md). They take at most MEMORY_SHARE of the
# container's memory limit (cgroup), at CONNECTION_BYTES each (the chart's 512 MiB holds 4,096;
# without the share a default install would be OOM-killed at ~6,000 beating attempts), within the
# open-file limit less RESERVED_FDS for the operator's own API connections, the Lease and its
# other servers, and SPARE_CONNECTIONS. A beat on a connection past the limit (within the spare)
# is answered 503 with a Retry-After of about BUSY_RETRY_SECONDS: its agent beats by annotation
# until then instead of paying a TLS handshake here every beat. Past the spare too, a connection
# is closed before its handshake.
MAX_CONNECTIONS = 65_536  # ~3 GiB of connections at most
RESERVED_FDS = 1024
SPARE_CONNECTIONS = 256
CONNECTION_BYTES = 64 * 1024  # ~45 KiB measured idle, with room for a request and its answer in flight
MEMORY_SHARE = 0.5  # the rest for the jobs and pods kept, and a list's page at start
BUSY_RETRY_SECONDS = 300  # answered as 150-450 s, at random: the refused agents do not come back together
_REFUSAL_LOG_SECONDS = 60.0  # a flood's refusals are logged at most this often per server
_FEED_PIECE = 4096  # bytes fed to a parser at once, so a request's head is bounded before it is buffered
_MAX_QUEUED = 16  # answers waited for on one connection (pipelined requests) before it stops being read

# Why a server closed a connection it did not answer (vigil_connections_refused_total's reasons).
LIMIT, SOURCE_LIMIT, SOURCE_RATE = "limit", "source-limit", "source-rate"
SLOW_HANDSHAKE, SLOW_HEAD, LARGE_HEAD = "slow-handshake", "slow-head", "large-head"
REFUSALS = (LIMIT, SOURCE_LIMIT, SOURCE_RATE, SLOW_HANDSHAKE, SLOW_HEAD, LARGE_HEAD)


@dataclass(frozen=True)
class Bounds:
    """What one server admits. `max_connections`: held at once, of any kind (the beat server holds
    `spare` more, answered 503); `per_source`: of those, from one address; `per_source_rate`
    (burst `per_source`): new connections a second from one address, since every new one costs a
    TLS handshake (~1 ms of CPU) and a client refused on its request comes back on a new one."""

    max_connections: int
    per_source: int
    per_source_rate: float = 10.0
    handshake_seconds: float = HANDSHAKE_SECONDS
    head_seconds: float = HEAD_SECONDS
    idle_seconds: float = IDLE_SECONDS
    spare: int = 0


def busy_retry_after(u: float) -> int:
    """The Retry-After of a beat past the limit, for `u` uniform in [0, 1)."""
    return round(BUSY_RETRY_SECONDS * (0.5 + u))


def connection_limit(
    open_files: int,
    memory_limit: int | None = None,
    *,
    reserved: int = RESERVED_FDS,
    ceiling: int = MAX_CONNECTIONS,
) -> int:
    """The connections a server may hold under an open-file limit (RLIMIT_NOFILE's soft value;
    negative: unlimited), keeping `reserved` descriptors for the rest of the process, and under a
    memory limit in bytes (None: none), of which they take at most MEMORY_SHARE."""
    limit = ceiling if open_files < 0 else min(ceiling, open_files - reserved - SPARE_CONNECTIONS)
    if memory_limit is not None:
        limit = min(limit, int(memory_limit * MEMORY_SHARE) // CONNECTION_BYTES)
    return max(1, limit)


def process_connection_limit() -> int:
    """`connection_limit` of this process's open-file limit and its container's memory limit."""
    return connection_limit(resource.getrlimit(resource.RLIMIT_NOFILE)[0], memory_limit())


def memory_limit(read: Callable[[str], str] | None = None) -> int | None:
    """The memory limit of this process's container, in bytes, from its cgroup (v2, then v1), or
    None where it has none (`max`, v1's "no limit" of ~2^63, or no cgroup file to read)."""
    read = read or _read_text
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = read(path).strip()
        except OSError:
            continue
        if text == "max" or not text.isdigit():
            return None
        value = int(text)
        return value if value < 2**60 else None  # v1 writes "no limit" as a page-rounded 2^63 - 1
    return None


def _read_text(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read(64)


def split_address(address: str) -> tuple[str, int]:
    """("HOST", PORT) of "HOST:PORT" (or ":PORT", all interfaces)."""
    host, _, port = address.rpartition(":")
    return host or "0.0.0.0", int(port)


class Server:
    """A running server; `stop()` closes it."""

    def __init__(self, listener: _Listener, runner: web.AppRunner | None = None) -> None:
        self._listener, self._runner = listener, runner

    @property
    def port(self) -> int:
        """The port it listens on (the one the system picked when started on port 0)."""
        return self._listener.port

    def connections(self) -> tuple[int, int]:
        """(connections held, the most it holds), the 503-answered spare not counted."""
        listener = self._listener
        return min(len(listener.open), listener.bounds.max_connections), listener.bounds.max_connections

    def refusals(self) -> Mapping[str, int]:
        """Connections closed unanswered since the start, by reason (one of REFUSALS)."""
        return self._listener.refused

    async def stop(self) -> None:
        await self._listener.stop()
        if self._runner is not None:
            await self._runner.cleanup()


async def serve(
    routes: Iterable[web.RouteDef],
    address: str,
    *,
    bounds: Bounds,
    ssl_context: ssl.SSLContext | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    on_refused: Callable[[str], None] = lambda reason: None,
) -> Server:
    """aiohttp's routes on HOST:PORT, behind the gate."""
    app = web.Application(client_max_size=max_body)
    app.add_routes(list(routes))
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=bounds.idle_seconds)
    await runner.setup()
    handlers = runner.server
    assert handlers is not None
    listener = _Listener(bounds, ssl_context, lambda lst, peer, held: _Watched(lst, handlers(), peer), on_refused)
    try:
        await listener.listen(address)
    except BaseException:
        await runner.cleanup()
        raise
    return Server(listener, runner)


async def serve_fast(
    route: FastRoute | Sequence[FastRoute],
    address: str,
    *,
    bounds: Bounds,
    ssl_context: ssl.SSLContext | None = None,
    random: Callable[[], float] = _random.random,
    on_refused: Callable[[str], None] = lambda reason: None,
) -> Server:
    """Fast routes (one, or a few by path) on HOST:PORT, behind the gate. Its `bounds.spare`
    connections past `bounds.max_connections` are admitted, and their requests answered 503 with
    a Retry-After."""
    routes = {r.path: r for r in ([route] if isinstance(route, FastRoute) else route)}
    bounds = replace(bounds, head_seconds=min([bounds.head_seconds, *(r.read_seconds for r in routes.values())]))
    listener = _Listener(
        bounds, ssl_context, lambda lst, peer, held: _FastConnection(lst, routes, peer, held, random), on_refused
    )
    await listener.listen(address)
    return Server(listener)


# --- The gate ----------------------------------------------------------------------------------


class _Deadlines:
    """What the listener's one timer asks of a connection's protocol (a timer per request, armed
    and cancelled, would cost as much as the request)."""

    late: str = SLOW_HEAD  # the refusal a late connection is counted as
    began: float  # the loop's time of the current request's first byte (0: no request being read)
    read_seconds: float  # from `began`, for what must arrive before the request is answered
    active: float  # the loop's time of the last byte read or request answered
    busy: bool  # a request is being answered: never idle

    def expire(self, why: str) -> None:
        raise NotImplementedError


class _Listener:
    """One server's listening side: the count of its connections, by source address too, and one
    timer for the deadlines of all of them."""

    def __init__(
        self,
        bounds: Bounds,
        ssl_context: ssl.SSLContext | None,
        app: Callable[[_Listener, str, bool], Any],
        on_refused: Callable[[str], None],
    ) -> None:
        self.bounds, self.ssl_context, self.app, self.on_refused = bounds, ssl_context, app, on_refused
        self.loop = asyncio.get_running_loop()
        self.open: set[_Deadlines] = set()  # admitted, handshaken or not, and not yet closed
        self.by_source: Counter[str] = Counter()
        # Only the sources' buckets: the server's limit already bounds the sum of connections.
        self.accepts = SourceBudget(
            rate=1e9, burst=2**31, source_rate=bounds.per_source_rate, source_burst=bounds.per_source
        )
        self.reading: set[_Deadlines] = set()  # a request begun and its head not all here
        self.refused: dict[str, int] = dict.fromkeys(REFUSALS, 0)
        self._refusal_logged = -math.inf
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task | None = None

    async def listen(self, address: str) -> None:
        host, port = split_address(address)
        self._server = await self.loop.create_server(lambda: _Gate(self), host, port, backlog=128, reuse_address=True)
        self._sweeper = self.loop.create_task(self._sweep())

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def admit(self, peer: str) -> bool | None:
        """Whether a new connection from `peer` is held (True), admitted to be answered 503
        (False: past max_connections, within the spare), or refused (None, counted)."""
        bounds = self.bounds
        if len(self.open) >= bounds.max_connections + bounds.spare:
            self.refuse(LIMIT, f"it holds {bounds.max_connections + bounds.spare} connections, the most it may")
            return None
        if self.by_source[peer] >= bounds.per_source:
            self.refuse(SOURCE_LIMIT, f"{peer} holds {bounds.per_source} connections, the most one address may")
            return None
        if not self.accepts.take(peer, self.loop.time()):
            self.refuse(SOURCE_RATE, f"{peer} opens more than {bounds.per_source_rate:g} connections a second")
            return None
        return len(self.open) < bounds.max_connections

    def opened(self, connection: _Deadlines, peer: str) -> None:
        self.open.add(connection)
        self.by_source[peer] += 1

    def handed(self, gate: _Deadlines, app: _Deadlines) -> None:
        """The gate's connection, its first bytes come, is the application's protocol's now."""
        self.open.discard(gate)
        self.reading.discard(gate)
        self.open.add(app)

    def closed(self, connection: _Deadlines, peer: str) -> None:
        if connection in self.open:
            self.open.discard(connection)
            self.reading.discard(connection)
            self.by_source[peer] -= 1
            if self.by_source[peer] <= 0:
                del self.by_source[peer]

    def refuse(self, reason: str, why: str) -> None:
        self.refused[reason] += 1
        self.on_refused(reason)
        now = self.loop.time()
        if now - self._refusal_logged >= _REFUSAL_LOG_SECONDS:
            self._refusal_logged = now
            log.warning(
                "the server on port %d closed a connection: %s (%s so far, by reason). Find who opens so many, or "
                "raise the limit",
                self.port,
                why,
                ", ".join(f"{k} {v}" for k, v in self.refused.items() if v),
            )

    async def _sweep(self) -> None:
        bounds = self.bounds
        every = min(max(bounds.head_seconds / 4, 0.05), 1.0)
        idle_due = 0.0
        while True:
            await asyncio.sleep(every)
            now = self.loop.time()
            for connection in [c for c in self.reading if c.began and now - c.began > c.read_seconds]:
                self.refused[connection.late] += 1
                self.on_refused(connection.late)
                connection.expire(f"the request did not arrive within {connection.read_seconds:g} s")
            if now >= idle_due:  # every connection walked only every few seconds
                idle_due = now + bounds.idle_seconds / 8
                for connection in [
                    c for c in self.open if not c.busy and not c.began and now - c.active > bounds.idle_seconds
                ]:
                    connection.expire("idle")

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for connection in list(self.open):
            connection.expire("the server is stopping")


class _Gate(asyncio.Protocol, _Deadlines):
    """A connection as accepted: admitted or closed at once, then held as a socket alone (~1 KiB)
    until its first bytes (a TLS ClientHello, or a request), which must come within the
    handshake's (or a head's) deadline; only then are TLS's state and buffers and the
    application's protocol made for it."""

    late = SLOW_HANDSHAKE

    def __init__(self, listener: _Listener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.peer, self.held = "", False
        self.began = self.active = listener.loop.time()
        self.busy = False
        tls = listener.ssl_context is not None
        self.read_seconds = listener.bounds.handshake_seconds if tls else listener.bounds.head_seconds
        if not tls:
            self.late = SLOW_HEAD

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        listener = self.listener
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if peername else ""
        held = listener.admit(self.peer)
        if held is None:
            transport.abort()
            return
        self.transport, self.held = transport, held
        listener.opened(self, self.peer)
        listener.reading.add(self)

    def data_received(self, data: bytes) -> None:
        listener, transport = self.listener, self.transport
        assert transport is not None
        app = listener.app(listener, self.peer, self.held)
        listener.handed(self, app)
        if listener.ssl_context is None:
            transport.set_protocol(app)
            app.connection_made(transport)
            app.data_received(data)
            return
        tls = _LeanTLS(listener, app, self.peer)
        transport.set_protocol(tls)
        tls.connection_made(transport)
        view = tls.get_buffer(len(data))  # the ClientHello read so far, given to TLS as if it read it
        view[: len(data)] = data
        tls.buffer_updated(len(data))

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.closed(self, self.peer)  # before any byte came, or refused (never counted)

    def expire(self, why: str) -> None:
        if self.transport is not None:
            self.transport.abort()


class _LeanTLS(sslproto.SSLProtocol):
    """asyncio's TLS protocol with a record-sized read buffer and the listener's handshake
    deadline, counted until its connection closes (whether or not its handshake ended)."""

    max_size = TLS_READ_BUFFER

    def __init__(self, listener: _Listener, app: Any, peer: str) -> None:
        assert listener.ssl_context is not None
        super().__init__(
            listener.loop,
            app,
            listener.ssl_context,
            None,  # type: ignore[arg-type]  # no waiter: the gate waits for nothing
            server_side=True,
            ssl_handshake_timeout=listener.bounds.handshake_seconds,  # type: ignore[arg-type]  # a float works
        )
        self._gate = listener, app, peer

    def connection_lost(self, exc: BaseException | None) -> None:
        listener, app, peer = self._gate
        listener.closed(app, peer)  # the app's own connection_lost follows only after a handshake
        super().connection_lost(exc)


# --- aiohttp's connections, watched ------------------------------------------------------------


class _Watched(asyncio.Protocol, _Deadlines):
    """aiohttp's protocol for one connection, with the gate's deadlines: aiohttp bounds a request
    line and each header's size, but not the time a head takes to arrive, nor its whole size.
    The bytes pass through an httptools parser that only notes where requests begin and end."""

    def __init__(self, listener: _Listener, inner: asyncio.Protocol, peer: str) -> None:
        self.listener, self.inner, self.peer = listener, inner, peer
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.began, self.active, self.busy = 0.0, listener.loop.time(), False
        self.read_seconds = listener.bounds.head_seconds
        self.head_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.active = self.listener.loop.time()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.active = self.listener.loop.time()
        if self.parser is not None:
            for start in range(0, len(data), _FEED_PIECE):
                piece = data[start : start + _FEED_PIECE]
                if not self.busy:
                    self.head_bytes += len(piece)
                    if self.head_bytes > MAX_HEAD:
                        self.listener.refused[LARGE_HEAD] += 1
                        self.listener.on_refused(LARGE_HEAD)
                        self.expire(f"a request's line and headers are over {MAX_HEAD} bytes")
                        return
                try:
                    self.parser.feed_data(piece)
                except httptools.HttpParserError:
                    self.parser = None  # aiohttp answers the malformed request itself
                    self.listener.reading.discard(self)
                    break
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.closed(self, self.peer)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # httptools callbacks: where requests begin and end
    def on_message_begin(self) -> None:
        self.began = self.listener.loop.time()
        self.listener.reading.add(self)

    def on_headers_complete(self) -> None:
        self.began, self.busy, self.head_bytes = 0.0, True, 0
        self.listener.reading.discard(self)

    def on_message_complete(self) -> None:
        self.busy = False

    def expire(self, why: str) -> None:
        self.listener.reading.discard(self)
        if self.transport is not None:
            self.transport.abort()


# --- Fast routes -------------------------------------------------------------------------------
# An endpoint that every agent calls every few seconds (the beats, `vigil.servers.beats`) is
# answered on the connection's own protocol: the request parsed by httptools (llhttp, the parser
# aiohttp's own is built on) and answered from the parser's callback when the handler can answer
# at once, with no task, request object or response object per request: about half the CPU of a
# request through aiohttp (bench/README.md, "Beats answered by the server's protocol").


class Reply:
    """A fast route's answer: a status and a JSON body, and whether the connection closes after
    it. Its bytes on the wire are made once per Reply: a handler that answers nearly every
    request with one of a few Replies made once encodes nothing per request."""

    __slots__ = ("status", "body", "close", "headers", "_wire")

    def __init__(
        self, status: int, body: bytes, *, close: bool = False, headers: Mapping[str, str] | None = None
    ) -> None:
        self.status, self.body, self.close = status, body, close
        self.headers = dict(headers or {})
        self._wire: list[bytes | None] = [None, None]

    @classmethod
    def error(cls, status: int, why: str, *, headers: Mapping[str, str] | None = None) -> Reply:
        """A refusal: it closes its connection, so a refused client holds no slot (it comes back
        on a new connection, paying a handshake, if it is worth answering again)."""
        return cls(status, json.dumps({"error": why}).encode(), close=True, headers=headers)

    def wire(self, keep_alive: bool) -> bytes:
        keep = keep_alive and not self.close
        made = self._wire[keep]
        if made is None:
            phrase = HTTPStatus(self.status).phrase
            connection = b"" if keep else b"Connection: close\r\n"
            extra = b"".join(
                b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()
            )
            made = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s%s\r\n%s" % (
                self.status,
                phrase.encode(),
                len(self.body),
                extra,
                connection,
                self.body,
            )
            self._wire[keep] = made
        return made


FastHandler = Callable[[Mapping[str, str], bytes, str], "Reply | Awaitable[Reply]"]


@dataclass(frozen=True)
class FastRoute:
    """POST `path` answered by `handler(headers, body, peer)`: headers by lower-case name, the
    whole body (at most `max_body` bytes, else 413 before the handler), within `read_seconds` of
    the request's first byte (else 408), and the client's address. `refused` is told the status
    of each request the protocol refuses itself, for the endpoint's metrics."""

    path: str
    handler: FastHandler
    max_body: int
    read_seconds: float = 2.0
    refused: Callable[[int], None] = lambda status: None


class _Stop(Exception):
    """Raised from a parser callback: the connection is closing, parse no further."""


class _FastConnection(asyncio.Protocol, _Deadlines):
    """One connection of the fast server: parsed, answered in order (a handler's awaited answer
    holds back the ones pipelined after it), and closed on a malformed, oversized or late
    request. One admitted past the limit (`held` False) answers its request 503 and closes."""

    def __init__(
        self,
        listener: _Listener,
        routes: Mapping[str, FastRoute],
        peer: str,
        held: bool,
        random: Callable[[], float],
    ) -> None:
        self.listener, self.routes, self.peer, self.held, self.random = listener, routes, peer, held, random
        route = self.route = next(iter(routes.values()))  # the request's, once its path is read
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closing = False
        self.began, self.active, self.busy = 0.0, listener.loop.time(), False
        self.read_seconds = route.read_seconds
        self.in_body = False
        self.head_bytes = 0
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.answers: deque[tuple[Reply | asyncio.Future[Reply], bool]] = deque()
        self.paused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.active = self.listener.loop.time()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.listener.closed(self, self.peer)
        for answer, _ in self.answers:
            if isinstance(answer, asyncio.Future):
                answer.cancel()
        self.answers.clear()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.active = self.listener.loop.time()
        for start in range(0, len(data), _FEED_PIECE):
            piece = data[start : start + _FEED_PIECE]
            if not self.in_body:  # a head being read (counted from the end of the request before)
                self.head_bytes += len(piece)
                if self.head_bytes > MAX_HEAD:
                    self.refuse(431, f"a request's line and headers are at most {MAX_HEAD} bytes")
                    return
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserCallbackError:
                return  # _Stop: the connection is closing
            except httptools.HttpParserUpgrade:
                self.refuse(400, "this endpoint does not upgrade connections")
                return
            except httptools.HttpParserError as err:
                self.refuse(400, f"not an HTTP/1.1 request: {err}")
                return
            if self.closing:
                return

    def pause_writing(self) -> None:  # a client that does not read its answers is not read either
        assert self.transport is not None
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        assert self.transport is not None
        if not self.paused:
            self.transport.resume_reading()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self.began = self.listener.loop.time()
        self.listener.reading.add(self)
        self.in_body, self.body_bytes = False, 0
        self.url, self.headers, self.body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.in_body = True
        path = self.url.partition(b"?")[0].decode("latin-1")
        route = self.routes.get(path)
        if self.parser.get_method() != b"POST" or route is None:
            self.refuse(404, f"this server serves only POST {' and POST '.join(self.routes)}")
            raise _Stop
        self.route, self.read_seconds = route, route.read_seconds
        if self.headers.get("expect", "").lower() == "100-continue":
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.route.max_body:
            self.refuse(413, f"a request's body is at most {self.route.max_body} bytes")
            raise _Stop
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.listener.reading.discard(self)
        self.began, self.in_body, self.head_bytes = 0.0, False, 0
        keep_alive = self.parser.should_keep_alive()
        answer: Reply | Awaitable[Reply]
        if not self.held:  # past the limit: told when to come back, and closed
            self.route.refused(503)
            answer = self._busy()
        else:
            try:
                answer = self.route.handler(self.headers, b"".join(self.body), self.peer)
            except Exception:
                log.exception("%s failed", self.route.path)
                answer = Reply.error(500, "the server failed to answer; retry")
        if isinstance(answer, Reply):
            if not self.answers:
                self._write(answer, keep_alive)
                return
            self.answers.append((answer, keep_alive))
        else:
            task = asyncio.ensure_future(answer)
            self.answers.append((task, keep_alive))
            task.add_done_callback(lambda _: self._flush())
        self.busy = True
        if len(self.answers) >= _MAX_QUEUED and not self.paused:
            assert self.transport is not None
            self.paused = True
            self.transport.pause_reading()

    # the rest

    def _busy(self) -> Reply:
        retry = busy_retry_after(self.random())
        most = self.listener.bounds.max_connections
        return Reply.error(
            503,
            f"this server holds {most} connections for beats, the most it may: retry in {retry} s",
            headers={"Retry-After": str(retry)},
        )

    def refuse(self, status: int, why: str) -> None:
        """Answers `status` at once and closes: the request is not read further."""
        if self.closing:
            return
        self.route.refused(status)
        self._write(Reply.error(status, why), False)

    def expire(self, why: str) -> None:
        if self.began:  # a request begun and late: told so
            self.refuse(408, why)
        else:
            self.close()

    def close(self) -> None:
        self.closing = True
        self.listener.reading.discard(self)
        if self.transport is not None:
            self.transport.close()

    def _flush(self) -> None:
        while self.answers and not self.closing:
            answer, keep_alive = self.answers[0]
            if isinstance(answer, asyncio.Future):
                if not answer.done():
                    return
                if answer.cancelled() or answer.exception() is not None:
                    if not answer.cancelled():
                        log.error("a fast route failed", exc_info=answer.exception())
                    answer = Reply.error(500, "the server failed to answer; retry")
                else:
                    answer = answer.result()
            self.answers.popleft()
            self._write(answer, keep_alive)
        if self.paused and not self.closing and len(self.answers) < _MAX_QUEUED:
            assert self.transport is not None
            self.paused = False
            self.transport.resume_reading()

    def _write(self, reply: Reply, keep_alive: bool) -> None:
        assert self.transport is not None
        self.transport.write(reply.wire(keep_alive))
        self.active = self.listener.loop.time()
        self.busy = bool(self.answers)
        if not keep_alive or reply.close:
            self.close()
