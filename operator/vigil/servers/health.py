"""/healthz (the event loop answers) and /readyz (every watch has listed and is fresh): the
probes the chart gives the kubelet."""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from vigil.kube.informer import Informer


def routes(informers: Iterable[Informer]) -> list[web.RouteDef]:
    watched = list(informers)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        stale = [informer.name for informer in watched if not informer.fresh()]
        if stale:
            return web.Response(status=503, text=f"not fresh: {', '.join(stale)}\n")
        return web.Response(text="ok\n")

    return [web.get("/healthz", healthz), web.get("/readyz", readyz)]
