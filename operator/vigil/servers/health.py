"""/healthz (the event loop answers, and every supervised worker is alive) and /readyz (every
watch has listed and is fresh): the probes the chart gives the kubelet."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aiohttp import web

from vigil.kube.informer import Informer

# What /healthz asks besides the loop answering: None while healthy, else what is wrong.
Check = Callable[[], str | None]


def routes(informers: Iterable[Informer], checks: Iterable[Check] = ()) -> list[web.RouteDef]:
    watched, checked = list(informers), list(checks)

    async def healthz(_: web.Request) -> web.Response:
        # A dead or crash-looping worker leaves the process up but doing nothing: the kubelet
        # restarts it once the liveness probe fails.
        failing = [why for check in checked if (why := check()) is not None]
        if failing:
            return web.Response(status=503, text=f"unhealthy: {'; '.join(failing)}\n")
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        stale = [informer.name for informer in watched if not informer.fresh()]
        if stale:
            return web.Response(status=503, text=f"not fresh: {', '.join(stale)}\n")
        return web.Response(text="ok\n")

    return [web.get("/healthz", healthz), web.get("/readyz", readyz)]
