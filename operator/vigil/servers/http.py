"""The one way Vigil serves HTTP: an aiohttp application on HOST:PORT, plain or with TLS, on the
operator's event loop. The health, metrics and admission endpoints are each a set of routes
handed to `serve`."""

from __future__ import annotations

import ssl
from asyncio import sslproto
from collections.abc import Iterable

from aiohttp import web

DEFAULT_MAX_BODY = 1024**2  # aiohttp's own default: endpoints that take bodies say how much
# asyncio gives every TLS connection a 256 KiB read buffer (sslproto.SSLProtocol.max_size), held
# for as long as the connection is open: an agent beating to the leader keeps one open, so 10,000
# beating pods would hold 2.8 GiB (measured: 291 KiB per idle connection, 50 KiB with 16 KiB; see
# bench/README.md). A TLS record carries at most 16 KiB, so smaller reads cost only more recv
# calls on large answers. The attribute is the class's: it applies to every TLS connection of
# the process, the API client's too.
TLS_READ_BUFFER = 16 * 1024


def lean_tls_buffers() -> None:
    if getattr(sslproto.SSLProtocol, "max_size", 0) > TLS_READ_BUFFER:
        sslproto.SSLProtocol.max_size = TLS_READ_BUFFER


class Server:
    """A running server; `stop()` closes it."""

    def __init__(self, runner: web.AppRunner) -> None:
        self._runner = runner

    @property
    def port(self) -> int:
        """The port it listens on (the one the system picked when started on port 0)."""
        return self._runner.addresses[0][1]

    async def stop(self) -> None:
        await self._runner.cleanup()


def split_address(address: str) -> tuple[str, int]:
    """("HOST", PORT) of "HOST:PORT" (or ":PORT", all interfaces)."""
    host, _, port = address.rpartition(":")
    return host or "0.0.0.0", int(port)


async def serve(
    routes: Iterable[web.RouteDef],
    address: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    max_body: int = DEFAULT_MAX_BODY,
) -> Server:
    if ssl_context is not None:
        lean_tls_buffers()
    app = web.Application(client_max_size=max_body)
    app.add_routes(list(routes))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = split_address(address)
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    return Server(runner)
