"""The one way Vigil serves HTTP: an aiohttp application on HOST:PORT, plain or with TLS, on the
operator's event loop. The health, metrics and admission endpoints are each a set of routes
handed to `serve`; the heartbeat endpoint is a `FastRoute` among them (see below)."""

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
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus

import httptools
from aiohttp import web

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 1024**2  # aiohttp's own default: endpoints that take bodies say how much
# asyncio gives every TLS connection a 256 KiB read buffer (sslproto.SSLProtocol.max_size), held
# for as long as the connection is open: an agent beating to the leader keeps one open, so 10,000
# beating pods would hold 2.8 GiB (measured: 291 KiB per idle connection, 50 KiB with 16 KiB; see
# bench/README.md). A TLS record carries at most 16 KiB, so smaller reads cost only more recv
# calls on large answers. The attribute is the class's: it applies to every TLS connection of
# the process, the API client's too.
TLS_READ_BUFFER = 16 * 1024


# Connections held open for fast routes (the beats) at once. Every beating pod keeps one to the
# leader, so the seed's 50,000 attempts in flight need 50,000; each costs a descriptor and ~45 KiB
# (bench/README.md). They take at most MEMORY_SHARE of the container's memory limit (cgroup), at
# CONNECTION_BYTES each (the chart's 512 MiB holds 4,096: docs/capacity-planning.md; without the
# share a default install would be OOM-killed at ~6,000 beating attempts), within the open-file
# limit less RESERVED_FDS for the operator's own API connections and Lease, and SPARE_CONNECTIONS
# for everything else the server answers (the API server's admission reviews, and the answers
# below). A beat on a new connection past the limit is answered 503 with a Retry-After of about
# BUSY_RETRY_SECONDS (its agent beats by annotation until then, instead of paying a TLS handshake
# here every beat), and the connection closed. Past the limit and the spare together a new
# connection is closed as soon as it is made: a flood takes neither the memory nor the descriptors.
MAX_CONNECTIONS = 65_536  # ~3 GiB of connections at most
RESERVED_FDS = 1024
SPARE_CONNECTIONS = 256
CONNECTION_BYTES = 64 * 1024  # ~45 KiB measured idle, with room for a request and its answer in flight
MEMORY_SHARE = 0.5  # the rest for the jobs and pods kept, and a list's page at start
BUSY_RETRY_SECONDS = 300  # answered as 150-450 s, at random: the refused agents do not come back together
_REFUSAL_LOG_SECONDS = 60.0  # a flood's refusals are logged at most this often


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


def lean_tls_buffers() -> None:
    if getattr(sslproto.SSLProtocol, "max_size", 0) > TLS_READ_BUFFER:
        sslproto.SSLProtocol.max_size = TLS_READ_BUFFER


class Server:
    """A running server; `stop()` closes it."""

    def __init__(
        self, runner: web.AppRunner, listener: asyncio.Server | None = None, fast: _FastServer | None = None
    ) -> None:
        self._runner, self._listener, self._fast = runner, listener, fast

    @property
    def port(self) -> int:
        """The port it listens on (the one the system picked when started on port 0)."""
        if self._listener is not None:
            return int(self._listener.sockets[0].getsockname()[1])
        return int(self._runner.addresses[0][1])

    def fast_connections(self) -> tuple[int, int]:
        """(connections held for fast routes, the most it holds); (0, 0) without fast routes."""
        if self._fast is None:
            return 0, 0
        return self._fast.fast, self._fast.max_connections

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._fast is not None:
            await self._fast.stop()
        await self._runner.cleanup()


def split_address(address: str) -> tuple[str, int]:
    """("HOST", PORT) of "HOST:PORT" (or ":PORT", all interfaces)."""
    host, _, port = address.rpartition(":")
    return host or "0.0.0.0", int(port)


async def serve(
    routes: Iterable[web.RouteDef | FastRoute],
    address: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    max_connections: int | None = None,
    spare_connections: int = SPARE_CONNECTIONS,
    random: Callable[[], float] = _random.random,
) -> Server:
    """`max_connections` bounds the connections a server with fast routes holds for them
    (default: `connection_limit` of this process's open-file and memory limits), and
    `spare_connections` the others on top (`random` draws the Retry-After past the limit)."""
    if ssl_context is not None:
        lean_tls_buffers()
    every = list(routes)
    fast = [route for route in every if isinstance(route, FastRoute)]
    app = web.Application(client_max_size=max_body)
    app.add_routes([route for route in every if not isinstance(route, FastRoute)] + [as_aiohttp(r) for r in fast])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = split_address(address)
    if not fast:
        await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
        return Server(runner)
    if max_connections is None:
        max_connections = connection_limit(resource.getrlimit(resource.RLIMIT_NOFILE)[0], memory_limit())
    front = _FastServer(fast, runner.server, max_connections, spare_connections, random)  # type: ignore[arg-type]
    # What aiohttp's TCPSite does, with the fast protocol in front of aiohttp's.
    listener = await asyncio.get_running_loop().create_server(
        front.protocol, host, port, ssl=ssl_context, backlog=128, reuse_address=True
    )
    return Server(runner, listener, front)


