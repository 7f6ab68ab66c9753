"""The one HTTP server: what a connection to it costs while it stays open, and its fast routes
(the beats) answered by its own protocol beside aiohttp's routes on the same port."""

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
    FAST_MAX_HEAD,
    TLS_READ_BUFFER,
    FastRoute,
    Reply,
    Server,
    connection_limit,
    memory_limit,
    serve,
)

pytestmark = pytest.mark.unit


def test_an_open_tls_connection_holds_a_record_sized_read_buffer_not_asyncios_256_kib(certs: Path) -> None:
    # An agent beating to the leader keeps its connection open: at 10,000 pods, asyncio's default
    # 256 KiB each would be 2.5 GiB of the operator's memory.
    async def test() -> list[int]:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(certs / "tls.crt"), str(certs / "tls.key"))

        async def ok(_request: web.Request) -> web.Response:
            return web.Response(text="ok")

        server = await serve([web.get("/", ok)], "127.0.0.1:0", ssl_context=context)
        try:
            client = ssl.create_default_context(cafile=str(certs / "ca.crt"))
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            handlers = server._runner.server.connections  # the server side of the open connection
            sizes = [len(h.transport._ssl_protocol._ssl_buffer) for h in handlers]
            writer.close()
            return sizes
        finally:
            await server.stop()

    sizes = asyncio.run(test())
    assert sizes and all(size <= TLS_READ_BUFFER for size in sizes), sizes


# --- Fast routes: the protocol that answers the beats ------------------------------------------

FAST = "/v1/fast"


class Fast:
    """A server with one fast route beside an aiohttp route, on real TLS over loopback. The fast
    handler answers at once, or (a body of b"wait") after the test lets it, or fails (b"fail")."""

    def __init__(self, certs: Path) -> None:
        self.certs = certs
        self.seen: list[tuple[dict, bytes]] = []
        self.refused: list[int] = []
        self.release = asyncio.Event()

    def handler(self, headers: Mapping[str, str], body: bytes) -> Reply | Awaitable[Reply]:
        self.seen.append((dict(headers), body))
        if body == b"fail":
            raise RuntimeError("boom")
        if body == b"wait":
            return self._later()
        return Reply(200, b'{"n": %d}' % len(self.seen))

    async def _later(self) -> Reply:
        await self.release.wait()
        return Reply(200, b'{"waited": true}')

    async def start(
        self, read_seconds: float = 5.0, max_connections: int | None = None, spare_connections: int = 256
    ) -> Server:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.certs / "tls.crt"), str(self.certs / "tls.key"))

        async def slow(_request: web.Request) -> web.Response:
            return web.Response(text="aiohttp")

        route = FastRoute(FAST, self.handler, 64, read_seconds, self.refused.append)
        return await serve(
            [web.get("/", slow), route],
            "127.0.0.1:0",
            ssl_context=context,
            max_connections=max_connections,
            spare_connections=spare_connections,
            random=lambda: 0.25,
        )

    async def connect(self, server: Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        client = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        return await asyncio.open_connection("127.0.0.1", server.port, ssl=client)


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
        server = await fast.start(**start)
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


def test_other_routes_on_the_same_port_are_aiohttps_and_so_is_the_fast_route_after_them(certs: Path) -> None:
    async def body(fast: Fast, server: Server) -> None:
        reader, writer = await fast.connect(server)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, text = await answer(reader)
        assert (status, text) == (200, b"aiohttp")
        writer.write(post(b"hello"))  # on a connection aiohttp serves: the same handler, through aiohttp
        status, headers, text = await answer(reader)
        assert (status, text) == (200, b'{"n": 1}') and headers["content-type"].startswith("application/json")
        writer.close()

    assert run(certs, body).seen[0][1] == b"hello"


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
        (post(b"x", "X-Big: " + "y" * (FAST_MAX_HEAD + 1)), 431, f"at most {FAST_MAX_HEAD} bytes"),
        (post(b"x") + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 404, f"serves only POST {FAST}"),
        (post(b"x") + b"POST \x00 nonsense\r\n\r\n", 400, "not an HTTP/1.1 request"),
        (post(b"fail"), 500, "failed to answer"),
    ],
    ids=["body-too-large", "head-too-large", "another-path-after-a-fast-one", "malformed", "handler-raises"],
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


def test_a_request_that_does_not_arrive_in_time_is_a_408_and_an_idle_connection_is_closed(
    certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "FAST_IDLE_SECONDS", 0.4)

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

    assert run(certs, body, read_seconds=0.2).refused == [408]


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
    """With 2 connections held for fast routes and 1 spare: a third fast one is answered 503 with
    a Retry-After and closed (its agent rests the leader, rather than paying a handshake every
    beat); an aiohttp one (the API server's reviews) takes the spare; past both, a new connection
    is closed unanswered (a flood takes neither descriptors nor memory); the held ones are served
    throughout, and once one closes a new one is held."""

    async def body(fast: Fast, server: Server) -> None:
        first_reader, first_writer = await fast.connect(server)
        first_writer.write(post(b"one"))
        assert (await answer(first_reader))[0] == 200
        second_reader, second_writer = await fast.connect(server)
        second_writer.write(post(b"two"))
        assert (await answer(second_reader))[0] == 200
        assert server.fast_connections() == (2, 2)  # read by the vigil_beat_connections gauges
        busy_reader, busy_writer = await fast.connect(server)
        busy_writer.write(post(b"three"))
        status, headers, said = await answer(busy_reader)
        assert status == 503 and headers["connection"] == "close" and await closed(busy_reader)
        assert headers["retry-after"] == "225" and b"retry in 225 s" in said  # random 0.25: 300 x (0.5 + 0.25)
        busy_writer.close()
        other_reader, other_writer = await fast.connect(server)
        other_writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # handed to aiohttp: the spare
        assert (await answer(other_reader))[2] == b"aiohttp"
        # Past the limit and the spare (the busy connection gone, as the server sees it), a fourth
        # connection is closed unanswered.
        front = server._fast  # the server's own count of its connections
        assert front is not None
        await until(lambda: len(front.connections) == 2, 5, "the busy connection closed at the server")
        extra_reader, extra_writer = await fast.connect(server)
        extra_writer.write(post(b"four"))
        with contextlib.suppress(ConnectionError):  # closed at once: no answer, whatever was sent
            assert await closed(extra_reader)
        extra_writer.close()
        first_writer.write(post(b"five"))  # the connections held are served as before
        assert (await answer(first_reader))[0] == 200
        second_writer.close()
        await second_writer.wait_closed()
        await until(lambda: server.fast_connections()[0] == 1, 5, "the closed connection's slot freed")
        reader, writer = await fast.connect(server)  # one held connection gone: a new one is held
        writer.write(post(b"six"))
        assert (await answer(reader))[0] == 200
        for w in (first_writer, other_writer, writer):
            w.close()

    fast = Fast(certs)

    async def main() -> None:
        server = await fast.start(max_connections=2, spare_connections=1)
        try:
            await body(fast, server)
        finally:
            await server.stop()

    asyncio.run(main())
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
