"""The client's reads: it authenticates as the official client does, and a paced watch loses and
reorders nothing while it reads in batches (against a small local HTTP server streaming events)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes import client, config

from vigil.kube.client import ApiClient, resource_path
from vigil.kube.config import Credentials
from vigil.kube.errors import Stalled

pytestmark = pytest.mark.unit


def test_a_bearer_token_from_a_kubeconfig_is_sent(tmp_path: Path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "s3cret"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    assert ApiClient(Credentials(configuration))._headers()["Authorization"] == "Bearer s3cret"


def test_collection_paths():
    assert resource_path("", "v1", "pods", None) == "/api/v1/pods"
    assert resource_path("vigil.dev", "v1beta1", "vigiljobs", "ns") == "/apis/vigil.dev/v1beta1/namespaces/ns/vigiljobs"


EVENTS = 60
SPACING = 0.01  # seconds between two events: 100 a second, a heartbeat load's rate


def event(n: int) -> bytes:
    pod = {"metadata": {"name": f"p-{n}", "resourceVersion": str(n)}, "status": {"phase": "Running"}}
    return json.dumps({"type": "MODIFIED", "object": pod}).encode() + b"\n"


STREAMED: list[float] = []  # how long the last stream took to write, on the loop's clock


async def stream(request: web.Request) -> web.StreamResponse:
    """EVENTS events SPACING apart, then the end of the watch (or, with ?hang, silence)."""
    response = web.StreamResponse()
    await response.prepare(request)
    began = asyncio.get_running_loop().time()
    for n in range(1, EVENTS + 1):
        await response.write(event(n))
        await asyncio.sleep(SPACING)  # the stream's rate: the workload, not a wait
    STREAMED[:] = [asyncio.get_running_loop().time() - began]
    if "hang" in request.query:
        await asyncio.Event().wait()  # silent until the server's shutdown cancels it
    return response


async def serving(scenario: Callable[[ApiClient], Awaitable[None]]) -> None:
    app = web.Application()
    app.router.add_get("/api/v1/pods", stream)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)  # a hanging stream is cut
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    reader = ApiClient(Credentials(configuration))
    try:
        await scenario(reader)
    finally:
        await reader.close()
        await runner.cleanup()


async def read_all(events: AsyncIterator[dict]) -> list[str]:
    return [e["object"]["metadata"]["resourceVersion"] async for e in events]


def watched(pace: float) -> tuple[list[str], int, float]:
    """(the versions delivered, the reads that delivered them, the seconds the server took to
    write them) of one watch of the stream."""
    got: list[str] = []
    reads = 0

    def on_bytes() -> None:
        nonlocal reads
        reads += 1

    async def scenario(reader: ApiClient) -> None:
        # Real sockets, and the pacing and the stall deadline run on the event loop's own clock (the
        # client's, not an injected one): 20 s is a net against a hang, not a measure of speed.
        got.extend(await asyncio.wait_for(read_all(reader.watch("/api/v1/pods", {}, 10, on_bytes, pace)), 20))

    asyncio.run(serving(scenario))
    return got, reads - 1, STREAMED[0]  # the first call is the stream being accepted


def test_a_paced_watch_delivers_every_event_in_order_in_a_few_reads():
    everything = [str(n) for n in range(1, EVENTS + 1)]
    unpaced, unpaced_reads, _ = watched(0.0)
    paced, paced_reads, took = watched(0.1)
    assert unpaced == everything and paced == everything
    # At most one read per 0.1 s rest while the server writes, and two at the edges (the last
    # events and the end), however long a busy machine stretches the stream's nominal 0.6 s: the
    # bound is on reads per rest, not on time. Unpaced, it is about one read an event.
    assert paced_reads <= math.ceil(took / 0.1) + 2, (paced_reads, took)
    assert unpaced_reads > 3 * paced_reads, (unpaced_reads, paced_reads, took)


def test_a_paced_watch_still_notices_a_stall():
    async def scenario(reader: ApiClient) -> None:
        events = reader.watch("/api/v1/pods", {"hang": "1"}, 0.5, lambda: None, 0.1)
        with pytest.raises(Stalled):  # after 0.5 s of silence; 10 s is a net against a hang, as above
            await asyncio.wait_for(read_all(events), 10)

    asyncio.run(serving(scenario))
