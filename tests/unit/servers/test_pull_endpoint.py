"""POST /v1/pull beside /v1/heartbeat on the beat server, on loopback (real TLS, no cluster): a
worker of a pool claims the pool's offered tasks with its pod's token; a forged token, another
pod's, a pod that is no pool's worker, one being deleted, or a standby gets nothing; a long poll is
answered when a task is offered."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.builders import make_job
from tests.support.clock import FakeClock
from tests.support.tokens import KEYS, OTHER_KEY, claims, token
from vigil import api
from vigil.controllers.jobs.pulled import Pulled
from vigil.core import beats
from vigil.core.actions import CreatePod
from vigil.core.pull import PoolPod
from vigil.servers.beats import BeatEndpoint
from vigil.servers.http import Bounds, serve_fast
from vigil.servers.pull import PATH, PullEndpoint

pytestmark = pytest.mark.unit

WORKER = {"namespace": "team-a", "name": "etl-x7k2q", "uid": "pod-uid-1"}


class Bed:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.now = self.clock.wall().timestamp()
        self.leading = True
        self.pokes: list[Any] = []
        self.pulled = Pulled(self.clock, self.pokes.append)
        self.pulled.start()
        self.pool_pods = {("team-a", "etl-x7k2q"): PoolPod("etl", "pod-uid-1", False)}
        self.beat = BeatEndpoint(
            leading=lambda: self.leading,
            keys=self.fetch,
            held=lambda: KEYS,
            pod_of=lambda uid: None,
            heard=lambda pod: None,
            clock=self.clock,
        )
        self.endpoint = PullEndpoint(
            self.beat, leading=lambda: self.leading, request=self.pulled.request, pool_of=self._pool_of
        )

    async def fetch(self, kid: str | None) -> beats.IssuerKeys | None:
        return KEYS

    def _pool_of(self, namespace: str, name: str) -> PoolPod | None:
        return self.pool_pods.get((namespace, name))

    def offer(self, index: int) -> None:
        """A task's start, as a pulled array's decision makes it (its virtual pod's creation)."""
        job = make_job(spec={"pool": "etl", "tasks": {"count": 5}})
        manifest = {
            "metadata": {
                "name": f"ledger-{index}-1",
                "namespace": "team-a",
                "labels": {api.LABEL_JOB_UID: "job-uid", api.LABEL_TASK_INDEX: str(index), api.LABEL_ATTEMPT: "1"},
            },
            "spec": {"containers": [{"name": "task", "env": [{"name": "VIGIL_TASK_INDEX", "value": str(index)}]}]},
        }
        assert self.pulled.carry_out(job, CreatePod(manifest))

    def good(self, **over: Any) -> str:
        return token(claims(self.now, namespace="team-a", name="etl-x7k2q", uid="pod-uid-1", **over))


def body(**over: Any) -> dict[str, Any]:
    return {"pod": WORKER, "boot": "b1", "seq": 1, "seen": 0, "free": 2, "waitSeconds": 0, **over}


def post_all(
    certs: Path, bed: Bed, requests: list[tuple[str | None, Any]], during: Any = None
) -> list[tuple[int, dict]]:
    answers: list[tuple[int, dict]] = []

    async def main() -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(certs / "tls.crt"), str(certs / "tls.key"))
        routes = [*bed.beat.routes(), *bed.endpoint.routes()]
        server = await serve_fast(
            routes, "127.0.0.1:0", bounds=Bounds(max_connections=100, per_source=100), ssl_context=context
        )
        client = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        try:
            async with aiohttp.ClientSession() as session:
                for bearer, payload in requests:
                    headers = {"Authorization": f"Bearer {bearer}"} if bearer is not None else {}
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                    url = f"https://127.0.0.1:{server.port}{PATH}"
                    post = session.post(url, data=data, headers=headers, ssl=client)
                    if during is not None:
                        async with asyncio.timeout(10):
                            task = asyncio.ensure_future(post.__aenter__())
                            while not bed.pulled.waiters:  # the long poll waits for an offer
                                await asyncio.sleep(0.01)
                            during()
                            response = await task
                    else:
                        response = await post.__aenter__()
                    answers.append((response.status, await response.json()))
                    response.release()
        finally:
            await server.stop()

    asyncio.run(main())
    return answers


def test_a_worker_claims_its_pools_tasks_and_its_beat_comes_back_with_the_timing(certs: Path) -> None:
    bed = Bed()
    bed.offer(0)
    bed.offer(1)
    bed.offer(2)
    ((status, answer),) = post_all(certs, bed, [(bed.good(), body())])
    assert status == 200
    assert [lease["index"] for lease in answer["leases"]] == [0, 1]  # two free slots, oldest first
    assert answer["leases"][0]["env"]["VIGIL_TASK_INDEX"] == "0"
    assert (answer["beatSeconds"], answer["leaseSeconds"]) == (5.0, 30.0)


def test_forged_foreign_and_unknown_workers_get_nothing(certs: Path) -> None:
    bed = Bed()
    bed.offer(0)
    bed.pool_pods[("team-a", "ledger-1")] = PoolPod("etl", "pod-uid-9", True)
    other_pool_pod = {"namespace": "team-b", "name": "etl-x7k2q", "uid": "pod-uid-1"}
    answers = post_all(
        certs,
        bed,
        [
            (token(claims(bed.now, namespace="team-a", name="etl-x7k2q", uid="pod-uid-1"), key=OTHER_KEY), body()),
            (token(claims(bed.now, namespace="team-a", name="other", uid="pod-uid-2")), body()),  # another pod's
            (token(claims(bed.now, namespace="team-b", name="etl-x7k2q", uid="pod-uid-1")), body(pod=other_pool_pod)),
            (token(claims(bed.now)), body(pod={"namespace": "team-a", "name": "ledger-1", "uid": "pod-uid-1"})),
            (None, body()),
            (bed.good(), b"{"),
            (bed.good(), body(free=5000)),
        ],
    )
    assert [status for status, _ in answers] == [401, 403, 404, 404, 401, 400, 400]
    assert all("error" in answer for _, answer in answers)
    assert bed.pulled.load("team-a", "etl").running == 0  # nothing was claimed


def test_a_worker_being_deleted_claims_nothing_and_a_standby_answers_503(certs: Path) -> None:
    bed = Bed()
    bed.offer(0)
    bed.pool_pods[("team-a", "etl-x7k2q")] = PoolPod("etl", "pod-uid-1", True)
    ((status, answer),) = post_all(certs, bed, [(bed.good(), body())])
    assert status == 200 and answer["leases"] == []  # draining: heard, given nothing
    bed.pool_pods[("team-a", "etl-x7k2q")] = PoolPod("etl", "pod-uid-1", False)
    bed.leading = False
    ((status, answer),) = post_all(certs, bed, [(bed.good(), body())])
    assert status == 503 and "does not lead" in answer["error"]
    assert bed.pulled.load("team-a", "etl").running == 0


def test_a_long_poll_is_answered_when_a_task_is_offered(certs: Path) -> None:
    bed = Bed()
    ((status, answer),) = post_all(certs, bed, [(bed.good(), body(waitSeconds=8))], during=lambda: bed.offer(3))
    assert status == 200 and [lease["index"] for lease in answer["leases"]] == [3]