# --- Fast routes -------------------------------------------------------------------------------
# An endpoint that every agent calls every few seconds (the beats, `vigil.servers.beats`) is
# answered on the connection's own protocol: the request parsed by httptools (llhttp, the parser
# aiohttp's own is built on) and answered from the parser's callback when the handler can answer
# at once, with no task, request object or response object per request: about half the CPU of a
# request through aiohttp (bench/README.md, "Beats answered by the server's protocol"). The rest
# of a server's routes stay aiohttp's: a connection whose first request is not for a fast route
# is handed to aiohttp's protocol, bytes and all; one whose first request is stays with the fast
# protocol for as long as it is open, and is answered 404 for anything else.

FAST_MAX_HEAD = 16 * 1024  # the request line and headers of a request (a projected token is ~1 KiB)
FAST_IDLE_SECONDS = 75.0  # a kept-alive connection with nothing asked is closed (aiohttp's default)
_FEED_PIECE = 4096  # bytes fed to the parser at once, so a request's head is bounded before it is buffered
_MAX_QUEUED = 16  # answers waited for on one connection (pipelined requests) before it stops being read


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
    def error(cls, status: int, why: str, *, close: bool = False, headers: Mapping[str, str] | None = None) -> Reply:
        return cls(status, json.dumps({"error": why}).encode(), close=close, headers=headers)

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


FastHandler = Callable[[Mapping[str, str], bytes], "Reply | Awaitable[Reply]"]


@dataclass(frozen=True)
class FastRoute:
    """POST `path` answered by `handler(headers, body)`: headers by lower-case name, the whole
    body (at most `max_body` bytes, else 413 before the handler), within `read_seconds` of the
    request's first byte (else 408). `refused` is told the status of each request the protocol
    refuses itself, for the endpoint's metrics."""

    path: str
    handler: FastHandler
    max_body: int
    read_seconds: float = 2.0
    refused: Callable[[int], None] = lambda status: None


class _Stop(Exception):
    """Raised from a parser callback: the connection is closing, parse no further."""


