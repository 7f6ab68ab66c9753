"""The one HTTP server: what a connection to it costs before and while it stays open, the gate
that bounds it before its TLS handshake, aiohttp's routes behind it, and the fast route (the
beats) answered by the server's own protocol on a port of its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import pytest
from aiohttp import web

from tests.support.waits import until
from vigil.servers import http
from vigil.servers.http import (
    LARGE_HEAD,
    LIMIT,
    MAX_HEAD,
    SLOW_HANDSHAKE,
    SLOW_HEAD,
    SOURCE_LIMIT,
    SOURCE_RATE,
    TLS_READ_BUFFER,
    Bounds,
    FastRoute,
    Reply,
    Server,
    connection_limit,
    memory_limit,
    serve,
    serve_fast,
)

pytestmark = pytest.mark.unit

ROOMY = Bounds(max_connections=100, per_source=100)


def server_context(certs: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(certs / "tls.crt"), str(certs / "tls.key"))
    return context


def client_context(certs: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs / "ca.crt"))


async def ok(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def test_an_open_tls_connection_holds_a_record_sized_read_buffer_not_asyncios_256_kib(certs: Path) -> None:
    # An agent beating to the leader keeps its connection open: at 10,000 pods, asyncio's default
    # 256 KiB each would be 2.5 GiB of the operator's memory.
    async def test() -> list[int]:
        server = await serve([web.get("/", ok)], "127.0.0.1:0", bounds=ROOMY, ssl_context=server_context(certs))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_context(certs))
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            held = server._listener.open  # the server side of the open connection
            sizes = [len(c.transport._ssl_protocol._ssl_buffer) for c in held]  # type: ignore[attr-defined]
            writer.close()
            return sizes
        finally:
            await server.stop()

    sizes = asyncio.run(test())
    assert sizes and all(size <= TLS_READ_BUFFER for size in sizes), sizes


def test_asyncios_own_tls_connections_keep_their_buffer(certs: Path) -> None:
    # The record-sized buffer is this module's own TLS protocol's, not a patch of asyncio's: the
    # operator's API client (and anything else in the process) keeps asyncio's default.
    from asyncio import sslproto

    assert sslproto.SSLProtocol.max_size == 256 * 1024


# --- The gate: counted before the handshake ----------------------------------------------------


async def raw(port: int, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection that says nothing: no TLS handshake begun."""
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def hung_up(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection (read end or reset), within 5 s."""
    try:
        return await asyncio.wait_for(reader.read(1), 5) == b""
    except ConnectionError:
        return True


def test_connections_that_never_handshake_are_counted_and_past_the_limit_closed_at_once(certs: Path) -> None:
    """3,000 raw connects that send nothing used to be counted 0 (the count began after the
    handshake) and each held ~65 KiB of the leader's memory; now each is counted as accepted."""

    async def test() -> None:
        bounds = Bounds(max_connections=3, per_source=100)
        refused: list[str] = []
        server = await serve(
            [web.get("/", ok)], "127.0.0.1:0", bounds=bounds, ssl_context=server_context(certs),
            on_refused=refused.append,
        )  # fmt: skip
        try:
            held = [await raw(server.port) for _ in range(3)]
            await until(lambda: server.connections() == (3, 3), 5, "three silent connections counted")
            # Silent, each is a socket alone: no TLS state or buffer is made before a ClientHello.
            assert not [c for c in server._listener.open if not isinstance(c, http._Gate)]
            reader, writer = await raw(server.port)
            assert await hung_up(reader)  # closed before any handshake
            writer.close()
            assert server.refusals()[LIMIT] == 1 and refused == [LIMIT]
            for _, w in held:
                w.close()
            await until(lambda: server.connections()[0] == 0, 5, "their slots freed as they close")
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_context(certs))
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")  # served again
            writer.close()
        finally:
            await server.stop()

    asyncio.run(test())


