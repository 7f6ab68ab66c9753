"""The one HTTP server: what a connection to it costs while it stays open."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from aiohttp import web

from vigil.servers.http import TLS_READ_BUFFER, serve

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