class _FastServer:
    """The listening side's state: its routes, its open connections (the fast ones, and those
    handed to aiohttp, counted until their transport closes) and one timer for all of them (a
    timer per request, armed and cancelled, would cost as much as the request)."""

    def __init__(
        self,
        routes: Iterable[FastRoute],
        hand_off: Callable[[], asyncio.Protocol],
        max_connections: int,
        spare_connections: int = SPARE_CONNECTIONS,
        random: Callable[[], float] = _random.random,
    ) -> None:
        self.routes = {("POST", route.path): route for route in routes}
        self.prefixes = [f"POST {route.path}".encode() for route in self.routes.values()]
        self.sniff_bytes = max(len(prefix) for prefix in self.prefixes) + 1
        self.read_seconds = min(route.read_seconds for route in self.routes.values())
        self.hand_off = hand_off
        self.loop = asyncio.get_running_loop()
        self.connections: set[_FastConnection] = set()
        self.handed_off: set[asyncio.BaseTransport] = set()  # aiohttp's: counted until closed
        self.max_connections, self.spare_connections, self.random = max_connections, spare_connections, random
        self.fast = 0  # connections held for fast routes, counted against max_connections
        self.refused = 0  # connections closed at once, or answered 503 past max_connections
        self._refusal_logged = self._handed_off_walked = -math.inf
        self.reading: set[_FastConnection] = set()  # a request begun and not yet all here
        self._sweeper = self.loop.create_task(self._sweep())

    def protocol(self) -> _FastConnection:
        return _FastConnection(self)

    def admits(self) -> bool:
        """Whether one more connection may be opened, of any kind (counted as refused if not)."""
        most = self.max_connections + self.spare_connections
        if len(self.connections) + len(self.handed_off) < most:
            return True
        now = self.loop.time()
        if self.handed_off and now - self._handed_off_walked >= 1.0:  # at most once a second under a flood
            self._handed_off_walked = now
            self.handed_off = {t for t in self.handed_off if not t.is_closing()}  # closed since the last sweep
            if len(self.connections) + len(self.handed_off) < most:
                return True
        self.refusing("new connections are closed at once")
        return False

    def holds_fast(self) -> bool:
        """Whether one more connection may be held for fast routes (counted if so)."""
        if self.fast < self.max_connections:
            self.fast += 1
            return True
        self.refusing(f"beats on new ones are answered 503, retry in ~{BUSY_RETRY_SECONDS} s")
        return False

    def busy(self) -> Reply:
        """The answer to a fast request on a connection past the limit."""
        retry = busy_retry_after(self.random())
        return Reply.error(
            503,
            f"this server holds {self.max_connections} connections, the most it may: retry in {retry} s",
            close=True,
            headers={"Retry-After": str(retry)},
        )

    def refusing(self, how: str) -> None:
        self.refused += 1
        now = self.loop.time()
        if now - self._refusal_logged >= _REFUSAL_LOG_SECONDS:
            self._refusal_logged = now
            log.warning(
                "%d connections held for beats, the most this server holds: %s (%d refused so far); those agents "
                "beat by annotation meanwhile. Raise the memory limit (or --beat-connections), or find who opens "
                "so many",
                self.max_connections,
                how,
                self.refused,
            )

    def route_of(self, first_bytes: bytes | bytearray) -> FastRoute | None:
        """The fast route a connection's first request asks for, or None (aiohttp answers it)."""
        for prefix, route in zip(self.prefixes, self.routes.values(), strict=True):
            if first_bytes.startswith(prefix) and first_bytes[len(prefix) : len(prefix) + 1] in (b" ", b"?"):
                return route
        return None

    async def _sweep(self) -> None:
        every = min(max(self.read_seconds / 4, 0.05), 1.0)
        idle_due = 0.0
        while True:
            await asyncio.sleep(every)
            now = self.loop.time()
            for connection in [c for c in self.reading if now - c.began > c.read_seconds]:
                connection.refuse(408, f"the request did not arrive within {connection.read_seconds:g} s")
            if now >= idle_due:  # all connections walked only every few seconds
                idle_due = now + FAST_IDLE_SECONDS / 8
                for connection in [c for c in self.connections if c.idle(now)]:
                    connection.close()
                self.handed_off = {t for t in self.handed_off if not t.is_closing()}

    async def stop(self) -> None:
        self._sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sweeper
        for connection in list(self.connections):
            connection.close()


