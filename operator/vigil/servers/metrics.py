"""/metrics in Prometheus' text format, from the operator's registry (`vigil.metrics`)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler


def routes(registry: CollectorRegistry) -> list[web.RouteDef]:
    return [web.get("/metrics", make_aiohttp_handler(registry))]
