"""The one way Vigil serves HTTP: an aiohttp application on HOST:PORT, plain or with TLS, on the
operator's event loop. The health, metrics and admission endpoints are each a set of routes
handed to `serve`."""

from __future__ import annotations

import ssl
from collections.abc import Iterable

from aiohttp import web

DEFAULT_MAX_BODY = 1024**2  # aiohttp's own default: endpoints that take bodies say how much


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
    app = web.Application(client_max_size=max_body)
    app.add_routes(list(routes))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = split_address(address)
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    return Server(runner)