class _FastConnection(asyncio.Protocol):
    """One connection: sniffed until its first request line shows whether it is for a fast
    route; then parsed, answered in order (a handler's awaited answer holds back the ones
    pipelined after it), and closed on a malformed, oversized or late request."""

    def __init__(self, server: _FastServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.sniffed: bytearray | None = bytearray()
        self.parser: httptools.HttpRequestParser | None = None
        self.closing = False
        self.began = 0.0  # the loop's time of the current request's first byte
        self.active = server.loop.time()
        self.read_seconds = server.read_seconds
        self.in_body = False
        self.head_bytes = 0
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.route: FastRoute | None = None
        self.answers: deque[tuple[Reply | asyncio.Future[Reply], bool]] = deque()
        self.paused = False
        self.held = False  # counted in the server's connections for fast routes

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.server.admits():
            self.closing = True
            self.transport.abort()  # type: ignore[union-attr]
            return
        self.server.connections.add(self)  # idle until its first bytes, as aiohttp's would be

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.held:
            self.held = False
            self.server.fast -= 1
        self.server.connections.discard(self)
        self.server.reading.discard(self)
        for answer, _ in self.answers:
            if isinstance(answer, asyncio.Future):
                answer.cancel()
        self.answers.clear()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.active = self.server.loop.time()
        if self.sniffed is not None:
            self.sniffed += data
            if len(self.sniffed) < self.server.sniff_bytes and any(
                prefix.startswith(self.sniffed[: len(prefix)]) for prefix in self.server.prefixes
            ):
                return  # too little yet to tell
            self.route = self.server.route_of(self.sniffed)
            if self.route is None:
                self._hand_off()
                return
            data, self.sniffed = bytes(self.sniffed), None
            self.parser = httptools.HttpRequestParser(self)
            self.held = self.server.holds_fast()  # else its request is answered busy(), and it closes
        for start in range(0, len(data), _FEED_PIECE):
            piece = data[start : start + _FEED_PIECE]
            if not self.in_body:  # a head being read (counted from the end of the request before)
                self.head_bytes += len(piece)
                if self.head_bytes > FAST_MAX_HEAD:
                    self.refuse(431, f"a request's line and headers are at most {FAST_MAX_HEAD} bytes")
                    return
            try:
                assert self.parser is not None
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
        self.began = self.server.loop.time()
        self.server.reading.add(self)
        self.in_body, self.body_bytes = False, 0
        self.url, self.headers, self.body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.in_body = True
        assert self.parser is not None
        path = self.url.partition(b"?")[0].decode("latin-1")
        route = self.server.routes.get((self.parser.get_method().decode("latin-1"), path))
        if route is None:
            served = ", ".join(f"{method} {path}" for method, path in self.server.routes)
            self.refuse(404, f"this connection serves only {served}: ask anything else on another connection")
            raise _Stop
        self.route = route
        self.read_seconds = self.route.read_seconds
        if self.headers.get("expect", "").lower() == "100-continue":
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        assert self.route is not None
        self.body_bytes += len(body)
        if self.body_bytes > self.route.max_body:
            self.refuse(413, f"a request's body is at most {self.route.max_body} bytes")
            raise _Stop
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.parser is not None and self.route is not None
        self.server.reading.discard(self)
        self.began, self.in_body, self.head_bytes = 0.0, False, 0
        keep_alive = self.parser.should_keep_alive()
        answer: Reply | Awaitable[Reply]
        if not self.held:  # past the limit: told when to come back, and closed
            self.route.refused(503)
            answer = self.server.busy()
        else:
            try:
                answer = self.route.handler(self.headers, b"".join(self.body))
            except Exception:
                log.exception("%s failed", self.route.path)
                answer = Reply.error(500, "the server failed to answer; retry", close=True)
        if isinstance(answer, Reply):
            if not self.answers:
                self._write(answer, keep_alive)
                return
            self.answers.append((answer, keep_alive))
        else:
            task = asyncio.ensure_future(answer)
            self.answers.append((task, keep_alive))
            task.add_done_callback(lambda _: self._flush())
        if len(self.answers) >= _MAX_QUEUED and not self.paused:
            assert self.transport is not None
            self.paused = True
            self.transport.pause_reading()

    # the rest

    def refuse(self, status: int, why: str) -> None:
        """Answers `status` at once and closes: the request is not read further."""
        if self.closing:
            return
        assert self.route is not None  # the route of this request, or of the one before it
        self.route.refused(status)
        self._write(Reply.error(status, why, close=True), False)

    def idle(self, now: float) -> bool:
        return not self.began and not self.answers and now - self.active > FAST_IDLE_SECONDS

    def close(self) -> None:
        self.closing = True
        self.server.reading.discard(self)
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
                    answer = Reply.error(500, "the server failed to answer; retry", close=True)
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
        if not keep_alive or reply.close:
            self.close()

    def _hand_off(self) -> None:
        """Hands the connection, and what it sent so far, to aiohttp's protocol."""
        assert self.transport is not None and self.sniffed is not None
        self.server.connections.discard(self)
        self.server.handed_off.add(self.transport)
        self.server.reading.discard(self)
        protocol = self.server.hand_off()
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        protocol.data_received(bytes(self.sniffed))
        self.sniffed = None
        self.closing = True  # this object sees nothing more


def as_aiohttp(route: FastRoute) -> web.RouteDef:
    """The fast route as an aiohttp route too, for a connection handed to aiohttp that asks it."""

    async def handle(request: web.Request) -> web.StreamResponse:
        reply = None
        if request.content_length is None or request.content_length <= route.max_body:
            try:
                async with asyncio.timeout(route.read_seconds):
                    body = await request.content.read(route.max_body + 1)
            except TimeoutError:
                route.refused(408)
                reply = Reply.error(408, f"the request did not arrive within {route.read_seconds:g} s", close=True)
            else:
                if len(body) <= route.max_body:
                    answer = route.handler({k.lower(): v for k, v in request.headers.items()}, body)
                    reply = answer if isinstance(answer, Reply) else await answer
        if reply is None:  # declared or found too large
            route.refused(413)
            reply = Reply.error(413, f"a request's body is at most {route.max_body} bytes", close=True)
        response = web.Response(status=reply.status, body=reply.body, content_type="application/json")
        if reply.close:
            response.force_close()
        return response

    return web.post(route.path, handle)