def test_one_address_holds_at_most_its_share_and_another_address_is_still_served(certs: Path) -> None:
    async def test() -> None:
        server = await serve(
            [web.get("/", ok)], "127.0.0.1:0", bounds=Bounds(max_connections=10, per_source=2),
            ssl_context=server_context(certs),
        )  # fmt: skip
        try:
            flood = [await raw(server.port, "127.0.0.2") for _ in range(2)]
            reader, writer = await raw(server.port, "127.0.0.2")
            assert await hung_up(reader)
            writer.close()
            assert server.refusals()[SOURCE_LIMIT] == 1
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.port, ssl=client_context(certs), local_addr=("127.0.0.3", 0)
            )
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            for _, w in [*flood, (reader, writer)]:
                w.close()
        finally:
            await server.stop()

    asyncio.run(test())


def test_a_handshake_that_does_not_end_in_time_frees_its_slot(certs: Path) -> None:
    async def test() -> None:
        bounds = Bounds(max_connections=1, per_source=1, handshake_seconds=0.2)
        server = await serve([web.get("/", ok)], "127.0.0.1:0", bounds=bounds, ssl_context=server_context(certs))
        try:
            reader, writer = await raw(server.port)
            assert await hung_up(reader)  # the server gave up on the handshake
            writer.close()
            await until(lambda: server.connections()[0] == 0, 5, "the slot freed")
            assert server.refusals()[SLOW_HANDSHAKE] == 1
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_context(certs))
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            writer.close()
        finally:
            await server.stop()

    asyncio.run(test())


# --- aiohttp behind the gate: a head's time and size, idle connections -------------------------


def aiohttp_server(certs: Path, **bounds: float) -> Callable[[Callable[[Server], Awaitable[None]]], None]:
    def run_with(body: Callable[[Server], Awaitable[None]]) -> None:
        async def main() -> None:
            server = await serve(
                [web.get("/", ok)], "127.0.0.1:0", bounds=Bounds(max_connections=10, per_source=10, **bounds),  # type: ignore[arg-type]
                ssl_context=server_context(certs),
            )  # fmt: skip
            try:
                await body(server)
            finally:
                await server.stop()

        asyncio.run(main())

    return run_with


def test_a_request_head_sent_slowly_is_cut_off_at_its_deadline(certs: Path) -> None:
    async def body(server: Server) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_context(certs))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        await reader.readuntil(b"ok")
        writer.write(b"GET / HTTP/1.1\r\nX-Slow: ")  # and the rest never comes
        assert await hung_up(reader)
        assert server.refusals()[SLOW_HEAD] == 1
        writer.close()

    aiohttp_server(certs, head_seconds=0.2)(body)


