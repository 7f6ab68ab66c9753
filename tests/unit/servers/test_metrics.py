"""The secure /metrics against a small fake API server: no token 401, a refused token 401, a user
without the permission 403, one with it 200 and the metrics; verdicts cached; a flood of unknown
tokens costs at most the review budget, the rest answered 429 without a review, and a flood from
one address spends that address's budget, not the real Prometheus's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes import client
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from tests.support.clock import FakeClock
from vigil.core.access import REVIEW_SOURCE_BURST
from vigil.kube.client import ApiClient
from vigil.kube.config import Credentials
from vigil.metrics import Metrics
from vigil.servers import metrics as metrics_server
from vigil.servers.http import Bounds, serve

pytestmark = pytest.mark.unit

USERS = {"prom-token": "system:serviceaccount:mon:prometheus", "tenant-token": "system:serviceaccount:t:app"}
ALLOWED = {"system:serviceaccount:mon:prometheus"}


class FakeApi:
    def __init__(self) -> None:
        self.reviews: list[str] = []
        self.down = False

    async def handle(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        self.reviews.append(body["kind"])
        if self.down:
            return web.json_response({"kind": "Status", "code": 500}, status=500)
        if body["kind"] == "TokenReview":
            user = USERS.get(body["spec"]["token"])
            status: dict[str, Any] = {"authenticated": True, "user": {"username": user}} if user else {}
        else:
            assert body["spec"]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
            status = {"allowed": body["spec"]["user"] in ALLOWED}
        return web.json_response({**body, "status": status}, status=201)


def scenario(steps) -> Any:
    async def main() -> Any:
        api = FakeApi()
        app = web.Application()
        app.router.add_post("/apis/{group}/v1/{kind}", api.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        http = ApiClient(Credentials(configuration))
        metrics = Metrics()
        access = metrics_server.Access(http, metrics, FakeClock())
        bounds = Bounds(max_connections=200, per_source=200)
        routes = metrics_server.secure_routes(metrics.registry, access, metrics)
        server = await serve(routes, "127.0.0.1:0", bounds=bounds)
        sessions: dict[str, aiohttp.ClientSession] = {}

        async def scrape(token: str | None, source: str = "127.0.0.1", accept: str | None = None) -> tuple[int, str]:
            """A scrape from the loopback address `source` (127.0.0.0/8 is all loopback on Linux)."""
            if source not in sessions:
                sessions[source] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(source, 0)))
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            if accept:
                headers["Accept"] = accept
            async with sessions[source].get(f"http://127.0.0.1:{server.port}/metrics", headers=headers) as response:
                return response.status, await response.text()

        try:
            return await asyncio.wait_for(steps(scrape, api), 60)  # a hang's bound, not a timing
        finally:
            for session in sessions.values():
                await session.close()
            await server.stop()
            await http.close()
            await runner.cleanup()

    return asyncio.run(main())


def test_no_token_a_refused_one_and_one_without_permission_are_kept_out():
    async def steps(scrape, api: FakeApi) -> None:
        status, text = await scrape(None)
        assert status == 401 and "bearer token" in text
        status, text = await scrape("made-up")
        assert status == 401 and "refused" in text
        status, text = await scrape("tenant-token")
        assert status == 403 and "/metrics" in text
        status, text = await scrape("prom-token")
        assert status == 200 and "workqueue_depth" in text and "vigil_metrics_requests_total" in text
        reviews = ["TokenReview", "TokenReview", "SubjectAccessReview", "TokenReview", "SubjectAccessReview"]
        assert api.reviews == reviews

    scenario(steps)


def test_verdicts_are_cached_and_concurrent_scrapes_share_one_review():
    async def steps(scrape, api: FakeApi) -> None:
        answers = await asyncio.gather(*(scrape("prom-token") for _ in range(5)))
        assert [status for status, _ in answers] == [200] * 5
        for _ in range(5):
            assert (await scrape("tenant-token"))[0] == 403
        assert api.reviews.count("TokenReview") == 2, api.reviews

    scenario(steps)


def test_a_flood_of_unknown_tokens_costs_at_most_the_budget_of_reviews():
    async def steps(scrape, api: FakeApi) -> None:
        statuses = [status for status, _ in await asyncio.gather(*(scrape(f"bad-{n}") for n in range(100)))]
        assert statuses.count(429) == 100 - REVIEW_SOURCE_BURST and statuses.count(401) == REVIEW_SOURCE_BURST
        assert api.reviews.count("TokenReview") == REVIEW_SOURCE_BURST

    scenario(steps)


def test_a_flood_from_one_address_does_not_spend_the_reviews_of_another():
    async def steps(scrape, api: FakeApi) -> None:
        flood = [status for status, _ in await asyncio.gather(*(scrape(f"bad-{n}", "127.0.0.2") for n in range(50)))]
        assert flood.count(401) == REVIEW_SOURCE_BURST and flood.count(429) == 50 - REVIEW_SOURCE_BURST
        assert (await scrape("prom-token", "127.0.0.1"))[0] == 200, "the real Prometheus, its token not cached yet"
        assert (await scrape("bad-again", "127.0.0.2"))[0] == 429, "the flood's address is still held back"

    scenario(steps)


def test_an_api_server_that_cannot_review_is_503_and_nothing_is_cached():
    async def steps(scrape, api: FakeApi) -> None:
        api.down = True
        status, text = await scrape("prom-token")
        assert status == 503 and "retry" in text
        api.down = False
        assert (await scrape("prom-token"))[0] == 200

    scenario(steps)


def test_a_refused_scrape_closes_its_connection():
    # A client refused 401 or 403 used to keep its connection (and a slot of the server) open.
    async def main() -> tuple[bytes, bytes]:
        metrics = Metrics()
        access = metrics_server.Access(None, metrics, FakeClock())  # type: ignore[arg-type]  # no review is made
        routes = metrics_server.secure_routes(metrics.registry, access, metrics)
        server = await serve(routes, "127.0.0.1:0", bounds=Bounds(max_connections=4, per_source=4))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            rest = await asyncio.wait_for(reader.read(), 5)  # to the end: the server closed it
            writer.close()
            return head, rest
        finally:
            await server.stop()

    head, rest = asyncio.run(main())
    assert head.startswith(b"HTTP/1.1 401") and b"Connection: close" in head and b"bearer token" in rest


# What Prometheus sends when it prefers OpenMetrics (its scrape_protocols' default order).
OPENMETRICS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


def test_a_scraper_that_asks_for_openmetrics_gets_it_through_the_secure_endpoint():
    async def steps(scrape, api: FakeApi) -> None:
        status, text = await scrape("prom-token", accept=OPENMETRICS_ACCEPT)
        assert status == 200 and text.endswith("# EOF\n"), text[-200:]
        names = {family.name for family in parse_openmetrics(text)}  # strict: raises on any clash
        assert {"vigil_attempts_uncertain", "vigil_build", "process_resident_memory_bytes"} <= names
        status, text = await scrape("prom-token")
        assert status == 200 and "# EOF" not in text, "without the header, Prometheus' text format"

    scenario(steps)


def test_the_plain_endpoint_answers_openmetrics_with_its_content_type():
    async def main() -> tuple[str, str, str]:
        metrics = Metrics()
        server = await serve(metrics_server.routes(metrics.registry), "127.0.0.1:0", bounds=Bounds(4, 4))
        try:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{server.port}/metrics"
                async with session.get(url, headers={"Accept": OPENMETRICS_ACCEPT}) as response:
                    kind, text = response.headers["Content-Type"], await response.text()
                async with session.get(url) as response:
                    plain = response.headers["Content-Type"]
            return kind, text, plain
        finally:
            await server.stop()

    kind, text, plain = asyncio.run(main())
    assert kind.startswith("application/openmetrics-text") and "version=1.0.0" in kind
    assert list(parse_openmetrics(text)) and plain.startswith("text/plain")