def test_a_request_head_over_its_size_closes_the_connection(certs: Path) -> None:
    async def body(server: Server) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_context(certs))
        many = "".join(f"X-H{n}: {'y' * 1000}\r\n" for n in range(MAX_HEAD // 1000 + 1))
        writer.write(f"GET / HTTP/1.1\r\nHost: x\r\n{many}".encode())
        assert await hung_up(reader)
        assert server.refusals()[LARGE_HEAD] == 1
        writer.close()

    aiohttp_server(certs)(body)


def test_an_idle_connection_is_closed_and_a_silent_one_too(certs: Path) -> None:
    async def body(server: Server) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_context(certs))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        await reader.readuntil(b"ok")
        assert await hung_up(reader)  # kept alive, nothing asked: closed
        silent_reader, silent_writer = await asyncio.open_connection(
            "127.0.0.1", server.port, ssl=client_context(certs)
        )
        assert await hung_up(silent_reader)  # handshaken, never asked anything: closed too
        await until(lambda: server.connections()[0] == 0, 5, "both slots freed")
        writer.close()
        silent_writer.close()

    aiohttp_server(certs, idle_seconds=0.3)(body)


# --- Fast routes: the protocol that answers the beats ------------------------------------------

FAST = "/v1/fast"


class Fast:
    """A server with one fast route, on real TLS over loopback. The handler answers at once, or
    (a body of b"wait") after the test lets it, or fails (b"fail"), or refuses (b"deny")."""

    def __init__(self, certs: Path) -> None:
        self.certs = certs
        self.seen: list[tuple[dict, bytes]] = []
        self.peers: list[str] = []
        self.refused: list[int] = []
        self.release = asyncio.Event()

    def handler(self, headers: Mapping[str, str], body: bytes, peer: str) -> Reply | Awaitable[Reply]:
        self.seen.append((dict(headers), body))
        self.peers.append(peer)
        if body == b"fail":
            raise RuntimeError("boom")
        if body == b"wait":
            return self._later()
        if body == b"deny":
            return Reply.error(401, "not a token of this cluster")
        return Reply(200, b'{"n": %d}' % len(self.seen))

    async def _later(self) -> Reply:
        await self.release.wait()
        return Reply(200, b'{"waited": true}')

    async def start(
        self, read_seconds: float = 5.0, max_connections: int = 100, spare: int = 256, idle_seconds: float = 75.0
    ) -> Server:
        route = FastRoute(FAST, self.handler, 64, read_seconds, self.refused.append)
        bounds = Bounds(max_connections=max_connections, per_source=1000, spare=spare, idle_seconds=idle_seconds)
        return await serve_fast(
            route, "127.0.0.1:0", bounds=bounds, ssl_context=server_context(self.certs), random=lambda: 0.25
        )

    async def connect(self, server: Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", server.port, ssl=client_context(self.certs))


def post(body: bytes, *extra: str, path: str = FAST) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0k\r\nContent-Length: {len(body)}\r\n"
    return (head + "".join(f"{h}\r\n" for h in extra) + "\r\n").encode() + body


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP answer off the stream: status, headers (lower-case names), body."""
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 5)
    return int(head[0].split()[1]), headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(1), 5) == b""


def run(certs: Path, body: Callable[[Fast, Server], Awaitable[None]], **start: float) -> Fast:
    fast = Fast(certs)

    async def main() -> None:
        server = await fast.start(**start)  # type: ignore[arg-type]
        try:
            await body(fast, server)
        finally:
            await server.stop()

    asyncio.run(main())
    return fast


def test_a_fast_route_is_answered_with_its_headers_and_body_and_the_connection_kept(certs: Path) -> None:
    async def body(fast: Fast, server: Server) -> None:
        reader, writer = await fast.connect(server)
        for n in (1, 2, 3):
            writer.write(post(b"hello"))
            headers = {"content-type": "application/json", "content-length": "8"}
            assert await answer(reader) == (200, headers, b'{"n": %d}' % n)
        writer.close()

    fast = run(certs, body)
    headers = {"host": "x", "authorization": "Bearer t0k", "content-length": "5"}
    assert fast.seen == [(headers, b"hello")] * 3


def test_the_handler_is_told_the_clients_address(certs: Path) -> None:
    async def body(fast: Fast, server: Server) -> None:
        reader, writer = await fast.connect(server)
        writer.write(post(b"hello"))
        assert (await answer(reader))[0] == 200
        writer.close()

    assert run(certs, body).peers == ["127.0.0.1"]


def test_a_refused_request_closes_its_connection_so_it_holds_no_slot(certs: Path) -> None:
    # A 401 used to keep the connection alive: a client with a bad token held a slot for good.
    async def body(fast: Fast, server: Server) -> None:
        reader, writer = await fast.connect(server)
        writer.write(post(b"deny"))
        status, headers, _ = await answer(reader)
        assert status == 401 and headers["connection"] == "close" and await closed(reader)
        await until(lambda: server.connections()[0] == 0, 5, "its slot freed")
        writer.close()

    run(certs, body)


def test_pipelined_requests_are_answered_in_order_even_when_one_is_awaited(certs: Path) -> None:
    async def body(fast: Fast, server: Server) -> None:
        reader, writer = await fast.connect(server)
        writer.write(post(b"one") + post(b"wait") + post(b"three"))
        first = await answer(reader)
        assert first[2] == b'{"n": 1}'
        with contextlib.suppress(TimeoutError):  # the third is answered, but held back behind the second
            await asyncio.wait_for(reader.read(1), 0.2)
            raise AssertionError("an answer overtook the awaited one")
        fast.release.set()
        assert [(await answer(reader))[2] for _ in range(2)] == [b'{"waited": true}', b'{"n": 3}']
        writer.close()

    assert [b for _, b in run(certs, body).seen] == [b"one", b"wait", b"three"]


@pytest.mark.parametrize(
    ("request_bytes", "status", "why"),
    [
        (post(b"x" * 65), 413, "at most 64 bytes"),
        (post(b"x", "X-Big: " + "y" * (MAX_HEAD + 1)), 431, f"at most {MAX_HEAD} bytes"),
        (post(b"x") + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 404, f"serves only POST {FAST}"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 404, f"serves only POST {FAST}"),
        (post(b"x") + b"POST \x00 nonsense\r\n\r\n", 400, "not an HTTP/1.1 request"),
        (post(b"fail"), 500, "failed to answer"),
    ],
    ids=[
        "body-too-large",
        "head-too-large",
        "another-path-after-a-fast-one",
        "another-path",
        "malformed",
        "handler-raises",
    ],  # fmt: skip
)
def test_a_bad_request_on_a_fast_connection_is_refused_with_why_and_the_connection_closed(
    certs: Path, request_bytes: bytes, status: int, why: str
) -> None:
    async def body(fast: Fast, server: Server) -> None:
        reader, writer = await fast.connect(server)
        writer.write(request_bytes)
        answers = [await answer(reader)]
        if answers[0][0] == 200:  # the good request before the bad one
            answers.append(await answer(reader))
        got, headers, text = answers[-1]
        assert got == status and why in json.loads(text)["error"] and headers["connection"] == "close"
        assert await closed(reader)
        writer.close()

    fast = run(certs, body)
    assert fast.refused == ([status] if status in (413, 431, 404, 400) else [])


def test_a_request_that_does_not_arrive_in_time_is_a_408_and_an_idle_connection_is_closed(certs: Path) -> None:
    async def body(fast: Fast, server: Server) -> None:
        reader, writer = await fast.connect(server)
        writer.write(post(b"hello")[:-2])  # two bytes of the body never come
        status, _, text = await answer(reader)
        assert status == 408 and "did not arrive within 0.2 s" in json.loads(text)["error"]
        assert await closed(reader)
        reader, writer = await fast.connect(server)
        writer.write(post(b"hi"))
        assert (await answer(reader))[0] == 200
        assert await closed(reader)  # nothing more asked: closed once idle (within the reader's 5 s)
        writer.close()

    assert run(certs, body, read_seconds=0.2, idle_seconds=0.4).refused == [408]


def test_connection_close_and_expect_100_continue_are_honoured(certs: Path) -> None:
    async def body(fast: Fast, server: Server) -> None:
        reader, writer = await fast.connect(server)
        writer.write(post(b"", "Expect: 100-continue").replace(b"Content-Length: 0", b"Content-Length: 2"))
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100 Continue")
        writer.write(b"hi")
        assert (await answer(reader))[0] == 200
        writer.write(post(b"bye", "Connection: close"))
        status, headers, _ = await answer(reader)
        assert status == 200 and headers["connection"] == "close" and await closed(reader)
        writer.close()

    assert [b for _, b in run(certs, body).seen] == [b"hi", b"bye"]


def test_past_its_limit_a_beat_is_told_when_to_come_back_and_past_the_spare_a_connection_is_closed_at_once(
    certs: Path,
) -> None:
    """With 2 connections held and 1 spare: a third is answered 503 with a Retry-After and closed
    (its agent rests the leader, rather than paying a handshake every beat); past both, a new
    connection is closed before its handshake (a flood takes neither descriptors nor memory); the
    held ones are served throughout, and once one closes a new one is held."""

    async def body(fast: Fast, server: Server) -> None:
        first_reader, first_writer = await fast.connect(server)
        first_writer.write(post(b"one"))
        assert (await answer(first_reader))[0] == 200
        second_reader, second_writer = await fast.connect(server)
        second_writer.write(post(b"two"))
        assert (await answer(second_reader))[0] == 200
        assert server.connections() == (2, 2)  # read by the vigil_beat_connections gauges
        busy_reader, busy_writer = await fast.connect(server)
        busy_writer.write(post(b"three"))
        status, headers, said = await answer(busy_reader)
        assert status == 503 and headers["connection"] == "close" and await closed(busy_reader)
        assert headers["retry-after"] == "225" and b"retry in 225 s" in said  # random 0.25: 300 x (0.5 + 0.25)
        busy_writer.close()
        spare_reader, spare_writer = await raw(server.port)  # the spare, taken by a silent connection
        await until(lambda: len(server._listener.open) == 3, 5, "the spare taken, the busy one gone")
        extra_reader, extra_writer = await raw(server.port)
        assert await hung_up(extra_reader)  # closed unanswered, before any handshake
        extra_writer.close()
        assert server.refusals()[LIMIT] == 1
        first_writer.write(post(b"five"))  # the connections held are served as before
        assert (await answer(first_reader))[0] == 200
        second_writer.close()
        spare_writer.close()
        await until(lambda: len(server._listener.open) == 1, 5, "the closed connections' slots freed")
        reader, writer = await fast.connect(server)  # one held connection gone: a new one is held
        writer.write(post(b"six"))
        assert (await answer(reader))[0] == 200
        for w in (first_writer, writer):
            w.close()

    fast = run(certs, body, max_connections=2, spare=1)
    assert [b for _, b in fast.seen] == [b"one", b"two", b"five", b"six"]  # no busy beat reached the handler
    assert 503 in fast.refused  # told to the endpoint, for its metrics (outcome over-capacity)


def test_the_connection_limit_keeps_descriptors_for_the_operators_own_connections():
    assert connection_limit(20_000) == 20_000 - 1024 - 256  # this bed's hard limit, less the spare
    assert connection_limit(1_048_576) == 65_536  # containerd's default: the memory bound then
    assert connection_limit(-1) == 65_536  # unlimited
    assert connection_limit(1000) == 1  # a tiny limit still serves


def test_the_connection_limit_keeps_half_the_containers_memory_for_the_rest():
    mib = 1024 * 1024
    # The chart's 512 MiB: 4,096 connections of 64 KiB (~45 KiB measured), 256 MiB, not the ~6,000
    # that would OOM the leader with the jobs and pods it keeps.
    assert connection_limit(1_048_576, 512 * mib) == 4096
    assert connection_limit(1_048_576, 4 * 1024 * mib) == 32_768
    assert connection_limit(20_000, 4 * 1024 * mib) == 20_000 - 1024 - 256  # the lower of the two limits
    assert connection_limit(1_048_576, None) == 65_536  # no memory limit: the ceiling
    assert connection_limit(1_048_576, 32 * 1024) == 1


def test_the_memory_limit_is_read_from_cgroup_v2_then_v1():
    v2, v1 = "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"

    def files(found: dict[str, str]):
        def read(path: str) -> str:
            if path not in found:
                raise FileNotFoundError(path)
            return found[path]

        return read

    assert memory_limit(files({v2: "536870912\n"})) == 512 * 1024 * 1024
    assert memory_limit(files({v2: "max\n"})) is None  # v2, no limit
    assert memory_limit(files({v1: "1073741824\n"})) == 1024 * 1024 * 1024
    assert memory_limit(files({v1: "9223372036854771712\n"})) is None  # v1's "no limit"
    assert memory_limit(files({})) is None  # no cgroup to read: outside a container


def test_one_address_opening_connections_faster_than_its_rate_is_refused_before_the_handshake(certs: Path) -> None:
    # A client refused on its request comes back on a new connection, and each costs a handshake:
    # one address gets its burst, then `per_source_rate` a second.
    async def test() -> None:
        bounds = Bounds(max_connections=100, per_source=3, per_source_rate=0.001)
        server = await serve([web.get("/", ok)], "127.0.0.1:0", bounds=bounds, ssl_context=server_context(certs))
        try:
            for _ in range(3):  # the burst, each closed at once
                _, writer = await raw(server.port, "127.0.0.4")
                writer.close()
            await until(lambda: server.connections()[0] == 0, 5, "the burst's connections closed")
            reader, writer = await raw(server.port, "127.0.0.4")
            assert await hung_up(reader)
            writer.close()
            assert server.refusals()[SOURCE_RATE] == 1
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.port, ssl=client_context(certs), local_addr=("127.0.0.5", 0)
            )
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")  # another address is served
            writer.close()
        finally:
            await server.stop()

    asyncio.run(test())
